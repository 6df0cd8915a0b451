"""Sampling is lossless: committed tokens are distributed exactly as the target's own samples.

A tiny vocabulary (4 tokens) makes the exact joint distribution of the first two committed tokens computable
(16 cells). A chi-square test at alpha = 1e-3 with 10,000 samples detects a total-variation error of 0.03 with
probability ~0.85 even when the error is spread evenly over all cells (non-centrality 4 n TV^2 = 36 on 15 degrees
of freedom), and almost surely when it is concentrated on a few cells, as real bugs are; fixed seeds make the
outcome reproducible. A deliberately biased method must fail the same test.
"""
import itertools
from dataclasses import asdict

import pytest
import torch
from scipy.stats import chisquare
from test_greedy_identity import recycle_decoder

from dynasd.decoders import make_decoder
from dynasd.models import ModelPair, tiny_llama, tiny_tokenizer
from dynasd.options import DecoderOptions
from dynasd.sampling import Draws, SamplingConfig, draw_candidates, logits_to_probs, mcss_walk
from dynasd.tree import ROOT

VOCAB = 4
SAMPLES = 10_000
PROMPT = [1]  # one token: nothing to prefill, so a run is one or two steps


def unrelated_pair(device: str = "cpu") -> ModelPair:
    """Target and draft with unrelated weights, so q is far from p and rejections are common."""
    dev = torch.device(device)
    return ModelPair(name="tiny-v4", target=tiny_llama(VOCAB, seed=44, layers=1).to(dev),
                     draft=tiny_llama(VOCAB, seed=45, layers=1).to(dev),
                     tokenizer=tiny_tokenizer(), draft_label="unrelated tiny draft", device=dev,
                     dtype=torch.float32, eos_token_ids=frozenset())


@pytest.fixture(scope="module")
def small_pair():
    return unrelated_pair()


def exact_first_two(pair, cfg: SamplingConfig, prompt: list[int] = PROMPT) -> torch.Tensor:
    def next_probs(ids: list[int]) -> torch.Tensor:
        logits = pair.target(torch.tensor([ids], device=pair.device)).logits[0, -1]
        return logits_to_probs(logits, cfg).float().cpu()

    with torch.inference_mode():
        first = next_probs(prompt)
        joint = torch.zeros(VOCAB, VOCAB)
        for x in range(VOCAB):
            joint[x] = first[x] * next_probs(prompt + [x])
    return joint.flatten()


def sampled_first_two(pair, cfg, method, options, samples=SAMPLES, prompt: list[int] = PROMPT) -> torch.Tensor:
    return sampled_first_two_of(
        lambda seed: make_decoder(pair, DecoderOptions(method=method, seed=seed, **asdict(cfg), **options)),
        samples, prompt)


def sampled_first_two_of(decoder_for_seed, samples=SAMPLES, prompt: list[int] = PROMPT) -> torch.Tensor:
    counts = torch.zeros(VOCAB * VOCAB)
    for seed in range(samples):
        run = decoder_for_seed(seed).generate(prompt, 2)
        a, b = run.new_token_ids
        counts[a * VOCAB + b] += 1
    return counts


def assert_matches(counts: torch.Tensor, exact: torch.Tensor) -> None:
    n = counts.sum()
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    keep = exact > 0
    assert counts[~keep].sum() == 0, "sampled a token the target gives probability 0"
    stat, p_value = chisquare(counts[keep].numpy(), (exact[keep] / exact[keep].sum() * n).numpy())
    print(f"TV={tv:.4f} chi2={stat:.1f} p={p_value:.4g}")
    assert p_value > 1e-3, f"distribution differs from the target's (TV {tv:.4f}, p {p_value:.2e})"
    assert tv < 0.03


CASES = [
    ("sd", dict(gamma=2), SamplingConfig(temperature=1.0)),
    ("sd", dict(gamma=2), SamplingConfig(temperature=0.8, top_p=0.8)),
    ("mcsd", dict(k_config=(3, 2), with_replacement=True), SamplingConfig(temperature=1.0)),
    ("mcsd", dict(k_config=(3, 1)), SamplingConfig(temperature=0.9, top_k=2, top_p=0.95)),  # 3 siblings, 2 tokens
    ("ti-mcsd", dict(width=1, depth=2), SamplingConfig(temperature=1.0)),
]


@pytest.mark.slow
@pytest.mark.parametrize("method,options,cfg", CASES, ids=[f"{m}-{o}-{c}" for m, o, c in CASES])
def test_first_two_tokens_follow_the_target_distribution(small_pair, method, options, cfg):
    assert_matches(sampled_first_two(small_pair, cfg, method, options), exact_first_two(small_pair, cfg))


@pytest.mark.slow
def test_a_tree_of_draws_follows_the_target_distribution_on_every_device(device):
    """The mcsd tree (3 siblings, then 2) at T = 1 on each device under test: the draws, the residuals and the walk
    run where the models are."""
    pair = unrelated_pair(device)
    cfg = SamplingConfig(temperature=1.0)
    assert_matches(sampled_first_two(pair, cfg, "mcsd", dict(k_config=(3, 2))), exact_first_two(pair, cfg))


@pytest.mark.slow
def test_a_draft_blind_to_half_the_vocabulary_stays_lossless(small_pair):
    """q is zero on tokens 1 and 3 (a reduced output layer, SubsetHead): the residual must supply them."""
    from dynasd.models import SubsetHead

    draft = tiny_llama(VOCAB, seed=45, layers=1)
    draft.lm_head = SubsetHead(draft.lm_head.weight, [0, 2])
    pair = ModelPair(name="tiny-v4-subset", target=small_pair.target, draft=draft, tokenizer=small_pair.tokenizer,
                     draft_label="half-vocabulary draft", device=torch.device("cpu"), dtype=torch.float32,
                     eos_token_ids=frozenset())
    cfg = SamplingConfig(temperature=1.0)
    assert_matches(sampled_first_two(pair, cfg, "mcsd", dict(k_config=(2, 1))), exact_first_two(pair, cfg))


# The last token of this prompt occurred before, so prompt lookup proposes [2, 3, 1] at the first step (one-hot q);
# in a 4-token vocabulary it fires at most later steps too.
LOOKUP_PROMPT = [1, 2, 3, 1]
LOOKUP_CASES = [
    ("sd", dict(gamma=2, lookup=3, lookup_ngram=1), SamplingConfig(temperature=1.0)),
    ("mcsd", dict(k_config=(3, 1), lookup=2, lookup_ngram=1), SamplingConfig(temperature=0.8, top_p=0.9)),
]


@pytest.mark.slow
@pytest.mark.parametrize("method,options,cfg", LOOKUP_CASES, ids=[f"{m}-{o}-{c}" for m, o, c in LOOKUP_CASES])
def test_prompt_lookup_keeps_the_target_distribution(small_pair, method, options, cfg):
    run = make_decoder(small_pair, DecoderOptions(method=method, **asdict(cfg), **options)).generate(LOOKUP_PROMPT, 2)
    assert run.steps[0].nodes[0].origin == "lookup"  # the case exercises what it claims to
    counts = sampled_first_two(small_pair, cfg, method, options, prompt=LOOKUP_PROMPT)
    assert_matches(counts, exact_first_two(small_pair, cfg, LOOKUP_PROMPT))


# Token recycling alone, and joined with the draft's tree and prompt lookup in one verify: in a 4-token vocabulary
# the sources propose the same token under one parent all the time, so the merged nodes are exercised too.
RECYCLE_CASES = [
    ("recycle", (2, 1), dict(), SamplingConfig(temperature=1.0)),
    ("recycle", (3, 2), dict(), SamplingConfig(temperature=0.8, top_k=3)),
    ("mcsd", (2, 1), dict(recycle=(2, 1)), SamplingConfig(temperature=1.0)),
    ("mcsd", (2, 1), dict(recycle=(2, 2), lookup=2, lookup_ngram=1), SamplingConfig(temperature=0.9, top_p=0.9)),
    ("mcsd", (3, 1), dict(recycle=(1, 1), with_replacement=True), SamplingConfig(temperature=1.0)),
]


@pytest.mark.slow
@pytest.mark.parametrize("method,branching,options,cfg", RECYCLE_CASES,
                         ids=[f"{m}-{b}-{o}-{c}" for m, b, o, c in RECYCLE_CASES])
def test_token_recycling_keeps_the_target_distribution(small_pair, method, branching, options, cfg):
    run = recycle_decoder(small_pair, method, branching, options, cfg).generate(LOOKUP_PROMPT, 2)
    assert any(n.origin == "recycled" for n in run.steps[0].nodes)  # the case exercises what it claims to
    counts = sampled_first_two_of(lambda seed: recycle_decoder(small_pair, method, branching, options, cfg, seed),
                                  prompt=LOOKUP_PROMPT)
    assert_matches(counts, exact_first_two(small_pair, cfg, LOOKUP_PROMPT))


@pytest.mark.slow
def test_the_test_detects_a_wrong_residual(small_pair, monkeypatch):
    """A mutation: after a rejection the walk goes on with p itself instead of norm(max(p - q, 0)). With recycled
    and drafted candidates in one tree the same test must catch it."""
    import dynasd.sampling

    monkeypatch.setattr(dynasd.sampling, "residual", lambda p, q: p)
    cfg = SamplingConfig(temperature=1.0)
    counts = sampled_first_two_of(lambda seed: recycle_decoder(small_pair, "mcsd", (2, 1), dict(recycle=(2, 1)),
                                                               cfg, seed), samples=4000, prompt=LOOKUP_PROMPT)
    with pytest.raises(AssertionError):
        assert_matches(counts, exact_first_two(small_pair, cfg, LOOKUP_PROMPT))


@pytest.mark.slow
def test_the_test_detects_a_lossy_method(small_pair):
    """ti-mcsd with two target roots picks the longer chain: biased, and the same test must say so."""
    cfg = SamplingConfig(temperature=1.0)
    counts = sampled_first_two(small_pair, cfg, "ti-mcsd", dict(width=2, depth=2), samples=4000)
    with pytest.raises(AssertionError):
        assert_matches(counts, exact_first_two(small_pair, cfg))


# -- the acceptance walk alone, on synthetic distributions (fast, many samples) ----------------------------------

def walk_output_distribution(p_root, q_root, k, without_replacement, samples, seed=0) -> torch.Tensor:
    """Draw k candidates from q, run MCSS one level deep, and count the committed token."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(p_root))
    for _ in range(samples):
        if without_replacement:
            races = torch.empty_like(q_root).exponential_(generator=gen)
            kids = torch.topk(q_root / races, k).indices.tolist()
        else:
            kids = torch.multinomial(q_root, k, replacement=True, generator=gen).tolist()
        draws = {ROOT: [Draws(list(range(k)), q_root, without_replacement)]}
        result = mcss_walk(ROOT, lambda n: draws.get(n, []), kids, lambda n: p_root, gen)
        token = kids[result.path[0]] if result.path else int(torch.multinomial(result.final_probs, 1,
                                                                              generator=gen))
        counts[token] += 1
    return counts


@pytest.mark.parametrize("without_replacement", [True, False])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_mcss_one_level_is_exact(without_replacement, k):
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = torch.tensor([0.1, 0.1, 0.3, 0.2, 0.2, 0.1])
    counts = walk_output_distribution(p, q, k, without_replacement, samples=6000, seed=k)
    stat, p_value = chisquare(counts[:5].numpy(), (p[:5] * counts.sum()).numpy())
    assert counts[5] == 0 and p_value > 1e-4, (counts, p_value)


def test_mcss_walk_detects_a_wrong_q():
    """Testing candidates from q against the wrong q (a classic bug) shifts the output: the check catches it."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = torch.tensor([0.1, 0.1, 0.3, 0.2, 0.2, 0.1])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    for _ in range(6000):
        kid = int(torch.multinomial(q, 1, generator=gen))
        wrong_q = torch.full_like(q, 1 / 6)
        result = mcss_walk(ROOT, lambda n: [Draws([0], wrong_q, False)] if n == ROOT else [], [kid], lambda n: p,
                           gen)
        counts[kid if result.path else int(torch.multinomial(result.final_probs, 1, generator=gen))] += 1
    _, p_value = chisquare(counts[:5].numpy(), (p[:5] * counts.sum()).numpy())
    assert p_value < 1e-4 or counts[5] > 0


def test_warping_is_identical_for_target_and_draft():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    cfg = SamplingConfig(temperature=0.7, top_k=3, top_p=0.9)
    probs = logits_to_probs(logits, cfg)
    assert torch.isclose(probs.sum(), torch.tensor(1.0))
    assert (probs[0, [3, 4]] == 0).all()          # outside the top-3
    kept = probs[0] > 0
    scaled = torch.softmax(logits[0] / 0.7, -1)
    assert torch.allclose(probs[0][kept], scaled[kept] / scaled[kept].sum())


@pytest.mark.parametrize("replacement", [True, False])
def test_candidates_are_drawn_in_sequential_order(replacement):
    """Pairs (first, second) follow q(a) q(b) with replacement, q(a) q(b) / (1 - q(a)) without."""
    q = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    rows = 40_000
    picks = draw_candidates(q.expand(rows, -1).contiguous(), 2, replacement, torch.Generator().manual_seed(1))
    counts = torch.bincount(picks[:, 0] * 5 + picks[:, 1], minlength=25).float()
    expected = torch.zeros(25)
    for a, b in itertools.product(range(5), range(5)):
        if replacement:
            expected[a * 5 + b] = q[a] * q[b]
        elif a != b:
            expected[a * 5 + b] = q[a] * q[b] / (1 - q[a])
    keep = expected > 0
    assert counts[~keep].sum() == 0
    _, p_value = chisquare(counts[keep].numpy(), (expected[keep] * rows).numpy())
    assert p_value > 1e-3


def test_rows_without_enough_mass_get_distinct_padding():
    q = torch.tensor([[0.0, 0.6, 0.0, 0.4, 0.0]])
    for seed in range(20):
        picks = draw_candidates(q, 4, False, torch.Generator().manual_seed(seed))[0].tolist()
        assert sorted(picks[:2]) == [1, 3] and len(set(picks)) == 4
