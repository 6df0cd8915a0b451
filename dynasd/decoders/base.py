"""The contract every decoder keeps: `start()` a run, `step()` until `done`, read `run` (a RunTrace); between two
steps, `snapshot()` its state as data, which `dynasd.decoders.resume` turns back into a decoder."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod

import torch

from ..device_info import device_line
from ..loading.models import ModelPair
from ..options import DecoderOptions
from ..trace import RunTrace, StepTrace
from .snapshot import SNAPSHOT_FORMAT, DecoderSnapshot, state_fingerprint


def no_draft_model(proposed_by: str) -> str:
    """The "draft:" of a run that ran no draft model (ar, prompt lookup, token recycling), with what proposed its
    candidates instead: the decoder that ran is the one owner of this label, and the page draws it as it is."""
    return f"none ({proposed_by})"


class RequestError(ValueError):
    """A request the decoder refuses (empty prompt, too long, ...); the message is meant for the user."""


class Decoder(ABC):
    """Every entry point that runs the models or samples (start, continue_with, restore, step) runs under
    `torch.inference_mode`, not only the forwards: a step is hundreds of small tensor operations (warps, draws,
    the walk, the trace's reads), and without autograd's bookkeeping each costs less (a whole sampled run of a tiny
    pair 14% less; the same draws, tests/test_losslessness.py pins them)."""

    method = "base"

    def __init__(self, pair: ModelPair, options: DecoderOptions) -> None:
        """Everything a decoder is comes from `options` (dynasd/options.py: their defaults and checks, none of
        its own); a run's trace records them, so a saved run gives them back (options.options_of_run)."""
        self.options = options.validate()
        self.pair = pair
        self.sampling = options.sampling
        self.seed = options.seed  # set anew to run again with another seed (start() reads it)
        self.run: RunTrace | None = None
        self.committed: list[int] = []
        self.max_new_tokens = 0
        self.steps_before = 0  # steps of this run taken before a resume: not in run.steps, counted in step indices

    # -- what subclasses provide -------------------------------------------------------------------------------
    @property
    def lossless(self) -> bool:
        return True

    @property
    def draft_label(self) -> str:
        """The draft model a run used, as its trace names it: none for a method that runs none."""
        return no_draft_model("the target alone")

    def max_step_tokens(self) -> int:
        """Most positions one step can add beyond the committed tokens (for the context-limit check)."""
        return 1

    @abstractmethod
    def _prefill(self) -> None:
        """Cache the prompt (all of it, or all but the token the first step will feed)."""

    @abstractmethod
    def _extend(self, kept: int) -> None:
        """The committed text is its first `kept` tokens as the caches know them, then new prompt tokens (the next
        turn of a conversation): drop what the caches hold past `kept`, then cache the new tokens as `_prefill`
        caches a prompt, so the next step costs what a first step costs."""

    @abstractmethod
    def _step(self) -> StepTrace:
        """Draft, verify once, commit: the method itself."""

    def _clock(self) -> float:
        """The time now, once the work queued on the pair's device has run. On CUDA a forward returns as soon as
        its kernels are queued, so a clock read without a synchronisation gives the phase's time to whichever
        later phase first waits for the GPU (a verify's time landed in the acceptance at T > 0, where nothing is
        read back from the verify). Every step's phase times are read through this."""
        if self.pair.device.type == "cuda":
            torch.cuda.synchronize(self.pair.device)
        return time.perf_counter()

    def _source_states(self) -> list[dict]:
        """The state as data of whatever the decoder keeps besides its caches (its candidate sources)."""
        return []

    def _restore_sources(self, states: list[dict]) -> None:
        """Give back what `_source_states` took, after `_prefill` has rebuilt the caches."""
        if states:
            raise ValueError(f"a {self.method} decoder keeps no source state; the snapshot has {len(states)}")

    # -- the shared run loop -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def start(self, prompt_ids: list[int], max_new_tokens: int, prompt_text: str = "") -> RunTrace:
        self._check_request(prompt_ids, max_new_tokens, "the prompt")
        self.generator = torch.Generator(device=self.pair.device).manual_seed(self.seed)
        self._new_run(list(prompt_ids), max_new_tokens, prompt_text, turn=1)
        started = self._clock()
        self._prefill()
        self.run.seconds += self._clock() - started
        return self.run

    @torch.inference_mode()
    def continue_with(self, extra_ids: list[int], max_new_tokens: int, prompt_text: str = "") -> RunTrace:
        """A new run that goes on from the finished one: its prompt is the last run's prompt, the tokens it kept,
        then `extra_ids` (the next user turn with the chat template's markers, prompts.follow_up_ids).

        Why: in a conversation every turn's prompt holds the earlier turns and the model's own answers, whose keys
        and values the caches already hold. Only the tokens no forward has read yet are forwarded (the answer's
        last token and `extra_ids`), instead of prefilling the whole conversation again; the output is what a
        fresh decoder would make of the whole conversation (exactly so at T = 0 for a lossless method). The
        random stream goes on from the last run rather than restarting."""
        if self.run is None:
            raise RuntimeError("continue_with() goes on from a run: call start() first")
        if not self.done:
            raise RequestError("the run is not finished: a conversation goes on after a whole answer")
        context = self.run.prompt_ids + self.run.new_token_ids  # the answer as counted, past its end cut off
        self._check_request(extra_ids, max_new_tokens, "the follow-up message", len(context))
        self._new_run(context + list(extra_ids), max_new_tokens, prompt_text, turn=self.run.config["turn"] + 1)
        started = self._clock()
        self._extend(len(context))
        self.run.seconds += self._clock() - started
        return self.run

    def _check_request(self, ids: list[int], max_new_tokens: int, what: str, context: int = 0) -> None:
        if not ids:
            raise RequestError(f"{what} is empty")
        if max_new_tokens < 1:
            raise RequestError("max new tokens must be at least 1")
        limit = self.pair.context_limit
        if context + len(ids) + max_new_tokens + self.max_step_tokens() > limit:
            earlier = f"the conversation so far ({context} tokens) + " if context else ""
            raise RequestError(f"{earlier}{what} ({len(ids)} tokens) + max new tokens ({max_new_tokens}) exceeds "
                               f"the model's context of {limit} tokens")

    def _new_run(self, prompt_ids: list[int], max_new_tokens: int, prompt_text: str, turn: int) -> None:
        self.committed = prompt_ids
        self.max_new_tokens = max_new_tokens
        self.steps_before = 0
        # The trace's config: the options under their own names (options.options_of_run reads them back) and
        # which turn of a conversation this is; nothing else, so there is one vocabulary.
        self.run = RunTrace(method=self.method, config={"options": self.options.to_record(), "turn": turn},
                            pair=self.pair.name, draft_label=self.draft_label, lossless=self.lossless,
                            prompt=prompt_text, prompt_ids=list(prompt_ids), device=device_line(self.pair))

    @property
    def done(self) -> bool:
        return self.run is not None and bool(self.run.finished)

    @property
    def steps_taken(self) -> int:
        """Steps of this run so far, the next step's index: a resumed run's `steps` start after a snapshot's."""
        return self.steps_before + (len(self.run.steps) if self.run is not None else 0)

    # -- the state as data (snapshot.py) -----------------------------------------------------------------------
    def snapshot(self) -> DecoderSnapshot:
        """This decoder's state between two steps as plain data; `resume(pair, snapshot)` goes on from it."""
        if self.run is None:
            raise RuntimeError("snapshot() is of a run: call start() first")
        run = self.run
        return DecoderSnapshot(
            options=self.options.to_record(), pair=self.pair.name, device=self.pair.device.type,
            prompt_ids=list(run.prompt_ids), new_token_ids=list(run.new_token_ids), prompt=run.prompt,
            max_new_tokens=self.max_new_tokens, finished=run.finished, turn=run.config["turn"],
            steps=self.steps_taken, seconds=run.seconds, committed=list(self.committed),
            generator_state=self.generator.get_state().numpy().tobytes(), sources=self._source_states())

    def fingerprint(self) -> str:
        """The fingerprint of the snapshot this decoder would take now (DecoderSnapshot.fingerprint), without
        taking it."""
        if self.run is None:
            raise RuntimeError("a fingerprint is of a run: call start() first")
        return state_fingerprint(self.pair.name, self.options.to_record(), self.run.config["turn"],
                                 self.steps_taken, self.max_new_tokens, self.run.prompt_ids, self.committed,
                                 self.generator.get_state().numpy().tobytes())

    @torch.inference_mode()
    def restore(self, snapshot: DecoderSnapshot) -> RunTrace:
        """Go on from `snapshot` on this fresh decoder, made from `snapshot.options` (`resume` does both).

        The caches are rebuilt by prefilling the committed text as `start` prefills a prompt; the run's header,
        the random generator and every source's state come from the snapshot. The run's `steps` start empty; the
        next step's index is `snapshot.steps`. A finished run resumes finished (continue_with goes on from it).
        The prefill is not counted in `run.seconds`: it rebuilds state, it decodes nothing."""
        self._check_snapshot(snapshot)
        self.generator = torch.Generator(device=self.pair.device)
        self._new_run(list(snapshot.prompt_ids), snapshot.max_new_tokens, snapshot.prompt, snapshot.turn)
        self.committed = list(snapshot.committed)
        self.steps_before = snapshot.steps
        run = self.run
        run.new_token_ids = list(snapshot.new_token_ids)
        run.text = self.pair.decode(run.new_token_ids)
        run.seconds, run.finished = snapshot.seconds, snapshot.finished
        self._prefill()
        self._restore_sources(snapshot.sources)
        self.generator.set_state(torch.frombuffer(bytearray(snapshot.generator_state), dtype=torch.uint8))
        return run

    def _check_snapshot(self, snapshot: DecoderSnapshot) -> None:
        if snapshot.format != SNAPSHOT_FORMAT:
            raise ValueError(f"a {snapshot.format!r} snapshot; this version reads {SNAPSHOT_FORMAT!r}")
        if snapshot.pair != self.pair.name:
            raise ValueError(f"the snapshot is of a run on the pair '{snapshot.pair}', not '{self.pair.name}'")
        if snapshot.device != self.pair.device.type:
            raise ValueError(f"the snapshot's random state is of a {snapshot.device} generator; this pair runs on "
                             f"{self.pair.device.type}")
        if snapshot.options != self.options.to_record():
            raise ValueError("the snapshot was taken with other options than this decoder's")
        prompt, new = len(snapshot.prompt_ids), len(snapshot.new_token_ids)
        if (snapshot.committed[:prompt] != snapshot.prompt_ids
                or snapshot.committed[prompt:prompt + new] != snapshot.new_token_ids or not snapshot.committed):
            raise ValueError("the snapshot's committed tokens are not its prompt followed by its new tokens")

    @torch.inference_mode()
    def step(self) -> StepTrace:
        """One draft phase + one target forward; commits tokens and records what happened."""
        if self.run is None:
            raise RuntimeError("call start() before step()")
        if self.done:
            raise RuntimeError("the run is finished")
        started = self._clock()
        trace = self._step()
        self._truncate(trace)
        self.run.seconds += self._clock() - started
        self.run.steps.append(trace)
        return trace

    def _truncate(self, trace: StepTrace) -> None:
        """Stop at the first end-of-sequence token or at max_new_tokens; overshoot never counts."""
        room = self.max_new_tokens - len(self.run.new_token_ids)
        keep = min(len(trace.committed), room)
        for i, token in enumerate(trace.committed[:keep]):
            if token in self.pair.eos_token_ids:
                keep = i + 1
                self.run.finished = "eos"
                break
        if keep < len(trace.committed):
            trace.committed = trace.committed[:keep]
            trace.committed_tokens = trace.committed_tokens[:keep]
            trace.committed_origins = trace.committed_origins[:keep]
        self.run.new_token_ids += trace.committed
        if not self.run.finished and len(self.run.new_token_ids) >= self.max_new_tokens:
            self.run.finished = "length"
        self.run.text = self.pair.decode(self.run.new_token_ids)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, prompt_text: str = "") -> RunTrace:
        self.start(prompt_ids, max_new_tokens, prompt_text)
        return self._finish()

    def generate_turn(self, extra_ids: list[int], max_new_tokens: int, prompt_text: str = "") -> RunTrace:
        """`generate` for the next turn of a conversation (continue_with, then step to the end)."""
        self.continue_with(extra_ids, max_new_tokens, prompt_text)
        return self._finish()

    def _finish(self) -> RunTrace:
        while not self.done:
            self.step()
        return self.run
