"""Two methods take the same step: from one run's prefix, each builds its own tree and verifies it once.

The prefix is the prompt plus what the run on show had committed before the chosen step, so both methods start
exactly where that step started; each one-step run is a RunTrace like any other, drawn by the usual figures.
"""
from __future__ import annotations

from ...decoders import RequestError
from ...options import METHODS
from ...trace import RunTrace
from ..engine import prepare
from ..inputs import Settings, UserError
from ..pairs import PairCache


def prefix_before(run: RunTrace, index: int) -> list[int]:
    """The token ids committed before step `index` of `run` (prompt included)."""
    if not 0 <= index < len(run.steps):
        raise UserError(f"there is no step {index} in the run on show (it has {len(run.steps)})")
    before = sum(len(step.committed) for step in run.steps[:index])
    return list(run.prompt_ids) + list(run.new_token_ids[:before])


def one_step(pairs: PairCache, settings: Settings, method: str, ids: list[int], prompt: str) -> RunTrace:
    """One step of `method` from the token ids `ids`, with the settings' other options."""
    if method not in METHODS:
        raise UserError(f"unknown method '{str(method)[:40]}' (use {', '.join(METHODS)})")
    prepared = prepare(pairs, settings)
    decoder = prepared.decoder(method)
    try:
        with prepared.lock:
            decoder.start(list(ids), prepared.settings.max_new_tokens, prompt)
            decoder.step()
    except RequestError as exc:
        raise UserError(str(exc)) from exc
    return decoder.run


def side_by_side(pairs: PairCache, settings: Settings, methods: tuple[str, str], ids: list[int],
                 prompt: str) -> dict[str, RunTrace]:
    """The same step through two methods; the same method twice is refused (nothing to compare)."""
    if methods[0] == methods[1]:
        raise UserError("pick two different methods to compare")
    return {method: one_step(pairs, settings, method, ids, prompt) for method in methods}


def standing_for(runs: dict[str, RunTrace], index: int) -> dict[str, RunTrace]:
    """Each method's one step numbered as the step `index` of the run on show, which it was taken in place of."""
    for run in runs.values():
        run.steps[0].index = index
    return runs
