"""`dynasd costs` on the tiny-random pair: every level prints one row per thing it timed, at its own row counts, and
its ratio rows; a bad level or variant is one error line and exit code 2."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dynasd.bench.costs import ENGINE_ORDER, ROWS, VERIFY_ROWS
from dynasd.cli import main
from dynasd.explorer.costs.cost import CALIBRATION_ROWS
from dynasd.kernels.compile import runnable_variants

REPO = Path(__file__).resolve().parent.parent
VARIANTS = [*runnable_variants(), *[f"{v}/float32" for v in runnable_variants()], "torch"]
TIMED = re.compile(r"^-?\d+\.\d+ \(-?\d+\.\d+\)$")  # min (median)


@pytest.fixture(scope="module")
def printed() -> list[str]:
    """Every level once, one round each: the table's lines."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "dynasd", "costs", "--pair", "tiny-random", "--levels",
                           "products,forward,verify,load", "--variants", ",".join(VARIANTS), "--rounds", "1",
                           "--threads", "1", "--contexts", "8", "--busy", "1", "--settle", "0.2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if line.startswith("|")]  # the header, its rule, the rows


@pytest.fixture(scope="module")
def table(printed) -> dict[tuple[str, str, str], dict[int, str]]:
    """The table's rows by (level, model or engine, variant or condition): each row count's cell, where timed."""
    counts = [int(cell.split()[0]) for cell in printed[0].strip("| ").split(" | ")[3:-1]]
    assert counts == sorted({*ROWS, *VERIFY_ROWS, *CALIBRATION_ROWS})  # one column per row count any level timed
    rows = {}
    for line in printed[2:]:
        level, model, condition, *cells, _note = cells_of(line)
        assert (level, model, condition) not in rows, line
        rows[level, model, condition] = {q: cell for q, cell in zip(counts, cells) if cell != "–"}
    return rows


def cells_of(line: str) -> list[str]:
    return line.removeprefix("| ").removesuffix(" |").split(" | ")


def of_level(table: dict, level: str) -> dict:
    return {key[1:]: cells for key, cells in table.items() if key[0] == level}


def test_products_time_each_model_with_block_layers_per_variant_and_a_row_beyond_the_first(table):
    """On the tiny-random pair only the drafts' layers are block layers (block_weights.use_draft_blocks), and torch
    has none."""
    rows = of_level(table, "products")
    blocks = [v for v in VARIANTS if v != "torch"]
    models = [(model, v) for model in ("draft", "feature draft") for v in blocks]
    assert list(rows) == models + [(f"{model}: a row beyond the first (min)", v) for model, v in models]
    assert all(set(rows[key]) == set(ROWS) and all(TIMED.match(c) for c in rows[key].values()) for key in models)
    assert all(set(rows[key]) == set(ROWS[1:]) for key in list(rows)[len(models):])


def test_forward_times_each_model_and_variant_and_each_drafts_share_of_the_target(table):
    rows = of_level(table, "forward (8 tokens)")
    roles = ("target", "draft", "feature draft")
    timed = [(role, v) for role in roles for v in VARIANTS]
    assert list(rows) == timed + [(f"{role} / target (min)", v) for role in roles[1:] for v in VARIANTS]
    assert all(set(rows[key]) == set(ROWS) and all(TIMED.match(c) for c in rows[key].values()) for key in timed)
    ratios = [float(cell) for key in list(rows)[len(timed):] for cell in rows[key].values()]
    assert len(ratios) == 2 * len(ROWS) * len(VARIANTS) and all(ratio > 0 for ratio in ratios)


def test_verify_times_each_engine_at_every_tree_size_against_fast_and_per_node(table):
    rows = of_level(table, "verify (8 tokens)")
    assert list(rows) == ([("target", engine) for engine in ENGINE_ORDER]
                          + [("target / fast (median)", engine) for engine in ENGINE_ORDER[:-1]]
                          + [("target: a node beyond the first (median)", engine) for engine in ENGINE_ORDER])
    assert all(set(rows["target", engine]) == set(VERIFY_ROWS) for engine in ENGINE_ORDER)
    assert all(set(rows["target: a node beyond the first (median)", engine]) == set(VERIFY_ROWS[1:])
               for engine in ENGINE_ORDER)


def test_load_measures_the_explorers_table_quiet_loaded_and_quiet_again(table, printed):
    """Each measurement's note says what the explorer would do with it: keep it or refuse it."""
    rows = of_level(table, "load")
    conditions = ["quiet", "1 busy loop(s)", "quiet again"]
    assert list(rows) == ([("target", c) for c in conditions]
                          + [("target / quiet (median)", c) for c in conditions])
    assert set(rows["target", "quiet"]) == set(CALIBRATION_ROWS)
    assert set(rows["target / quiet (median)", "quiet"].values()) == {"1.00x"}
    notes = [cells_of(line)[-1] for line in printed[2:] if cells_of(line)[:2] == ["load", "target"]]
    assert len(notes) == 3 and all(note.endswith(("quiet: kept", "busy: refused, the kept quiet table stays"))
                                   for note in notes), notes


@pytest.mark.parametrize("args,message", [
    (["--levels", "forward,speed"], "unknown level 'speed'"),
    (["--variants", "avx2,sse9"], "'sse9' is not a kernel variant this CPU runs"),
    (["--variants", "torch:fp16"], "weights ':fp16' must be one of"),
    (["--contexts", "8,many"], "--contexts must be comma-separated integers"),
    (["--levels", "load", "--cpu-time"], "--cpu-time does not go with the load level"),
])
def test_bad_input_is_one_error_line_before_a_model_loads(args, message, capsys):
    assert main(["costs", "--pair", "tiny-random", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
