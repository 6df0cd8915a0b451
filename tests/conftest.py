"""Shared fixtures.

tiny_pair       the seeded tiny-random pair (built in code, ~0.1 s) with the engine's fast kernels, as users load it,
                one per test session
embedded_pair   the embedded SmolLM2 pair (~15-30 s to load on CPU), one per test session; tests using it are slow,
                and run first, together (pytest_collection_modifyitems), so that one `make test` worker loads it
device          every device the engine tests run on: "cpu" always, "cuda" when a GPU is present (skipped otherwise,
                with one reason); tiny_pair_on_device / embedded_pair_on_device are the pairs loaded there (fp32),
                pair_on(name, device, dtype, ...) any pair, loaded once per test session
kernel          the compiled block kernel (block_weights.block_kernel) in every variant this CPU executes, per module
explorer_url    the app started the way users start it (`python app.py --pair tiny-random`), in a subprocess on a
                free local port, shared by the API and browser tests

The whole session (and every process it starts) keeps what it caches in a temporary folder (`temporary_cache`), and
the user's own cache folder is checked at the end to be as it was (`pytest_sessionfinish`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from dynasd.kernels.block_weights import block_kernel
from dynasd.kernels.compile import runnable_variants
from dynasd.loading.embedded import PACKAGE, VERSION, cache_dir
from dynasd.loading.models import load_pair

# `make test` runs two pytest-xdist workers on two cores: one torch thread each avoids oversubscription, and so
# does every process a worker starts (the app, the CLI, the scripts, gpu_check inherit OMP_NUM_THREADS). Why the
# children too: a process with torch's default two threads keeps its second OpenMP thread spinning after each small
# operation, on the core the other worker runs on. Measured side by side on 2 cores: a one-thread decoding loop ran
# at 2.0-2.2 ms a run next to another one-thread loop and at 3.2-3.4 ms next to a two-thread one; a whole suite
# spent 14% less CPU.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
else:
    torch.set_num_threads(2)

REPO = Path(__file__).resolve().parent.parent


def temporary_cache(real: Path, environ=os.environ) -> Path:
    """Point this process's cache folder ($DYNASD_CACHE, inherited by every process a test starts) at a new
    temporary folder, and return it.

    Why: tests calibrate costs, keep Compares and run under a CUDA emulation; written into the user's folder, they
    were read back by the app as this machine's measurements (an emulated "GPU" among them). What makes the suite
    fast is still reused, never written: the compiled kernels are copied in (a few hundred kB; a kernel folder the
    user names with $DYNASD_KERNEL_CACHE is theirs to share and is used as it is), and the embedded target's
    conversion (hundreds of MB) and its extracted GGUF are linked to, read only: a conversion or fetch the session
    needs anew lands in the temporary folder."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="dynasd-tests-"))
    cache = base / "cache"
    cache.mkdir()
    environ["DYNASD_CACHE"] = str(cache)
    if not environ.get("DYNASD_KERNEL_CACHE"):  # named, so that a test moving $DYNASD_CACHE still finds them
        kernels = cache / "kernels"
        kernels.mkdir()
        for library in (real / "kernels").glob("*.so"):
            shutil.copy2(library, kernels / library.name)
        environ["DYNASD_KERNEL_CACHE"] = str(kernels)
    converted = cache / "converted"
    converted.mkdir()
    for folder in (real / "converted").glob("*"):
        if (folder / "model.safetensors").is_file():  # complete conversions only (dynasd/loading/converted.py)
            (converted / folder.name).symlink_to(folder.resolve(), target_is_directory=True)
    extracted = real / f"{PACKAGE}-{VERSION}"
    if extracted.is_dir():
        (cache / extracted.name).symlink_to(extracted.resolve(), target_is_directory=True)
    return base


def cache_listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` (links not followed) with its size and modification time."""
    listing = {}
    for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
        stat = path.lstat()
        listing[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns)
    return listing


# What the user's cache folder holds as this machine's measurements (the explorer's kept costs and Compares), which
# the app reads back as fact; the build products beside them (kernels, conversions) are shared with `make setup`
# and every other checkout on the machine, which may write them while the suite runs.
MEASUREMENTS = ("costs", "measured")


def measurements_in(cache: Path) -> dict[str, tuple[int, int]]:
    return {f"{name}/{file}": seen for name in MEASUREMENTS for file, seen in cache_listing(cache / name).items()}


# The first process of a session (pytest-xdist's controller, or a plain run) makes the temporary cache; the workers
# and any pytest a test starts inherit it, and the user's folder's name with it.
_MADE_HERE = "DYNASD_TEST_CACHE" not in os.environ
if _MADE_HERE:
    os.environ["DYNASD_TEST_USER_CACHE"] = str(cache_dir())
    USER_MEASUREMENTS_BEFORE = measurements_in(cache_dir())
    os.environ["DYNASD_TEST_CACHE"] = str(temporary_cache(cache_dir()))
USER_CACHE = Path(os.environ["DYNASD_TEST_USER_CACHE"])
SESSION_CACHE = Path(os.environ["DYNASD_TEST_CACHE"])


def pytest_sessionfinish(session, exitstatus):
    """The run fails when the measurements in the user's cache folder changed under it (the process that made the
    temporary cache checks, once for all workers)."""
    if not _MADE_HERE:
        return
    after = measurements_in(USER_CACHE)
    changed = sorted(name for name in set(USER_MEASUREMENTS_BEFORE) | set(after)
                     if USER_MEASUREMENTS_BEFORE.get(name) != after.get(name))
    if changed:
        session.config.get_terminal_writer().line(
            f"\nthe test session changed the measurements kept in the user's cache folder {USER_CACHE}: "
            f"{', '.join(changed[:10])}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)
APP_START_TIMEOUT_S = 180  # importing torch + transformers + gradio on a loaded 2-core machine is slow


NO_CUDA = "no CUDA GPU on this machine (scripts/gpu_check.sh runs these tests on one)"
# The engine tests that must hold on every device take `device`; add a device here and they all run on it.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))]
_LOADED: dict[tuple, object] = {}


# `make test` runs two pytest-xdist workers with --dist worksteal: each starts on one half of the collection, in
# order, and a worker that runs out takes over the end of the other's queue. A test group (an xdist_group mark:
# tests sharing an expensive start) must stay on one worker, but under pytest 9.2 --dist loadgroup no longer groups
# anything; so the groups go first, group by group, into the first worker's half, which runs them before the other
# worker could run out and take them over. The tests that take the embedded pair are one group: one process loads
# the pair (on a fresh machine converting its GGUF first, ~8 s of CPU) instead of both. The tests that talk to a
# running explorer are another: one worker starts the app (a process importing torch, transformers and gradio,
# ~10 s of CPU, then ~3% of a core while it waits) and the in-process one, instead of each worker its own.
EMBEDDED_GROUP = "embedded-pair"
EMBEDDED_FIXTURES = {"embedded_pair", "embedded_pair_on_device"}
GROUP_FIXTURES = {EMBEDDED_GROUP: EMBEDDED_FIXTURES, "explorer-app": {"explorer_url", "explorer_inprocess"}}


def xdist_group(item: pytest.Item) -> str | None:
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


def pytest_collection_modifyitems(config, items):
    for item in items:
        for group, fixtures in GROUP_FIXTURES.items():
            if fixtures & set(getattr(item, "fixturenames", ())):
                item.add_marker(pytest.mark.xdist_group(group))
    groups: dict[str, int] = {}
    for item in items:
        group = xdist_group(item)
        if group is not None:
            groups.setdefault(group, len(groups))
    items[:] = balanced_order(items, groups)


def balanced_order(items: list[pytest.Item], groups: dict[str, int]) -> list[pytest.Item]:
    """The groups first, group by group; the other slow tests (marked `slow`), longest first, start the second
    half; quick tests end both halves.

    Why: a worker that runs out steals from the end of the other's queue, but never the test it is running nor the
    one after; so what is last in a half decides how long one worker waits for the other. With a 32 s test last,
    one worker sat idle for 31 s of a 370 s run. Two runs' durations replayed through xdist's scheduler: this order
    ends 4 s after the two workers' mean (358 s and 296 s, where the order of that first run ended at 370 s and of
    a second at 302 s); slow tests in file order leave which of them are stolen last to chance."""
    grouped = sorted((item for item in items if xdist_group(item) is not None),
                     key=lambda item: groups[xdist_group(item)])
    rest = [item for item in items if xdist_group(item) is None]
    slow = sorted((item for item in rest if item.get_closest_marker("slow")), key=lambda item: -expected_seconds(item))
    quick = [item for item in rest if not item.get_closest_marker("slow")]
    first_half_quick = max(0, len(items) // 2 - len(grouped))
    return grouped + quick[:first_half_quick] + slow + quick[first_half_quick:]


def expected_seconds(item: pytest.Item) -> float:
    """A slow test's time on a quiet 2-core machine, as its mark says (`slow(seconds=25)`), else 5: it orders the
    queue (balanced_order) and nothing else, so an estimate that drifts costs seconds, never a result."""
    mark = item.get_closest_marker("slow")
    return float(mark.kwargs.get("seconds", 5)) if mark else 0.0


def pair_on(name: str, device: str = "cpu", dtype: str | None = None, **load_options):
    """A pair loaded once per test session for each (name, device, dtype, load options): loading the embedded pair
    takes seconds, and the session-wide fixtures below share these objects."""
    key = (name, device, dtype, tuple(sorted(load_options.items())))
    if key not in _LOADED:
        _LOADED[key] = load_pair(name, device=device, dtype=dtype, **load_options)
    return _LOADED[key]


@pytest.fixture(scope="session", params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(scope="module", params=runnable_variants() or [None])
def kernel(request):
    """The block kernel in every variant this CPU executes (AVX-512 and AVX2 on an AVX-512 machine)."""
    op = block_kernel(request.param) if request.param else None
    if op is None:
        pytest.skip("no block kernel here (no variant for this CPU, or no compiler)")
    return op


@pytest.fixture
def fail_broken_runs(monkeypatch):
    """`fail_broken_runs()` from then on makes a step of every run whose prompt is "broken" fail as a model fails
    ("CUDA out of memory"); every other run steps as before: one session's failure, beside a healthy one."""
    from dynasd.decoders.base import Decoder

    step = Decoder.step

    def explode_on_broken(decoder):
        if decoder.run.prompt == "broken":
            raise RuntimeError("CUDA out of memory")
        return step(decoder)

    return lambda: monkeypatch.setattr(Decoder, "step", explode_on_broken)


@pytest.fixture(scope="session")
def tiny_pair():
    return pair_on("tiny-random", "cpu")


@pytest.fixture(scope="session")
def embedded_pair():
    return pair_on("embedded", "cpu")


@pytest.fixture(scope="session")
def tiny_pair_on_device(device):
    return pair_on("tiny-random", device)


@pytest.fixture(scope="session")
def embedded_pair_on_device(device):
    return pair_on("embedded", device)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(proc: subprocess.Popen, url: str, log_path, timeout_s: float = APP_START_TIMEOUT_S) -> None:
    """Wait until the app started as `proc` answers at `url`; fail with the end of its log if it exits or stays
    silent for `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the app exited with code {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"the app did not answer within {timeout_s} s:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def explorer_url(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("explorer") / "app.log"
    with served_app(["--pair", "tiny-random"], {"DYNASD_PUBLIC": ""}, log_path) as url:
        yield url


@contextlib.contextmanager
def served_app(arguments: list[str], env: dict[str, str], log_path, host: str = "127.0.0.1"):
    """`python app.py ARGUMENTS` (the way users start it) on a free local port, listening on `host`, its output in
    `log_path`, with `env` over this process's environment; yields its URL (on this machine's loopback) once it
    answers, and stops it afterwards."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", **env}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "app.py", *arguments, "--port", str(port), "--host", host],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_serving(proc, url, log_path)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def explorer_inprocess():
    """The app launched inside the test process (`app.serve(..., block=False)`) on tiny-random, for the tests that
    reach into the server: fault injection into one session's model calls, registry size, memory. Yields an
    object with `url`, `app` (the imported app module), `demo` (the launched Blocks) and `state` (ui/state.py: its
    SESSIONS and PAIRS are the live ones)."""
    from types import SimpleNamespace

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import app  # the repository root is on sys.path (pyproject.toml: pythonpath)
    from dynasd.explorer.pairs import PairCache
    from ui import state

    state.PAIRS = PairCache(allow_custom=True, device="cpu")
    port = free_port()
    demo = app.serve(app.build_app("tiny-random"), "127.0.0.1", port, block=False)
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}/", app=app, state=state, demo=demo)
    finally:
        demo.close()
