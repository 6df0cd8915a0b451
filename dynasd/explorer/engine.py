"""The explorer's model work as functions of data: what crosses the boundary of a GPU process.

Why: on a ZeroGPU Space every call that runs a model runs in a forked child process. Its arguments reach the
child by the fork (or pickled, when a child is reused), only its return value comes back (pickled), and nothing
it changes in memory reaches the process that serves the page. So every function here takes all it needs as data
(the settings, the prompt, the decoder's snapshot) and returns all the page needs as data (the steps, the run's
text after each, the new snapshot); a session keeps that data in the serving process (session.py). In a single
process (the CPU app, the command line, the tests) the same functions run in place.

A live decoder whose state is exactly the snapshot's (the same fingerprint) is reused instead of resumed, so a
Step in one process does not prefill the context again; that is an optimisation only: `resume` rebuilds the same
decoder from the snapshot alone, and the results are the same either way (tests/test_snapshot.py).

Every request (`StartRun`, `Advance`, `FollowUp`) comes through one door, `serve(pairs, request)`, whichever
transport brought it (sessions/calls.py); Compare's rounds go through it too.

Failures come back as data too (`Progress.error`), never as an exception: an exception raised in a GPU child
reaches the page as the hosting library chooses to show it, not as this project's one clear line.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from ..decoders import Decoder, RequestError, make_decoder, resume
from ..decoders.snapshot import DecoderSnapshot
from ..loading.models import ModelPair
from ..options import DecoderOptions
from ..prompts import follow_up_ids
from ..stopping.decision_models import DecisionModel
from ..stopping.policies import READS_DECISION_MODEL, load_decision_model
from ..trace import RunTrace, StepTrace
from .inputs import Settings, UserError, check_prompt, one_line
from .pairs import MODEL_BUILD_LOCK, PairCache

UNTIL_DONE = 1 << 30  # `steps` for "to the end of the run"


@dataclass
class RecordedStep:
    """One step as the page shows it: the step, and the run's text and end right after it."""

    step: StepTrace
    text: str
    finished: str


@dataclass
class Progress:
    """What one model call did, as data: a new run's header (when the call started one), the steps it took, the
    decoder's state after them, and what it cost. `error` is one line for the user; `failed` says the model call
    itself failed (the session is then marked failed) rather than the request being refused."""

    run: RunTrace | None = None          # a new run, steps empty (set when this call started the run)
    steps: list[RecordedStep] = field(default_factory=list)
    snapshot: DecoderSnapshot | None = None
    load_seconds: float = 0.0
    prefill_seconds: float = 0.0
    seconds: float = 0.0                 # the whole call, where it ran
    error: str = ""
    failed: bool = False
    tree_note: str = ""                  # a new run: what this device's kept costs say of its tree (where.py)

    @property
    def step_seconds(self) -> float:
        return sum(r.step.draft_seconds + r.step.verify_seconds + r.step.accept_seconds for r in self.steps)


class LiveDecoders:
    """Decoders kept in this process by the fingerprint of their state, at most `capacity` of them (their KV
    caches are the memory): `take` hands one out and forgets it, so two requests from the same state can never
    step one decoder twice; `keep` puts it back under its new state."""

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._decoders: OrderedDict[str, Decoder] = OrderedDict()
        self._guard = threading.Lock()

    def take(self, fingerprint: str) -> Decoder | None:
        with self._guard:
            return self._decoders.pop(fingerprint, None)

    def keep(self, fingerprint: str, decoder: Decoder) -> None:
        with self._guard:
            self._decoders[fingerprint] = decoder
            while len(self._decoders) > self.capacity:
                self._decoders.popitem(last=False)

    def clear(self) -> None:
        with self._guard:
            self._decoders.clear()

    def __len__(self) -> int:
        with self._guard:
            return len(self._decoders)


LIVE = LiveDecoders()


class InjectedFaults:
    """Model failures made on purpose, through the engine's own door: `arm(prompt, error)` makes the next model
    call on the run of `prompt` raise `error`, once, where the model works: at its prefill (`during="prefill"`, a
    new run or a follow-up turn) or at the start of its next step (`during="step"`). The engine handles it as any
    failing model: the call's request fails with one line, its decoder is dropped, its session is marked failed.

    Why a hook: a fault made by replacing a model attribute on one session's decoder ties the soak
    (scripts/soak.py) and the robustness tests to that attribute's name, and a rename would break the soak
    silently (it runs outside the suite). A step's fault follows the decoder being stepped (its run's prompt),
    not the request, so a decoder handed to the wrong session takes its fault with it, as a broken cache would;
    tests/test_soak.py holds the hook to this. Nothing is armed outside tests and the soak: the check is one
    attribute read per step."""

    DURING = ("prefill", "step")

    def __init__(self) -> None:
        self._armed: dict[tuple[str, str], BaseException] = {}
        self._guard = threading.Lock()

    def arm(self, prompt: str, error: BaseException, during: str = "step") -> None:
        if during not in self.DURING:
            raise ValueError(f"during must be one of {self.DURING}, got {during!r}")
        with self._guard:
            self._armed[(during, prompt)] = error

    def clear(self) -> None:
        with self._guard:
            self._armed.clear()

    def raise_if_armed(self, during: str, prompt: str) -> None:
        if not self._armed:
            return
        with self._guard:
            error = self._armed.pop((during, prompt), None)
        if error is not None:
            raise error


FAULTS = InjectedFaults()


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


def build_decoder(pair, settings: Settings, method: str | None = None,
                  decision_model: DecisionModel | None = None) -> Decoder:
    """A decoder from (normalised) explorer settings, for `method` (default: their own), with the options that
    method reads; problems become UserErrors."""
    options = settings.options.for_method(method)
    if decision_model is None:
        decision_model = load_decision_model_for(options)
    try:
        return make_decoder(pair, options, decision_model)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def encode(pair, prompt: str) -> list[int]:
    try:
        return pair.encode_prompt(prompt)
    except Exception as exc:  # e.g. lone surrogates from an API client
        raise UserError(f"the tokenizer cannot read this prompt ({one_line(exc)})") from exc


@dataclass
class Prepared:
    """What every explorer entry point needs before its first forward, made in one place (`prepare`): the
    normalised settings, the pair, the prompt's token ids, and decoders from them. Why one place: the public
    server's policy (only shipped decision models; pairs.py) is checked here, so no entry point can skip it."""

    pairs: PairCache
    settings: Settings
    pair: ModelPair
    ids: list[int]
    load_seconds: float = 0.0
    _decision_models: dict = field(default_factory=dict)

    def decoder(self, method: str | None = None) -> Decoder:
        """A decoder for `method` (default: the settings' own) with the options that method reads; the decision
        model its stop policy reads is loaded once for all of them."""
        options = self.settings.options.for_method(method)
        key = (options.stop, options.decision_model)
        if key not in self._decision_models:
            self._decision_models[key] = load_decision_model_for(options)
        return build_decoder(self.pair, self.settings, method, self._decision_models[key])

    @property
    def lock(self):
        return self.pairs.lock_for(self.pair)


def prepare(pairs: PairCache, settings: Settings, prompt: str | None = None) -> Prepared:
    """Check the settings (a bad one is refused before any model loads) and the server's policy, load the pair
    (when this process has not) and encode the prompt (`ids` empty without one). Problems are UserErrors."""
    settings = settings.normalised()
    prompt = None if prompt is None else check_prompt(prompt)
    pairs.check_decision_model(settings.decision_model)
    loading = time.perf_counter()
    pair = pairs.get(settings)
    load_seconds = time.perf_counter() - loading
    return Prepared(pairs, settings, pair, [] if prompt is None else encode(pair, prompt), load_seconds)


@dataclass(frozen=True)
class StartRun:
    """A new run of `prompt`: load the pair where this process has not, prefill, take up to `steps` steps."""

    settings: Settings
    prompt: str
    steps: int = 0
    expected_s: float = 0.0  # the session's own estimate of the call's time: a ZeroGPU call asks for GPU time by it


@dataclass(frozen=True)
class Advance:
    """Up to `steps` more steps of the run whose decoder state is `snapshot` (fewer when the run ends)."""

    settings: Settings
    snapshot: DecoderSnapshot
    steps: int = 1
    expected_s: float = 0.0


@dataclass(frozen=True)
class FollowUp:
    """The conversation's next turn after the finished run `snapshot`: `turns` are the user's messages, the new one
    last. The new run reads only the tokens no forward has read (Decoder.continue_with)."""

    settings: Settings
    snapshot: DecoderSnapshot
    turns: tuple[str, ...]
    steps: int = 0
    expected_s: float = 0.0


Request = StartRun | Advance | FollowUp
AfterSteps = Callable[[ModelPair, Request, Progress], None]


def serve(pairs: PairCache, request: Request, after_steps: AfterSteps | None = None) -> Progress:
    """The engine's one door: `request` done with the models of `pairs`, as data. The decoder it needs (started,
    the live one or one resumed from the snapshot, or going on with a follow-up turn), then up to `request.steps`
    steps, each under the pair's lock (other sessions' steps interleave), recording the run's text after each;
    then the snapshot, and the decoder kept live unless its run is over. A step that fails leaves the decoder half
    way through it: no snapshot then, the steps before it still come back.

    `after_steps(pair, request, progress)`, when given, runs once the steps are taken, where the models are: the
    caller's own step (the sessions room reads this device's kept costs there), handed in because the engine reads
    no measurement."""
    progress, started = Progress(), time.perf_counter()
    pair = None
    try:
        if isinstance(request, FollowUp):  # refused before the live decoder is taken
            check_prompt(request.turns[-1])
        prepared = prepare(pairs, request.settings, request.prompt if isinstance(request, StartRun) else None)
        pair = prepared.pair
        decoder = _decoder_for(prepared, request, progress)
        run = decoder.run
        for _ in range(request.steps):
            if decoder.done:
                break
            with prepared.lock:
                FAULTS.raise_if_armed("step", run.prompt)
                step = decoder.step()  # a failure leaves the decoder half way: no snapshot, the session fails
            progress.steps.append(RecordedStep(step, run.text, run.finished))
        progress.snapshot = decoder.snapshot()
        if not decoder.done:
            LIVE.keep(progress.snapshot.fingerprint, decoder)
    except (UserError, RequestError) as exc:
        progress.error = str(exc)
    except Exception as exc:  # a broken model must not take the app down: this one request fails, and says so
        progress.error, progress.failed = one_line(exc), True
    progress.seconds = time.perf_counter() - started
    if after_steps is not None and pair is not None and progress.steps:
        after_steps(pair, request, progress)
    return progress


def _decoder_for(prepared: Prepared, request: Request, progress: Progress) -> Decoder:
    """The decoder `request` goes on with, under the pair's lock: a new run prefilled, the live decoder at the
    snapshot's state (or one resumed from it: one prefill), or that one going on with a follow-up turn; a new run's
    header in `progress`."""
    with prepared.lock:
        prefilling = time.perf_counter()
        if isinstance(request, StartRun):
            decoder = prepared.decoder()
            FAULTS.raise_if_armed("prefill", request.prompt)
            run = decoder.start(prepared.ids, prepared.settings.max_new_tokens, request.prompt)
        else:
            decoder = _resumed(prepared, request.snapshot)
            if isinstance(request, FollowUp):
                run = _continued(prepared, decoder, request.turns)
        progress.prefill_seconds = time.perf_counter() - prefilling
    progress.load_seconds = prepared.load_seconds
    if not isinstance(request, Advance):
        progress.run = _header(run)
    return decoder


def _resumed(prepared: Prepared, snapshot: DecoderSnapshot) -> Decoder:
    """The live decoder at the snapshot's state, or one resumed from it (one prefill); under the pair's lock."""
    decoder = LIVE.take(snapshot.fingerprint)
    if decoder is None:
        options = DecoderOptions.from_record(snapshot.options)
        prepared.pairs.check_decision_model(options.decision_model)
        decoder = resume(prepared.pair, snapshot, load_decision_model_for(options))
    return decoder


def _continued(prepared: Prepared, decoder: Decoder, turns: tuple[str, ...]) -> RunTrace:
    """The follow-up turn's run: the conversation's tokens no forward has read, after the finished answer."""
    message = turns[-1]  # checked by serve, before the live decoder was taken
    messages = []
    for user in turns[:-1]:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": "..."}]
    messages.append({"role": "user", "content": message})
    try:
        extra = follow_up_ids(prepared.pair.tokenizer, messages, decoder.run.new_token_ids,
                              prepared.pair.eos_token_ids)
    except Exception as exc:
        raise UserError(f"cannot go on with this conversation ({one_line(exc)})") from exc
    FAULTS.raise_if_armed("prefill", message)
    return decoder.continue_with(extra, prepared.settings.max_new_tokens, message)


def _header(run: RunTrace) -> RunTrace:
    """The run without its steps: what a new run's page needs before its first step."""
    return RunTrace(method=run.method, config=dict(run.config), pair=run.pair, draft_label=run.draft_label,
                    lossless=run.lossless, prompt=run.prompt, prompt_ids=list(run.prompt_ids),
                    new_token_ids=list(run.new_token_ids), text=run.text, seconds=run.seconds,
                    finished=run.finished, device=run.device)
