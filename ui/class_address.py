"""The address a class's learners open: one their phones can reach, or a warning that says why there is none and
how to open the class to the room.

A lecturer usually opens the app on the machine that serves it, at http://127.0.0.1:PORT, an address that only
that machine can open. What learners can reach depends on how the server was started, which the page cannot see:

- on a Hugging Face Space, the Space's public address (SPACE_HOST, set by the Space);
- a page opened at an address that is not the loopback (the machine's network address, a host name, a tunnel)
  is reachable as the lecturer reached it: that address;
- a server listening on every interface (`--host 0.0.0.0`): this machine's address on the local network;
- a server listening on one network address: that address;
- a server listening on the loopback only (the default): the page's own address, with a warning and the command
  that opens the class to the room.

`serve` in app.py records how it listens (`listening`); the Class tab asks `learner_address` at each start.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

ALL_INTERFACES = ("0.0.0.0", "::", "")
LISTEN: dict = {}  # {"host": ..., "port": ...} as app.py's serve launched this process's server


@dataclass(frozen=True)
class LearnerAddress:
    base: str        # the page address learners open, without the class's path
    warning: str     # "" when learners can reach `base`


def listening(host: str, port: int) -> None:
    """Record how this process's server listens (app.py's serve, before it launches)."""
    LISTEN.update(host=host, port=port)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def lan_address() -> str | None:
    """This machine's address on its local network: the source address of its default route (a UDP socket's
    connect sends nothing), else None (no network)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.254.254.254", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if is_loopback(address) or address == "0.0.0.0" else address


def learner_address(page_address: str, listen: dict | None = None, env=None) -> LearnerAddress:
    """Where learners open the class, from the lecturer page's own address and how the server listens."""
    listen = LISTEN if listen is None else listen
    env = os.environ if env is None else env
    page = urlsplit(page_address)
    path = page.path.rstrip("/")
    if env.get("SPACE_HOST"):
        return LearnerAddress(f"https://{env['SPACE_HOST']}", "")
    if page.hostname and not is_loopback(page.hostname):
        return LearnerAddress(page_address, "")
    host, port = listen.get("host"), listen.get("port") or page.port
    if host is None or is_loopback(host):
        where = host or "127.0.0.1"
        return LearnerAddress(page_address, (
            f"**Phones cannot open this link**: the app listens only on this computer ({where}). To open the class "
            f"to the room, start the app with `python app.py --host 0.0.0.0` (anyone on your local network can "
            f"then reach it); the link then carries this computer's network address."))
    if host in ALL_INTERFACES:
        address = lan_address()
        if address is None:
            return LearnerAddress(page_address, (
                "**Phones cannot open this link**: this computer has no local network address. Connect it to the "
                "room's network (the one the phones use) and start the class again."))
        return LearnerAddress(f"http://{address}:{port}{path}", "")
    shown = f"[{host}]" if ":" in host else host
    return LearnerAddress(f"http://{shown}:{port}{path}", "")
