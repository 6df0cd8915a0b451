"""Hugging Face's `spaces` package's own CUDA emulation, on a CPU-only machine: the engine and the app as a ZeroGPU
Space runs them, without a GPU.

On a ZeroGPU Space the serving process runs under `spaces.zero.torch.patching.patch()`: a tensor placed on "cuda"
becomes a fake "cuda:0" tensor backed by host memory, and any operation that mixes one with a CPU tensor raises
"Expected all tensors to be on the same device" as real CUDA would. So code that runs correctly under the emulation
with the pair on "cuda" places every tensor it makes on the pair's device. `start()` enters it in this process;
a CPU build of torch needs three stubs first (the package reads `torch.version.cuda` and `torch._C._cuda_init`, and a
CUDA `torch.Generator`
cannot exist in a CPU build: under the emulation "cuda" tensors are host tensors, so a CPU generator is the one they
draw from).

`start_zero_gpu()` goes further: it imports `spaces` as a Space does (SPACES_ZERO_GPU=1: the package patches torch
itself and wraps every `spaces.GPU` function in its own fork-and-pickle worker, one per function) with the three
things only a real GPU host has stubbed: the scheduler (which grants a GPU, or refuses a duration over the visitor's
quota), the worker's CUDA initialisation, and the weights' move to the GPU (the worker stays in the emulation).

The emulation changes torch for the whole process, so the tests run each scenario in a child process:

    python tests/spaces_emulation.py engine PAIR [WORD ...]  # a JSON line per case (those naming a WORD)
    python tests/spaces_emulation.py app [PAIR]              # a JSON line per action of the page
    python tests/spaces_emulation.py timing                  # when each step reads its clock
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The longest GPU call a learner's action may ask for: ZeroGPU's daily quota is 2 minutes for a visitor who is not
# logged in (3.5 for a free account), and a request over what is left is refused outright.
QUOTA_S = 60


def _stub_cpu_torch() -> None:
    import torch

    if torch.version.cuda is None:
        torch.version.cuda = "12.8"
    if not hasattr(torch._C, "_cuda_init"):  # the emulation keeps the original to restore it
        def no_cuda():
            raise RuntimeError("a CPU build of torch has no CUDA")
        torch._C._cuda_init = no_cuda
    if getattr(torch.cuda._is_in_bad_fork, "__name__", "") == "<lambda>":  # asked in a child: must pickle
        torch.cuda._is_in_bad_fork = _never_in_bad_fork
    warnings.filterwarnings("ignore", message="Error while reading infos from Nvidia driver FS")
    if isinstance(torch.Generator, type) and not hasattr(torch.Generator, "_emulated"):
        real = torch.Generator

        class _CpuGenerator(type):
            def __call__(cls, device=None):
                return real("cpu")

            def __instancecheck__(cls, instance):
                return isinstance(instance, real)

        torch.Generator = _CpuGenerator("Generator", (), {"_emulated": True})


def _never_in_bad_fork() -> bool:
    return False


def start() -> None:
    """The serving process's emulation, entered on this thread (torch modes are thread-local)."""
    _stub_cpu_torch()
    from spaces.zero.torch import patching

    patching.patch()


def enter_on_this_thread() -> None:
    """The emulation's torch modes on another thread (the package does this on its own threads)."""
    from spaces.zero.torch import patching

    patching.enter_mode()


def is_fake_cuda(tensor) -> bool:
    """A tensor the emulation placed on "cuda" (its device reads cuda:0, its data lives on the host)."""
    return tensor.device.type == "cuda"


# -- the real package, as a Space imports it --------------------------------------------------------------------

GRANTED: list[float] = []   # the duration (s) of every GPU call granted, in order


def start_zero_gpu() -> None:
    """`import spaces` as on a ZeroGPU Space, with the scheduler and the worker's GPU stubbed (module docstring)."""
    os.environ["SPACES_ZERO_GPU"] = "1"
    os.environ.setdefault("SPACES_ZERO_DEVICE_API_URL", "http://127.0.0.1:9")  # never reached: schedule is stubbed
    os.environ.setdefault("ZEROGPU_OFFLOAD_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) /
                                                     f"zerogpu-{os.getpid()}"))
    _stub_cpu_torch()
    import spaces  # noqa: F401  (patches torch: the serving process's emulation)
    import spaces.zero.torch as zero_torch
    from spaces.zero import client
    from spaces.zero.api import ScheduleResponse

    def schedule(task_id, request=None, duration=None, gpu_size=None, **_):
        seconds = duration.total_seconds() if duration is not None else 60
        if seconds > QUOTA_S:
            import gradio as gr
            raise gr.Error(f"The requested GPU duration ({seconds:.0f}s) is larger than the maximum allowed",
                           title="ZeroGPU quota exceeded")
        GRANTED.append(seconds)
        return ScheduleResponse(idle=True, nvidiaIndex=0, nvidiaUUID="emulated", allowToken="emulated")

    client.schedule = schedule
    client.release = lambda *args, **kwargs: None
    client.allow = lambda *args, **kwargs: None
    client.startup_report = lambda *args, **kwargs: None
    # The worker: no real CUDA to initialise or move the weights to, so it stays in the emulation it was forked in
    # (its pair's fake "cuda" tensors still refuse to meet CPU tensors). Weights are not packed to disk at launch.
    from concurrent.futures import ThreadPoolExecutor

    from spaces.zero import wrappers

    wrappers.ThreadPoolExecutor = lambda *args, **kwargs: ThreadPoolExecutor(
        *args, initializer=zero_torch.enter_mode, **kwargs)  # the worker runs a call on a thread of its own
    zero_torch.unpatch = lambda: None
    zero_torch.init = lambda *args, **kwargs: None
    zero_torch.move = lambda *args, **kwargs: None
    zero_torch.pack = lambda *args, **kwargs: 0


# -- scenarios ----------------------------------------------------------------------------------------------------

PROMPT = "Explain what a binary search tree is."
# The losslessness checks' draws: what runs here is their device placement, each ~1 s under the emulation's
# dispatch; their statistics are tests/test_losslessness.py's.
LOSSLESS_DRAWS = 6


def engine_cases() -> list[tuple[str, dict]]:
    """(name, settings overrides): every method at its defaults, every recipe, every stop policy, the feature draft,
    lookup and recycling, each at temperature 0 and 0.7."""
    from dynasd.options import METHODS
    from dynasd.recipes import ALL

    shapes: list[tuple[str, dict]] = [(method, {"method": method}) for method in METHODS]
    shapes += [(f"recipe={recipe.key}", dict(recipe.values)) for recipe in ALL]
    for stop in ("confidence", "decision", "cumulative"):
        shapes.append((f"mcsd stop={stop}", {"method": "mcsd", "dynamic_depth": True, "stop": stop}))
    shapes += [("mcsd features", {"method": "mcsd", "draft_kind": "features"}),
               ("mcsd lookup", {"method": "mcsd", "lookup": 8}),
               ("mcsd recycle", {"method": "mcsd", "recycle": "4,2,1"})]
    return [(f"{name} T={t}", {**values, "temperature": t}) for name, values in shapes for t in (0.0, 0.7)]


def scenario_engine(pair_name: str, only: list[str]) -> None:
    """Every case: a run started and stepped twice, then resumed from its snapshot (a fresh decoder, as in a new GPU
    process) and stepped once more; then a follow-up turn, a calibration, a side by side, a losslessness check and
    Compare. One JSON line each: {"case", "error"}."""
    from dynasd.explorer import engine
    from dynasd.explorer.costs import cost, measuring
    from dynasd.explorer.inputs import Settings
    from dynasd.explorer.lessons import losslessness, side_by_side
    from dynasd.explorer.measure.compare import run_compare
    from dynasd.explorer.pairs import PairCache

    start()
    pairs = PairCache(device="cuda")
    base = Settings(pair=pair_name, max_new_tokens=10)
    pair = pairs.get(base)
    params = [p for model in (pair.target, pair.draft) for p in model.parameters()]
    print(json.dumps({"case": f"{pair_name}: placed on cuda", "error": "" if all(
        is_fake_cuda(p) for p in params) else "a parameter is not on the emulated cuda device"}), flush=True)

    def report(name, body):
        started = time.perf_counter()
        try:
            error = body() or ""
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        print(json.dumps({"case": f"{pair_name}: {name}", "error": error,
                          "seconds": round(time.perf_counter() - started, 2)}), flush=True)

    for name, values in engine_cases():
        if only and not any(word in name for word in only):
            continue
        settings = Settings(pair=pair_name, max_new_tokens=10, **values)

        def run(settings=settings):
            started = engine.serve(pairs, engine.StartRun(settings, PROMPT, 2))
            if started.error:
                return started.error
            engine.LIVE.clear()  # the next call resumes from the snapshot alone
            more = engine.serve(pairs, engine.Advance(settings, started.snapshot, 1))
            return more.error
        report(name, run)

    def follow_up():
        settings = Settings(pair=pair_name, max_new_tokens=6, method="mcsd")
        done = engine.serve(pairs, engine.StartRun(settings, PROMPT, engine.UNTIL_DONE))
        if done.error:
            return done.error
        engine.LIVE.clear()
        return engine.serve(pairs, engine.FollowUp(settings, done.snapshot, (PROMPT, "And a heap?"), 1)).error

    if only:
        return
    report("follow-up", follow_up)
    def calibration():
        """Measured, and never kept as a GPU's costs: it was this CPU under a GPU's name."""
        measured = measuring.calibrate_context(pairs, base, list(range(5, 40)))
        if cost.costs_file(pair).exists() or not measured.not_kept:
            return f"an emulated GPU's costs were kept as a real one's ({measured.device})"
        return ""

    report("calibration", calibration)
    report("side by side", lambda: side_by_side.side_by_side(pairs, base, ("mcsd", "sd"), list(range(5, 20)),
                                                              PROMPT) and "")
    report("losslessness T=0.7", lambda: losslessness.check_first_tokens(
        pairs, Settings(pair=pair_name, temperature=0.7), PROMPT, ["mcsd", "ti-mcsd"], LOSSLESS_DRAWS) and "")
    report("compare", lambda: [None for _ in run_compare(pairs, Settings(pair=pair_name, max_new_tokens=6), PROMPT,
                                                          peer=False)] and "")


def scenario_app(other_pair: str) -> None:
    """The page's model actions from a handler thread, through the real `spaces.GPU` wrappers (a forked worker per
    function, arguments and results pickled, exceptions as ZeroGPU passes them), with tiny-random loaded at start-up
    on the main thread as app.py loads it: a Step, a Run, the cost model calibrated, the losslessness check, two
    requests refused (one inside a GPU call), and a Step on `other_pair`, which the serving process loads from the
    handler thread. One JSON line per action: {"action", "status"}; then {"granted": [seconds of each GPU call]}.
    (Compare is left out: transformers' assisted generation, its last row, runs for minutes under the emulation.)"""
    start_zero_gpu()
    from dynasd.explorer.inputs import Settings
    from ui import learn, play, state

    state.PAIRS.device = "cuda"  # as app.py places pairs on ZeroGPU, and loads the start-up pair on this thread
    state.PAIRS.get(Settings(pair="tiny-random").normalised())
    tiny = dict(pair="tiny-random", method="mcsd", max_new_tokens=12)
    sampled = dict(tiny, temperature=0.7)

    def status_of(outputs) -> str:
        if not isinstance(outputs, tuple):  # a generator's last update (Compare)
            *_, outputs = outputs
        return next((str(v) for v in reversed(outputs[:-1]) if isinstance(v, str) and v[:1] in "✓⚠✗→"), "")

    def handler():
        session = state.SESSIONS.get(None).id
        actions = [
            ("step", lambda: play.on_step(session, PROMPT, **tiny)),
            ("run", lambda: play.on_run(session, PROMPT, **tiny)),
            ("calibrated cost", lambda: learn.on_cost(session, 1, True, **tiny)),
            ("side by side of one method twice", lambda: learn.on_side_by_side(session, 0, "sd", "sd", **tiny)),
            ("losslessness at temperature 0", lambda: learn.on_losslessness(session, PROMPT, "sd", 20, **tiny)),
            ("losslessness", lambda: learn.on_losslessness(session, PROMPT, "sd", LOSSLESS_DRAWS, **sampled)),
            ("step on another pair", lambda: play.on_step(state.SESSIONS.get(None).id, PROMPT,
                                                          **dict(tiny, pair=other_pair, max_new_tokens=4))),
        ]
        for name, action in actions:
            started = time.perf_counter()
            try:
                said = status_of(action())
            except Exception as exc:
                said = f"raised {type(exc).__name__}: {exc}"
            print(json.dumps({"action": name, "status": said, "seconds": round(time.perf_counter() - started, 2)}),
                  flush=True)

    worker = threading.Thread(target=handler)
    worker.start()
    worker.join()
    print(json.dumps({"granted": GRANTED}), flush=True)
    _end_workers()


def _end_workers() -> None:
    """The package's GPU workers wait for their next call forever: end them with this process."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


def scenario_timing() -> None:
    """Each method's step at temperature 0.7 on tiny-random on the emulated "cuda", with torch.cuda.synchronize and
    the step's clock reads recorded in order: {"method", "events"} ("sync", "clock") per method."""
    start()
    import torch

    from dynasd.decoders import make_decoder
    from dynasd.loading.models import tiny_random_pair
    from dynasd.options import METHODS, DecoderOptions

    pair = tiny_random_pair(device="cuda")
    events: list[str] = []
    torch.cuda.synchronize = lambda *args, **kwargs: events.append("sync")
    clock = time.perf_counter
    for method in METHODS:
        decoder = make_decoder(pair, DecoderOptions(method=method, temperature=0.7).for_method())
        decoder.start(list(range(5, 30)), 8)
        events.clear()
        time.perf_counter = lambda: events.append("clock") or clock()
        try:
            decoder.step()
        finally:
            time.perf_counter = clock
        print(json.dumps({"method": method, "events": list(events)}), flush=True)


def main(argv: list[str]) -> None:
    started = time.perf_counter()
    name, args = argv[0], argv[1:]
    if name == "engine":
        scenario_engine(args[0] if args else "tiny-random", args[1:])
    elif name == "timing":
        scenario_timing()
    elif name == "app":
        scenario_app(args[0] if args else "embedded")
    else:
        raise SystemExit(f"unknown scenario '{name}'")
    print(json.dumps({"seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
