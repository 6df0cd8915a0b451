"""The code runs on the oldest Python the package supports: 3.10, the Python of a ZeroGPU Space (3.10.13).

The machines that build and test the project run 3.11, where a 3.11-only construct (`import tomllib`, `except*`,
`enum.StrEnum`, `datetime.UTC`) passes every other test and then fails on the Space at import time. vermin reads
each file's syntax tree and knows in which Python each syntax form and each standard-library module, member and
keyword argument appeared, so one run checks both syntax and standard library; a hand-written list of 3.11
additions would be longer and would miss what it does not list. Its flags:
  --target=3.10-       fail when a file needs a newer Python than 3.10 (requires-python's floor)
  --pessimistic        a file this interpreter cannot parse (syntax newer than the running Python) fails too
  --no-eval-annotations  annotations are not evaluated (`from __future__ import annotations`, which most modules
                       use), so `list[int] | None` in an annotation is not taken for a run-time expression
  --no-parse-comments  a `# novm` comment exempts nothing: the check has no escape hatch
  --no-config-file     no vermin.ini or setup.cfg nearby changes the result
vermin cannot see a method on a value whose type it does not know (an exception's `add_note()`); ruff's
`target-version = "py310"` (pyproject.toml) catches newer syntax again, and `make test` runs it.

Scope: every Python file of the repository but hidden folders (.venv) and the bench's outputs (runs/, out/),
tests included. The Space runs app.py and what it imports (dynasd/, viz/, ui/), never the tests; but
requires-python and requirements.txt promise 3.10 to whoever installs the project, scripts and tests included, a
rule without exceptions needs no list kept up to date as folders appear, and the tests cost nothing to keep
3.10-true (tests/test_space.py reads pyproject.toml with a regular expression instead of 3.11's tomllib).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VERMIN_FLAGS = ["--violations", "--pessimistic", "--no-eval-annotations", "--no-parse-comments", "--no-config-file",
                "--no-tips", "--quiet"]


def oldest_supported_python() -> str:
    """requires-python's floor in pyproject.toml: the one place the oldest supported Python is written."""
    match = re.search(r'^requires-python = ">=(\d+\.\d+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert match, "pyproject.toml states requires-python as >=X.Y"
    return match.group(1)


def vermin(path: Path, target: str, *flags: str) -> subprocess.CompletedProcess:
    """vermin's command line, run by this interpreter (its console script need not be on PATH)."""
    command = [sys.executable, "-c", "from vermin import main; main()", f"--target={target}-", *VERMIN_FLAGS,
               *flags, str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_repository_uses_no_syntax_or_standard_library_newer_than_the_oldest_supported_python():
    assert oldest_supported_python() == "3.10", "rename this file and its samples with the new floor"
    result = vermin(REPO, oldest_supported_python(), "--exclude-regex", rf"^{re.escape(str(REPO))}/(runs|out)/")
    assert result.returncode == 0, f"needs a Python newer than 3.10:\n{result.stdout}{result.stderr}"


NEWER_THAN_310 = {
    "uses_tomllib.py": "import tomllib\n",
    "uses_except_star.py": "try:\n    pass\nexcept* ValueError:\n    pass\n",
    "uses_strenum.py": "from enum import StrEnum\n",
    "uses_datetime_utc.py": "import datetime\n\nNOW = datetime.datetime.now(datetime.UTC)\n",
    # 3.12 syntax: a syntax error for a 3.11 interpreter (--pessimistic), a 3.12 construct for a newer one
    "uses_type_statement.py": "type Pair = tuple[int, int]\n",
}

PYTHON_310 = '''\
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(slots=True, kw_only=True)
class Record:
    tokens: list[int] | None = None
    scores: dict[str, float] = dataclasses.field(default_factory=dict)


def kind(value: int | str | None) -> str:
    match value:
        case int():
            return "int"
        case _:
            return "other"


MaybeInt = int | None
PAIRS = list(zip([1], [2], strict=True))
'''


def test_the_check_fails_on_each_file_that_needs_python_3_11_or_newer(tmp_path):
    for name, source in NEWER_THAN_310.items():
        (tmp_path / name).write_text(source)
    result = vermin(tmp_path, "3.10")
    assert result.returncode == 1, result.stdout + result.stderr
    missed = [name for name in NEWER_THAN_310 if name not in result.stdout]
    assert not missed, f"not reported: {missed}\n{result.stdout}"


def test_the_check_passes_python_3_10_code_and_annotations_under_the_future_import(tmp_path):
    """`match`, `X | Y` at run time and zip(strict=) are 3.10: the check allows them, so its target is 3.10,
    not older; and it does not read postponed annotations as run-time expressions."""
    (tmp_path / "python310.py").write_text(PYTHON_310)
    assert vermin(tmp_path, "3.10").returncode == 0
    too_old = vermin(tmp_path, "3.9")
    assert too_old.returncode == 1 and "python310.py" in too_old.stdout
