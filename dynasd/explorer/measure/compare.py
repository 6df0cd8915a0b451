"""Compare: every method on one prompt, measured so that load on the machine falls on all of them alike.

Why interleaved: run one after another, a method that ran while another process was busy reads slow and one that
ran after it reads fast (under background load ar read 64.2 tokens/s and the peer 0.7; on a quiet machine three
Compares of one prompt gave pld 3.18x, 1.49x and 1.93x). So, as `dynasd bench` rotates its methods prompt by
prompt, Compare runs its methods round-robin in short chunks of steps: each round gives every unfinished method one
chunk of about CHUNK_S seconds, the order rotating from round to round, until every run is finished.

Why a ratio against ar, paired round by round: absolute tokens / s move with whatever else the cores do (15%
between two quiet Compares, 3x while a browser drew on the same cores), and both runs of a ratio move together when
they are timed side by side. So every round also times ar: its own run while it lasts, then ar run again from the
prompt only as the round's reference (a `Chunk.repeat`), and a method's speed-up is its tokens / s against ar's in
the same rounds (`paired_ratio`), its range a seeded bootstrap over those rounds (over fewer than SMALL_SAMPLE,
Student's t: a bootstrap of a handful of pairs is narrower than their spread warrants): load that came and went
widens the range instead of crowning a winner. The range is this Compare's: a shared machine's own speed drifts over
minutes, and every ratio with it, so a later Compare can land outside it (docs/benchmarks.md). A method finished
early with less than MIN_TIMED_S of timed steps runs again from the prompt while others are still running
(`CompareState.repeats`, timed only, as ar's reference is): a fast method's whole run is a few tenths of a second,
and two Compares that timed pld over 0.7 s each read 1.09x and 0.89x. A method's own tokens / s (its steps' own
time, never the prefill) and its range over its chunks are kept beside it, second. Each chunk also records this
process's CPU time over its call, so the ratio can be read by CPU time too: a cross-check that other work on the
same cores cannot move in the same way. The load average is recorded at every round; above the threads the
measurement used, the result says it was measured on a busy machine.

The peer (transformers' assisted generation, peer.py) is one `generate` call that cannot be cut into steps: whole
peer runs are interleaved with the rounds instead (PEER_RUNS of them, spread over the rounds), each paired with ar's
chunks in the rounds on either side of it, and its range is Student's t over those few pairs.

Everything here is data: `CompareState` goes into a round and comes out of it, so that on a ZeroGPU Space each round
is one GPU call in a forked process (ui/gpu.py) and elsewhere the same function runs in place; `compare_result`
turns a state into `CompareRow`s (numbers, not display strings) and `verdict` says what they show.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import torch

from ...acceptance import acceptance_of
from ...decoders.snapshot import DecoderSnapshot
from ...options import METHODS
from ...trace import RunTrace, StepTrace
from .. import engine
from ..costs.cost import Conditions, check_kept_costs, load_average
from ..failures import SessionFailed, failed_during
from ..inputs import Settings, UserError, check_methods
from .measured_here import PROMPT_KEPT_CHARS, KeptCompare, Measured, keep_compare, now_utc, prompt_key
from .peer import PEER_LABEL, PeerRun, run_peer

CHUNK_S = 0.2             # a method's turn in a round lasts about this long (from its own last chunk's step time)
MIN_TIMED_S = 2.0         # a method's timed steps, its repeats included, before it stops running again
FIRST_CHUNK_STEPS = 2     # the first turn, before any step time is known
MAX_CHUNK_STEPS = 16
PEER_RUNS = 3             # whole peer runs, spread over the rounds
PEER_EVERY = 3            # rounds between two peer runs (the first after the first round)
RANGE_RESAMPLES = 400
RANGE_SHARE = 0.90        # a rate's range: the middle 90% of its bootstrap
SMALL_SAMPLE = 8          # fewer pairs than this: a ratio's range from Student's t, not a bootstrap
# Student's t, two-sided 90% (its 0.95 quantile), by degrees of freedom (pairs - 1) below SMALL_SAMPLE - 1.
STUDENT_T_90 = {2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943}


@dataclass(frozen=True)
class Chunk:
    """One method's turn in one round: the tokens its steps committed and their own seconds; the CPU time this
    process spent over the whole call and the call's wall time (None where the models are not on a CPU, or the
    call prefilled a prompt); `repeat`: the method run again from the prompt only to be timed, its own run
    finished (ar's to time the round against, another's to time it longer)."""

    method: str
    round: int
    tokens: int
    seconds: float
    cpu_seconds: float | None = None
    call_seconds: float | None = None
    repeat: bool = False


@dataclass
class MethodRun:
    """One method's run so far, as data between rounds: the run on record and the decoder state it goes on from."""

    method: str
    run: RunTrace | None = None
    snapshot: DecoderSnapshot | None = None
    prefill_seconds: float = 0.0
    last_step_s: float = 0.0

    @property
    def done(self) -> bool:
        return self.run is not None and bool(self.run.finished)


@dataclass
class CompareState:
    """A Compare in progress, all of it data (it travels to a GPU process and back at every round)."""

    settings: Settings
    prompt: str
    methods: tuple[str, ...]
    runs: dict[str, MethodRun] = field(default_factory=dict)
    repeats: dict[str, MethodRun] = field(default_factory=dict)  # a method again from the prompt, timed only
    chunks: list[Chunk] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)   # the 1-minute load average around each round
    threads: int = 1
    rounds: int = 0
    peers: list[PeerRun] = field(default_factory=list)
    peer_rounds: list[int] = field(default_factory=list)  # the round after which each peer run ran
    peer_error: str = ""

    @property
    def finished(self) -> bool:
        return all(self.runs.get(m) is not None and self.runs[m].done for m in self.methods)

    @property
    def complete(self) -> bool:
        """Every method finished and no peer run still to come: the Compare's last state."""
        return self.finished and not self.peer_due()

    def order(self, round_index: int) -> list[str]:
        """The methods' order in a round: rotated by one each round (as `dynasd bench` rotates per prompt)."""
        shift = round_index % len(self.methods)
        return list(self.methods[shift:] + self.methods[:shift])

    def timed_s(self, method: str) -> float:
        """The seconds of `method`'s steps timed so far, its own run's and its repeats'."""
        return sum(c.seconds for c in self.chunks if c.method == method)

    def repeats_now(self, method: str) -> bool:
        """Whether `method`, its own run finished, runs again this round: ar while any other method is unfinished
        (every round has an ar chunk to pair with), another while it has less than MIN_TIMED_S timed and some
        other method is unfinished (measured longer without adding a round: the slowest method sets how many)."""
        others_left = any(not r.done for m, r in self.runs.items() if m != method)
        return others_left and (method == "ar" or self.timed_s(method) < MIN_TIMED_S)

    def peer_due(self) -> bool:
        """Whether a whole peer run goes after the round just run: after the first, then every PEER_EVERY rounds,
        PEER_RUNS in all; and one at the end when the Compare was too short for any."""
        if self.peer_error or len(self.peers) >= PEER_RUNS:
            return False
        if self.finished and not self.peers:
            return True
        return self.rounds >= 1 and (self.rounds - 1) % PEER_EVERY == 0 and self.rounds not in self.peer_rounds


def new_compare(settings: Settings, prompt: str, methods: tuple[str, ...] = METHODS) -> CompareState:
    """A Compare of `methods` (each option checked before any model runs: a UserError names the method)."""
    settings = settings.normalised()
    check_methods(settings, methods)
    return CompareState(settings, prompt, tuple(methods), runs={m: MethodRun(m) for m in methods})


def chunk_steps(method_run: MethodRun) -> int:
    """Steps for a method's next turn: about CHUNK_S of its own last step time, FIRST_CHUNK_STEPS at first."""
    if method_run.last_step_s <= 0:
        return FIRST_CHUNK_STEPS
    return max(1, min(MAX_CHUNK_STEPS, round(CHUNK_S / method_run.last_step_s)))


def _raise(progress: engine.Progress, method: str) -> None:
    if progress.failed:
        raise SessionFailed(failed_during(f"the {method} run", progress.error))
    if progress.error:
        raise UserError(f"{method}: {progress.error}")


def _absorb(method_run: MethodRun, progress: engine.Progress) -> list[StepTrace]:
    if progress.run is not None:
        method_run.run, method_run.prefill_seconds = progress.run, progress.prefill_seconds
    run = method_run.run
    steps = []
    for recorded in progress.steps:
        step = recorded.step
        run.steps.append(step)
        run.new_token_ids += step.committed
        run.text, run.finished = recorded.text, recorded.finished
        run.seconds += step.seconds
        steps.append(step)
    if progress.snapshot is not None:
        method_run.snapshot = progress.snapshot
    if steps:
        method_run.last_step_s = sum(s.seconds for s in steps) / len(steps)
    return steps


def _chunk_of(pairs, state: CompareState, method_run: MethodRun, on_cpu: bool,
              repeat: bool = False) -> Chunk:
    """One chunk of `method_run`'s steps (its first starts the run), timed: its steps' own seconds, and where the
    models are on a CPU and the call prefilled nothing, this process's CPU time and the call's wall time."""
    method = method_run.method
    steps = chunk_steps(method_run)
    starts = method_run.run is None
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    settings = replace(state.settings, method=method)
    progress = engine.serve(pairs, engine.StartRun(settings, state.prompt, steps) if starts else
                            engine.Advance(settings, method_run.snapshot, steps))
    cpu_s, call_s = time.process_time() - cpu_started, time.perf_counter() - wall_started
    _raise(progress, method)
    taken = _absorb(method_run, progress)
    if not repeat:
        check_kept_costs(pairs.get(state.settings.normalised()), taken)
    timed = on_cpu and not starts
    return Chunk(method, state.rounds, sum(len(s.committed) for s in taken), sum(s.seconds for s in taken),
                 cpu_s if timed else None, call_s if timed else None, repeat)


def compare_round(pairs, state: CompareState, load: Callable[[], float | None] = load_average) -> CompareState:
    """One round: every unfinished method takes one chunk of steps, in this round's order (a StartRun for
    its first, an Advance from its snapshot after: engine.serve), each chunk's steps checked against this device's kept
    costs as a session's are, and the load average is read before and after. A method whose own run is finished
    runs again from the prompt in its place in the order while `repeats_now` says so (ar: so that every round has an
    ar chunk to pair with; another: until it is timed for MIN_TIMED_S)."""
    state = replace(state, runs={m: replace(r) for m, r in state.runs.items()}, chunks=list(state.chunks),
                    loads=list(state.loads), repeats={m: replace(r) for m, r in state.repeats.items()})
    pairs.check_decision_model(state.settings.decision_model)  # the server's policy, before any model loads
    on_cpu = pairs.get(state.settings.normalised()).device.type == "cpu"
    before = load()
    repeating = {m for m in state.methods if state.runs[m].done and state.repeats_now(m)}  # at the round's start
    for method in state.order(state.rounds):
        method_run = state.runs[method]
        if not method_run.done:
            state.chunks.append(_chunk_of(pairs, state, method_run, on_cpu))
        elif method in repeating:
            if method not in state.repeats or state.repeats[method].done:
                state.repeats[method] = MethodRun(method)
            state.chunks.append(_chunk_of(pairs, state, state.repeats[method], on_cpu, repeat=True))
    state.loads += [x for x in (before, load()) if x is not None]
    state.threads = torch.get_num_threads()
    state.rounds += 1
    return state


def with_peer(state: CompareState, peer: PeerRun | None, why_not: str,
              load: Callable[[], float | None] = load_average) -> CompareState:
    """The state with one more whole peer run (or the reason there is none, which ends the peer's runs)."""
    loaded = load()
    return replace(state, peers=state.peers + ([peer] if peer is not None else []),
                   peer_rounds=state.peer_rounds + [state.rounds], peer_error=why_not if peer is None else "",
                   loads=state.loads + ([loaded] if loaded is not None else []))


def interleaved(state: CompareState, run_round: Callable[[CompareState], CompareState],
                run_peer: Callable[[], tuple[PeerRun | None, str]] | None) -> Iterator[CompareState]:
    """Rounds until every method is finished, a whole peer run after the rounds `peer_due` names; yields the state
    after each, so the table grows as results come. `run_round` and `run_peer` are where the model work runs (in
    place, or one GPU call each on ZeroGPU)."""
    while not state.finished:
        state = run_round(state)
        yield state
        if run_peer is not None and state.peer_due():
            state = with_peer(state, *run_peer())
            yield state
    while run_peer is not None and state.peer_due():  # a Compare too short for any peer run between rounds
        state = with_peer(state, *run_peer())
        yield state


def run_compare(pairs, settings: Settings, prompt: str, methods: tuple[str, ...] = METHODS,
                peer: bool = True, load: Callable[[], float | None] = load_average) -> Iterator[CompareState]:
    """`interleaved` in this process (the CLI, the tests, a CPU app through ui/gpu.py)."""
    def one_peer() -> tuple[PeerRun | None, str]:
        try:
            return run_peer(pairs, settings, prompt), ""
        except UserError as exc:
            return None, str(exc)

    return interleaved(new_compare(settings, prompt, methods), lambda s: compare_round(pairs, s, load),
                       one_peer if peer else None)


# -- what a Compare measured -------------------------------------------------------------------------------------

def rate_range(parts: list[tuple[int, float]], resamples: int = RANGE_RESAMPLES) -> tuple[float, float]:
    """The middle RANGE_SHARE of the tokens / s of `parts` (tokens, seconds) drawn again with replacement (a
    bootstrap, seeded: the same parts give the same range); fewer than 3 timed parts give the lowest and highest
    of their own rates (one part: its one rate, a range that says nothing of the noise: `verdict` knows)."""
    timed = [(t, s) for t, s in parts if s > 0]
    if len(timed) < 3:
        rates = [t / s for t, s in timed] or [0.0]
        return min(rates), max(rates)
    draw = random.Random(0)
    rates = []
    for _ in range(resamples):
        picked = [timed[draw.randrange(len(timed))] for _ in timed]
        rates.append(sum(t for t, _ in picked) / sum(s for _, s in picked))
    rates.sort()
    cut = (1 - RANGE_SHARE) / 2
    return rates[int(cut * resamples)], rates[int((1 - cut) * resamples) - 1]


@dataclass(frozen=True)
class PairedRatio:
    """A method's speed against ar from chunks paired with ar's in the same rounds (the peer: its whole runs with
    ar's chunks on either side): `ratio` over every pair, `low`-`high` the middle RANGE_SHARE of a seeded
    bootstrap over the pairs (from 3 to SMALL_SAMPLE - 1 pairs: `ratio` plus or minus Student's t times the standard
    error of the pairs' own ratios: a bootstrap of a handful of pairs is narrower than their spread warrants, as
    the peer's three whole runs showed (docs/benchmarks.md); fewer than 3 pairs: their lowest and highest own
    ratios, so one pair gives a range of one value, compared by that value), `by_cpu` the same ratio by this
    process's CPU time over the pairs that have it, at least half of them (a cross-check against other work on the
    same cores; None elsewhere), and
    `ar_tokens_per_s` ar's rate over the paired chunks: the method's rate over its own is `ratio` times it, where
    ar's rate over all its chunks (of every size and round) need not be."""

    ratio: float
    low: float
    high: float
    pairs: int
    by_cpu: float | None = None
    ar_tokens_per_s: float = 0.0

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def cpu_disagrees(self) -> bool:
        """The ratio by CPU time falls outside the range by wall time: other work on the cores moved the wall
        times of the paired chunks unevenly."""
        return self.by_cpu is not None and not self.contains(self.by_cpu)


def _rate(parts: list[tuple[int, float]]) -> float:
    seconds = sum(s for _, s in parts)
    return sum(t for t, _ in parts) / seconds if seconds > 0 else 0.0


def paired_ratio(own: list[tuple[int, float]], ar: list[tuple[int, float]],
                 own_cpu: list[float | None] | None = None, ar_cpu: list[float | None] | None = None,
                 resamples: int = RANGE_RESAMPLES) -> PairedRatio | None:
    """The ratio of `own`'s tokens / s to `ar`'s, `own[i]` and `ar[i]` (tokens, seconds) timed side by side, with
    its range (PairedRatio); None without a timed pair."""
    pairs = [(o, a) for o, a in zip(own, ar) if o[1] > 0 and a[1] > 0 and a[0] > 0]
    if not pairs:
        return None
    ratio = _rate([o for o, _ in pairs]) / _rate([a for _, a in pairs])
    each = [_rate([o]) / _rate([a]) for o, a in pairs]  # every pair's own ratio
    if len(pairs) < 3:
        low, high = min(each + [ratio]), max(each + [ratio])
    elif len(pairs) < SMALL_SAMPLE:
        half = STUDENT_T_90[len(pairs) - 1] * statistics.stdev(each) / math.sqrt(len(pairs))
        low, high = max(ratio - half, 0.0), ratio + half  # a speed is never below nothing
    else:
        draw = random.Random(0)
        ratios = []
        for _ in range(resamples):
            picked = [pairs[draw.randrange(len(pairs))] for _ in pairs]
            ratios.append(_rate([o for o, _ in picked]) / _rate([a for _, a in picked]))
        ratios.sort()
        cut = (1 - RANGE_SHARE) / 2
        low, high = ratios[int(cut * resamples)], ratios[int((1 - cut) * resamples) - 1]
    by_cpu = None
    if own_cpu is not None and ar_cpu is not None:
        timed = [((o[0], oc), (a[0], ac)) for o, a, oc, ac in zip(own, ar, own_cpu, ar_cpu)
                 if oc and ac and a[0] > 0]
        if timed and 2 * len(timed) >= len(pairs):  # a round that prefilled has no CPU time: most must have one
            by_cpu = _rate([o for o, _ in timed]) / _rate([a for _, a in timed])
    return PairedRatio(ratio, min(low, ratio), max(high, ratio), len(pairs), by_cpu, _rate([a for _, a in pairs]))


@dataclass(frozen=True)
class CompareRow:
    """One method's (or the peer's) numbers in a Compare: its speed against ar paired round by round first
    (`against_ar`; None where ar was not run), then its own tokens / s."""

    method: str
    lossless: bool
    same_text_as_ar: bool | None      # None: ar was not run, or one of the two runs is not finished yet
    tokens_per_s: float
    low: float                        # the range of tokens / s over its chunks (the peer: its whole runs)
    high: float
    parts: int                        # chunks timed (the peer: whole runs)
    tokens_per_target_forward: float
    acceptance_rate: float | None     # draft levels accepted; None for ar and for runs that drafted nothing
    per_position: tuple[float, ...]
    conditional: tuple[float, ...]
    target_forwards: int
    new_tokens: int
    prefill_s: float
    finished: bool
    peer: bool = False
    against_ar: PairedRatio | None = None

    @property
    def ratio_span(self) -> tuple[float, float]:
        """What this row's speed can be told apart by: its range against ar (ar itself: exactly 1), else its own
        tokens / s range."""
        if self.method == "ar":
            return (1.0, 1.0)
        if self.against_ar is not None:
            return (self.against_ar.low, self.against_ar.high)
        return (self.low, self.high)

    @property
    def speed(self) -> float:
        """The row's speed as the verdict ranks it: against ar where paired, else its tokens / s."""
        if self.method == "ar":
            return 1.0
        return self.against_ar.ratio if self.against_ar is not None else self.tokens_per_s


@dataclass(frozen=True)
class CompareResult:
    """A Compare's rows and the conditions it was measured in."""

    rows: list[CompareRow]
    rounds: int
    load_average: float | None       # the highest 1-minute load average seen around its rounds
    threads: int
    finished: bool
    peer_note: str = ""              # why there is no peer row, or how its runs were interleaved

    @property
    def busy(self) -> str:
        """"measured on a busy machine: load 2.7 on 2 threads", or "" when the load stayed within the threads."""
        return Conditions(self.load_average, self.threads, 0.0, 0.0, on_cpu=False).busy_because()

    @property
    def paired(self) -> bool:
        """Every method's speed is a ratio against ar paired round by round (ar was among the methods)."""
        return any(r.method == "ar" for r in self.rows)

    def load_said(self) -> str:
        load = f"load {self.load_average:.1f}" if self.load_average is not None else "load unknown"
        return f"{load} on {self.threads} thread{'s' if self.threads != 1 else ''}"

    def conditions(self) -> str:
        return f"{self.rounds} interleaved rounds; {self.load_said().replace(' on', ' at most, on', 1)}"


def _row(method: str, run: RunTrace, chunks: list[Chunk], reference: RunTrace | None,
         prefill_s: float, against_ar: PairedRatio | None = None) -> CompareRow:
    steps = run.steps
    tokens = sum(len(s.committed) for s in steps)
    forwards = sum(s.target_forwards for s in steps)
    low, high = rate_range([(c.tokens, c.seconds) for c in chunks])
    acceptance = acceptance_of(steps)
    same = None
    if reference is not None and reference.finished and run.finished:
        same = run.text == reference.text
    # Over all its chunks, its repeats' too, as its range and its ratio against ar are: its first run's steps
    # alone read up to 15% off the ratio beside them (a pld 0.94x ar's rate beside a paired 1.09x).
    return CompareRow(
        method=method, lossless=run.lossless, same_text_as_ar=same,
        tokens_per_s=_rate([(c.tokens, c.seconds) for c in chunks]), low=low, high=high, parts=len(chunks),
        tokens_per_target_forward=tokens / forwards if forwards else 0.0,
        acceptance_rate=run.summary()["acceptance_rate"] if acceptance.drafts else None,
        per_position=tuple(acceptance.per_position), conditional=tuple(acceptance.conditional),
        target_forwards=forwards, new_tokens=tokens, prefill_s=prefill_s, finished=bool(run.finished),
        against_ar=against_ar)


def _peer_row(peers: list[PeerRun], reference: RunTrace | None, against_ar: PairedRatio | None = None) -> CompareRow:
    tokens = sum(p.new_tokens for p in peers)
    seconds = sum(p.decoding_seconds for p in peers)
    forwards = sum(p.target_forwards for p in peers)
    drafted = sum(p.assistant_forwards for p in peers)
    low, high = rate_range([(p.new_tokens, p.decoding_seconds) for p in peers])
    same = None if reference is None or not reference.finished else peers[-1].text == reference.text
    return CompareRow(
        method=PEER_LABEL, lossless=True, same_text_as_ar=same,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0, low=low, high=high, parts=len(peers),
        tokens_per_target_forward=tokens / forwards if forwards else 0.0,
        acceptance_rate=sum(p.accepted_tokens for p in peers) / drafted if drafted else None,
        per_position=(), conditional=(), target_forwards=forwards // len(peers), new_tokens=tokens // len(peers),
        prefill_s=sum(p.prefill_seconds for p in peers) / len(peers), finished=True, peer=True, against_ar=against_ar)


def _ar_by_round(chunks: list[Chunk]) -> dict[int, Chunk]:
    """ar's chunk in each round: its own run's, or the reference's once that had finished."""
    return {c.round: c for c in chunks if c.method == "ar"}


def method_against_ar(chunks: list[Chunk], method: str) -> PairedRatio | None:
    """`method`'s chunks (its repeats' too) paired with ar's chunk of the same round (paired_ratio); None without
    ar."""
    ar = _ar_by_round(chunks)
    own = [c for c in chunks if c.method == method and c.round in ar]
    return paired_ratio([(c.tokens, c.seconds) for c in own], [(ar[c.round].tokens, ar[c.round].seconds) for c in own],
                        [c.cpu_seconds for c in own], [ar[c.round].cpu_seconds for c in own])


def peer_against_ar(chunks: list[Chunk], peers: list[PeerRun], peer_rounds: list[int]) -> PairedRatio | None:
    """Each whole peer run paired with ar's chunks in the rounds on either side of it (it ran after round
    `peer_rounds[i]` - 1); None without ar."""
    ar = _ar_by_round(chunks)
    own, ars = [], []
    for peer, after in zip(peers, peer_rounds):
        beside = [ar[r] for r in (after - 1, after) if r in ar]
        if beside:
            own.append((peer.new_tokens, peer.decoding_seconds))
            ars.append((sum(c.tokens for c in beside), sum(c.seconds for c in beside)))
    return paired_ratio(own, ars)


def compare_result(state: CompareState) -> CompareResult:
    """The rows of every method started so far (then the peer's), each with its speed against ar paired round by
    round where ar ran, and the conditions."""
    ar = state.runs.get("ar")
    reference = ar.run if ar is not None else None
    paired = ar is not None
    rows = [_row(m, r.run, [c for c in state.chunks if c.method == m], reference,
                 r.prefill_seconds,
                 method_against_ar(state.chunks, m) if paired and m != "ar" else None)
            for m, r in state.runs.items() if r.run is not None and r.run.steps]
    if state.peers:
        rows.append(_peer_row(state.peers, reference,
                              peer_against_ar(state.chunks, state.peers, state.peer_rounds) if paired else None))
    runs = len(state.peers)
    note = (f"no {PEER_LABEL} row: {state.peer_error}" if state.peer_error and not state.peers
            else f"{PEER_LABEL}: {runs} whole run{'s' if runs != 1 else ''} between the rounds (one generate call "
                 "cannot be cut into steps)" if state.peers else "")
    return CompareResult(rows, state.rounds, max(state.loads) if state.loads else None, state.threads,
                         state.finished, note)


def progress(state: CompareState, result: CompareResult) -> tuple[str, str]:
    """What Compare's status line says after a round, and its kind: the rounds under way (no speed: the table and
    chart are drawn once, at the end, so that drawing them does not share the cores with the measurement), or,
    once every method and the peer are done, the conditions and the verdict."""
    if not state.complete:
        started = sum(1 for m in state.methods if state.runs[m].run is not None)
        finished = sum(1 for m in state.methods if state.runs[m].done)
        peers = f"; {len(state.peers)} of {PEER_RUNS} {PEER_LABEL} runs" if state.peers else ""
        return (f"Round {result.rounds}: {started} of {len(state.methods)} methods started, {finished} finished"
                f"{peers} ({result.conditions()}). The table and chart are drawn at the end: drawing them now would "
                "share the cores with the measurement…", "info")
    done = "all methods compared" + (f"; {result.peer_note}" if result.peer_note else "")
    return f"{done[0].upper() + done[1:]} ({result.conditions()}). {verdict(result)}", "ok"


def how_long(kept: list[KeptCompare]) -> str:
    """How long a Compare takes here, said before it starts: the newest kept Compare of this machine and pair that
    recorded its time ("" when none did: the first one here says nothing it cannot know)."""
    timed = next((k for k in kept if k.seconds > 0), None)
    if timed is None:
        return ""
    return (f"about {timed.seconds:.0f} s (the last Compare here, {timed.measured_at} UTC, took "
            f"{timed.seconds:.0f} s over {timed.rounds} rounds)")


def ratio_said(row: CompareRow) -> str:
    """A row's speed against ar as the page writes it: "0.13× ar (0.12–0.14 over 9 paired rounds)"."""
    paired = row.against_ar
    if row.method == "ar":
        return "1× ar (itself)"
    if paired is None:
        return f"{row.tokens_per_s:.1f} tokens/s (ar not run: no ratio)"
    unit = "whole runs" if row.peer else "paired rounds"
    return f"{paired.ratio:.2f}× ar ({paired.low:.2f}–{paired.high:.2f} over {paired.pairs} {unit})"


def verdict(result: CompareResult) -> str:
    """Which method was fastest against ar, in this Compare's own paired ratios (tokens / s second); no winner is
    named when another row's range reaches the fastest's (within the noise: a second Compare may flip it; a row
    timed once is compared by its one value); a line when the machine was busy or the CPU time disagrees; and,
    when another method saved more target forwards, why that did not make it faster here."""
    rows = [r for r in result.rows if r.method == "ar" or r.against_ar is not None] if result.paired else result.rows
    if not rows:
        return ""
    fastest = max(rows, key=lambda r: r.speed)
    tied = [r for r in rows if r is not fastest and r.ratio_span[1] >= fastest.ratio_span[0]]
    if tied:
        names = ", ".join(f"{r.method} ({ratio_said(r)})" for r in tied[:3])
        text = (f"**No clear winner here**: {fastest.method} was fastest at {ratio_said(fastest)}, "
                f"{fastest.tokens_per_s:.1f} tokens/s, but {names} reach{'es' if len(tied) == 1 else ''} into "
                "its range: within the noise.")
    else:
        text = (f"Fastest here: **{fastest.method}**, **{ratio_said(fastest)}**, {fastest.tokens_per_s:.1f} "
                f"tokens/s, with {fastest.tokens_per_target_forward:.2f} tokens per target forward.")
        if fastest.method == "ar" and len(rows) > 1:
            runner = max((r for r in rows if r is not fastest), key=lambda r: r.speed)
            text += (f" No speculative method paid on this device (the closest: {runner.method}, "
                     f"{ratio_said(runner)}): verifying several rows and running the draft cost more time than the "
                     "target forwards they saved.")
    frugal = max(rows, key=lambda r: r.tokens_per_target_forward)
    if frugal is not fastest and frugal.tokens_per_target_forward > fastest.tokens_per_target_forward:
        text += (f" {frugal.method} needed the fewest target forwards ({frugal.tokens_per_target_forward:.2f} tokens "
                 f"each) but ran at {ratio_said(frugal)}: its forwards verified more rows and its "
                 "draft ran more, which cost more here than the forwards saved (Learn → Where would it pay? "
                 "carries this run's acceptance to other targets and a GPU).")
    off = [r for r in rows if r.against_ar is not None and r.against_ar.cpu_disagrees]
    if off:
        text += (" By this process's CPU time " + ", ".join(f"{r.method} reads {r.against_ar.by_cpu:.2f}× ar"
                                                            for r in off[:3])
                 + ", outside the range by wall time: other work on these cores slowed some chunks more than "
                 "their ar neighbours.")
    busy = result.busy
    return text + (f" **{busy[0].upper()}{busy[1:]}**: every method ran in the same rounds, so the load fell on "
                   "all of them, but their ranges are wider." if busy else "")


def kept(result: CompareResult, runs: dict[str, RunTrace], settings: Settings, prompt: str,
         seconds: float = 0.0) -> KeptCompare | None:
    """The finished Compare as what this machine measured (measured_here.py: every view that quotes a speed-up and
    the Recipe menu read it), or None when no run names its machine. The machine is the one the runs name (on
    ZeroGPU the GPU process's)."""
    machine = next(iter(runs.values())).device.partition(";")[0] if runs else ""
    if not machine:
        return None

    def measured(row: CompareRow) -> Measured:
        paired = row.against_ar
        if paired is None:
            return Measured(row.method, row.tokens_per_s, row.low, row.high)
        return Measured(row.method, row.tokens_per_s, row.low, row.high, paired.ratio, paired.low, paired.high,
                        paired.pairs)

    return KeptCompare(now_utc(), machine, settings.pair_key, settings.controls(),
                       [measured(r) for r in result.rows], busy=result.busy, prompt=prompt[:PROMPT_KEPT_CHARS],
                       prompt_key=prompt_key(prompt), load=result.load_said(), rounds=result.rounds,
                       seconds=round(seconds, 1))


def keep(result: CompareResult, state: CompareState, seconds: float = 0.0) -> None:
    """Keep a finished Compare, with how long it took (nothing when no run names its machine)."""
    measured = kept(result, {m: r.run for m, r in state.runs.items() if r.run is not None}, state.settings,
                    state.prompt, seconds)
    if measured is not None:
        keep_compare(measured)
