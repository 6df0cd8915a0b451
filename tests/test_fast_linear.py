"""Pre-transposed linear layers change speed, never results (within float rounding), and leave training alone."""
import pytest
import torch

from dynasd.decoders import make_decoder
from dynasd.fast_linear import SMALL_ROWS, PretransposedLinear, pretranspose_linears
from dynasd.models import SubsetHead, load_pair, tiny_random_pair
from dynasd.sampling import SamplingConfig


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, SMALL_ROWS, SMALL_ROWS + 1, 9, 33])
def test_same_product_on_both_sides_of_the_row_threshold(rows, bias):
    torch.manual_seed(rows)
    plain = torch.nn.Linear(24, 40, bias=bias)
    fast = PretransposedLinear(plain)
    x = torch.randn(1, rows, 24)
    with torch.inference_mode():
        assert torch.allclose(fast(x), plain(x), atol=1e-5, rtol=1e-5)
    assert fast.weight is plain.weight  # the row-major weight is shared, not copied
    assert fast.weight_t.is_contiguous() and torch.equal(fast.weight_t, plain.weight.t())


def test_every_linear_of_a_model_is_swapped_and_logits_agree():
    reference = tiny_random_pair()
    swapped = tiny_random_pair()
    head_weight = swapped.target.lm_head.weight
    pretranspose_linears(swapped.target)
    assert not [m for m in swapped.target.modules() if type(m) is torch.nn.Linear]
    assert swapped.target.lm_head.weight is head_weight  # kept, not copied (a tied head stays tied)
    ids = torch.tensor([reference.encode_prompt("What is speculative decoding?")])
    with torch.inference_mode():
        assert torch.allclose(swapped.target(ids).logits, reference.target(ids).logits, atol=1e-4)


def test_subset_head_product_is_swapped_too():
    head = SubsetHead(torch.randn(50, 16), [3, 9, 41])
    hidden = torch.randn(1, 6, 16)
    before = head(hidden)
    pretranspose_linears(head)
    assert isinstance(head.rows, PretransposedLinear)
    assert torch.allclose(head(hidden), before, atol=1e-5)


def test_load_pair_swaps_on_cpu_unless_told_not_to():
    fast = load_pair("tiny-random", device="cpu")
    plain = load_pair("tiny-random", device="cpu", fast_kernels=False)
    assert isinstance(fast.target.model.layers[0].mlp.down_proj, PretransposedLinear)
    assert isinstance(fast.draft.lm_head, PretransposedLinear)
    assert type(plain.target.model.layers[0].mlp.down_proj) is torch.nn.Linear


@pytest.mark.parametrize("method,options", [("sd", dict(gamma=5)), ("mcsd", dict(k_config=(4, 2, 2, 1))),
                                            ("pld", dict(lookup=8, lookup_min_ngram=1))])
def test_swapped_pair_stays_greedy_identical_to_its_target(method, options):
    """Verify passes of 4+ rows take the transposed path, ar's single rows the other one: outputs still agree."""
    pair = load_pair("tiny-random", device="cpu")
    for prompt in ["What is speculative decoding?", "1, 2, 3, 1, 2, 3, 1, 2,"]:
        ids = pair.encode_prompt(prompt)
        reference = make_decoder("ar", pair, SamplingConfig()).generate(ids, 40).new_token_ids
        run = make_decoder(method, pair, SamplingConfig(), **options).generate(ids, 40)
        assert run.new_token_ids == reference, prompt
        assert max(len(step.nodes) for step in run.steps) + 1 > SMALL_ROWS  # the wide path was exercised
