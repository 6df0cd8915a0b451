"""Explorer sessions: one decoder per browser session, models shared and loaded once per process (pairs.py).

The app keeps only a session id in its (per-browser) state. A Session holds a decoder, its RunTrace and the
settings it was built from, or a loaded trace to replay. A failing model call marks only its own session failed;
other sessions and the loaded models carry on.
"""
from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Iterator

from ..decision import DecisionModel
from ..decoders import Decoder, RequestError, make_decoder
from ..models import ModelPair
from ..options import METHODS, DecoderOptions, OptionsError
from ..prompts import follow_up_ids
from ..stopping import READS_DECISION_MODEL, load_decision_model
from ..trace import RunTrace, StepTrace, TraceError, load_run
from .inputs import Settings, UserError, check_prompt, one_line
from .pairs import MODEL_BUILD_LOCK, PairCache
from .shown import SentOutputs


def load_decision_model_for(options: DecoderOptions) -> DecisionModel | None:
    """The decision model the options' stop policy reads, built under the model lock; a missing one is a
    UserError."""
    if options.stop not in READS_DECISION_MODEL:
        return None
    try:
        with MODEL_BUILD_LOCK:
            return load_decision_model(options.stop, options.decision_model)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def build_decoder(pair: ModelPair, settings: Settings, method: str | None = None,
                  decision_model: DecisionModel | None = None) -> Decoder:
    """A decoder from (normalised) explorer settings, for `method` (default: their own), with the options that
    method reads; `decision_model`, when given, is used instead of loading one. Problems become UserErrors."""
    options = settings.options.for_method(method)
    builds_a_module = decision_model is None and options.stop in READS_DECISION_MODEL
    try:
        with MODEL_BUILD_LOCK if builds_a_module else contextlib.nullcontext():
            return make_decoder(pair, options, decision_model)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def encode(pair: ModelPair, prompt: str) -> list[int]:
    try:
        return pair.encode_prompt(prompt)
    except Exception as exc:  # e.g. lone surrogates from an API client
        raise UserError(f"the tokenizer cannot read this prompt ({one_line(exc)})") from exc


class Session:
    """One browser session's decoder and run. Methods are called with `self.lock` held by the registry user.

    States: empty (no run) -> running a run (decoder set) -> finished (decoder released, run kept on show), or
    failed (`error` set, decoder released): a failed session refuses to step until reset() or a new run with
    other settings; a loaded trace is a finished run with no decoder (`replay`)."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.lock = threading.RLock()
        self.created = self.last_used = time.monotonic()
        self.settings: Settings | None = None
        self.prompt: str = ""
        self.turns: list[str] = []   # the conversation's user messages: the prompt, then any follow-ups
        self.pair: ModelPair | None = None
        self.decoder = None
        self.run: RunTrace | None = None
        self.replay = False          # the run came from a trace file; there is no decoder to step
        self.error: str | None = None  # set when a model call failed; cleared by reset()
        self.stop_requested = False
        self.stopped_by_page = False   # the page's flag ended its paced Run before the Stop request arrived
        self.running = False           # a Run stream is in progress (it takes self.lock one step at a time)
        # A Run paced by the browser: the page asks for each next step only once it has drawn the last one, so
        # the display is never more than a step behind. `paced_at` is the time of the last step it asked for;
        # a page that was closed mid-run stops asking, and after PACED_RUN_TIMEOUT_S the run counts as stopped.
        self.paced_at: float | None = None
        self.load_seconds = 0.0        # loading the model pair for the current run (0 when it was loaded already)
        self.prefill_seconds = 0.0     # the current run's prompt prefill: not part of any step's time
        self.restart_asked = False     # Step or Run on the finished run was pressed once: the next press replaces it
        self.sent = SentOutputs()      # what this session's page shows, so that an update sends only what changed

    def touch(self) -> None:
        self.last_used = time.monotonic()

    @property
    def paced_run_alive(self) -> bool:
        return self.paced_at is not None and time.monotonic() - self.paced_at < PACED_RUN_TIMEOUT_S

    @property
    def run_in_progress(self) -> bool:
        """A Run is under way: a server-side stream (API clients) or a browser-paced run still being asked for."""
        return self.running or self.paced_run_alive

    @property
    def busy(self) -> bool:
        if self.run_in_progress:
            return True
        if self.lock.acquire(blocking=False):
            self.lock.release()
            return False
        return True

    @property
    def done(self) -> bool:
        return self.run is not None and bool(self.run.finished)

    def matches(self, settings: Settings, prompt: str) -> bool:
        return not self.replay and self.run is not None and self.settings == settings and self.prompt == prompt

    def reset(self) -> None:
        self.paced_at = None
        self.decoder = self.run = self.settings = self.pair = None
        self.prompt, self.replay, self.error, self.stop_requested = "", False, None, False
        self.stopped_by_page = False
        self.restart_asked = False
        self.turns = []

    def start(self, pairs: PairCache, settings: Settings, prompt: str) -> RunTrace:
        """Build the decoder and prefill the prompt. Raises UserError for anything the user can fix; the
        previous run stays on show until the new one has started."""
        settings = settings.normalised()  # a bad shape or sampling setting is refused before any model loads
        prompt = check_prompt(prompt)
        pairs.check_decision_model(settings.decision_model)
        decision_model = load_decision_model_for(settings.options.for_method())
        loading = time.perf_counter()
        pair = pairs.get(settings)
        load_seconds = time.perf_counter() - loading
        decoder = build_decoder(pair, settings, decision_model=decision_model)
        ids = encode(pair, prompt)
        with pairs.lock_for(pair):
            try:
                prefilling = time.perf_counter()
                decoder.start(ids, settings.max_new_tokens, prompt)
                prefill_seconds = time.perf_counter() - prefilling
            except RequestError as exc:
                raise UserError(str(exc)) from exc
            except Exception as exc:  # a broken model must not take the app down; this session is marked
                self.reset()
                self.settings, self.prompt = settings, prompt
                self.error = _failure("prefill", exc)
                raise SessionFailed(self.error) from exc
        self.reset()
        self.settings, self.prompt, self.pair, self.decoder, self.run = settings, prompt, pair, decoder, decoder.run
        self.load_seconds, self.prefill_seconds = load_seconds, prefill_seconds
        self.turns = [prompt]
        return self.run

    def follow_up(self, pairs: PairCache, message: str) -> RunTrace:
        """The next turn of the conversation: `message` after the finished run's answer, as a new run with the
        same settings (Step and Run then go on with it).

        A finished run has released its caches (the memory rule of a shared server), so the new run's prefill
        reads the whole conversation; the command line and the bench continue from the caches instead
        (Decoder.continue_with). The tokens are the same either way: prompt, answer, then prompts.follow_up_ids."""
        message = check_prompt(message)
        if self.error:
            raise SessionFailed(self.error)
        if self.replay or self.run is None or self.pair is None or not self.done:
            raise UserError("a follow-up message goes after a finished run: press Run (or Step to the end) first")
        users = self.turns + [message]
        messages = []
        for user in users[:-1]:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": "..."}]
        messages.append({"role": "user", "content": message})
        try:
            extra = follow_up_ids(self.pair.tokenizer, messages, self.run.new_token_ids, self.pair.eos_token_ids)
        except Exception as exc:
            raise UserError(f"cannot go on with this conversation ({one_line(exc)})") from exc
        ids = self.run.prompt_ids + self.run.new_token_ids + extra
        decoder = build_decoder(self.pair, self.settings,
                                decision_model=load_decision_model_for(self.settings.options.for_method()))
        with pairs.lock_for(self.pair):
            try:
                prefilling = time.perf_counter()
                decoder.start(ids, self.settings.max_new_tokens, message)
                prefill_seconds = time.perf_counter() - prefilling
            except RequestError as exc:
                raise UserError(str(exc)) from exc
            except Exception as exc:
                self.error = _failure("prefill", exc)
                raise SessionFailed(self.error) from exc
        self.decoder, self.run, self.turns = decoder, decoder.run, users
        self.load_seconds, self.prefill_seconds = 0.0, prefill_seconds
        return self.run

    def step(self, pairs: PairCache) -> StepTrace:
        if self.error:
            raise SessionFailed(self.error)
        if self.replay:
            raise UserError("this run was loaded from a trace file: there is no model to step (press Reset)")
        if self.done:
            raise UserError("the run is finished; press Reset (or Step again) to start a new one")
        if self.decoder is None or self.run is None:
            raise UserError("nothing to step: press Step or Run to start a run")
        with pairs.lock_for(self.pair):
            try:
                step = self.decoder.step()
            except Exception as exc:
                # The decoder may be half way through a step (caches and committed tokens out of line): it is
                # dropped, its memory with it; the steps so far stay on show.
                self.error = _failure("step", exc)
                self.decoder = None
                raise SessionFailed(self.error) from exc
        if self.done:
            self.decoder = None  # the KV caches are not needed to show a finished run
        return step

    def load(self, run: RunTrace) -> None:
        self.reset()
        self.run, self.replay = run, True


PACED_RUN_TIMEOUT_S = 30.0  # a browser-paced Run not asked for its next step this long was abandoned


class SessionFailed(RuntimeError):
    """A model call failed inside one session; the message says so and how to recover."""


def _failure(what: str, exc: Exception) -> str:
    return f"the model call failed during {what} ({one_line(exc)}); press Reset to start over"


def compare_methods(pairs: PairCache, settings: Settings, prompt: str,
                    methods: tuple[str, ...] = METHODS) -> Iterator[tuple[str, RunTrace]]:
    """The same prompt and settings through each method, one after another (yields as each finishes).
    Each run holds the pair's lock one step at a time, so other sessions keep stepping meanwhile."""
    settings = settings.normalised()
    prompt = check_prompt(prompt)
    for method in methods:  # every method's options are checked before any model loads
        try:
            settings.options.for_method(method).validate()
        except OptionsError as exc:
            raise UserError(f"{method}: {exc}") from exc
    pairs.check_decision_model(settings.decision_model)
    decision_model = load_decision_model_for(settings.options)  # once, for every method whose stop policy reads it
    pair = pairs.get(settings)
    lock = pairs.lock_for(pair)
    ids = encode(pair, prompt)
    for method in methods:
        decoder = build_decoder(pair, settings, method, decision_model)
        try:
            with lock:
                decoder.start(ids, settings.max_new_tokens, prompt)
            while not decoder.done:
                with lock:
                    decoder.step()
        except RequestError as exc:
            raise UserError(str(exc)) from exc
        except UserError:
            raise
        except Exception as exc:
            raise SessionFailed(_failure(f"the {method} run", exc)) from exc
        yield method, decoder.run


def load_trace(path) -> RunTrace:
    """A trace file from a stranger: a run the figures can draw (dynasd/trace.py checks all of it), or UserError."""
    if not isinstance(path, (str, Path)):
        raise UserError("cannot load that trace: expected a file")
    try:
        return load_run(path)
    except (TraceError, OSError) as exc:
        raise UserError(f"cannot load that trace: {exc}") from exc
