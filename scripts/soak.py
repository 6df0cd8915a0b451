"""Soak the explorer: many sessions at once, bad input of every kind, injected model failures, a class (a lecturer
and learners answering its steps), and N sessions created and abandoned while memory is watched. Prints the figures
and exits non-zero if any check failed.

    .venv/bin/python scripts/soak.py                      # 500 sessions, 16 at once (several minutes on 2 cores)
    .venv/bin/python scripts/soak.py --sessions=60 --concurrent=8    # a quick look
    .venv/bin/python scripts/soak.py --memory-only --sessions=500    # the server's memory alone, see below

The app runs in this process (tiny-random pair, `app.serve(block=False)`) so that faults can be injected into one
session's model calls (through the engine's hook, dynasd.explorer.engine.FAULTS); clients talk to it over HTTP with
gradio_client, one client session per browser tab. RSS is this process's (server and clients together).
What counts as passing: every tab's tokens (its saved trace's token ids, not the text panel's rendering, which
shows spaces as ␣ and line ends as ↵) are those of the same settings run alone; every bad input is answered in
one line that names the field and what is allowed there (the range, from its owner in dynasd/); a fault reaches
its own session only, which says so in one line and starts over after Reset. tests/test_soak.py runs a short
soak (short_soak) in the suite, so a change that breaks the soak breaks a test.

--memory-only measures the server alone: the app runs in its own process (scripts/soak_server.py, which is app.py
plus memory probes), the clients in this one, and the figures are the server's VmRSS after a gc.collect(), read at
the server's end on SIGUSR1, after a warm-up and then every --every tabs. --server-env KEY=VALUE goes into the
server's environment, e.g. MALLOC_ARENA_MAX=2 or SOAK_TRACEMALLOC=<frames> (then the Python allocations that grew
between the first and the last probe are listed). The app itself returns freed heap to the OS every 30 s
(dynasd.explorer.sessions.session.start_heap_trimmer).
"""
from __future__ import annotations

import argparse
import collections
import functools
import gc
import importlib.util
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dynasd.explorer.sessions.memory import process_rss_mb  # noqa: E402  (the hub reads HF_HUB_OFFLINE at import)


def import_app():
    """app.py, loaded from the checkout: a Space runs it from the repository root, so it is not part of the
    installed package (dynasd and viz are). The ui package beside it is imported from the checkout too."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    spec = importlib.util.spec_from_file_location("app", REPO / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["app"] = module
    spec.loader.exec_module(module)
    return module


STATUS, TEXT, SCRUBBER = 7, 0, 9
TINY = dict(pair="tiny-random", method="mcsd", max_new_tokens=16)
# Tab i runs CONFIGS[i % 8]. The lossy tree is third, so the short soak's four tabs run it too: its tokens depend on
# the draft's kernels as well, and show a solo run that was not made on the served pair.
CONFIGS = [dict(method="mcsd", k_config="3,2,1"), dict(method="sd", gamma=3), dict(method="ti-mcsd", width=3, depth=2),
           dict(method="ti-mcsd", width=1, depth=3),
           dict(method="mcsd", k_config="2,2,2", dynamic_depth=True, stop="confidence", threshold=0.5),
           dict(method="mcsd", k_config="3,1,2"), dict(method="ar"),
           dict(method="mcsd", k_config="1,1,1,1,1", stop="cumulative", threshold=0.3)]


def range_said(title: str, kind) -> str:
    """How a refusal states a number's allowed range, from the range's owner (dynasd/ranges.py): the soak follows
    a range that changes instead of holding a copy of it."""
    from dynasd.ranges import Float

    if isinstance(kind, Float):
        return f"{title} must lie in {kind.bounds()}"
    if kind.high is None:
        return f"{title} must be at least {kind.low}"
    return f"{title} must lie in [{kind.low}, {kind.high}]"


def option_range(name: str) -> str:
    from dynasd.options import OPTIONS

    return range_said(OPTIONS[name].title, OPTIONS[name].kind)


def bad_inputs() -> dict:
    """kind -> (inputs of /step, what the one line must say: the field it names and what is allowed there)."""
    from dynasd.explorer.inputs import MAX_PROMPT_CHARS, NEW_TOKENS
    from dynasd.options import MAX_SHAPE_CHARS, MAX_TREE_NODES
    from dynasd.sampling import TEMPERATURE, TOP_K, TOP_P

    hi = dict(prompt="hi", pair="tiny-random")
    new_tokens = range_said("max new tokens", NEW_TOKENS)
    return {
        "empty prompt": (dict(prompt="", **TINY), ["the prompt is empty"]),
        "whitespace prompt": (dict(prompt=" \n\t", **TINY), ["the prompt is empty"]),
        "prompt over the character cap": (dict(prompt="x" * 25_000, **TINY),
                                          ["prompt", f"the limit is {MAX_PROMPT_CHARS}"]),
        "prompt over the context limit": (dict(prompt="word " * 300, pair="tiny-random", max_new_tokens=500),
                                          ["prompt", "max new tokens", "exceeds the model's context of"]),
        "max new tokens over the cap": (dict(**hi, max_new_tokens=10**6), [new_tokens]),
        "max new tokens zero": (dict(**hi, max_new_tokens=0), [new_tokens]),
        "tree shape zero": (dict(**hi, k_config="0"), ["branching factor", "at least 1"]),
        "tree shape negative": (dict(**hi, k_config="-1,2"), ["branching factor", "at least 1"]),
        "tree shape non-numeric": (dict(**hi, k_config="a,b"), ["tree shape", "comma-separated integers"]),
        "tree shape over the node cap": (dict(**hi, k_config="16,16"), ["tree", f"the limit is {MAX_TREE_NODES}"]),
        "tree shape astronomically big": (dict(**hi, k_config="99999,99999"),
                                          ["tree", f"the limit is {MAX_TREE_NODES}"]),
        "tree shape text huge": (dict(**hi, k_config="1," * 10_000), ["tree shape", f"the limit is {MAX_SHAPE_CHARS}"]),
        "tree shape not text": (dict(**hi, k_config=["4", "2"]), ["tree shape", "comma-separated integers"]),
        "temperature out of range": (dict(**hi, temperature=-1.0), [range_said("temperature", TEMPERATURE)]),
        "top-p out of range": (dict(**hi, top_p=2.0), [range_said("top-p", TOP_P)]),
        "top-k out of range": (dict(**hi, top_k=-1), [range_said("top-k", TOP_K)]),
        "threshold out of range": (dict(**hi, threshold=7.0), [option_range("threshold")]),
        "gamma out of range": (dict(**hi, method="sd", gamma=10**6), [option_range("gamma")]),
        "seed out of range": (dict(**hi, seed=1e30), [option_range("seed")]),
        "seed not a number": (dict(**hi, seed="abc"), ["seed must be a whole number"]),
        "slider sent null": (dict(**hi, gamma=None), ["gamma must be a whole number"]),
        "custom pair without models": (dict(prompt="hi", pair="custom"), ["custom pair", "target", "draft"]),
        "unreachable hub id": (dict(prompt="hi", pair="custom", target="no-org/no-model", draft="no-org/no-model"),
                               ["no-org/no-model", "hub is unreachable"]),
        "missing local path": (dict(prompt="hi", pair="custom", target="/nonexistent/a", draft="/nonexistent/b"),
                               ["no model at local path", "/nonexistent/a"]),
        # refused by Gradio itself before any handler runs (the page offers no way to send them): its message
        # names the value and lists the allowed choices
        "unknown model pair": (dict(prompt="hi", pair="gpt-17"), ["gpt-17", "not in the list of choices", "embedded"]),
        "unknown method": (dict(prompt="hi", pair="tiny-random", method="beam"),
                           ["beam", "not in the list of choices", "mcsd"]),
    }


REFUSED_BY_GRADIO = {"unknown model pair", "unknown method"}
HOSTILE_TRACES = {
    "trace: not JSON": b"not json at all",
    "trace: pickle bytes": b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93.",
    "trace: deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "trace: wrong format": json.dumps({"format": "evil/1"}).encode(),
    "trace: JSON array": b"[1, 2, 3]",
}


def unclear(kind: str, status: str, must_say: list[str]) -> str:
    """Why `status` is not a clear answer to bad input `kind` ("" when it is): one line, a warning (or, for a
    choice outside its list, Gradio's own refusal), naming the field and what is allowed there."""
    if kind in REFUSED_BY_GRADIO:
        if not status.startswith("error: "):
            return "not refused"
    elif not status.startswith("⚠"):
        return "not a warning"
    if "\n" in status.strip() or "Traceback" in status or "verbose error" in status:
        return "more than one line"
    missing = [phrase for phrase in must_say if phrase not in status]
    return f"does not say {missing}" if missing else ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Figures:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.in_flight = self.peak_in_flight = 0
        self.peak_sessions = 0
        self.texts_compared = 0
        self.class_answers = 0  # answers given in a class and found in its summary
        self.bad_inputs: collections.Counter = collections.Counter()
        self.faults = collections.Counter()
        self.failures: list[str] = []
        self.rss_track: list[tuple[int, float]] = []  # (tabs opened so far, RSS MB)

    def fail(self, message: str) -> None:
        with self.lock:
            self.failures.append(message)
        print("FAIL:", message, flush=True)


class Tab:
    """One browser tab: a gradio_client session whose requests are counted."""

    def __init__(self, url: str, figures: Figures, registry) -> None:
        from gradio_client import Client

        self.client = Client(url, verbose=False)
        self.figures, self.registry = figures, registry

    def call(self, *args, api_name: str, **kwargs):
        f = self.figures
        with f.lock:
            f.in_flight += 1
            f.peak_in_flight = max(f.peak_in_flight, f.in_flight)
        try:
            return self.client.predict(*args, api_name=api_name, **kwargs)
        finally:
            with f.lock:
                f.in_flight -= 1
                f.requests += 1
                if self.registry is not None:
                    f.peak_sessions = max(f.peak_sessions, len(self.registry))

    def status(self, *args, api_name: str = "/step", **kwargs) -> str:
        try:
            return self.call(*args, api_name=api_name, **kwargs)[STATUS]
        except Exception as exc:
            return f"error: {exc}"

    def token_ids(self) -> list[int]:
        """The token ids of the run on show, as its saved trace holds them: what the text panel shows, without
        its rendering (spaces as ␣, line ends as ↵)."""
        path, status = self.call(api_name="/save_trace")
        if not path:
            raise RuntimeError(f"no trace saved: {status}")
        return json.loads(Path(path).read_text())["new_token_ids"]


def solo_ids(pairs, prompt: str, options: dict, max_new: int) -> list[int]:
    """The token ids these settings give run alone: one decoder, no other session, in this process, on the pair
    the server serves (`pairs`, its PairCache) under that pair's lock.

    Why the served pair, not one built here: a lossy tree (ti-mcsd wider than 1) writes what its draft proposes,
    and the served pair's draft computes in the kernels' rounding (dynasd/kernels/), so a pair built with stock
    modules writes other tokens."""
    from dynasd.explorer.engine import build_decoder
    from dynasd.explorer.inputs import Settings

    settings = Settings(pair="tiny-random", max_new_tokens=max_new, **options).normalised()
    pair = pairs.get(settings)
    with pairs.lock_for(pair):
        return build_decoder(pair, settings).generate(pair.encode_prompt(prompt), max_new).new_token_ids


def concurrency_phase(url, state, figures, tabs: int, max_new: int) -> None:
    """`tabs` tabs step and run at once; each must write exactly the tokens it writes alone."""
    from dynasd.explorer.inputs import Settings

    start = threading.Barrier(tabs)
    tokenizer = state.PAIRS.get(Settings(pair="tiny-random")).tokenizer

    def tab_main(i):
        prompt, options = f"tab {i} says", CONFIGS[i % len(CONFIGS)]
        expected = solo_ids(state.PAIRS, prompt, options, max_new)
        try:
            tab = Tab(url, figures, state.SESSIONS)
            kwargs = dict(prompt=prompt, pair="tiny-random", max_new_tokens=max_new, **options)
            start.wait()
            for _ in range(i % 4):
                tab.call(**kwargs, api_name="/step")
            status = tab.call(**kwargs, api_name="/run")[STATUS]
            if not status.startswith("✓ Done"):
                figures.fail(f"tab {i} ({options}): the run did not finish: {status[:200]!r}")
            written = tab.token_ids()
            with figures.lock:
                figures.texts_compared += 1
            if written != expected:
                figures.fail(f"tab {i} ({options}) wrote {tokenizer.decode(written)!r}, alone it writes "
                             f"{tokenizer.decode(expected)!r} (token ids {written} against {expected})")
        except Exception as exc:
            figures.fail(f"tab {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=tab_main, args=(i,)) for i in range(tabs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


ONE_TOKEN_PER_STEP = dict(pair="tiny-random", method="ar", max_new_tokens=512)  # the n-th step says "Step n"


class Bystander:
    """A tab that takes one step after another on its own run; every step must be the next one."""

    def __init__(self, url, figures, registry, prompt: str) -> None:
        self.tab, self.prompt, self.figures, self.steps = Tab(url, figures, registry), prompt, figures, 0
        self.step("start")

    def step(self, after: str) -> None:
        status = self.tab.status(prompt=self.prompt, **ONE_TOKEN_PER_STEP)
        if not status.startswith(f"✓ Step {self.steps} took"):
            self.figures.fail(f"{after} disturbed another session: its step {self.steps} said {status[:200]!r}")
        self.steps += 1


def bad_input_phase(url, state, figures, every: int = 1) -> None:
    """Every `every`-th kind of bad input, then hostile trace files, in one tab; another tab steps between them."""
    tab, healthy = Tab(url, figures, state.SESSIONS), Bystander(url, figures, state.SESSIONS, "healthy")
    for kind, (kwargs, must_say) in list(bad_inputs().items())[::every]:
        status = tab.status(**kwargs)
        figures.bad_inputs[kind] += 1
        why = unclear(kind, status, must_say)
        if why:
            figures.fail(f"bad input '{kind}': unclear answer ({why}): {status[:200]!r}")
        healthy.step(f"bad input '{kind}'")
    from gradio_client import handle_file

    folder = Path(tempfile.mkdtemp(prefix="soak-traces-"))
    for kind, payload in list(HOSTILE_TRACES.items())[::every]:
        path = folder / f"{len(figures.bad_inputs)}.json"
        path.write_bytes(payload)
        status = tab.status(handle_file(str(path)), api_name="/load_trace")
        figures.bad_inputs[kind] += 1
        if not status.startswith("⚠") or "cannot load that trace" not in status:
            figures.fail(f"hostile {kind}: unclear answer {status[:200]!r}")
    if not tab.status(prompt="a good prompt after all that", **TINY).startswith("✓ Step 0"):
        figures.fail("the tab that sent bad input cannot step afterwards")


def injected_errors() -> list[tuple[str, BaseException]]:
    """(when, error): the model failures the fault phase injects, one of each kind, in turn."""
    import torch

    return [("step", torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB (injected)")),
            ("step", RuntimeError("CUDA error: device-side assert triggered (injected)")),
            ("prefill", MemoryError("out of memory while prefilling (injected)"))]


def fault_phase(url, state, figures, faults: int) -> None:
    """Model calls that fail (an OOM, a CUDA error, a failed prefill) in one session, injected through the engine's
    hook (engine.FAULTS); a bystander steps after each fault is armed and again after it went off, so a fault that
    reaches the wrong session is seen there."""
    import viz
    from dynasd.explorer import engine

    bystander = Bystander(url, figures, state.SESSIONS, "bystander")
    errors = injected_errors()
    for i in range(faults):
        during, error = errors[i % len(errors)]
        victim, prompt, name = Tab(url, figures, state.SESSIONS), f"victim {i}", type(error).__name__
        kind = f"{name} at a {during}"
        if during == "step" and not victim.status(prompt=prompt, **TINY).startswith("✓ Step 0"):
            figures.fail(f"fault {i}: the victim could not start")
        engine.FAULTS.arm(prompt, error, during)
        figures.faults[kind] += 1
        bystander.step(f"fault {i} ({kind}, armed for another session)")
        status = victim.status(prompt=prompt, **TINY)
        told = status.startswith("✗") and name in status and "Reset" in status
        if not told or (during == "prefill" and "prefill" not in status):
            figures.fail(f"fault {i} ({kind}): the victim was not told clearly: {status[:200]!r}")
        if name not in victim.status(prompt=prompt, **TINY):
            figures.fail(f"fault {i} ({kind}): the victim's session did not stay failed")
        bystander.step(f"fault {i} ({kind})")
        victim.status(api_name="/reset")
        if not victim.status(prompt=prompt, **TINY).startswith("✓ Step 0"):
            figures.fail(f"fault {i} ({kind}): the victim could not start over after Reset")
    engine.FAULTS.clear()
    # a bug outside the model (a figure builder) is one line too, and the next request is fine
    real = viz.tree_figure
    viz.tree_figure = lambda *a, **k: (_ for _ in ()).throw(KeyError("injected figure bug"))
    try:
        status = bystander.tab.status(prompt=bystander.prompt, **ONE_TOKEN_PER_STEP)
        bystander.steps += 1
        figures.faults["KeyError in a figure builder"] += 1
        if not status.startswith("✗") or "something went wrong on the server (KeyError" not in status:
            figures.fail(f"figure bug: unclear answer {status[:200]!r}")
    finally:
        viz.tree_figure = real
    bystander.step("the figure bug")


def soak_phase(url, state, figures, sessions: int, workers: int, steps: int) -> tuple[float, float, float]:
    """`sessions` tabs opened, stepped a few times and abandoned, `workers` at a time. Returns RSS (MB) at the
    start, at the end, and the peak. The start is after a warm-up that fills both bounded stores (our registry
    and gradio's per-session state, which holds twice as many), so what follows is the steady state."""
    per_worker = sessions // workers
    counter = iter(range(10**9))
    lock = threading.Lock()
    peak = [0.0]

    def worker(n):
        tab = Tab(url, figures, state.SESSIONS)
        for _ in range(n):
            with lock:
                i = next(counter)
            step_new_tab(tab, figures, i, steps)
            if i % 50 == 0:
                with lock:
                    peak[0] = max(peak[0], process_rss_mb())
                    figures.rss_track.append((i, process_rss_mb()))

    run_workers(worker, workers, warm_up_tabs(state) // workers + 1)
    gc.collect()
    start = process_rss_mb()
    run_workers(worker, workers, per_worker)
    gc.collect()
    end = process_rss_mb()
    return start, end, max(peak[0], end)


def step_new_tab(tab, figures, i: int, steps: int) -> None:
    """Start tab number i in `tab`'s client (the previous one is abandoned without a word) and step it."""
    tab.client.reset_session()
    for _ in range(steps):
        status = tab.status(prompt=f"abandoned tab {i}", pair="tiny-random", method="mcsd", max_new_tokens=48)
        if not status.startswith("✓"):
            figures.fail(f"abandoned tab {i}: {status[:200]!r}")


def warm_up_tabs(state) -> int:
    return 2 * state.SESSIONS.max_sessions + 8


def run_workers(fn, workers, n):
    threads = [threading.Thread(target=fn, args=(n,)) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def abandon_tabs(url, figures, tabs: int, workers: int, steps: int, counter) -> None:
    """`tabs` tabs opened, stepped `steps` times and abandoned, `workers` at a time (a registry-less Tab each)."""
    lock = threading.Lock()

    def worker(n):
        tab = Tab(url, figures, None)
        for _ in range(n):
            with lock:
                i = next(counter)
            step_new_tab(tab, figures, i, steps)

    run_workers(worker, workers, tabs // workers)


def process_cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system, s), from /proc/PID/stat (OSError once it has ended)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe_server(server, probe_dir: Path, n: int, timeout_s: float = 120.0) -> dict:
    server.send_signal(signal.SIGUSR1)
    path, deadline = probe_dir / f"probe-{n}.json", time.monotonic() + timeout_s
    while not path.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not answer probe {n}")
        time.sleep(0.2)
    return json.loads(path.read_text())


def wait_until_up(url: str, server, timeout_s: float = 900.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            if httpx.get(url + "config", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError("the server did not come up")


def stop_server(server: subprocess.Popen) -> None:
    """End a served app: asked first, killed if it has not ended within 30 s."""
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()


def memory_only(args) -> int:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    probe_dir = Path(tempfile.mkdtemp(prefix="soak-probe-"))
    env = dict(os.environ, SOAK_PROBE_DIR=str(probe_dir))
    env.update(kv.split("=", 1) for kv in args.server_env)
    server = subprocess.Popen([sys.executable, str(REPO / "scripts" / "soak_server.py"), "--pair", "tiny-random",
                               "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)], env=env, cwd=REPO)
    figures, counter, track = Figures(), iter(range(10**9)), []
    started = time.monotonic()
    try:
        wait_until_up(url, server)
        probes = [probe_server(server, probe_dir, 0)]
        abandon_tabs(url, figures, args.warm_up, args.workers, args.steps, counter)
        probes.append(probe_server(server, probe_dir, 1))
        track.append((0, probes[-1], process_rss_mb(), time.monotonic() - started))
        done = 0
        while done < args.sessions:
            chunk = min(args.every, args.sessions - done)
            abandon_tabs(url, figures, chunk, args.workers, args.steps, counter)
            done += chunk
            probes.append(probe_server(server, probe_dir, len(probes)))
            track.append((done, probes[-1], process_rss_mb(), time.monotonic() - started))
            print(f"  {done:5d} tabs: server RSS {probes[-1]['rss_mb']:.0f} MB "
                  f"(before gc {probes[-1]['rss_mb_before_gc']:.0f}), client RSS {process_rss_mb():.0f} MB, "
                  f"{time.monotonic() - started:.0f} s", flush=True)
    finally:
        stop_server(server)

    first, last = track[0][1], track[-1][1]
    print()
    print("DynaSD Explorer memory soak (tiny-random, server in its own process, gradio_client over HTTP)")
    print(f"  server environment             {' '.join(args.server_env) or '(default)'}")
    print(f"  tabs created and abandoned     {args.sessions} (+{args.warm_up} warm-up), {args.steps} steps each, "
          f"{args.workers} at a time")
    print(f"  server RSS (MB, after gc)      boot {probes[0]['rss_mb']:.0f}; after warm-up {first['rss_mb']:.0f}; "
          + ", ".join(f"{n}: {p['rss_mb']:.0f}" for n, p, _, _ in track[1:])
          + f" ({last['rss_mb'] - first['rss_mb']:+.0f} MB after warm-up)")
    print("  client RSS (MB, this process)  " + ", ".join(f"{n}: {c:.0f}" for n, _, c, _ in track))
    if "traced_mb" in last:
        print("  Python heap traced (MB)        " + ", ".join(f"{n}: {p['traced_mb']:.1f}" for n, p, _, _ in track))
    print(f"  server threads                 {first['threads']} -> {last['threads']}")
    grew = {k: (first['stores'].get(k), v) for k, v in last["stores"].items() if first["stores"].get(k) != v}
    print(f"  per-session stores             {last['stores']}")
    print(f"  stores that changed            {grew or 'none'}")
    counts0 = dict(first["objects"])
    print("  live objects that grew         " + (", ".join(
        f"{t} {counts0.get(t, 0)}->{c}" for t, c in last["objects"] if c - counts0.get(t, 0) > 500) or "none"))
    if "traced_mb" in last:
        import tracemalloc

        a = tracemalloc.Snapshot.load(str(probe_dir / f"snap-{first['n']}.pickle"))
        b = tracemalloc.Snapshot.load(str(probe_dir / f"snap-{last['n']}.pickle"))
        print("  Python allocations that grew most (after warm-up -> end):")
        for stat in b.compare_to(a, "traceback")[:8]:
            print(f"    {stat.size_diff / 2**20:+7.2f} MB {stat.count_diff:+7d} blocks")
            for line in stat.traceback.format(limit=6)[::2]:
                print("        " + line.strip())
    print(f"  wall time                      {time.monotonic() - started:.0f} s")
    print(f"  checks failed                  {len(figures.failures)}")
    for failure in figures.failures[:20]:
        print("   -", failure)
    return 1 if figures.failures else 0


class ClassLearner:
    """One learner's page in a class (ui/classroom.py), talking plain HTTP as the page does (its events skip the
    queue): join, then a poll every `poll_s` seconds; a new key asks for the views (the round's choices with them).
    The rejoin token the class hands out at the join is kept, as the browser keeps it, and goes with every request.
    `shown` keeps when each (round, phase, vote) reached this page."""

    def __init__(self, url: str, code: str, name: str, poll_s: float = 0.5) -> None:
        import httpx

        self.http = httpx.Client(base_url=url + "gradio_api/", timeout=60)
        self.code, self.name, self.poll_s = code, name, poll_s
        self.token = ""  # the rejoin token, once joined
        self.page = os.urandom(8).hex()  # the page's session; a reload gets a new one
        self.key, self.round, self.choices, self.status = "", 0, [], ""
        self.shown: dict[tuple[int, str], float] = {}
        self.requests = 0

    def call(self, api: str, *data) -> list:
        self.requests += 1
        answer = self.http.post(f"run/{api}", json={"data": list(data), "session_hash": self.page})
        body = answer.json()
        if answer.status_code != 200 or "data" not in body:
            raise RuntimeError(f"/{api}: {body.get('error', answer.status_code)}")
        return body["data"]

    def join(self, name: str | None = None) -> str:
        """Join (or, after a reload, rejoin with the kept token); the status line's words."""
        # JoinViews' order: the token, the join box, the status line, ...
        joined = self.call("class_join", self.code, self.name if name is None else name, self.token)
        self.status = str(joined[2])
        if isinstance(joined[0], str) and joined[0]:
            self.token = joined[0]
        return self.status

    def reload(self) -> str:
        """The page reloaded: a new session, nothing on show; the browser still holds the token."""
        self.page, self.key, self.round, self.choices = os.urandom(8).hex(), "", 0, []
        return self.join()

    def poll(self) -> bool:
        """One tick of the page's timer: whether the view changed (and then it is fetched, as the page does)."""
        key = self.call("class_poll", self.code, self.token)[0]
        if key == self.key:
            return False
        self.key = key
        status, _question, _outcome, _text, _story, _tree, _mask, _pq, asked, _round, _box, choice, _button = \
            self.call("class_show", self.code, self.token)  # ShowViews' order
        self.status, self.round = str(status), int(asked or 0)
        self.choices = [value for _, value in choice.get("choices", [])] if isinstance(choice, dict) else []
        self.shown.setdefault((*self.frame(), self.vote()), time.monotonic())
        return True

    def frame(self) -> tuple[int, str]:
        """(round, phase) from the key the page holds (LearnerView.key: id.round.phase.question.vote.answer)."""
        parts = self.key.split(".")
        return (int(parts[1]), parts[2]) if len(parts) >= 6 and parts[1].isdigit() else (0, "")

    def vote(self) -> int:
        """The vote open in the round on show (1, or 2 once the lecturer opened the second), as the key says."""
        parts = self.key.split(".")
        return int(parts[4]) if len(parts) >= 6 and parts[4].isdigit() else 1

    def mine(self) -> str:
        """The learner's own answer in the vote on show, as the key says ('None': none)."""
        return self.key.split(".")[-1] if self.key.count(".") >= 5 else ""

    def answer(self, value, number: int | None = None) -> str:
        status, key = self.call("class_answer", self.code, self.token, self.round if number is None else number,
                                value)
        self.status = str(status)
        return self.status


def class_phase(url, state, figures: Figures, learners: int = 3, rounds: int = 2) -> None:
    """A class (ui/classroom.py) on the served app: a lecturer and `learners` learners; every answer of both votes
    must be counted exactly once, a rejoin with the kept token must find its answers, no one may join under a
    classmate's name or answer with a made-up token, and each kind of bad input must be refused in one line that
    changes nothing."""
    from gradio_client import Client

    lecturer = Client(url, verbose=False)
    started = lecturer.predict(api_name="/class_start")
    code, token = started[3], started[4]
    pupils = [ClassLearner(url, code, f"pupil {i}") for i in range(learners)]
    for pupil in pupils:
        pupil.join()
    counted = 0
    for r in range(1, rounds + 1):
        lecturer.predict(code, token, "a class's prompt", **TINY, api_name="/class_step")
        for pupil in pupils:
            pupil.poll()
            if pupil.round != r or not pupil.choices:
                figures.fail(f"class: {pupil.name} does not show round {r} ({pupil.key!r})")
                continue
            if pupil.answer(pupil.choices[0]).startswith("✓"):
                counted += 1
            else:
                figures.fail(f"class: {pupil.name}'s answer to round {r} was refused: {pupil.status[:160]!r}")
        before = class_views(pupils)
        bad = {
            "a second answer": (lambda: pupils[0].answer(pupils[0].choices[-1]), "that answer stands"),
            **impostors(url, code, pupils[1].name, r, pupils[0].choices[0]),
            "a wrong code": (lambda: ClassLearner(url, "ZZZZZ", "x").join(), "no class has the code ZZZZZ"),
            "a code that is no code": (lambda: ClassLearner(url, "no code!", "x").join(), "is not a class code"),
            "an empty name": (ClassLearner(url, code, " ").join, "type your name first"),
            "a name too long": (ClassLearner(url, code, "n" * 80).join, "at most"),
            "a learner's reveal": (lambda: Client(url, verbose=False).predict(code, "", api_name="/class_reveal")[-3],
                                   "only the class's lecturer"),
        }
        for kind, (act, must_say) in bad.items():
            said = str(act())
            figures.bad_inputs[f"class: {kind}"] += 1
            if not said.startswith("⚠") or must_say not in said or "\n" in said.strip():
                figures.fail(f"class: {kind}: unclear answer {said[:200]!r}")
        if class_views(pupils) != before:
            figures.fail("class: bad input changed a learner's view")
        pupils[-1].reload()
        pupils[-1].poll()
        if pupils[-1].mine() != str(pupils[-1].choices[0]):
            figures.fail(f"class: a rejoin with the kept token lost its answer ({pupils[-1].key!r})")
        if r == 1:  # peer instruction: a second vote, every learner answers again
            lecturer.predict(code, token, api_name="/class_second_vote")
            for pupil in pupils:
                pupil.poll()
                if pupil.vote() != 2 or pupil.mine() != "None":
                    figures.fail(f"class: {pupil.name} does not show the second vote ({pupil.key!r})")
                elif pupil.answer(pupil.choices[-1]).startswith("✓"):
                    counted += 1
                else:
                    figures.fail(f"class: {pupil.name}'s second answer was refused: {pupil.status[:160]!r}")
        lecturer.predict(code, token, api_name="/class_reveal")
        late = pupils[1].answer(pupils[1].choices[-1], r)
        figures.bad_inputs["class: an answer after the reveal"] += 1
        if not late.startswith("⚠") or "closed at its reveal" not in late:
            figures.fail(f"class: an answer after the reveal: unclear answer {late[:200]!r}")
    summary = lecturer.predict(code, token, api_name="/class_end")[2]
    answered = sum(int(n) for n in re.findall(r"\d+ of (\d+) right", summary))
    answered += sum(int(n) for n in re.findall(r"Second vote: (\d+) answered", summary))
    if answered != counted:
        figures.fail(f"class: {counted} answers were acknowledged, the summary counts {answered}")
    with figures.lock:
        figures.class_answers += counted
    if len(state.CLASSES) > state.CLASSES.max_classes:
        figures.fail(f"the class registry holds {len(state.CLASSES)} classes, over its cap")


def impostors(url: str, code: str, classmate: str, number: int, value) -> dict:
    """The two ways of answering as another learner, each with what its refusal must say: joining under a
    classmate's name (in capitals: a name is one name whatever its case), and answering round `number` with
    `value` under a made-up rejoin token."""
    impostor = ClassLearner(url, code, classmate.upper())
    forger = ClassLearner(url, code, "forger")
    forger.token, forger.round = secrets.token_urlsafe(16), number
    return {"a classmate's name": (impostor.join, "already goes by"),
            "a made-up token": (functools.partial(forger.answer, value), "join the class first")}


def class_views(pupils: list[ClassLearner]) -> list[str]:
    """What each learner's page should show, as the server says it (the poll's key)."""
    return [pupil.call("class_poll", pupil.code, pupil.token)[0] for pupil in pupils]


def serve_in_process():
    """The app on tiny-random in this process (so that faults can be injected into its engine) on a free port:
    returns the launched Blocks, its URL and ui.state (its SESSIONS are the live ones)."""
    from dynasd.explorer.pairs import PairCache

    app = import_app()
    from ui import state  # import_app put the checkout on sys.path

    state.PAIRS = PairCache(allow_custom=True, device="cpu")
    port = free_port()
    demo = app.serve(app.build_app("tiny-random"), "127.0.0.1", port, block=False)
    return demo, f"http://127.0.0.1:{port}/", state


def short_soak(url, state, tabs: int = 4, max_new: int = 12, every_bad_input: int = 3,
               abandoned: int = 6) -> Figures:
    """The soak in miniature, for the test suite (tests/test_soak.py): `tabs` tabs at once, every
    `every_bad_input`-th bad input, one injected fault of each kind, `abandoned` tabs opened and left, a short class.
    It checks what the long soak checks, memory aside (that needs hundreds of tabs)."""
    figures = Figures()
    concurrency_phase(url, state, figures, tabs, max_new)
    bad_input_phase(url, state, figures, every_bad_input)
    fault_phase(url, state, figures, len(injected_errors()))
    abandon_tabs(url, figures, abandoned, 2, 1, iter(range(10**9)))
    class_phase(url, state, figures)
    if len(state.SESSIONS) > state.SESSIONS.max_sessions:
        figures.fail(f"the registry holds {len(state.SESSIONS)} sessions, over its cap")
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=500, help="tabs created and abandoned in the soak")
    parser.add_argument("--concurrent", type=int, default=16, help="tabs stepping and running at once")
    parser.add_argument("--workers", type=int, default=4, help="tabs opened at once during the soak")
    parser.add_argument("--steps", type=int, default=3, help="steps per abandoned tab")
    parser.add_argument("--faults", type=int, default=6,
                        help="sessions whose model calls are made to fail (in turn: an OOM at a step, a CUDA error at "
                             "a step, a MemoryError at a prefill)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--memory-only", action="store_true",
                        help="only the abandon soak, against a server in its own process; its RSS alone")
    parser.add_argument("--every", type=int, default=100, help="--memory-only: probe the server every N tabs")
    parser.add_argument("--warm-up", type=int, default=136,
                        help="--memory-only: tabs before the first figure (default: fills both bounded stores)")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                        help="--memory-only: set in the server's environment (repeatable)")
    args = parser.parse_args(argv)
    if args.memory_only:
        return memory_only(args)

    demo, url, state = serve_in_process()
    figures = Figures()
    started = time.monotonic()
    rss_boot = process_rss_mb()
    try:
        t = time.monotonic()
        concurrency_phase(url, state, figures, args.concurrent, args.max_new_tokens)
        print(f"concurrency: {args.concurrent} tabs at once, {time.monotonic() - t:.0f} s", flush=True)
        t = time.monotonic()
        bad_input_phase(url, state, figures)
        print(f"bad input: {sum(figures.bad_inputs.values())} tried, {time.monotonic() - t:.0f} s", flush=True)
        t = time.monotonic()
        fault_phase(url, state, figures, args.faults)
        print(f"faults: {sum(figures.faults.values())} injected, {time.monotonic() - t:.0f} s", flush=True)
        t = time.monotonic()
        class_phase(url, state, figures, learners=8, rounds=3)
        print(f"class: {figures.class_answers} answers counted, {time.monotonic() - t:.0f} s", flush=True)
        t = time.monotonic()
        rss_start, rss_end, rss_peak = soak_phase(url, state, figures, args.sessions, args.workers, args.steps)
        print(f"soak: {args.sessions} tabs, {time.monotonic() - t:.0f} s", flush=True)
    finally:
        demo.close()

    print()
    print("DynaSD Explorer soak (tiny-random, in-process server, gradio_client over HTTP)")
    print(f"  sessions held concurrently     {args.concurrent} tabs stepping/running at once "
          f"(peak {figures.peak_in_flight} requests in flight); registry peak {figures.peak_sessions} "
          f"of max {state.SESSIONS.max_sessions}, {len(state.SESSIONS)} at the end")
    print(f"  requests served                {figures.requests}; texts compared with their solo run (token ids) "
          f"{figures.texts_compared}")
    print(f"  bad inputs tried               {sum(figures.bad_inputs.values())} of {len(figures.bad_inputs)} kinds: "
          + ", ".join(figures.bad_inputs))
    print(f"  a class                        {figures.class_answers} answers, each counted once; a rejoin by name, "
          "bad input of every kind refused in one line")
    print(f"  faults injected                {sum(figures.faults.values())}: "
          + ", ".join(f"{n}x {kind}" for kind, n in figures.faults.items()))
    print(f"  sessions created and abandoned {args.sessions} (+{warm_up_tabs(state)} warm-up), "
          f"{args.steps} steps each")
    print(f"  RSS (server + clients)         boot {rss_boot:.0f} MB; soak start {rss_start:.0f} MB, "
          f"end {rss_end:.0f} MB ({rss_end - rss_start:+.0f} MB), peak {rss_peak:.0f} MB "
          "(the server alone: --memory-only)")
    print("  RSS every 50 tabs (MB)         " + ", ".join(f"{i}: {mb:.0f}" for i, mb in figures.rss_track))
    print(f"  wall time                      {time.monotonic() - started:.0f} s")
    print(f"  checks failed                  {len(figures.failures)}")
    for failure in figures.failures[:20]:
        print("   -", failure)
    return 1 if figures.failures else 0


if __name__ == "__main__":
    sys.exit(main())
