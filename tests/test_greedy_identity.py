"""At temperature 0 every lossless method must emit exactly the target's own greedy tokens."""
import pytest
import torch
from conftest import pair_on

from dynasd.decoders import make_decoder
from dynasd.options import DecoderOptions
from dynasd.sampling import SamplingConfig

PROMPTS = ["hello there", "What is speculative decoding?", "a", "Write a poem about the sea.",
           "1, 2, 3, 4,", "THE END", "Explain trees to me", "zz top"]

CONFIGS = [
    ("sd", dict(gamma=1)),
    ("sd", dict(gamma=4)),
    ("sd", dict(gamma=7)),
    ("mcsd", dict(k_config=(4, 2, 2, 1))),
    ("mcsd", dict(k_config=(2, 2, 2))),
    ("mcsd", dict(k_config=(3, 1, 2))),
    ("mcsd", dict(k_config=(1, 1, 1, 1, 1))),
    ("mcsd", dict(k_config=(4, 2, 2, 1), dynamic_depth=True)),
    ("mcsd", dict(k_config=(4, 2, 2, 1), stop="confidence", threshold=0.5)),
    ("mcsd", dict(k_config=(2, 2, 2, 2, 2), stop="confidence", threshold=0.9)),
    ("ti-mcsd", dict(width=1, depth=3)),
    ("ti-mcsd", dict(width=1, depth=5, stop="confidence", threshold=0.6)),
    ("ti-mcsd", dict(ti_k_config=(1, 3, 2))),
    ("sd", dict(gamma=3, lookup=6)),
    ("mcsd", dict(k_config=(2, 2, 1), lookup=4, lookup_ngram=1)),
    ("mcsd", dict(k_config=(4, 2, 2, 1), lookup=8, stop="confidence", threshold=0.5)),
    ("pld", dict(lookup=8)),
    ("pld", dict(lookup=3, lookup_ngram=1)),
    ("dynamic", dict(nodes=10, depth=4, expand=3)),
    ("dynamic", dict(nodes=3, depth=3, expand=1)),
    ("dynamic", dict(nodes=24, depth=2, expand=8, lookup=4, recycle=(2, 1))),
]


def target_greedy(pair, ids: list[int], max_new_tokens: int) -> list[int]:
    out = pair.target.generate(torch.tensor([ids], device=pair.device),
                               attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=pair.device),
                               max_new_tokens=max_new_tokens, do_sample=False,
                               eos_token_id=sorted(pair.eos_token_ids), pad_token_id=sorted(pair.eos_token_ids)[0])
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def references(device):
    """The target's greedy tokens from transformers' own generate on stock modules (no fast kernels), on the
    device under test."""
    stock = pair_on("tiny-random", device, fast_kernels=False)
    return {p: target_greedy(stock, stock.encode_prompt(p), 48) for p in PROMPTS}


@pytest.mark.parametrize("method,options", CONFIGS, ids=[f"{m}-{o}" for m, o in CONFIGS])
def test_tiny_random_greedy_identity(tiny_pair_on_device, references, method, options):
    pair = tiny_pair_on_device
    for prompt in PROMPTS:
        decoder = make_decoder(pair, DecoderOptions(method=method, **options))
        run = decoder.generate(pair.encode_prompt(prompt), 48, prompt_text=prompt)
        assert run.new_token_ids == references[prompt], prompt
        assert run.lossless


# Token recycling (dynasd/sources/recycling.py), alone or joined with the other sources in one verify. For the
# method "recycle" the shape is the recycled tree's template; otherwise `recycle` adds one.
RECYCLE_CONFIGS = [
    ("recycle", (2, 1, 1), dict()),
    ("recycle", (4, 2, 1), dict(lookup=4, lookup_ngram=1)),
    ("pld", (1,) * 6, dict(lookup=6, recycle=(3, 2))),
    ("mcsd", (4, 2, 2, 1), dict(recycle=(4, 2, 1))),
    ("mcsd", (2, 1, 1, 1), dict(lookup=8, recycle=(2, 1, 1), dynamic_depth=True, stop="confidence", threshold=0.5)),
    ("sd", (1,) * 4, dict(lookup=4, recycle=(1, 1, 1, 1), draft_kind="features")),
    ("mcsd", (3, 1, 2), dict(recycle=(3, 3), with_replacement=True)),
]


def recycle_decoder(pair, method, branching, options, cfg=SamplingConfig(), seed=0):
    """The decoder of a (method, tree, options) case through the options table: `branching` is the method's own
    tree (the recycle method's template, sd's chain, mcsd's shape, pld's lookup chain)."""
    own_tree = {"recycle": dict(recycle=tuple(branching)), "sd": dict(gamma=len(branching)),
                "mcsd": dict(k_config=tuple(branching)), "pld": dict(lookup=len(branching))}[method]
    return make_decoder(pair, DecoderOptions(method=method, temperature=cfg.temperature, top_k=cfg.top_k,
                                             top_p=cfg.top_p, seed=seed, **{**own_tree, **options}))


@pytest.mark.parametrize("method,branching,options", RECYCLE_CONFIGS,
                         ids=[f"{m}-{b}-{o}" for m, b, o in RECYCLE_CONFIGS])
def test_tiny_random_greedy_identity_with_recycling(tiny_pair_on_device, references, method, branching, options):
    recycled, pair = 0, tiny_pair_on_device
    for prompt in PROMPTS:
        run = recycle_decoder(pair, method, branching, options).generate(pair.encode_prompt(prompt), 48)
        assert run.new_token_ids == references[prompt], prompt
        assert run.lossless
        recycled += sum(o == "recycled" for s in run.steps for o in s.committed_origins)
    assert recycled > 0, "recycled candidates were accepted somewhere"


def test_speculation_actually_happens(tiny_pair):
    """Guard against a decoder that is 'identical' because it never accepts a draft token."""
    decoder = make_decoder(tiny_pair, DecoderOptions(method="mcsd", k_config=(4, 2, 2, 1)))
    run = decoder.generate(tiny_pair.encode_prompt(PROMPTS[1]), 48)
    assert run.summary()["tokens_per_target_forward"] > 1.5
    assert any(o == "draft" for s in run.steps for o in s.committed_origins)


def test_dynamic_depth_changes_depth_between_steps(tiny_pair):
    options = DecoderOptions(method="mcsd", k_config=(2, 2, 2, 2, 2), stop="confidence", threshold=0.5)
    decoder = make_decoder(tiny_pair, options)
    run = decoder.generate(tiny_pair.encode_prompt(PROMPTS[3]), 48)
    depths = {s.live_depth for s in run.steps}
    assert len(depths) > 1, depths
    for step in run.steps:
        assert len(step.nodes) == decoder.shape.level_starts[step.live_depth]
        assert step.draft_forwards == step.live_depth  # root forward + one per fed level
        assert all(ls.continued == (max(ls.scores) >= 0.5) for ls in step.stop_scores)


def test_target_initialized_width_above_one_is_lossy_and_its_deviation_is_measured(tiny_pair):
    deviations = []
    for prompt in PROMPTS:
        ids = tiny_pair.encode_prompt(prompt)
        run = make_decoder(tiny_pair, DecoderOptions(method="ti-mcsd", width=3, depth=3)).generate(ids, 48)
        assert not run.lossless
        ref = target_greedy(tiny_pair, ids, 48)
        same = next((i for i, (a, b) in enumerate(zip(run.new_token_ids, ref)) if a != b), min(len(ref), 48))
        deviations.append(1 - same / 48)
    print(f"ti-mcsd width 3: share of tokens after the first divergence from greedy, per prompt: {deviations}")
    assert all(0.0 <= d <= 1.0 for d in deviations)


def test_overshoot_is_truncated_to_max_new_tokens(tiny_pair):
    for n in (1, 2, 5, 13):
        run = make_decoder(tiny_pair, DecoderOptions(method="mcsd")).generate(tiny_pair.encode_prompt("a"), n)
        assert len(run.new_token_ids) == n and run.finished == "length"
        assert sum(len(s.committed) for s in run.steps) == n


EMBEDDED_PROMPTS = ["What is the capital of France?", "Write a haiku about autumn leaves."]


@pytest.fixture(scope="module")
def embedded_references():
    """The embedded target's greedy 24 tokens for a prompt, from transformers' own generate, computed once per
    prompt and device for all the embedded cases below."""
    computed = {}

    def reference(pair, prompt: str) -> list[int]:
        key = (str(pair.device), prompt)
        if key not in computed:
            computed[key] = target_greedy(pair, pair.encode_prompt(prompt), 24)
        return computed[key]

    return reference


@pytest.mark.slow
@pytest.mark.parametrize("method,options", [("sd", dict(gamma=4)), ("mcsd", dict(k_config=(4, 2, 2, 1))),
                                            ("mcsd", dict(k_config=(2, 2, 1), stop="confidence", threshold=0.3)),
                                            ("ti-mcsd", dict(width=1, depth=3)),
                                            ("pld", dict(lookup=8, lookup_ngram=1)),
                                            ("sd", dict(gamma=2, lookup=4, lookup_ngram=1)),
                                            ("dynamic", dict(nodes=12, depth=4, expand=4))])
def test_embedded_greedy_identity(embedded_pair_on_device, embedded_references, method, options):
    pair = embedded_pair_on_device
    for prompt in EMBEDDED_PROMPTS:
        ids = pair.encode_prompt(prompt)
        ref = embedded_references(pair, prompt)
        run = make_decoder(pair, DecoderOptions(method=method, **options)).generate(ids, 24)
        assert run.new_token_ids == ref, (prompt, pair.decode(run.new_token_ids), pair.decode(ref))


@pytest.mark.slow
@pytest.mark.parametrize("method,branching,options", [
    ("recycle", (2, 1, 1, 1), dict()),
    ("mcsd", (2, 1, 1, 1), dict(lookup=8, recycle=(2, 1, 1, 1), dynamic_depth=True,
                                stop="confidence", threshold=0.4))])
def test_embedded_greedy_identity_with_recycling(embedded_pair, embedded_references, method, branching, options):
    for prompt in EMBEDDED_PROMPTS:
        ids = embedded_pair.encode_prompt(prompt)
        ref = embedded_references(embedded_pair, prompt)
        run = recycle_decoder(embedded_pair, method, branching, options).generate(ids, 24)
        assert run.new_token_ids == ref, (prompt, embedded_pair.decode(run.new_token_ids), embedded_pair.decode(ref))


def test_argmax_rows_is_torch_argmax_with_ties_infinities_and_nan():
    """The engine takes greedy tokens through numpy on CPU (dynasd/sampling.py): the same index as torch.argmax,
    the first one, on ties, on rows that are -inf outside a draft's reduced head, and on NaN."""
    from dynasd.sampling import argmax_rows

    torch.manual_seed(0)
    logits = torch.randn(6, 1000).round(decimals=1)  # many ties near the top
    logits[1, 100:] = float("-inf")
    logits[2, [5, 700]] = 9.0  # an exact tie at the maximum
    logits[3] = float("-inf")
    logits[4, [3, 9]] = float("nan")
    logits[5] = 0.0
    assert argmax_rows(logits) == logits.argmax(dim=-1).tolist()
    assert argmax_rows(logits)[2] == 5 and argmax_rows(logits)[5] == 0
    with torch.inference_mode():  # the decoders' logits are inference tensors
        assert argmax_rows(logits.clone()[2:3]) == [5]
    assert argmax_rows(logits.double()) == logits.argmax(dim=-1).tolist()  # torch's own path
