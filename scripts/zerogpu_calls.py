"""GPU calls and the bytes that cross per call, with the app served as a ZeroGPU Space serves it.

Starts `python app.py` under the ZeroGPU double (tests/zerogpu_double: every spaces.GPU call in a forked child,
arguments and results pickled), then through the API: three Steps, a Run of the rest, a scrub, and a Run from a
fresh prompt; prints, per action, the GPU calls it made and the bytes of their arguments and results.

    .venv/bin/python scripts/zerogpu_calls.py --pair embedded --max-new-tokens 64
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from dynasd.options import DEFAULT_MAX_NEW_TOKENS

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny-random")
    parser.add_argument("--method", default="mcsd")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--prompt", default="Explain what a binary search tree is.")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="dynasd-zerogpu-"))
    log = folder / "gpu_calls.jsonl"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "SPACES_ZERO_GPU": "1",
           "ZEROGPU_DOUBLE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "zerogpu_double"), str(REPO)])}
    port = free_port()
    with open(folder / "app.log", "w") as out:
        app = subprocess.Popen([sys.executable, "app.py", "--pair", args.pair, "--device", "cpu", "--port",
                                str(port)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5):
                    break
            except OSError:
                if app.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the app did not start: {(folder / 'app.log').read_text()[-2000:]}")
                time.sleep(1)
        from gradio_client import Client

        client = Client(url, verbose=False)
        controls = dict(pair=args.pair, method=args.method, max_new_tokens=args.max_new_tokens)
        actions = [("Step", lambda: client.predict(prompt=args.prompt, **controls, api_name="/step"))] * 3
        actions += [("Run (the rest)", lambda: client.predict(prompt=args.prompt, **controls, api_name="/run")),
                    ("scrub to step 1", lambda: client.predict(1, api_name="/show_step")),
                    ("Reset", lambda: client.predict(api_name="/reset")),
                    ("Run (fresh)", lambda: client.predict(prompt=args.prompt + " ", **controls, api_name="/run"))]
        print(f"pair {args.pair}, {args.method}, {args.max_new_tokens} new tokens, under the ZeroGPU double")
        print(f"{'action':<18}{'GPU calls':>10}{'args bytes':>12}{'result bytes':>14}  status")
        for name, act in actions:
            before = len(log.read_text().splitlines()) if log.exists() else 0
            outputs = act()
            calls = [json.loads(line) for line in log.read_text().splitlines()[before:]] if log.exists() else []
            status = outputs[7] if isinstance(outputs, (list, tuple)) and len(outputs) > 7 else ""
            print(f"{name:<18}{len(calls):>10}{sum(c['args_bytes'] for c in calls):>12}"
                  f"{sum(c['result_bytes'] for c in calls):>14}  {str(status)[:70]}")
    finally:
        app.terminate()
        app.wait(30)


if __name__ == "__main__":
    main()
