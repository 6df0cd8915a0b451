"""Few-row linear layouts and the compiled kernel change speed, never results (within float rounding), and leave
training alone."""
import os

import pytest
import torch

from dynasd.decoders import make_decoder
from dynasd.kernels import compile, fast_linear
from dynasd.kernels.block_weights import Q8_0, BlockLinear
from dynasd.kernels.compile import compiled_op, runnable_variants
from dynasd.kernels.fast_linear import (
    PANEL,
    PANEL_ROWS,
    SMALL_ROWS,
    FusedProjections,
    PretransposedLinear,
    panel_kernel,
    pretranspose_linears,
)
from dynasd.loading.models import SubsetHead, load_pair, tiny_random_pair
from dynasd.options import DecoderOptions

# Every kernel variant this CPU executes (AVX-512 and AVX2 on an AVX-512 machine) is tested, not only the one a load
# picks; a CPU that runs none (ARM) has no kernel to test.
EVERY_VARIANT = pytest.mark.parametrize(
    "variant", runnable_variants() or [pytest.param(None, marks=pytest.mark.skip(reason="no kernel variant here"))])


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


@EVERY_VARIANT
@pytest.mark.parametrize("in_features", [37, 576])
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_gives_the_linear_product_for_every_row_count(variant, in_features, bias):
    torch.manual_seed(in_features)
    plain = torch.nn.Linear(in_features, 3 * PANEL, bias=bias)
    fast = PretransposedLinear(plain, panel_kernel(variant))
    assert fast.panels is not None and fast.panels.shape == (3, in_features, PANEL)
    for rows in range(1, PANEL_ROWS.stop + 8):
        x = torch.randn(2, rows, in_features)  # a batch dimension too: rows are counted over all of them
        with torch.inference_mode():
            assert torch.allclose(fast(x), plain(x), atol=1e-5, rtol=1e-5), rows


@EVERY_VARIANT
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_rows_do_not_depend_on_their_neighbours(variant, dtype):
    """Each output is summed in the same order whatever the row count, so a node's logits in a verify of 1 row
    and of 24 rows are bitwise the same: the tree's size cannot flip a greedy choice through rounding."""
    torch.manual_seed(0)
    kernel = panel_kernel(variant)
    panels = fast_linear.to_panels(torch.randn(2 * PANEL, 64)).to(dtype)
    x = torch.randn(PANEL_ROWS.stop - 1, 64)
    full = kernel(x, panels)  # 24 rows: passes of 12 (AVX-512) or 6 (AVX2: half a panel at a time)
    for rows in range(1, PANEL_ROWS.stop):  # one pass (the whole panel for 1-2 rows with AVX2), or equal ones
        assert torch.equal(kernel(x[:rows], panels), full[:rows]), rows
        assert torch.equal(kernel(x[rows - 1:rows + 4], panels), full[rows - 1:rows + 4]), rows


@EVERY_VARIANT
def test_kernel_gives_an_empty_product_for_no_rows(variant):
    """No rows split into no passes: the split itself (rows_per_pass) would divide by zero and end the process."""
    kernel = panel_kernel(variant)
    panels = fast_linear.to_panels(torch.randn(2 * PANEL, 64))
    assert kernel(torch.empty(0, 64), panels).shape == (0, 2 * PANEL)
    assert kernel(torch.empty(3, 0, 64), panels).shape == (3, 0, 2 * PANEL)


def test_every_variant_gives_bitwise_the_same_products():
    """AVX-512 and AVX2 sum each output in the same order with the same fused multiply-adds: a text decoded on a
    laptop without AVX-512 is the one decoded on a server with it."""
    variants = runnable_variants()
    if len(variants) < 2:
        pytest.skip("this CPU executes one kernel variant at most")
    torch.manual_seed(4)
    for dtype in (torch.float32, torch.float16):
        panels = fast_linear.to_panels(torch.randn(3 * PANEL, 200)).to(dtype)
        for rows in (1, 2, 3, 6, 7, 13, 30):
            x = torch.randn(rows, 200)
            results = [panel_kernel(variant)(x, panels) for variant in variants]
            assert all(torch.equal(results[0], other) for other in results[1:]), (dtype, rows)


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


@EVERY_VARIANT
@pytest.mark.parametrize("half", [False, True])
def test_fused_projections_give_each_layers_output_bit_for_bit(variant, half):
    torch.manual_seed(3)
    layers = [PretransposedLinear(torch.nn.Linear(48, n * PANEL, bias=False), panel_kernel(variant), half_panels=half)
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


@EVERY_VARIANT
def test_half_precision_panels_give_the_product_of_the_rounded_weight_for_every_row_count(variant):
    """A draft's layers keep their float16 panels only (no float32 weight, no transpose): every row count, a
    prefill's too, goes to the kernel."""
    torch.manual_seed(1)
    plain = torch.nn.Linear(576, 2 * PANEL, bias=False)
    fast = PretransposedLinear(plain, panel_kernel(variant), half_panels=True)
    assert fast.panels.dtype == torch.float16 and fast.weight is None and fast.weight_t is None
    rounded = plain.weight.detach().half().float()
    for rows in (1, 2, 7, 24, 30, 100):
        x = torch.randn(rows, 576)
        with torch.inference_mode():
            assert torch.allclose(fast(x), torch.nn.functional.linear(x, rounded), atol=1e-4, rtol=1e-5), rows


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
        drafted = fast.draft.model.layers[0].mlp.down_proj  # 8-bit blocks where they fit (use_draft_blocks)
        assert isinstance(drafted, BlockLinear) and drafted.kind == Q8_0
        halves = [m.panels.dtype for m in fast.draft.modules() if isinstance(m, PretransposedLinear) and m.kernel]
        assert set(halves) <= {torch.float16}  # any other with the kernel: float16 panels
    else:
        assert fast.target.model.layers[0].mlp.down_proj.panels is None


def test_the_variant_is_chosen_from_the_cpus_features_and_can_be_forced(monkeypatch, capfd):
    """AVX-512 where the CPU has it, else AVX2 (with FMA and F16C), else none: the layers keep the torch layouts
    there, even where the kernel builds. $DYNASD_KERNEL_VARIANT forces one the CPU runs; another is said once."""
    x86 = os.uname().machine == "x86_64"
    monkeypatch.delenv("DYNASD_KERNEL_VARIANT", raising=False)
    monkeypatch.setattr(compile, "_told_variant", set())
    monkeypatch.setattr(compile, "cpu_flags", lambda: "flags\t: fpu sse2 avx avx2 fma")
    assert compile.kernel_variant() is None and not fast_linear.kernel_pays_here()
    pair = load_pair("tiny-random", device="cpu")
    layer = pair.target.model.layers[0].mlp.down_proj
    assert isinstance(layer, PretransposedLinear) and layer.panels is None and layer.kernel is None
    monkeypatch.setattr(compile, "cpu_flags", lambda: "flags\t: fpu sse2 avx avx2 fma f16c")
    assert compile.kernel_variant() == ("avx2" if x86 else None)
    monkeypatch.setattr(compile, "cpu_flags", lambda: "flags\t: fpu sse2 avx2 fma f16c avx512f avx512bw")
    assert compile.kernel_variant() == ("avx512" if x86 else None)
    assert compile.runnable_variants() == (("avx512", "avx2") if x86 else ())
    monkeypatch.setenv("DYNASD_KERNEL_VARIANT", "avx2")
    assert compile.kernel_variant() == ("avx2" if x86 else None)
    monkeypatch.setenv("DYNASD_KERNEL_VARIANT", "torch")
    assert compile.kernel_variant() is None and not fast_linear.kernel_pays_here()
    monkeypatch.setattr(compile, "cpu_flags", lambda: "flags\t: fpu sse2 avx avx2 fma f16c")
    monkeypatch.setenv("DYNASD_KERNEL_VARIANT", "avx512")
    capfd.readouterr()
    assert compile.kernel_variant() == ("avx2" if x86 else None)
    assert compile.kernel_variant() == ("avx2" if x86 else None)
    said = capfd.readouterr().err.splitlines()
    assert len(said) == 1 and "DYNASD_KERNEL_VARIANT=avx512" in said[0]


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
