"""scripts/gpu_check.sh runs on the CPU too: CI proves with `--device cpu --quick` that every part of the prepared
GPU check works (tests, bench, host reads, the app) before it is spent on a GPU machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow(seconds=35)
def test_the_gpu_check_runs_on_the_cpu_in_quick_mode_and_writes_one_results_folder(tmp_path):
    """Around a minute of one core: the script runs its parts as four Python processes in a row (the device tests,
    a bench, the host reads, the app and one Step), each importing torch and transformers, the app gradio too, and
    this run is what shows every part works before a GPU machine is spent on it."""
    results = tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--device", "cpu", "--quick",
                           str(results)], capture_output=True, text=True, env=env, timeout=900)
    summary = (results / "summary.md").read_text()
    assert done.returncode == 0, summary + done.stderr[-2000:]
    parts = [line for line in summary.splitlines() if line.startswith("- ")]
    assert len(parts) == 5 and all("passed" in line or "skipped (--quick)" in line for line in parts), summary
    runs = [json.loads(line) for line in (results / "bench-tiny-random-fp32" / "runs.jsonl").read_text().splitlines()]
    methods = {r["method"] for r in runs}
    assert {"ar", "sd:gamma=6", "mcsd:k=4,2,2,1", "ti-mcsd", "hf-assisted"} <= methods and len(methods) == 6
    assert all(r["identical_to_ar"] for r in runs if r["method"] not in ("ar", "ti-mcsd")), runs
    syncs = [json.loads(line) for line in (results / "host-syncs-tiny-random.jsonl").read_text().splitlines()]
    assert syncs and all(row["reads"] > 0 for record in syncs for row in record["steps"])
    assert "status: ✓ Step 0" in (results / "app.log").read_text()
    assert "passed" in (results / "tests.log").read_text()


def test_the_gpu_check_refuses_a_bad_option_in_one_line(tmp_path):
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--device", "tpu", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "cuda or cpu" in done.stderr
