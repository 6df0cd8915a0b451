"""Few-row linear layouts and the compiled kernel change speed, never results (within float rounding), and leave
training alone."""
import os

import pytest
import torch

from dynasd.decoders import make_decoder
from dynasd.kernels import compile, fast_linear
from dynasd.kernels.compile import compiled_op
from dynasd.kernels.fast_linear import (
    PANEL,
    PANEL_ROWS,
    SMALL_ROWS,
    FusedProjections,
    PretransposedLinear,
    panel_kernel,
    pretranspose_linears,
)
from dynasd.models import SubsetHead, load_pair, tiny_random_pair
from dynasd.options import DecoderOptions


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, SMALL_ROWS, SMALL_ROWS + 1, 9, 33])
def test_same_product_on_both_sides_of_the_row_threshold(rows, bias):
    torch.manual_seed(rows)
    plain = torch.nn.Linear(24, 40, bias=bias)
    fast = PretransposedLinear(plain)  # no kernel: the two torch layouts only
    x = torch.randn(1, rows, 24)
    with torch.inference_mode():
        assert torch.allclose(fast(x), plain(x), atol=1e-5, rtol=1e-5)
    assert fast.weight is plain.weight  # the row-major weight is shared, not copied
    assert fast.weight_t.is_contiguous() and torch.equal(fast.weight_t, plain.weight.t())


def test_the_compiled_kernel_builds_here():
    """CI has a compiler and ninja (requirements.txt): the kernel must build there, not silently fall back."""
    assert panel_kernel() is not None


@pytest.mark.parametrize("in_features", [37, 576])
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_gives_the_linear_product_for_every_row_count(in_features, bias):
    torch.manual_seed(in_features)
    plain = torch.nn.Linear(in_features, 3 * PANEL, bias=bias)
    fast = PretransposedLinear(plain, panel_kernel())
    assert fast.panels is not None and fast.panels.shape == (3, in_features, PANEL)
    for rows in range(1, PANEL_ROWS.stop + 8):
        x = torch.randn(2, rows, in_features)  # a batch dimension too: rows are counted over all of them
        with torch.inference_mode():
            assert torch.allclose(fast(x), plain(x), atol=1e-5, rtol=1e-5), rows


def test_kernel_rows_do_not_depend_on_their_neighbours():
    """Each output is summed in the same order whatever the row count, so a node's logits in a verify of 2 rows
    and of 24 rows are bitwise the same: the tree's size cannot flip a greedy choice through rounding."""
    torch.manual_seed(0)
    plain = torch.nn.Linear(64, 2 * PANEL, bias=False)
    fast = PretransposedLinear(plain, panel_kernel())
    x = torch.randn(PANEL_ROWS.stop - 1, 64)
    with torch.inference_mode():
        full = fast(x)  # 24 rows: passes of 12 (AVX-512) or 8
        for rows in PANEL_ROWS:  # one pass (up to 14 rows with AVX-512), or two or three equal ones
            assert torch.equal(fast(x[:rows]), full[:rows]), rows


@pytest.mark.parametrize("vendor,single_row_in_kernel", [("GenuineIntel", False), ("AuthenticAMD", True)])
def test_the_kernel_takes_every_row_count_where_mkl_is_not_tuned(monkeypatch, vendor, single_row_in_kernel):
    """On Intel CPUs MKL wins for 1 row and from 32 rows (Intel Xeon, 2026-12-01); elsewhere it is slower at every count
    (AMD EPYC, 2026-12-01), and then ar's single rows and a prefill's hundreds take the kernel too."""
    monkeypatch.setattr(fast_linear, "_cpu_vendor", lambda: vendor)
    torch.manual_seed(2)
    plain = torch.nn.Linear(64, 2 * PANEL, bias=True)
    fast = PretransposedLinear(plain, panel_kernel())
    assert (1 in fast.kernel_rows) == single_row_in_kernel and (300 in fast.kernel_rows) == single_row_in_kernel
    assert 2 in fast.kernel_rows and PANEL_ROWS.stop - 1 in fast.kernel_rows
    x = torch.randn(300, 64)
    with torch.inference_mode():
        assert torch.allclose(fast(x), plain(x), atol=1e-5, rtol=1e-5)
        if single_row_in_kernel:  # one kernel for every count: a row's logits never depend on its neighbours
            for rows in (1, 2, 15, 299):
                assert torch.equal(fast(x[:rows]), fast(x)[:rows]), rows


@pytest.mark.parametrize("half", [False, True])
def test_fused_projections_give_each_layers_output_bit_for_bit(half):
    torch.manual_seed(3)
    layers = [PretransposedLinear(torch.nn.Linear(48, n * PANEL, bias=False), panel_kernel(), half_panels=half)
              for n in (3, 1, 2)]
    fused = FusedProjections.of(layers)
    assert fused is not None and fused.panels.shape[0] == 6
    assert all(layer.panels.untyped_storage().data_ptr() == fused.panels.untyped_storage().data_ptr()
               for layer in layers)  # views: no second copy of the weights
    for rows in (1, 2, 5, 14, 15, 40):
        x = torch.randn(1, rows, 48)
        with torch.inference_mode():
            for part, layer in zip(fused(x), layers):
                assert torch.equal(part, layer(x)), rows


def test_layers_with_a_bias_or_without_the_kernel_are_not_fused():
    with_bias = [PretransposedLinear(torch.nn.Linear(16, PANEL), panel_kernel()) for _ in range(2)]
    no_kernel = [PretransposedLinear(torch.nn.Linear(16, PANEL, bias=False)) for _ in range(2)]
    assert FusedProjections.of(with_bias) is None and FusedProjections.of(no_kernel) is None


def test_half_precision_panels_give_the_product_of_the_rounded_weight_from_one_row():
    torch.manual_seed(1)
    plain = torch.nn.Linear(576, 2 * PANEL, bias=False)
    fast = PretransposedLinear(plain, panel_kernel(), half_panels=True)
    assert fast.panels.dtype == torch.float16 and fast.kernel_rows.start == 1
    rounded = plain.weight.detach().half().float()
    for rows in (1, 2, 7, 24, 30):
        x = torch.randn(rows, 576)
        with torch.inference_mode():
            expected = torch.nn.functional.linear(x, rounded if rows in fast.kernel_rows else plain.weight)
            assert torch.allclose(fast(x), expected, atol=1e-4, rtol=1e-5), rows


def test_layers_the_kernel_cannot_take_keep_the_torch_layouts():
    kernel = panel_kernel()
    odd_width = PretransposedLinear(torch.nn.Linear(16, PANEL + 8), kernel)
    half = PretransposedLinear(torch.nn.Linear(16, PANEL).to(torch.float64), kernel)
    assert odd_width.panels is None and odd_width.kernel is None
    assert half.panels is None and half.kernel is None
    x = torch.randn(5, 16)
    with torch.inference_mode():
        assert torch.allclose(odd_width(x), torch.nn.functional.linear(x, odd_width.weight, odd_width.bias),
                              atol=1e-5)


def test_no_kernel_when_compiling_is_switched_off(monkeypatch):
    monkeypatch.setenv("DYNASD_COMPILE", "0")
    assert compiled_op("dynasd_panel_linear", fast_linear.KERNEL_SOURCE, lambda: "built") is None


def test_a_failed_build_warns_and_falls_back():
    missing = fast_linear.KERNEL_SOURCE.with_name("no_such_kernel.cpp")
    with pytest.warns(UserWarning, match="not available"):
        assert compiled_op("dynasd_no_such_kernel", missing, lambda: "built") is None


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
    torch_only = load_pair("tiny-random", device="cpu", compiled_kernel=False)
    assert isinstance(fast.target.model.layers[0].mlp.down_proj, PretransposedLinear)
    assert isinstance(fast.draft.lm_head, PretransposedLinear)
    assert torch_only.target.model.layers[0].mlp.down_proj.panels is None
    assert type(plain.target.model.layers[0].mlp.down_proj) is torch.nn.Linear
    if fast_linear.kernel_pays_here():
        assert fast.target.model.layers[0].mlp.down_proj.panels.dtype == torch.float32  # the target stays exact
        assert fast.draft.model.layers[0].mlp.down_proj.panels.dtype == torch.float16
    else:
        assert fast.target.model.layers[0].mlp.down_proj.panels is None


def test_no_kernel_in_the_layers_where_it_does_not_pay(monkeypatch):
    """Without AVX-512 the kernel's accumulators spill (15x slower): models keep the torch layouts there, even
    where the kernel builds."""
    monkeypatch.setattr(compile, "cpu_flags", lambda: "flags\t: fpu sse2 avx avx2 fma")
    assert not fast_linear.kernel_pays_here()
    pair = load_pair("tiny-random", device="cpu")
    layer = pair.target.model.layers[0].mlp.down_proj
    assert isinstance(layer, PretransposedLinear) and layer.panels is None and layer.kernel is None
    monkeypatch.setattr(compile, "cpu_flags", lambda: "flags\t: fpu sse2 avx2 avx512f avx512bw")
    assert fast_linear.kernel_pays_here() == (os.uname().machine == "x86_64")


@pytest.mark.parametrize("method,options", [("sd", dict(gamma=5)), ("mcsd", dict(k_config=(4, 2, 2, 1))),
                                            ("pld", dict(lookup=8, lookup_ngram=1))])
def test_swapped_pair_stays_greedy_identical_to_its_target(method, options):
    """On Intel, ar's single rows take F.linear, verifies of 2-24 rows the compiled kernel (mcsd 4,2,2,1's 44-node
    trees the transposed weight); elsewhere the kernel takes all; layers of 16 outputs keep the torch layouts:
    outputs still agree."""
    pair = load_pair("tiny-random", device="cpu")
    attention = pair.target.model.layers[0].self_attn
    assert isinstance(attention.q_proj, PretransposedLinear)
    assert (attention.q_proj.panels is not None) == fast_linear.kernel_pays_here()  # the torch layouts elsewhere
    assert attention.k_proj.panels is None  # 16 outputs: not a whole panel
    for prompt in ["What is speculative decoding?", "1, 2, 3, 1, 2, 3, 1, 2,"]:
        ids = pair.encode_prompt(prompt)
        reference = make_decoder(pair, DecoderOptions(method="ar")).generate(ids, 40).new_token_ids
        run = make_decoder(pair, DecoderOptions(method=method, **options)).generate(ids, 40)
        assert run.new_token_ids == reference, prompt
        assert max(len(step.nodes) for step in run.steps) + 1 > SMALL_ROWS  # past F.linear's rows: kernel or x @ W.T
