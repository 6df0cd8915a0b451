"""Measuring one run of one method: the forward clock, our decoders and transformers' assisted generation."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
import transformers

from ..acceptance import acceptance_of
from ..decoders import make_decoder
from ..options import DecoderOptions
from ..stopping.decision_models import DecisionModel
from ..trace import PROPOSED_ORIGINS
from .specs import HF_ASSISTED, MethodSpec

# ---------------------------------------------------------------------------------------------------------------
# measuring one run

class ForwardClock:
    """Counts and times every forward call of the target and the draft: from the input embedding's start to the
    output layer's end (hooks on those two modules; on the whole model where it has no such pair).

    Why not the whole model: our decoders run its layers through dynasd/kernels/lean_forward.py, which skips the model's
    own forward, while every path calls the embedding first and the output layer last. The hooks see transformers'
    assisted generation exactly as they see our decoders, so the draft/verify split is measured the same way for
    every method. On CUDA each forward is synchronized so its time is real. `first_seconds` keeps each model's
    first forward since the last reset: the one that reads the prompt, so a run that prefills inside one call
    (transformers' `generate`) has its prefill measured inside the same window as its total.
    """

    def __init__(self, pair) -> None:
        self.cuda = pair.device.type == "cuda"
        self.reset()
        self._handles = []
        self._started: dict[str, float] = {}
        drafts = [d for d in (pair.draft, getattr(pair, "feature_draft", None)) if d is not None]
        for role, model in [("target", pair.target)] + [("draft", d) for d in drafts]:
            first, last = model.get_input_embeddings(), model.get_output_embeddings()
            if first is None or last is None:
                first = last = model
            self._handles.append(first.register_forward_pre_hook(self._pre(role)))
            self._handles.append(last.register_forward_hook(self._post(role)))

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _pre(self, role: str):
        def hook(module, inputs):
            if inputs and isinstance(inputs[0], torch.Tensor):  # the embedding's input ids: positions forwarded
                self.positions[role] += inputs[0].shape[-1]
            self._sync()
            self._started[role] = time.perf_counter()
        return hook

    def _post(self, role: str):
        def hook(module, inputs, output):
            self._sync()
            seconds = time.perf_counter() - self._started.pop(role)
            if not self.calls[role]:
                self.first_seconds[role] = seconds
            self.seconds[role] += seconds
            self.calls[role] += 1
        return hook

    def reset(self) -> None:
        self.seconds = {"target": 0.0, "draft": 0.0}
        self.first_seconds = {"target": 0.0, "draft": 0.0}
        self.calls = {"target": 0, "draft": 0}
        self.positions = {"target": 0, "draft": 0}

    def snapshot(self) -> dict:
        return {"calls": dict(self.calls), "seconds": dict(self.seconds), "positions": dict(self.positions)}

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class Measured:
    """What one timed run produced; counts that a method cannot report are None."""

    token_ids: list[int]
    text: str
    seconds: float                        # the one timing window: wall time around the whole generate call
    target_forwards: int | None           # verify rounds (tokens per target forward = new tokens / this)
    accepted_draft_levels: int | None
    attempted_draft_levels: int | None
    finished: str
    lossless: bool
    phase_seconds: dict = field(default_factory=dict)  # the decoder's own split (our methods only)
    # drafting steps by accepted length: histogram[a] = steps whose accepted path held a proposed tokens
    acceptance_histogram: list[int] | None = None
    proposed_tokens: int | None = None    # candidates the target tested (draft, looked-up, recycled nodes)
    accepted_tokens: int | None = None    # of them, those committed
    context_ids: list[int] = field(default_factory=list)  # what the output answers (the whole conversation)
    forwards: dict = field(default_factory=dict)  # the forward clock's counts for this turn (ForwardClock.snapshot)


def truncate(ids: list[int], max_new_tokens: int, eos_ids) -> tuple[list[int], str]:
    """Cut after the first end-of-sequence token or at max_new_tokens, whichever comes first."""
    ids = list(ids[:max_new_tokens])
    for i, token in enumerate(ids):
        if token in eos_ids:
            return ids[: i + 1], "eos"
    return ids, "length" if len(ids) >= max_new_tokens else ""


def draft_level_counts(trace) -> tuple[int, int]:
    """(accepted, attempted) draft levels: a live level counts once per step, target-root levels not at all."""
    accepted = attempted = 0
    for step in trace.steps:
        attempted += len({n.level for n in step.nodes if n.origin in PROPOSED_ORIGINS})
        accepted += sum(step.nodes[i].origin in PROPOSED_ORIGINS for i in step.accepted_path)
    return accepted, attempted


def make_method_decoder(spec: MethodSpec, pair, options: DecoderOptions, decision_model: DecisionModel | None = None):
    """Our decoder for one benchmarked method: `options` are the spec's (specs.decoder_options) with this run's
    temperature and seed; `decision_model` is loaded once per method, not once per run."""
    return make_decoder(pair, options, decision_model)


def _synchronize(pair) -> None:
    if pair.device.type == "cuda":
        torch.cuda.synchronize()


def run_decoder(spec: MethodSpec, pair, options: DecoderOptions, ids, max_new_tokens, prompt_text,
                decision_model: DecisionModel | None = None, follow_ups=(), clock: ForwardClock | None = None
                ) -> list[Measured]:
    """One conversation: the first turn from `ids`, then one turn per follow-up. `follow_ups` is a list of
    functions, each given the conversation's token ids so far and the last answer's, returning (extra token ids,
    the user text): the decoder goes on from its caches (Decoder.continue_with). Every turn is timed on its own,
    by the same window (prefill or continuation + steps); building the follow-up's tokens is outside it."""
    decoder = make_method_decoder(spec, pair, options, decision_model)
    turns = []
    for turn in range(1 + len(follow_ups)):
        if turn:
            context = decoder.run.prompt_ids + decoder.run.new_token_ids
            extra, prompt_text = follow_ups[turn - 1](context, decoder.run.new_token_ids)
        if clock:
            clock.reset()
        _synchronize(pair)
        started = time.perf_counter()
        trace = (decoder.generate(ids, max_new_tokens, prompt_text=prompt_text) if not turn else
                 decoder.generate_turn(extra, max_new_tokens, prompt_text=prompt_text))
        _synchronize(pair)
        seconds = time.perf_counter() - started
        turns.append(_measured(spec, pair, trace, seconds, max_new_tokens, clock))
    return turns


def _measured(spec, pair, trace, seconds, max_new_tokens, clock) -> Measured:
    token_ids, finished = truncate(trace.new_token_ids, max_new_tokens, pair.eos_token_ids)
    accepted, attempted = draft_level_counts(trace) if spec.method != "ar" else (None, None)
    acceptance = acceptance_of(trace.steps)
    histogram, proposed, accepted_tokens = acceptance.histogram, acceptance.proposed, acceptance.accepted
    # The decoder's own phases; "rest" is prefill plus per-step bookkeeping (text, traces) outside them.
    phases = {"draft": sum(s.draft_seconds for s in trace.steps),
              "verify": sum(s.verify_seconds for s in trace.steps),
              "accept": sum(s.accept_seconds for s in trace.steps)}
    phases["rest"] = seconds - sum(phases.values())
    drafting = spec.method != "ar"
    return Measured(token_ids, pair.decode(token_ids), seconds, trace.target_forwards, accepted, attempted,
                    trace.finished or finished, trace.lossless, phases,
                    acceptance_histogram=histogram if drafting else None,
                    proposed_tokens=proposed if drafting else None,
                    accepted_tokens=accepted_tokens if drafting else None,
                    context_ids=list(trace.prompt_ids), forwards=clock.snapshot() if clock else {})


def run_hf_assisted_conversation(spec: MethodSpec, pair, options: DecoderOptions, ids, max_new_tokens,
                                 clock: ForwardClock | None = None, follow_ups=()) -> list[Measured]:
    """transformers' assisted generation over a conversation: every turn is one `generate` call on the whole
    conversation so far (transformers re-reads it: its caches are not carried from one call to the next)."""
    turns = []
    for turn in range(1 + len(follow_ups)):
        if turn:
            context = ids + turns[-1].token_ids
            extra, _ = follow_ups[turn - 1](context, turns[-1].token_ids)
            ids = context + list(extra)
        if clock:
            clock.reset()
        measured = run_hf_assisted(spec, pair, options, ids, max_new_tokens, clock)
        measured.context_ids, measured.forwards = list(ids), clock.snapshot() if clock else {}
        turns.append(measured)
    return turns


def run_hf_assisted(spec: MethodSpec, pair, options: DecoderOptions, ids, max_new_tokens,
                    clock: ForwardClock | None = None) -> Measured:
    """transformers' `generate(assistant_model=...)` with the same pair, sampling settings, seed and token budget
    (of `options` only those are read: the spec's own keys set the rest).

    HF defaults apply unless the spec overrides them (num_assistant_tokens 20, constant schedule, assistant
    confidence threshold 0.4). With `lookup=N` it runs transformers' prompt lookup decoding instead
    (`prompt_lookup_num_tokens=N`, no assistant model): the peer of our `pld`.
    The draft's generation config is restored afterwards: HF's heuristic schedule
    writes its state into it, which would leak from one run into the next.
    """
    sampling, seed = options.sampling, options.seed
    eos = sorted(pair.eos_token_ids)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=not sampling.greedy, eos_token_id=eos or None,
                  pad_token_id=eos[0] if eos else None)
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    input_ids = torch.tensor([ids], dtype=torch.long, device=pair.device)
    attention = torch.ones_like(input_ids)
    draft_calls_before = clock.calls["draft"] if clock else 0
    target_calls_before = clock.calls["target"] if clock else 0
    saved_config = copy.deepcopy(pair.draft.generation_config)
    verbosity = transformers.logging.get_verbosity()
    try:
        assistant = pair.draft.generation_config  # transformers reads the assistant's settings from here
        if spec.option("n") is not None:
            assistant.num_assistant_tokens = int(spec.option("n"))
        if spec.option("schedule") is not None:
            assistant.num_assistant_tokens_schedule = spec.option("schedule")
        if spec.option("th") is not None:
            assistant.assistant_confidence_threshold = float(spec.option("th"))
        transformers.logging.set_verbosity_error()  # HF warns on every call about flags it passes to itself
        torch.manual_seed(seed)
        _synchronize(pair)
        started = time.perf_counter()
        with torch.inference_mode():
            if spec.option("lookup") is not None:
                out = pair.target.generate(input_ids, attention_mask=attention,
                                           prompt_lookup_num_tokens=int(spec.option("lookup")), **kwargs)
            else:
                out = pair.target.generate(input_ids, attention_mask=attention, assistant_model=pair.draft,
                                           **kwargs)
        _synchronize(pair)
        seconds = time.perf_counter() - started
    finally:
        transformers.logging.set_verbosity(verbosity)
        pair.draft.generation_config = saved_config
    token_ids, finished = truncate(out[0, len(ids):].tolist(), max_new_tokens, pair.eos_token_ids)
    rounds = accepted = attempted = None
    if clock:
        # The first target forward is prefill and first verification at once; each forward is one round that
        # commits its accepted candidates plus one target token; each assistant forward yields one candidate.
        rounds = clock.calls["target"] - target_calls_before
        attempted = clock.calls["draft"] - draft_calls_before
        accepted = max(0, len(token_ids) - rounds)
    return Measured(token_ids, pair.decode(token_ids), seconds, rounds, accepted, attempted, finished, True)


def run_method(spec: MethodSpec, pair, options: DecoderOptions, ids, max_new_tokens, prompt_text,
               clock: ForwardClock | None = None, decision_model: DecisionModel | None = None,
               follow_ups=()) -> list[Measured]:
    """One conversation (a single turn unless `follow_ups` are given) of one method: one Measured per turn."""
    if spec.method == HF_ASSISTED:
        return run_hf_assisted_conversation(spec, pair, options, ids, max_new_tokens, clock, follow_ups)
    return run_decoder(spec, pair, options, ids, max_new_tokens, prompt_text, decision_model, follow_ups, clock)
