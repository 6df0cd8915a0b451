"""The misconception lab: the acceptance rule speculative sampling uses, beside the wrong rules learners propose,
each run many times at one position of the run on show and compared with the target's p.

Why: "why not simply resample from p after a rejection?" is best answered by drawing what that rule produces.
Every rule here decides one token from the target's p and the draft's q at one position, the q the candidates
were drawn from (k i.i.d. draws), and differs from the correct one in exactly one choice. They are rules for
sampling (temperature > 0): at temperature 0 p and q decide nothing (trace_semantics.GREEDY), so a
greedy run is told that instead.

- correct (multi-candidate speculative sampling): test each candidate with u < min(1, p′/q); after a rejection
  p′ becomes the residual norm(max(p′ − q, 0)); if all are rejected, draw from the last residual. Output ~ p.
- "on rejection, resample from p": the same, but the final draw comes from p instead of the residual.
- "on rejection, resample from q": the final draw comes from q.
- "accept whenever p′ ≥ q′ (no u)": a candidate passes iff p′(x) ≥ q(x), deterministically.
- "keep the longest accepted branch" (as ti-mcsd keeps its longest chain): every candidate is tested against the
  same p, none against a residual, and an accepted one is kept.

p and q come from the trace's record of a rejection (ResidualTrace: the largest tokens of each, the rest pooled
into one "all others" outcome), so the lab works on replayed and example traces with no model. Each rule's exact
output distribution is computed too: the sampled histogram shows the bias, the exact one gives the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...trace import RunTrace
from ...trace_semantics import GREEDY, run_rule
from ..inputs import UserError

CANDIDATES = 2                 # i.i.d. draws from q per decision (k): enough for the sibling rules to differ
DEFAULT_SAMPLES = 4000
MAX_SAMPLES = 20000
EXACT_TOLERANCE = 1e-9         # an exact distribution this close to p (total variation) is p
VISIBLE_TV = 0.1               # a bias at least this large (total variation) shows in the bars


@dataclass(frozen=True)
class Position:
    """p and q at one position of a run, over its listed tokens and one pooled "all others" outcome."""

    step: int
    tokens: list[str]
    p: np.ndarray
    q: np.ndarray


@dataclass(frozen=True)
class RuleResult:
    name: str
    correct: bool
    counts: np.ndarray          # samples per outcome
    exact: np.ndarray           # the rule's exact output distribution
    sampled_tv: float           # total variation between the sampled frequencies and p
    exact_tv: float             # between the exact distribution and p

    @property
    def verdict(self) -> str:
        if self.exact_tv <= EXACT_TOLERANCE:
            return "exact: its output is distributed as p"
        return f"biased: its output is off p by {self.exact_tv:.3f} (total variation) however many samples"


SHORT_NAMES = ("correct", "resample from p", "resample from q", "no u", "longest branch")  # the figure's panels
RULES = ("correct: residual after each rejection", "on rejection, resample from p", "on rejection, resample from q",
         "accept whenever p′ ≥ q′ (no u)", "keep the longest accepted branch (every candidate against p)")


def position_of(run: RunTrace | None, index: int) -> Position:
    """p and q at the rejection recorded in step `index`, or in the nearest step that has one."""
    if run is None or not run.steps:
        raise UserError("nothing to sample yet: press Step or Run (or replay the example 'sd-sampled') first")
    with_record = [s.index for s in run.steps if s.residual is not None]
    if not with_record:
        why = (f"this run is greedy. {GREEDY.statement} No p/q rule decides it, so the lab has nothing to compare"
               if run_rule(run) is GREEDY else "this run has no rejection recorded with p and q")
        raise UserError(f"{why}: the lab needs a sampled run (temperature above 0) that rejected a candidate; "
                        "replay the example 'sd-sampled'")
    index = int(index or 0)
    chosen = min(with_record, key=lambda i: (abs(i - index), i))
    record = run.steps[chosen].residual
    p = np.array(record.p + [0.0], dtype=np.float64)
    q = np.array(record.q + [0.0], dtype=np.float64)
    p[-1], q[-1] = max(0.0, 1.0 - p[:-1].sum()), max(0.0, 1.0 - q[:-1].sum())
    return Position(chosen, list(record.tokens) + ["(all others)"], p / p.sum(), q / q.sum())


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    left = np.maximum(p - q, 0.0)
    total = left.sum()
    return left / total if total > 0 else p


def _exact(rule: int, p: np.ndarray, q: np.ndarray, k: int = CANDIDATES) -> np.ndarray:
    """The exact output distribution of `rule` (an index into RULES) with k i.i.d. candidates from q."""
    out = np.zeros_like(p)
    reach = 1.0                 # the chance that the walk reaches the current candidate
    target = p.copy()           # p′: what the current candidate is tested against
    for _ in range(k):
        if rule == 3:
            passes = (target >= q).astype(np.float64)
        else:
            passes = np.minimum(1.0, np.divide(target, q, out=np.zeros_like(p), where=q > 0))
        out += reach * q * passes
        reach *= 1.0 - float((q * passes).sum())
        if rule != 4:           # the longest-branch rule tests every candidate against p itself
            target = _residual(target, q)
    final = {1: p, 2: q, 4: _residual(p, q)}.get(rule, target)
    return out + reach * final


def _sample(rule: int, p: np.ndarray, q: np.ndarray, samples: int, rng: np.random.Generator,
            k: int = CANDIDATES) -> np.ndarray:
    """`samples` decisions of `rule`, vectorised over samples; returns the counts per outcome."""
    n = len(p)
    chosen = np.full(samples, -1)
    target = np.broadcast_to(p, (samples, n)).copy()
    for _ in range(k):
        draws = rng.choice(n, size=samples, p=q)
        open_ = chosen < 0
        pt, qt = target[np.arange(samples), draws], q[draws]
        passed = pt >= qt if rule == 3 else rng.random(samples) * qt < pt
        take = open_ & passed
        chosen[take] = draws[take]
        if rule != 4:
            left = np.maximum(target - q, 0.0)
            totals = left.sum(axis=1, keepdims=True)
            target = np.where(totals > 0, left / np.where(totals > 0, totals, 1.0), target)
    rest = chosen < 0
    final = {1: np.broadcast_to(p, (samples, n)), 2: np.broadcast_to(q, (samples, n)),
             4: np.broadcast_to(_residual(p, q), (samples, n))}.get(rule, target)
    cumulative = np.cumsum(final[rest], axis=1)
    picks = (rng.random((int(rest.sum()), 1)) < cumulative).argmax(axis=1)
    chosen[rest] = picks
    return np.bincount(chosen, minlength=n)


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def run_lab(position: Position, samples: int = DEFAULT_SAMPLES, seed: int = 0) -> list[RuleResult]:
    """Every rule of RULES sampled `samples` times at `position` (seeded: the same figure every time)."""
    samples = int(samples)
    if not 100 <= samples <= MAX_SAMPLES:
        raise UserError(f"the number of samples must lie in [100, {MAX_SAMPLES}]")
    rng = np.random.default_rng(seed)
    results = []
    for rule, name in enumerate(RULES):
        counts = _sample(rule, position.p, position.q, samples, rng)
        exact = _exact(rule, position.p, position.q)
        results.append(RuleResult(name, rule == 0, counts, exact, total_variation(counts / samples, position.p),
                                  total_variation(exact, position.p)))
    return results


def sampling_noise(position: Position, samples: int) -> float:
    """The total variation a correct rule shows from sampling alone, on average (each outcome's frequency is off
    p by about its binomial standard deviation)."""
    p = position.p
    return 0.5 * float(np.sqrt(2 / np.pi) * np.sqrt(p * (1 - p) / samples).sum())


def clearest_step(run: RunTrace) -> int | None:
    """The step whose recorded rejection shows every wrong rule's bias best (the largest smallest exact total
    variation among the wrong rules), or None when the run has none."""
    best, best_gap = None, -1.0
    for step in run.steps:
        if step.residual is None:
            continue
        position = position_of(run, step.index)
        gap = min(total_variation(_exact(rule, position.p, position.q), position.p) for rule in range(1, len(RULES)))
        if gap > best_gap:
            best, best_gap = step.index, gap
    return best


def visible(result: RuleResult, position: Position, samples: int) -> bool:
    """Whether a wrong rule's bias shows: out of the sampling noise at this many samples (4x its mean) and large
    enough to see in the bars."""
    return result.exact_tv > max(VISIBLE_TV, 4 * sampling_noise(position, samples))


def lab_position(run: RunTrace | None, index: int, samples: int) -> Position:
    """Where the lab samples: the rejection nearest the step on show when every wrong rule's bias shows there at
    this many samples, else the run's clearest one (a position where p is nearly certain hides every bias)."""
    position = position_of(run, index)
    exact = [total_variation(_exact(rule, position.p, position.q), position.p) for rule in range(1, len(RULES))]
    if min(exact) > max(VISIBLE_TV, 4 * sampling_noise(position, samples)):
        return position
    return position_of(run, clearest_step(run))
