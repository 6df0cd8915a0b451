"""The README is what a newcomer reads first: its Python example must run as written, and it must stay short
enough to read in a few minutes (deployment notes live in docs/deploy.md)."""
import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
MAX_LINES = 110


def python_examples(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)


def test_the_readme_python_example_runs_as_written_and_prints_each_step_and_the_text():
    (example,) = python_examples(README.read_text())
    assert 'load_pair("tiny-random")' in example, "the example runs on the pair that needs no download"
    printed = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(example, str(README), "exec"), namespace)
    run = namespace["decoder"].run
    assert run.finished and len(run.steps) > 1
    step_lines = printed.getvalue().splitlines()[: len(run.steps)]
    assert [line.split()[0] for line in step_lines] == [str(step.index) for step in run.steps]
    assert all("committed:" in line for line in step_lines)
    assert printed.getvalue().endswith(run.text + "\n")


def test_the_readme_stays_short_and_sends_deployment_notes_to_their_own_page():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    assert "docs/deploy.md" in text and (README.parent / "docs" / "deploy.md").is_file()
