"""An empirical losslessness check at temperature > 0: sample the next token many times through one speculative
step from the same prefix (a different seed each time) and compare the counts with the target's own p.

A lossless method's first committed token is distributed exactly as p, so a chi-square test over p's largest
tokens (the rest pooled) should give an unremarkable p-value; ti-mcsd picks the longest of several chains, which
skews the first token toward roots that continue well, and shows as a deviation once there are enough samples.
The sampling is a plain function of a decoder factory, so the tests can feed it a deliberately biased sampler.
check_first_tokens runs the check on a model pair, for several methods at once (the app's Learn tab).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...sampling import SamplingConfig, logits_to_probs
from ..engine import prepare
from ..inputs import Settings, UserError
from ..pairs import PairCache

MIN_EXPECTED = 5.0   # chi-square's usual validity rule: every bin expects at least this many samples
MAX_BINS = 12
MAX_SAMPLES = 2000


@dataclass
class LosslessnessCheck:
    token_ids: list[int]          # the bins, most probable first; the last bin (-1) pools every other token
    expected: list[float]         # p of each bin
    observed: list[int]           # samples that fell in each bin
    samples: int
    statistic: float
    dof: int
    p_value: float
    total_variation: float        # 1/2 sum |observed/n - p| over the bins


def target_next_probs(model: torch.nn.Module, ids: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """The target's warped next-token distribution after `ids` (temperature, top-k, top-p as the decoder)."""
    with torch.inference_mode():
        device = next(model.parameters()).device
        logits = model(torch.tensor([ids], device=device)).logits[0, -1]
    return logits_to_probs(logits, sampling).float().cpu()


def chi_square_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularised upper incomplete gamma Q(dof/2, x/2)."""
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(statistic / 2.0, dtype=torch.float64)))


def check_samples(samples: list[int], probs: torch.Tensor, max_bins: int = MAX_BINS) -> LosslessnessCheck:
    """Bin `samples` over the largest tokens of `probs` (each expecting >= MIN_EXPECTED samples; the rest pooled
    as one bin) and test them against `probs` with Pearson's chi-square."""
    n = len(samples)
    if n == 0:
        raise ValueError("no samples to check")
    order = torch.argsort(probs, descending=True).tolist()
    bins = []
    for token in order[:max_bins]:
        if float(probs[token]) * n < MIN_EXPECTED:
            break
        bins.append(token)
    expected = [float(probs[t]) for t in bins]
    rest = max(0.0, 1.0 - sum(expected))
    counts: dict[int, int] = {}
    for token in samples:
        counts[token] = counts.get(token, 0) + 1
    observed = [counts.get(t, 0) for t in bins]
    if rest * n >= MIN_EXPECTED or n - sum(observed) > 0:  # samples outside the bins are never dropped
        bins.append(-1)
        expected.append(rest)
        observed.append(n - sum(observed))
    statistic = sum((o - e * n) ** 2 / (e * n) for o, e in zip(observed, expected) if e > 0)
    # a sample where p says 0 is a hard failure: infinite statistic
    if any(e <= 0 and o > 0 for o, e in zip(observed, expected)):
        statistic = float("inf")
    dof = len(bins) - 1
    return LosslessnessCheck(
        token_ids=bins, expected=expected, observed=observed, samples=n, statistic=statistic, dof=dof,
        p_value=0.0 if statistic == float("inf") else chi_square_sf(statistic, dof),
        total_variation=0.5 * sum(abs(o / n - e) for o, e in zip(observed, expected)))


def sample_first_tokens(first_token: Callable[[int], int], samples: int, seed: int = 0) -> list[int]:
    """`samples` draws of `first_token(seed)` for seeds seed, seed + 1, ..."""
    if not 1 <= samples <= MAX_SAMPLES:
        raise ValueError(f"the number of samples must lie in [1, {MAX_SAMPLES}], got {samples}")
    return [first_token(seed + i) for i in range(samples)]


def decoder_first_token(decoder, ids: list[int]) -> Callable[[int], int]:
    """One speculative step from `ids` with the decoder reseeded each time; its first committed token."""
    def first(seed: int) -> int:
        decoder.seed = seed
        decoder.start(list(ids), 1)
        return decoder.step().committed[0]
    return first


@dataclass
class FirstTokenChecks:
    """Several methods' first tokens after one prompt, each checked against the target's p."""
    checks: dict[str, LosslessnessCheck]   # by method; every check bins the same way (the bins depend on p and n)
    lossless: dict[str, bool]              # by method: whether the method claims to be lossless
    labels: dict[int, str]                 # the checked token ids' strings
    samples: int                           # per method


def check_first_tokens(pairs: PairCache, settings: Settings, prompt: str, methods: list[str],
                       samples: int) -> FirstTokenChecks:
    """The first token after `prompt`, sampled `samples` times by each of `methods` (one prefill and one step
    each, seeds from settings.seed on), against the target's own p under the settings' sampling. The parts below
    compose it, so that a caller with a time limit per model call (ui/gpu.py on ZeroGPU) can split the draws."""
    samples = checked_request(settings, samples)
    probs = target_p(pairs, settings, prompt)
    draws, lossless = {}, {}
    for method in methods:
        draws[method], lossless[method] = first_token_draws(pairs, settings, prompt, method, settings.seed, samples)
    return checks_of(pairs, settings, draws, lossless, probs)


def checked_request(settings: Settings, samples) -> int:
    """The number of samples, once the request is one the check can answer (else a UserError)."""
    if settings.temperature == 0:
        raise UserError("set the temperature above 0 (Sampling): at temperature 0 every method is greedy and "
                        "there is nothing random to compare")
    samples = int(samples)  # after the temperature's check, as the app has always said that first
    if not 1 <= samples <= MAX_SAMPLES:
        raise UserError(f"samples must lie in [1, {MAX_SAMPLES}]")
    return samples


def target_p(pairs: PairCache, settings: Settings, prompt: str) -> torch.Tensor:
    """The target's next-token distribution after `prompt` under the settings' sampling (on the host)."""
    prepared = prepare(pairs, settings, prompt)
    with prepared.lock:
        return target_next_probs(prepared.pair.target, prepared.ids, prepared.settings.options.sampling)


def first_token_draws(pairs: PairCache, settings: Settings, prompt: str, method: str, seed: int,
                      samples: int) -> tuple[list[int], bool]:
    """`samples` first tokens of `method` with seeds seed, seed + 1, ...; and whether the method is lossless."""
    prepared = prepare(pairs, settings, prompt)
    decoder = prepared.decoder(method)
    with prepared.lock:
        draws = sample_first_tokens(decoder_first_token(decoder, prepared.ids), samples, seed=seed)
    return draws, decoder.lossless


def checks_of(pairs: PairCache, settings: Settings, draws: dict[str, list[int]], lossless: dict[str, bool],
              probs: torch.Tensor) -> FirstTokenChecks:
    """Each method's draws checked against `probs`; the bins' labels from the pair's tokenizer (no model runs)."""
    checks = {method: check_samples(tokens, probs) for method, tokens in draws.items()}
    token_ids = next(iter(checks.values())).token_ids
    pair = pairs.get(settings.normalised())
    labels = dict(zip(token_ids, pair.token_strings([t for t in token_ids if t >= 0])))
    return FirstTokenChecks(checks, lossless, labels, len(next(iter(draws.values()))))
