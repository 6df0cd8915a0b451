"""accelerate() is the one place kernels are applied: it gives the logits of the kernels applied one by one, the
logits of stock transformers within float rounding, refuses to be applied twice differently, and nothing else in
the engine knows which kernels run."""
import ast
from pathlib import Path

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from dynasd.cache import STOCK_RUNTIME, CachedModel, Runtime, attach_runtime, runtime_of, stock_forward
from dynasd.decoders import make_decoder
from dynasd.kernels import INT8, KernelPlan, accelerate, accelerate_model, plan_for
from dynasd.kernels.block_weights import (
    RAW_BYTES,
    BlockLinear,
    block_kernel,
    dequantize,
    draft_block_kind,
    exact_attention_op,
    fits_draft_blocks,
    use_draft_blocks,
)
from dynasd.kernels.compile import kernel_variant
from dynasd.kernels.exact_attention import NAME as EXACT_ATTENTION
from dynasd.kernels.exact_attention import use_exact_attention
from dynasd.kernels.fast_linear import PretransposedLinear, kernel_pays_here, panel_kernel, pretranspose_linears
from dynasd.kernels.gqa_attention import NAME as PACKED_GQA
from dynasd.kernels.gqa_attention import use_packed_gqa
from dynasd.kernels.inplace_cache import InPlaceLayer, in_place_cache
from dynasd.kernels.lean_forward import lean_forward
from dynasd.loading.models import tiny_llama, tiny_random_pair
from dynasd.options import DecoderOptions
from dynasd.tree import ROOT, TreeShape, ancestor_mask

REPO = Path(__file__).resolve().parent.parent


def engine_calls(model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The calls a decoder makes, through the model's own runtime: a prefill, a one-token step, a chain + tree
    verify, a path kept (keys/values moved down), another verify. A feature draft gets seeded random feature
    rows (the same in every run)."""
    cached = CachedModel(model, need_hidden=True)
    gen = torch.Generator().manual_seed(0)

    def forward(chain, nodes, mask, positions, keep_logits):
        features = (torch.randn(len(chain) + len(nodes), model.config.hidden_size, generator=gen)
                    if cached.reads_features else None)
        return cached.forward(chain, nodes, mask, positions, keep_logits, features=features)

    tree = TreeShape((2, 2, 1))
    mask = ancestor_mask(tree.parents)
    outputs = [forward(list(range(3, 40)), [], None, [], 4), forward([41], [], None, [], 1)]
    outputs.append(forward([42, 43], list(range(5, 5 + tree.num_nodes)), mask, [41 + lv for lv in tree.levels],
                           2 + tree.num_nodes))
    first = tree.children[ROOT][1]
    path = [first, tree.children[first][0]]
    cached.keep_path(path, 44 + len(path))
    outputs.append(forward([60], [61, 62], mask[:2, :2], [47, 47], 3))
    return outputs


def models_of(pair) -> list[torch.nn.Module]:
    return [pair.target, pair.draft, pair.feature_draft]


def kernels_by_hand(pair, compiled_kernel: bool):
    """The kernels applied one at a time, as load_pair(fast_kernels=True) applied them inline up to 2026-12-01
    (the decoders then asked CachedModel for the in-place cache and the lean forward)."""
    for model in models_of(pair):
        if compiled_kernel and model is not pair.target and block_kernel() is not None:
            use_draft_blocks(model, block_kernel(), INT8)  # accelerate's default arithmetic
            use_exact_attention(model, exact_attention_op())
        use_packed_gqa(model)
        pretranspose_linears(model, compiled=compiled_kernel, half_panels=model is not pair.target)
        attach_runtime(model, Runtime(forward=lean_forward, new_cache=in_place_cache))
    return pair


@pytest.mark.parametrize("compiled_kernel", [True, False])
def test_accelerate_gives_bitwise_the_logits_of_the_kernels_applied_by_hand(compiled_kernel):
    accelerated = accelerate(tiny_random_pair(), compiled_kernel=compiled_kernel)
    reference = kernels_by_hand(tiny_random_pair(), compiled_kernel)
    for model, expected in zip(models_of(accelerated), models_of(reference)):
        eight_bit = compiled_kernel and model is not accelerated.target and block_kernel() is not None
        assert model.config._attn_implementation == (EXACT_ATTENTION if eight_bit else PACKED_GQA)
        assert isinstance(model.model.layers[0].mlp.down_proj, BlockLinear if eight_bit else PretransposedLinear)
        assert runtime_of(model).forward is lean_forward
        assert isinstance(CachedModel(model).cache.layers[0], InPlaceLayer)
        for (logits, hidden), (expected_logits, expected_hidden) in zip(engine_calls(model), engine_calls(expected)):
            assert torch.equal(logits, expected_logits) and torch.equal(hidden, expected_hidden)


def with_draft_block_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A stock model whose linear layers that use_draft_blocks would swap hold those blocks' values instead."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    with torch.no_grad():
        for path, layer in model.named_modules():
            if fits_draft_blocks(layer):
                kind = draft_block_kind(path)
                raw = quantize(layer.weight.numpy(), getattr(GGMLQuantizationType, kind))
                raw = torch.from_numpy(raw).reshape(layer.out_features, -1, RAW_BYTES[kind])
                layer.weight.copy_(dequantize(kind, raw))
    return model


@pytest.mark.parametrize("arithmetic", ["float32", "int8"])
def test_accelerated_logits_equal_stock_ones_within_rounding(arithmetic):
    """The target's within float rounding (packed attention and the linear layouts block their sums differently);
    the drafts' too, against stock drafts holding the 8-bit blocks' values where the drafts read 8-bit blocks,
    and within float16's rounding where the compiled kernel reads their other weights as float16 panels. With
    8-bit activations (the default) the drafts' blocks round their inputs too: a few tenths of a logit at most."""
    accelerated, stock = accelerate(tiny_random_pair(), arithmetic=arithmetic), tiny_random_pair()
    if kernel_variant() is not None and block_kernel() is not None:
        for draft in (stock.draft, stock.feature_draft):
            with_draft_block_weights(draft)
    assert all(runtime_of(model) is STOCK_RUNTIME for model in models_of(stock))
    assert type(CachedModel(stock.target).cache.layers[0]) is DynamicLayer
    half_panels = kernel_pays_here() and panel_kernel() is not None
    for model, reference in zip(models_of(accelerated), models_of(stock)):
        tolerance = 5e-2 if half_panels and model is not accelerated.target else 1e-4
        if arithmetic == "int8" and any(getattr(m, "arithmetic", None) == "int8" for m in model.modules()):
            tolerance = 0.5
        for (logits, hidden), (stock_logits, stock_hidden) in zip(engine_calls(model), engine_calls(reference)):
            torch.testing.assert_close(logits, stock_logits, rtol=0, atol=tolerance)
            torch.testing.assert_close(hidden, stock_hidden, rtol=0, atol=tolerance)


def test_accelerating_twice_is_harmless_and_another_plan_is_refused():
    pair = accelerate(tiny_random_pair(), compiled_kernel=False)
    layer = pair.target.model.layers[0].mlp.down_proj
    before = engine_calls(pair.target)
    assert accelerate(pair, compiled_kernel=False) is pair
    assert pair.target.model.layers[0].mlp.down_proj is layer  # not swapped a second time
    assert all(torch.equal(a[0], b[0]) for a, b in zip(engine_calls(pair.target), before))
    with pytest.raises(ValueError, match="already accelerated"):
        accelerate(pair, compiled_kernel=True)


def test_cpu_layouts_are_planned_for_cpu_only():
    cpu_target, cpu_draft = plan_for(torch.device("cpu")), plan_for(torch.device("cpu"), decides_output=False)
    assert cpu_target.linear_layouts and cpu_target.compiled_kernel and not cpu_target.half_panels
    assert cpu_draft.half_panels
    assert not plan_for(torch.device("cpu"), compiled_kernel=False).compiled_kernel
    for decides_output in (True, False):
        assert plan_for(torch.device("cuda"), decides_output=decides_output) == KernelPlan(
            packed_gqa=True, in_place_cache=True, lean_forward=True, linear_layouts=False, compiled_kernel=False,
            half_panels=False)


def test_a_plan_without_cpu_layouts_keeps_stock_linears_and_the_same_logits():
    """What a CUDA pair gets, applied here on CPU: stock nn.Linear modules, the lean forward and the in-place
    cache, whose logits are bitwise those of the packed attention alone on stock transformers."""
    model = accelerate_model(tiny_random_pair().target, plan_for(torch.device("cuda")))
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert runtime_of(model).forward is lean_forward
    reference = use_packed_gqa(tiny_random_pair().target)
    for (logits, hidden), (expected_logits, expected_hidden) in zip(engine_calls(model), engine_calls(reference)):
        assert torch.equal(logits, expected_logits) and torch.equal(hidden, expected_hidden)


def test_a_model_the_lean_forward_does_not_know_keeps_transformers_forward_on_the_in_place_cache():
    model = tiny_llama(60, seed=7).train()  # training mode: not the lean forward's
    accelerate_model(model, plan_for(torch.device("cuda")))
    assert runtime_of(model) == Runtime(forward=stock_forward, new_cache=in_place_cache)


def test_decoders_run_on_the_runtime_attached_to_the_model():
    """The decoders ask CachedModel, which asks the model: a runtime attached from outside is the one that runs."""
    pair = tiny_random_pair()
    calls = {"target": 0, "draft": 0}

    def counting(name):
        def forward(model, *args, **kwargs):
            calls[name] += 1
            return stock_forward(model, *args, **kwargs)
        return forward

    for name in calls:
        attach_runtime(getattr(pair, name), Runtime(forward=counting(name)))
    run = make_decoder(pair, DecoderOptions(method="mcsd", k_config=(2, 1, 1))).generate(pair.encode_prompt("hi"), 20)
    prefill = 1
    assert calls["target"] == prefill + sum(step.target_forwards for step in run.steps)
    assert calls["draft"] == prefill + sum(step.draft_forwards for step in run.steps)


def imported_modules(source: str, package: str) -> set[str]:
    """The absolute names of the modules a file of `package` imports (relative imports resolved)."""
    parts = package.split(".")
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(filter(None, [base, node.module]))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def kernel_imports(path: Path) -> list[str]:
    package = ".".join(path.relative_to(REPO).parts[:-1])
    return sorted(name for name in imported_modules(path.read_text(), package)
                  if name == "dynasd.kernels" or name.startswith("dynasd.kernels."))


def test_the_cache_and_the_decoders_import_nothing_from_the_kernels():
    files = [REPO / "dynasd" / "cache.py", *sorted((REPO / "dynasd" / "decoders").glob("*.py"))]
    assert len(files) >= 4
    for path in files:
        assert not kernel_imports(path), path.name


def test_the_import_guard_sees_every_spelling_of_a_kernels_import():
    """The guard above must be able to fail: relative and absolute imports are resolved to their modules."""
    source = "\n".join(["from ..kernels import accelerate", "from ..kernels.lean_forward import lean_forward",
                        "from .. import kernels", "import dynasd.kernels.fast_linear", "from ..cache import x"])
    names = imported_modules(source, "dynasd.decoders")
    assert {"dynasd.kernels.accelerate", "dynasd.kernels.lean_forward", "dynasd.kernels",
            "dynasd.kernels.fast_linear", "dynasd.cache.x"} <= names
    assert "dynasd.kernels" in imported_modules("from .kernels import accelerate", "dynasd")
    assert kernel_imports(REPO / "dynasd" / "loading" / "models.py") == ["dynasd.kernels", "dynasd.kernels.ARITHMETICS",
                                                             "dynasd.kernels.INT8", "dynasd.kernels.accelerate"]


def test_kernels_in_use_names_the_weights_and_the_products(monkeypatch):
    """The explorer's device line: what a model's linear layers compute with, in a few words."""
    from dynasd.kernels import kernels_in_use
    from dynasd.kernels.compile import VARIANT_LABELS, kernel_variant, multiplies_with_vnni

    variant = kernel_variant()
    compiled = f"{VARIANT_LABELS[variant]} kernels" if variant and panel_kernel() is not None else None
    pair = accelerate(tiny_random_pair())
    assert kernels_in_use(pair.target) == f"float32, {compiled or 'torch products'}"
    # the draft's layers that fit the panels are 8-bit blocks (block_weights.use_draft_blocks)
    eight_bit = f"8-bit blocks, {compiled}, 8-bit activations{' on VNNI' * multiplies_with_vnni(variant)}"
    assert kernels_in_use(pair.draft) == (eight_bit if compiled else "float32, torch products")
    assert kernels_in_use(accelerate(tiny_random_pair(), compiled_kernel=False).target) == "float32, torch products"
    monkeypatch.setenv("DYNASD_KERNEL_VARIANT", "torch")
    assert kernels_in_use(accelerate(tiny_random_pair()).target) == "float32, torch products"


def test_only_the_avx512_variant_on_a_cpu_with_vnni_multiplies_with_it(monkeypatch):
    """block_vnni.h's build test, read from this CPU's flags: the device line says VNNI only where it runs."""
    from dynasd.kernels import compile as compile_module

    for flags, variant, expected in [("avx2 avx512f avx512bw avx512_vnni", "avx512", True),
                                     ("avx2 avx512f avx512bw avx512_vnni", "avx2", False),
                                     ("avx2 avx512f avx512bw", "avx512", False), ("avx2 avx_vnni", "avx2", False),
                                     ("avx2 avx512f avx512bw avx512_vnni", None, False)]:
        monkeypatch.setattr(compile_module, "cpu_flags", lambda flags=flags: f"flags : {flags}")
        assert compile_module.multiplies_with_vnni(variant) == expected, (flags, variant)
