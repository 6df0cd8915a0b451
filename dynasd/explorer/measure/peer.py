"""The Compare tab's peer: transformers' own assisted generation (`target.generate(assistant_model=draft)`, the
bench's `hf-assisted`, dynasd/bench/measure.py) on the same pair, prompt, sampling settings, seed and budget.

Why a peer: the explorer's methods are compared with each other and with ar; a row from an implementation that is
not this project's says whether they are any good. Its numbers are read the way the explorer reads its own runs:
- tokens / s counts decoding only. transformers prefills inside `generate`: its prefill is the first forward of the
  target and the first of the draft in that call (the ones that read the prompt; the target's also verifies the
  first candidates), timed by the forward hooks and taken out of the `generate` time. Timed inside the same window,
  it cannot exceed it (a prefill timed apart, before the call, could on a busy machine, leaving 0 s of decoding);
- target forwards come from the forward hooks (bench.measure.ForwardClock): each is one verification round (the
  first one also reads the prompt), and each round commits its accepted candidates and one token of the target.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...bench.measure import ForwardClock, run_hf_assisted
from ...bench.specs import HF_ASSISTED, MethodSpec
from ...loading.models import ModelPair
from ..engine import prepare
from ..inputs import Settings, UserError, one_line
from ..pairs import PairCache

PEER_LABEL = "hf-assisted (transformers)"


@dataclass
class PeerRun:
    """One run of the peer, in the terms of the Compare table."""

    text: str
    new_tokens: int
    target_forwards: int
    accepted_tokens: int      # draft candidates the target kept: new tokens - target forwards
    assistant_forwards: int   # one per candidate the draft proposed
    decoding_seconds: float   # generate()'s time less the prefill below
    prefill_seconds: float    # generate()'s first forward of the target and of the draft: the ones over the prompt


def why_no_peer(pair: ModelPair) -> str | None:
    """Why transformers' assisted generation cannot run on this pair, or None when it can. A pair shares one
    tokenizer and one vocabulary by construction (models.py checks both when it loads a pair; a reduced draft head
    scores every token id), so what is left to ask is a draft that transformers can run."""
    if pair.draft is None or not hasattr(pair.draft, "generate"):
        return "this pair has no draft model that transformers can run"
    return None


def run_peer(pairs: PairCache, settings: Settings, prompt: str) -> PeerRun:
    """transformers' assisted generation of `prompt` with these settings' pair, sampling, seed and budget. Holds
    the pair's lock for the whole `generate` call (it cannot be cut into steps): other sessions on this pair wait
    that long. Raises UserError when the pair does not allow it or transformers refuses."""
    prepared = prepare(pairs, settings, prompt)
    settings, pair, ids = prepared.settings, prepared.pair, prepared.ids
    reason = why_no_peer(pair)
    if reason:
        raise UserError(f"transformers' assisted generation cannot run here: {reason}")
    with prepared.lock:
        clock = ForwardClock(pair)  # hooks on the shared models: only while the lock keeps other sessions out
        try:
            measured = run_hf_assisted(MethodSpec(HF_ASSISTED, HF_ASSISTED), pair, settings.options, ids,
                                       settings.max_new_tokens, clock)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise UserError(f"transformers' assisted generation failed on this pair ({one_line(exc)})") from exc
        finally:
            clock.close()
    prefill = min(clock.first_seconds["target"] + clock.first_seconds["draft"], measured.seconds)
    return PeerRun(text=measured.text, new_tokens=len(measured.token_ids), target_forwards=measured.target_forwards,
                   accepted_tokens=measured.accepted_draft_levels, assistant_forwards=measured.attempted_draft_levels,
                   decoding_seconds=max(measured.seconds - prefill, 0.0), prefill_seconds=prefill)
