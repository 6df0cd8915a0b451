"""The soak (scripts/soak.py) in miniature, so that it cannot rot outside the suite: a few tabs at once, a few bad
inputs, one injected fault of each kind, a few abandoned tabs; and the soak's own checks shown to catch what they
are there to catch (a fault that reaches the wrong session, an answer that does not say the allowed range)."""
import importlib.util
import sys
from pathlib import Path

import pytest

from dynasd.explorer import engine

SOAK_PY = Path(__file__).resolve().parent.parent / "scripts" / "soak.py"


def load_soak():
    if "soak" not in sys.modules:
        spec = importlib.util.spec_from_file_location("soak", SOAK_PY)
        module = importlib.util.module_from_spec(spec)
        sys.modules["soak"] = module
        spec.loader.exec_module(module)
    return sys.modules["soak"]


@pytest.fixture(scope="module")
def soak():
    return load_soak()


@pytest.mark.slow(seconds=15)
def test_the_short_soak_finds_nothing_wrong(soak, explorer_inprocess):
    server = explorer_inprocess
    figures = soak.short_soak(server.url, server.state, tabs=4)
    assert figures.failures == []
    assert figures.texts_compared == 4, "every tab's tokens were compared with its solo run"
    assert any(config.get("width", 1) > 1 for config in soak.CONFIGS[:4]), \
        "a lossy tree among the tabs: its tokens show whether the solo run used the served draft's kernels"
    assert set(figures.faults) == {"OutOfMemoryError at a step", "RuntimeError at a step",
                                   "MemoryError at a prefill", "KeyError in a figure builder"}
    assert len(figures.bad_inputs) >= 8


class MisdeliveredFaults(engine.InjectedFaults):
    """A broken hook: an armed fault goes off at the next step of any run, whichever session it belongs to."""

    def raise_if_armed(self, during, prompt):
        with self._guard:
            error = next(iter(self._armed.values()), None)
            self._armed.clear()
        if error is not None:
            raise error


@pytest.mark.slow(seconds=5)
def test_the_soak_fails_when_a_fault_reaches_another_session(soak, explorer_inprocess, monkeypatch):
    server = explorer_inprocess
    monkeypatch.setattr(engine, "FAULTS", MisdeliveredFaults())
    figures = soak.Figures()
    soak.fault_phase(server.url, server.state, figures, faults=1)
    assert any("disturbed another session" in failure for failure in figures.failures), figures.failures
    assert any("the victim was not told" in failure for failure in figures.failures), figures.failures


def test_an_answer_to_bad_input_is_clear_only_when_it_names_the_field_and_its_range(soak):
    kwargs, must_say = soak.bad_inputs()["temperature out of range"]
    assert must_say == ["temperature must lie in [0, 10]"]  # from dynasd/sampling.py's TEMPERATURE
    assert soak.unclear("temperature out of range", "⚠ temperature must lie in [0, 10], got -1.0", must_say) == ""
    assert soak.unclear("temperature out of range", "⚠ temperature is out of range", must_say)
    assert soak.unclear("temperature out of range", "✓ Step 0 took 3 ms", must_say)
    assert soak.unclear("temperature out of range", "⚠ temperature must lie in [0, 10]\nTraceback", must_say)
    _, choices = soak.bad_inputs()["unknown method"]
    assert soak.unclear("unknown method", "error: Value: 'beam' is not in the list of choices: ['ar', 'mcsd']",
                        choices) == ""
