"""The measuring scripts in scripts/ run end to end on the tiny-random pair."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    """scripts/NAME run as a user runs it, importing this checkout's dynasd whether or not an editable install put
    another copy on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, f"scripts/{name}", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_draft_agreement_prints_one_row_per_draft_with_every_category(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) for i, (c, t) in
                                 enumerate([("alpha", "hello there"), ("beta", "count to five")])))
    out = run_script("draft_agreement.py", "--pair", "tiny-random", "--prompts", str(prompts), "--max-new-tokens",
                     "12", "--threads", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    header, _, row, *feature_rows = out.stdout.strip().splitlines()
    assert header.split(" | ")[1:3] == ["alpha", "beta"]
    # tiny-random has a feature draft too: one row per depth, the same cells
    assert [r.split(" | ")[0] for r in feature_rows] == ["| pair feature draft (depth 1)",
                                                         "| pair feature draft (depth 2)"]
    for feature_row in feature_rows:
        assert len(re.findall(r"\d\.\d{3}", feature_row)) == 3 and feature_row.endswith("(24) |")
    shares = [float(x) for x in re.findall(r"\d\.\d{3}", row)]
    assert row.startswith("| pair draft") and len(shares) == 3 and all(0 < s <= 1 for s in shares), row
    assert min(shares[:2]) <= shares[2] <= max(shares[:2])  # overall lies between the categories
    assert row.endswith("(24) |")  # 12 answer tokens per prompt


@pytest.mark.slow
def test_acceptance_ceiling_is_what_sd_measures_for_chains_and_grows_with_the_tree(tmp_path):
    """Width 1 is sd itself (gamma = depth), so its row must equal the decoder's own tokens per target forward on
    the same prompts, with and without prompt lookup; wider or deeper trees can only raise the ceiling."""
    from dynasd.decoders import make_decoder
    from dynasd.loading.models import load_pair
    from dynasd.options import DecoderOptions

    texts = ["hello there, hello there, hello", "count to five: one two three"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]})
                                 for i, (c, t) in enumerate(zip(["alpha", "beta"], texts))))
    out = run_script("acceptance_ceiling.py", "--pair", "tiny-random", "--prompts", str(prompts), "--max-new-tokens",
                     "24", "--widths", "1,2,4", "--depths", "2,4", "--lookup", "4", "--threads", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {}
    for line in out.stdout.splitlines():
        cells = line.strip("| ").split(" | ")
        if len(cells) == 4 and cells[0].isdigit():
            rows[int(cells[0]), int(cells[1])] = (float(cells[2]), float(cells[3]))
    assert sorted(rows) == [(k, d) for k in (1, 2, 4) for d in (2, 4)]
    shares = [float(x) for x in re.search(r"\| share \| (.*) \|", out.stdout).group(1).split(" | ")]
    assert 0 < shares[0] <= shares[1] <= shares[2] <= 1

    pair = load_pair("tiny-random")
    for depth in (2, 4):
        for column, lookup in ((0, 0), (1, 4)):
            tokens = forwards = 0
            for text in texts:
                options = DecoderOptions(method="sd", temperature=0.0, gamma=depth, lookup=lookup)
                run = make_decoder(pair, options).generate(
                    pair.encode_prompt(text), 24)
                tokens, forwards = tokens + len(run.new_token_ids), forwards + run.target_forwards
            assert rows[1, depth][column] == pytest.approx(tokens / forwards, abs=0.006), (depth, lookup)
    assert rows[1, 4][0] > 1.0  # the tiny draft is often right: the comparison above is not between two 1.0s
    for width, depth in rows:
        for wider, deeper in ((width * 2, depth), (width, depth * 2)):
            if (wider, deeper) in rows:
                assert rows[wider, deeper][0] >= rows[width, depth][0]


@pytest.mark.slow(seconds=43)
def test_class_mode_counts_every_answer_and_writes_its_figures(tmp_path):
    """scripts/classroom.py --class-mode, small: a lecturer and two learners (one reloads and comes back with its
    token) over HTTP, two votes a round; every answer acknowledged is in the class's CSV results, none lost, every
    impostor refused, and the JSON carries the figures it promises."""
    out = run_script("classroom.py", "--class-mode", "--learners", "2", "--rounds", "2", "--think", "0.3",
                     "--pair", "tiny-random", "--json", str(tmp_path / "class.json"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    figures = json.loads((tmp_path / "class.json").read_text())
    assert figures["answers_expected"] == figures["answers_counted"] == 8 and figures["lost"] == 0
    assert figures["impostors"] == figures["impostors_refused"] == 2
    assert figures["reloads"] == 1 and figures["problems"] == []
    assert 0 <= figures["second_vote_to_learner_p95_s"]
    assert 0 <= figures["step_to_learner_p50_s"] <= figures["step_to_learner_p95_s"]
    assert figures["memory_per_learner_mb"] is not None


@pytest.mark.slow
def test_compare_agreement_reads_each_compare_against_the_others_ranges(tmp_path):
    """scripts/compare_agreement.py --landing: several headless Compares of the app served in the process, each
    method's ratios, range width, how often one Compare lands in another's range, and the numbers as JSON."""
    out = run_script("compare_agreement.py", "--pair", "tiny-random", "--landing", "2",
                     "--json", str(tmp_path / "landing.json"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    compares = json.loads((tmp_path / "landing.json").read_text())
    assert len(compares) == 2 and all("pld" in c["ratios"] for c in compares)
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in out.stdout.splitlines()
            if line.startswith("| ") and "of 1 |" in line}
    assert set(rows) == {m for m in compares[0]["ratios"] if m != "ar"}, out.stdout
    assert all(re.search(r"\| \d+% \| [01] of 1 \|$", row) for row in rows.values()), rows


def test_example_traces_writes_runs_the_explorer_can_replay(tmp_path):
    """scripts/example_traces.py on the tiny-random pair into a temporary folder: each example named is a saved
    run of its method that loads back as a trace."""
    from dynasd.trace import load_run

    out = run_script("example_traces.py", "--pair", "tiny-random", "--out", str(tmp_path),
                     "--only", "pld-copying-pays", "sd-sampled")
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pld-copying-pays.json", "sd-sampled.json"]
    runs = {p.stem: load_run(p) for p in tmp_path.iterdir()}
    assert runs["pld-copying-pays"].method == "pld" and runs["sd-sampled"].method == "sd"
    assert all(run.steps and run.new_token_ids for run in runs.values())
    assert out.stdout.count(" steps, ") == 2
