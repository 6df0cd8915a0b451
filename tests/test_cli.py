"""The command line: JSON Lines output, runs and seeds, and one clear error line for bad input."""
import json
import subprocess
import sys

import pytest

from dynasd.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynasd", *args], capture_output=True, text=True, timeout=300)


def test_generate_json_lines_with_runs_and_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    code = main(["generate", "--pair", "tiny-random", "--method", "sd", "--prompt", "hi", "--runs", "3",
                 "--temperature", "1", "--max-new-tokens", "12", "--json", "--trace-out", str(trace)])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["seed"] for line in lines] == [0, 1, 2]
    for line in lines:
        for key in ("token_ids", "text", "new_tokens", "steps", "target_forwards", "draft_forwards", "seconds",
                    "lossless"):
            assert key in line
        assert line["new_tokens"] == len(line["token_ids"]) <= 12 and line["lossless"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.0.json", "t.1.json", "t.2.json"]


def test_prompts_file_uses_first_turn(tmp_path, capsys):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"q{i}", "second"]})
                                 for i in range(3)))
    assert main(["generate", "--pair", "tiny-random", "--method", "ti-mcsd", "--width", "2", "--prompts",
                 str(prompts), "--limit", "2", "--json", "--max-new-tokens", "5"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["prompt_id"] for line in lines] == [0, 1] and all(line["lossless"] is False for line in lines)


@pytest.mark.parametrize("args,message", [
    (["--prompt", "  "], "prompt is empty"),
    (["--pair", "nope", "--prompt", "x"], "unknown model pair"),
    (["--prompt", "x", "--method", "mcsd", "--k-config", "4,a"], "comma-separated integers"),
    (["--prompt", "x", "--method", "mcsd", "--k-config", "9,9,9"], "limit is 256"),
    (["--prompt", "x", "--temperature", "-1"], "temperature"),
    (["--prompt", "x", "--top-p", "0"], "top-p"),
    (["--prompt", "x", "--max-new-tokens", "100000"], "exceeds the model's context"),
    (["--prompt", "x", "--method", "warp"], "invalid choice"),
    (["--prompt", "x", "--gamma", "zero"], "invalid int value"),
    (["--prompt", "x", "--method", "sd", "--gamma", "0"], "gamma must lie in [1, 256]"),
    (["--prompt", "x", "--method", "sd", "--k-config", "2,2"], "sd takes no tree shape"),
    (["--prompt", "x", "--method", "ti-mcsd", "--lookup", "4"], "ti-mcsd takes no prompt lookup"),
    (["--prompt", "x", "--stop", "sometimes"], "invalid choice"),
    (["--prompt", "x", "--method", "mcsd", "--stop", "decision", "--decision-model", "/no/such/folder"],
     "no decision model in /no/such/folder"),
    (["--target", "/no/such/model", "--draft", "/no/such/draft", "--prompt", "x"], "no model at local path"),
    (["--prompts", "/no/such/file.jsonl"], "cannot read prompts file"),
])
def test_bad_input_gives_one_clear_line(args, message, capsys):
    pair = [] if any(a in args for a in ("--pair", "--target")) else ["--pair", "tiny-random"]
    try:
        code = main(["generate", *pair, *args])
    except SystemExit as exc:  # argparse errors
        code = exc.code
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines


def test_every_problem_with_the_options_is_named_on_the_one_line(capsys):
    code = main(["generate", "--pair", "tiny-random", "--prompt", "x", "--method", "mcsd", "--k-config", "0",
                 "--temperature", "11", "--top-k", "-2"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    for problem in ("every branching factor must be at least 1", "temperature must lie in [0, 10]",
                    "top-k must be at least 0"):
        assert problem in lines[0], lines


@pytest.mark.slow
def test_a_real_process_exits_2_without_traceback():
    result = run_cli("generate", "--pair", "tiny-random", "--prompt", "x", "--k-config", "0")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == ["error: every branching factor must be at least 1, got '0'"]
