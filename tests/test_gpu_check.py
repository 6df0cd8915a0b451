"""scripts/gpu_check.sh is prepared for a GPU machine that is lent rarely and briefly: CI runs its quick mode on the
CPU under the `spaces` package's CUDA emulation, as the GPU machine will run it (the pair on "cuda", no gradio, no
gguf, no pytest), so that every part works before a GPU machine is spent on it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAX_RESULT_FILES = 8  # what comes back from the GPU machine


@pytest.mark.slow(seconds=50)
def test_the_gpu_check_runs_under_the_cuda_emulation_in_quick_mode_and_writes_its_results(tmp_path):
    """Its measurements on the emulated "cuda" with the GPU machine's missing packages unimportable: the device and
    versions, every lossless method greedy-identical to ar, every resumed decoder identical to an uninterrupted one,
    tokens/s for every method, the verify cost for every row count; at most 8 files."""
    results = tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--quick", "--emulate", str(results)],
                          capture_output=True, text=True, env=env, timeout=900)
    summary = (results / "summary.md").read_text()
    assert done.returncode == 0, summary + (results / "check.log").read_text()[-3000:]
    parts = [line for line in summary.splitlines() if line.startswith("- ")]
    assert parts[0].startswith("- measurements: passed") and "skipped (--quick)" in parts[1], summary
    assert len(list(results.iterdir())) <= MAX_RESULT_FILES
    records = [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines()]
    by_part: dict[str, list[dict]] = {}
    for record in records:
        by_part.setdefault(record.pop("part"), []).append(record)
    assert all(not r.get("error") for rows in by_part.values() for r in rows if "error" in r), records
    env_record = by_part["env"][0]
    assert env_record["device"] == "cuda" and env_record["emulated"] and env_record["transformers"]
    identity = [r for r in by_part["greedy identity, float32"] if "method" in r]
    assert len(identity) == 6 and all(r["identical_to_ar"] for r in identity), identity
    resumed = [r for r in by_part["snapshot and resume, float32"] if "method" in r]
    assert resumed and all(r["identical_to_uninterrupted"] and r["resumes"] >= 1 for r in resumed), resumed
    speed = [r for r in by_part["tokens/s, bfloat16"] if "method" in r]
    assert {r["method"] for r in speed} >= {"ar", "sd:gamma=6", "mcsd:k=4,2,2,1", "recipe=narrow-cpu", "ti-mcsd"}
    assert all(r["tokens_per_s"] > 0 and r["verify_ms"] > 0 for r in speed), speed
    rows = [r["rows"] for r in by_part["verify cost against rows, bfloat16"] if "rows" in r]
    assert rows == [1, 2, 4, 8, 16, 32, 64, 128]
    assert "greedy identity" in (results / "results.md").read_text()


def test_the_gpu_check_refuses_a_bad_option_in_one_line(tmp_path):
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--device", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "unknown option" in done.stderr
