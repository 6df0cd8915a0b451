"""The measuring scripts in scripts/ run end to end on the tiny-random pair."""
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_draft_agreement_prints_one_row_per_draft_with_every_category(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) for i, (c, t) in
                                 enumerate([("alpha", "hello there"), ("beta", "count to five")])))
    out = subprocess.run([sys.executable, "scripts/draft_agreement.py", "--pair", "tiny-random", "--prompts",
                          str(prompts), "--max-new-tokens", "12", "--threads", "1"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    header, _, row = out.stdout.strip().splitlines()
    assert header.split(" | ")[1:3] == ["alpha", "beta"]
    shares = [float(x) for x in re.findall(r"\d\.\d{3}", row)]
    assert row.startswith("| pair draft") and len(shares) == 3 and all(0 < s <= 1 for s in shares), row
    assert min(shares[:2]) <= shares[2] <= max(shares[:2])  # overall lies between the categories
    assert row.endswith("(24) |")  # 12 answer tokens per prompt


def test_verify_cost_prints_a_row_per_tree_size(tmp_path):
    out = subprocess.run([sys.executable, "scripts/verify_cost.py", "--pair", "tiny-random", "--reps", "1",
                          "--contexts", "20", "--threads", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(r.split(" | ")[0].strip("| ")) for r in rows] == [1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32]
