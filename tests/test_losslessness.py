"""Sampling is lossless: committed tokens are distributed exactly as the target's own samples.

A tiny vocabulary (4 tokens) makes the exact joint distribution of the first two committed tokens computable
(16 cells). A chi-square test at alpha = 1e-3 with 10,000 samples detects a total-variation error of 0.03 with
probability ~0.85 even when the error is spread evenly over all cells (non-centrality 4 n TV^2 = 36 on 15 degrees
of freedom), and almost surely when it is concentrated on a few cells, as real bugs are; fixed seeds make the
outcome reproducible. A deliberately biased method must fail the same test.

The 10,000 runs of a case are made cheap, not fewer: one decoder is started again for each seed (start() seeds a
new generator and starts its caches and every source afresh), and the models answer every row from a table of the
contexts they have already read (ContextTable: from one short prompt in a 4-token vocabulary fewer than a hundred
contexts come back thousands of times). Each run is the run of a new decoder with that seed on the stock models;
test_the_sampling_shortcuts_change_no_run pins that down.
"""
import itertools
from dataclasses import asdict, dataclass

import pytest
import torch
from scipy.stats import chisquare
from test_greedy_identity import recycle_decoder

from dynasd.cache import Runtime, attach_runtime, runtime_of
from dynasd.decoders import Decoder, make_decoder
from dynasd.loading.models import ModelPair, tiny_llama, tiny_tokenizer
from dynasd.options import DecoderOptions
from dynasd.sampling import Draws, SamplingConfig, draw_candidates, logits_to_probs, mcss_walk
from dynasd.tree import ROOT

VOCAB = 4
SAMPLES = 10_000
PROMPT = [1]  # one token: nothing to prefill, so a run is one or two steps
ALPHA = 1e-3  # the chi-square test's level
MAX_TV = 0.03


class ContextTable:
    """A model's forward function (cache.Runtime) under which every row's output is a function of its context
    alone: the tokens the row attends to, in order. Each distinct context is run once through the model itself (one
    forward without a cache, as `exact_first_two` runs it) and looked up afterwards.

    Why: 10,000 runs of a decoder from a one-token prompt in a 4-token vocabulary meet fewer than a hundred distinct
    contexts but thousands of distinct trees, so a table of contexts leaves only the decoder's own work per run. It
    is the model's distribution at every context, so the exact distribution the tests compare with is the table's
    too. The table reads each row's context from the attention mask and the tokens the cache holds (its keys are the
    token ids), so it checks what the tree mask and the cache bookkeeping decide: a row that saw a sibling, or a
    cache that kept the wrong node, gets another context's distribution, and a position id that is not the
    context's length minus one is an error. A feature draft's rows (input embeddings, not ids) are contexts of
    embedding rows, interned by their bytes."""

    def __init__(self) -> None:
        self.outputs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.calls: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        self.embedding_ids: dict[bytes, int] = {}
        self.embeddings: list[torch.Tensor] = []

    def _symbols(self, input_ids, inputs_embeds) -> list[int]:
        if inputs_embeds is None:
            return input_ids[0].tolist()
        symbols = []
        for row in inputs_embeds[0]:
            key = row.detach().cpu().numpy().tobytes()
            if key not in self.embedding_ids:
                self.embedding_ids[key] = len(self.embeddings)
                self.embeddings.append(row.detach().clone())
            symbols.append(self.embedding_ids[key])
        return symbols

    def _output(self, model, context: tuple, embedded: bool) -> tuple[torch.Tensor, torch.Tensor]:
        key = (id(model), embedded, context)
        if key not in self.outputs:
            with torch.inference_mode():
                if embedded:
                    out = model(inputs_embeds=torch.stack([self.embeddings[s] for s in context])[None],
                                output_hidden_states=True)
                else:
                    device = next(model.parameters()).device
                    out = model(torch.tensor([context], device=device), output_hidden_states=True)
            self.outputs[key] = (out.logits[0, -1].clone(), out.hidden_states[-1][0, -1].clone())
        return self.outputs[key]

    def __call__(self, model, input_ids, attention_mask, position_ids, cache, logits_to_keep, need_hidden=False,
                 inputs_embeds=None, hidden_to_keep=0):
        """The rows' outputs, and the new symbols written to the cache as the model writes its keys and values.

        A whole call (what the cache holds, the new symbols, the mask, the positions) comes back thousands of times
        too, so the rows' outputs are looked up per call, by the bytes of its tensors (cheaper than reading them as
        nested lists); its contexts are read and checked the first time."""
        layers = cache.layers
        held = layers[0].keys[0, 0, :, 0] if layers[0].is_initialized else None  # floats equal the ids
        new = tuple(self._symbols(input_ids, inputs_embeds)) if inputs_embeds is not None else None
        call = (id(model), new, _key(held), _key(input_ids) if new is None else b"", _key(attention_mask),
                attention_mask.shape[-1], _key(position_ids), logits_to_keep, need_hidden)
        if call not in self.calls:
            cached = held.tolist() if held is not None else []
            symbols = list(new) if new is not None else input_ids[0].tolist()
            visible = (attention_mask[0, 0] == 0).tolist()
            self.calls[call] = self._rows(model, cached, symbols, visible, position_ids[0].tolist(),
                                          logits_to_keep, need_hidden, new is not None, attention_mask.device)
        ids, logits, hidden = self.calls[call]
        for index in range(len(layers)):
            cache.update(ids, ids, index)  # copies: the looked-up ids stay as they are
        return logits.clone(), hidden.clone() if hidden is not None else None  # fresh, as a model's outputs are

    def _rows(self, model, cached, new, visible, positions, logits_to_keep, need_hidden, embedded, device):
        symbols = cached + new
        logits, hidden = [], []
        for row, sees in enumerate(visible):
            context = tuple(int(symbol) for symbol, seen in zip(symbols, sees) if seen)
            if positions[row] != len(context) - 1:
                raise AssertionError(f"row {row} reads {len(context)} tokens at position {positions[row]}")
            row_logits, row_hidden = self._output(model, context, embedded)
            logits.append(row_logits)
            hidden.append(row_hidden)
        ids = torch.tensor(new, dtype=torch.float32, device=device)[None, None, :, None]
        return (ids, torch.stack(logits[-logits_to_keep:])[None],
                torch.stack(hidden)[None] if need_hidden else None)


def _key(tensor: torch.Tensor | None) -> bytes:
    """A tensor's values as bytes, a cheap dictionary key (its shape is the caller's to add where it varies)."""
    return b"" if tensor is None else tensor.cpu().numpy().tobytes()


def on_context_table(pair: ModelPair) -> ModelPair:
    """`pair`, its models (and feature draft) now answering every row from one ContextTable."""
    table = ContextTable()
    for model in (pair.target, pair.draft, pair.feature_draft):
        if model is not None:
            attach_runtime(model, Runtime(forward=table, new_cache=runtime_of(model).new_cache))
    return pair


def unrelated_pair(device: str = "cpu") -> ModelPair:
    """Target and draft with unrelated weights, so q is far from p and rejections are common."""
    dev = torch.device(device)
    return ModelPair(name="tiny-v4", target=tiny_llama(VOCAB, seed=44, layers=1).to(dev),
                     draft=tiny_llama(VOCAB, seed=45, layers=1).to(dev),
                     tokenizer=tiny_tokenizer(), draft_label="unrelated tiny draft", device=dev,
                     dtype=torch.float32, eos_token_ids=frozenset())


@pytest.fixture(scope="module")
def small_pair():
    return on_context_table(unrelated_pair())


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
    decoder = make_decoder(pair, DecoderOptions(method=method, **asdict(cfg), **options))
    return first_two_counts(decoder, samples, prompt)


def first_two_counts(decoder: Decoder, samples=SAMPLES, prompt: list[int] = PROMPT) -> torch.Tensor:
    """How often each pair of first two tokens is committed in `samples` runs of `decoder`, with seeds 0, 1, ...
    (flattened: pair (a, b) at a * VOCAB + b)."""
    counts = torch.zeros(VOCAB * VOCAB)
    for a, b in first_two_runs(decoder, samples, prompt):
        counts[a * VOCAB + b] += 1
    return counts


def first_two_runs(decoder: Decoder, samples: int, prompt: list[int]) -> list[tuple[int, int]]:
    """The first two tokens of `decoder`'s run from `prompt` with seed 0, 1, ..., samples - 1: the decoder is started
    again for each seed, as a new decoder with that seed would be."""
    runs = []
    for seed in range(samples):
        decoder.seed = seed
        runs.append(tuple(decoder.generate(prompt, 2).new_token_ids))
    return runs


@dataclass
class Fit:
    """How sampled counts compare with the exact distribution they should follow (of the first two tokens, or of
    one token)."""

    impossible: int          # samples of an outcome the exact distribution gives probability 0
    p_value: float           # Pearson's chi-square over the possible pairs
    total_variation: float


def fit(counts: torch.Tensor, exact: torch.Tensor) -> Fit:
    n = counts.sum()
    keep = exact > 0
    _, p_value = chisquare(counts[keep].numpy(), (exact[keep] / exact[keep].sum() * n).numpy())
    return Fit(impossible=int(counts[~keep].sum()), p_value=float(p_value),
               total_variation=0.5 * (counts / n - exact).abs().sum().item())


def assert_matches(counts: torch.Tensor, exact: torch.Tensor) -> None:
    result = fit(counts, exact)
    print(result)
    assert result.impossible == 0, "sampled a token the target gives probability 0"
    assert result.p_value > ALPHA, f"distribution differs from the target's ({result})"
    assert result.total_variation < MAX_TV


CASES = [
    ("sd", dict(gamma=2), SamplingConfig(temperature=1.0)),
    ("sd", dict(gamma=2), SamplingConfig(temperature=0.8, top_p=0.8)),
    ("mcsd", dict(k_config=(3, 2), with_replacement=True), SamplingConfig(temperature=1.0)),
    ("mcsd", dict(k_config=(3, 1)), SamplingConfig(temperature=0.9, top_k=2, top_p=0.95)),  # 3 siblings, 2 tokens
    ("ti-mcsd", dict(width=1, depth=2), SamplingConfig(temperature=1.0)),
]


@pytest.mark.slow(seconds=12)
@pytest.mark.parametrize("method,options,cfg", CASES, ids=[f"{m}-{o}-{c}" for m, o, c in CASES])
def test_first_two_tokens_follow_the_target_distribution(small_pair, method, options, cfg):
    """10,000 runs of the decoder, so 9-35 s of one core for each case here and below (`make test`, 2026-12-04):
    the sample size is what gives the test the power the module docstring derives."""
    assert_matches(sampled_first_two(small_pair, cfg, method, options), exact_first_two(small_pair, cfg))


@pytest.mark.slow(seconds=10)
def test_a_tree_of_draws_follows_the_target_distribution_on_every_device(device):
    """The mcsd tree (3 siblings, then 2) at T = 1 on each device under test: the draws, the residuals and the walk
    run where the models are."""
    pair = on_context_table(unrelated_pair(device))
    cfg = SamplingConfig(temperature=1.0)
    assert_matches(sampled_first_two(pair, cfg, "mcsd", dict(k_config=(3, 2))), exact_first_two(pair, cfg))


@pytest.mark.slow(seconds=11)
def test_a_draft_blind_to_half_the_vocabulary_stays_lossless(small_pair):
    """q is zero on tokens 1 and 3 (a reduced output layer, SubsetHead): the residual must supply them."""
    from dynasd.loading.models import SubsetHead

    draft = tiny_llama(VOCAB, seed=45, layers=1)
    draft.lm_head = SubsetHead(draft.lm_head.weight, [0, 2])
    pair = on_context_table(ModelPair(name="tiny-v4-subset", target=small_pair.target, draft=draft,
                              tokenizer=small_pair.tokenizer, draft_label="half-vocabulary draft",
                              device=torch.device("cpu"), dtype=torch.float32, eos_token_ids=frozenset()))
    cfg = SamplingConfig(temperature=1.0)
    assert_matches(sampled_first_two(pair, cfg, "mcsd", dict(k_config=(2, 1))), exact_first_two(pair, cfg))


# The last token of this prompt occurred before, so prompt lookup proposes [2, 3, 1] at the first step (one-hot q);
# in a 4-token vocabulary it fires at most later steps too.
LOOKUP_PROMPT = [1, 2, 3, 1]
LOOKUP_CASES = [
    ("sd", dict(gamma=2, lookup=3, lookup_ngram=1), SamplingConfig(temperature=1.0)),
    ("mcsd", dict(k_config=(3, 1), lookup=2, lookup_ngram=1), SamplingConfig(temperature=0.8, top_p=0.9)),
]


@pytest.mark.slow(seconds=10)
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


@pytest.mark.slow(seconds=11)
@pytest.mark.parametrize("method,branching,options,cfg", RECYCLE_CASES,
                         ids=[f"{m}-{b}-{o}-{c}" for m, b, o, c in RECYCLE_CASES])
def test_token_recycling_keeps_the_target_distribution(small_pair, method, branching, options, cfg):
    decoder = recycle_decoder(small_pair, method, branching, options, cfg)
    run = decoder.generate(LOOKUP_PROMPT, 2)
    assert any(n.origin == "recycled" for n in run.steps[0].nodes)  # the case exercises what it claims to
    counts = first_two_counts(decoder, prompt=LOOKUP_PROMPT)
    assert_matches(counts, exact_first_two(small_pair, cfg, LOOKUP_PROMPT))


@pytest.mark.parametrize("method,options", [
    ("mcsd", dict(k_config=(2, 1), recycle=(2, 2), lookup=2, lookup_ngram=1, temperature=0.9, top_p=0.9)),
    ("ti-mcsd", dict(width=2, depth=2, temperature=1.0)),
])
def test_the_sampling_shortcuts_change_no_run(method, options):
    """The tests above start one decoder again for every seed, on models that answer every row from a ContextTable:
    each of its runs is the run of a new decoder with that seed on the stock models, token for token (over six
    tokens, so the later steps' caches, recycled table and carried target distribution take part)."""
    stock, fast = unrelated_pair(), on_context_table(unrelated_pair())
    reused = make_decoder(fast, DecoderOptions(method=method, **options))
    fresh_runs, reused_runs = [], []
    for seed in range(60):
        fresh_runs.append(make_decoder(stock, DecoderOptions(method=method, seed=seed, **options))
                          .generate(LOOKUP_PROMPT, 6).new_token_ids)
        reused.seed = seed
        reused_runs.append(reused.generate(LOOKUP_PROMPT, 6).new_token_ids)
    assert reused_runs == fresh_runs
    assert len({tuple(run) for run in fresh_runs}) > 10, "the seeds give different runs"


@pytest.mark.slow
def test_the_test_detects_a_wrong_residual(small_pair, monkeypatch):
    """A mutation: after a rejection the walk goes on with p itself instead of norm(max(p - q, 0)). With recycled
    and drafted candidates in one tree the same chi-square test must reject it."""
    import dynasd.sampling

    monkeypatch.setattr(dynasd.sampling, "residual", lambda p, q: p)
    cfg = SamplingConfig(temperature=1.0)
    decoder = recycle_decoder(small_pair, "mcsd", (2, 1), dict(recycle=(2, 1)), cfg)
    result = fit(first_two_counts(decoder, 4000, LOOKUP_PROMPT), exact_first_two(small_pair, cfg, LOOKUP_PROMPT))
    assert result.p_value <= ALPHA, f"the chi-square test missed the wrong residual ({result})"


@pytest.mark.slow
def test_the_test_detects_a_lossy_method(small_pair):
    """ti-mcsd with two target roots picks the longer chain: biased, and the same chi-square test must say so."""
    cfg = SamplingConfig(temperature=1.0)
    counts = sampled_first_two(small_pair, cfg, "ti-mcsd", dict(width=2, depth=2), samples=4000)
    result = fit(counts, exact_first_two(small_pair, cfg))
    assert result.p_value <= ALPHA, f"the chi-square test missed ti-mcsd's bias ({result})"


# -- the acceptance walk alone, on synthetic distributions (fast, many samples) ----------------------------------

WALK_ALPHA = 1e-4  # the walk tests' level: 6,000 samples of one token

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
    result = fit(counts, p)
    assert result.impossible == 0 and result.p_value > WALK_ALPHA, (counts, result)


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
    check = fit(counts, p)
    assert check.p_value <= WALK_ALPHA, f"the check above misses a walk that tests against the wrong q ({check})"


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
