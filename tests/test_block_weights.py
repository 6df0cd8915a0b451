"""A GGUF target kept in its quantized blocks computes with exactly the float32 weights transformers makes from the
same file: the kernel's products agree with x @ W.T within float rounding, a row's result never depends on the rows
beside it, the embedding rows come out exact, and decoding within the block mode stays greedy-identical."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import pair_on
from gguf import GGMLQuantizationType, GGUFWriter, quants

from dynasd.kernels import plan_for
from dynasd.kernels.block_weights import (
    Q4_1,
    Q8_0,
    BlockEmbedding,
    BlockLinear,
    FusedBlocks,
    block_kernel,
    dequantize,
    in_row_slices,
    llama_rope_rows,
    to_int8_panels,
    to_panels,
    use_draft_blocks,
    use_gguf_blocks,
)
from dynasd.kernels.compile import kernel_variant, runnable_variants
from dynasd.loading.models import ModelLoadError, load_pair

QTYPE = {Q4_1: GGMLQuantizationType.Q4_1, Q8_0: GGMLQuantizationType.Q8_0}


def quantized(kind: str, weight: torch.Tensor) -> torch.Tensor:
    """The (rows, blocks, bytes) GGUF blocks of `weight`, made by the gguf package's own quantizer."""
    raw = quants.quantize(weight.numpy(), QTYPE[kind])
    return torch.from_numpy(raw).reshape(weight.shape[0], weight.shape[1] // 32, -1)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_blocks_expand_to_what_the_gguf_package_reads(kind):
    raw = quantized(kind, torch.randn(64, 96, generator=torch.Generator().manual_seed(0)))
    reference = quants.dequantize(raw.reshape(64, -1).numpy(), QTYPE[kind])
    assert torch.equal(dequantize(kind, raw), torch.from_numpy(reference))


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize("rows", [1, 2, 4, 5, 6, 12, 13, 31])
def test_block_products_equal_the_float32_weights_products(kernel, kind, rows):
    gen = torch.Generator().manual_seed(rows)
    raw = quantized(kind, torch.randn(96, 128, generator=gen))
    layer, weight = BlockLinear(kind, raw, kernel), dequantize(kind, raw)
    x = torch.randn(rows, 128, generator=gen)
    torch.testing.assert_close(layer(x), x @ weight.T, rtol=1e-5, atol=1e-4)
    assert layer(x.view(1, rows, 128)).shape == (1, rows, 96)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(kernel, kind):
    """What makes a tree verify see exactly what a one-token forward sees: the same sums in the same order."""
    gen = torch.Generator().manual_seed(1)
    layer = BlockLinear(kind, quantized(kind, torch.randn(64, 64, generator=gen)), kernel)
    x = torch.randn(27, 64, generator=gen)
    together = layer(x)
    assert torch.equal(together, torch.cat([layer(x[i:i + 1]) for i in range(27)]))
    for rows in range(2, 14):  # AVX2: the whole panel for one row, half panels in passes of up to 4 (Q8_0: 5)
        assert torch.equal(together[3:3 + rows], layer(x[3:3 + rows])), rows


@pytest.mark.parametrize("arithmetic", ["float32", "int8"])
@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_every_variant_gives_bitwise_the_same_products(kind, arithmetic):
    """AVX-512 and AVX2 expand the same weights and sum each output in the same order; in 8-bit activations the
    AVX-512 build multiplies with VNNI where the CPU has it (block_vnni.h: two 8-column panels an instruction, an
    odd last panel by the AVX2 code, rows in passes of 8) into the same integer sums."""
    variants = runnable_variants()
    if len(variants) < 2 or any(block_kernel(variant) is None for variant in variants):
        pytest.skip("this CPU executes one kernel variant at most")
    gen = torch.Generator().manual_seed(5)
    for columns in (96, 40):  # 12 and 5 panels of 8 columns (32-column panels for float32: 96 only)
        if arithmetic == "float32" and columns % 32:
            continue
        raw = quantized(kind, torch.randn(columns, 128, generator=gen))
        layers = [BlockLinear(kind, raw, block_kernel(variant), arithmetic) for variant in variants]
        for rows in (1, 2, 3, 5, 7, 8, 9, 13, 17, 30):
            x = torch.randn(rows, 128, generator=gen) * torch.rand(rows, 1, generator=gen) * 10
            results = [layer(x) for layer in layers]
            assert all(torch.equal(results[0], other) for other in results[1:]), (columns, rows)


def test_fused_projections_are_bitwise_the_separate_layers(kernel):
    gen = torch.Generator().manual_seed(2)
    layers = [BlockLinear(Q4_1, quantized(Q4_1, torch.randn(n, 64, generator=gen)), kernel) for n in (64, 32, 32)]
    x = torch.randn(3, 64, generator=gen)
    separate = [layer(x) for layer in layers]
    fused = FusedBlocks.of(layers)
    assert all(torch.equal(a, b) for a, b in zip(fused(x), separate))
    assert all(torch.equal(layer(x), b) for layer, b in zip(layers, separate))  # the layers' panels are views now
    mixed = [BlockLinear(Q8_0, quantized(Q8_0, torch.randn(32, 64, generator=gen)), kernel), layers[0]]
    assert FusedBlocks.of(mixed) is None and FusedBlocks.of([torch.nn.Linear(64, 32)]) is None


@pytest.mark.parametrize("arithmetic", ["float32", "int8"])
def test_the_embedding_rows_come_out_exact(kernel, arithmetic):
    """From either arithmetic's panel layout (32 columns an input, or 8 columns two inputs at a time)."""
    raw = quantized(Q8_0, torch.randn(96, 64, generator=torch.Generator().manual_seed(3)))
    embedding = BlockEmbedding(BlockLinear(Q8_0, raw, kernel, arithmetic))
    ids = torch.tensor([[0, 31, 32, 95, 7], [95, 95, 1, 64, 33]])
    assert torch.equal(embedding(ids), dequantize(Q8_0, raw)[ids])
    with pytest.raises(RuntimeError, match="outside the embedding"):
        embedding(torch.tensor([96]))
    with pytest.raises(ValueError):
        BlockEmbedding(BlockLinear(Q4_1, quantized(Q4_1, torch.randn(32, 64)), kernel))


# ---------------------------------------------------------------------------------------------------------------
# a small Llama written as a GGUF file, then its layers swapped for the file's blocks

def small_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def write_gguf(model, path, corrupt: str | None = None) -> None:
    """Quantize `model`'s weights into a GGUF file as llama.cpp lays them out (q/k rows in its rope order) and set
    the model to the values the file encodes, as transformers would load them. `corrupt` names one tensor whose
    blocks are written for other weights."""
    writer = GGUFWriter(str(path), "llama")
    config = model.config
    tensors = {"token_embd.weight": (Q8_0, model.model.embed_tokens)}
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    modules = dict(model.named_modules())
    for index in range(config.num_hidden_layers):
        for module, tensor in names.items():
            tensors[f"blk.{index}.{tensor}.weight"] = (Q4_1, modules[f"model.layers.{index}.{module}"])
    with torch.no_grad():
        for name, (kind, module) in tensors.items():
            raw = quantized(kind, module.weight.detach())
            module.weight.copy_(dequantize(kind, raw))
            if name == corrupt:
                raw = quantized(kind, torch.randn(module.weight.shape))
            heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
            kind_of_rows = name.split(".")[-2]
            if kind_of_rows in heads:  # the file holds llama.cpp's row order; loading reverses it
                raw = raw[torch.argsort(llama_rope_rows(raw.shape[0], heads[kind_of_rows]))]
            writer.add_tensor(name, raw.reshape(raw.shape[0], -1).numpy(), raw_dtype=QTYPE[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize("rows", [64, 1024, 2080])
def test_panels_made_in_row_slices_are_those_of_the_whole_layer(kind, rows):
    """A layer's panels are made a slice of rows at a time (to bound a load's memory); a panel holds whole rows, so
    every byte is the one a conversion of the whole layer gives, in either layout."""
    raw = quantized(kind, torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows)))
    for convert in (to_panels, to_int8_panels):
        assert torch.equal(in_row_slices(convert, kind, raw), convert(kind, raw))


def test_a_drafts_layers_become_blocks_of_their_own_weights(kernel):
    """use_draft_blocks: each bias-free linear layer whose shape fits the panels becomes the blocks gguf's own
    quantizer makes of its weight (Q8_0; the output layer Q4_1), and multiplies as those blocks expanded; a layer
    with a bias or an output count that is no multiple of 32 stays as it was."""
    gen = torch.Generator().manual_seed(3)
    model = torch.nn.ModuleDict({"layer": torch.nn.Linear(64, 96, bias=False),
                                 "odd": torch.nn.Linear(96, 40, bias=False),
                                 "biased": torch.nn.Linear(96, 64, bias=True),
                                 "lm_head": torch.nn.Linear(64, 128, bias=False)})
    weight, head = model["layer"].weight.detach().clone(), model["lm_head"].weight.detach().clone()
    assert use_draft_blocks(model, kernel) == 2
    assert type(model["odd"]) is type(model["biased"]) is torch.nn.Linear
    assert (model["layer"].kind, model["lm_head"].kind) == (Q8_0, Q4_1)
    assert torch.equal(dequantize(Q8_0, quantized(Q8_0, weight)), dequantize(Q8_0, _raw_blocks(model["layer"])))
    x = torch.randn(3, 64, generator=gen)
    for layer, kind, w in ((model["layer"], Q8_0, weight), (model["lm_head"], Q4_1, head)):
        torch.testing.assert_close(layer(x), x @ dequantize(kind, quantized(kind, w)).T, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(model["layer"](x), x @ weight.T, rtol=0.02, atol=0.02)  # 8 bits: close, not equal


def _raw_blocks(layer: BlockLinear) -> torch.Tensor:
    """A Q8_0 layer's (rows, blocks, 34 bytes) blocks, back from its panels (block_weights.to_panels' inverse)."""
    panels = layer.panels  # (P, B, 32 d bytes... ): d of 32 columns (64 bytes), then 32 inputs x 32 columns of codes
    p, b, _ = panels.shape
    d = panels[..., :64].reshape(p, b, 32, 2)
    codes = panels[..., 64:].reshape(p, b, 32, 32).transpose(2, 3)  # (P, B, column, input)
    return torch.cat([d, codes], dim=-1).transpose(1, 2).reshape(p * 32, b, 34)


def test_the_embedded_draft_reads_blocks_and_proposes_as_before(embedded_pair):
    """The embedded draft's every linear layer is blocks, its decoder layers Q8_0 and its 16,384-token head Q4_1:
    17 MB a forward instead of 40 MB of float16 panels (21 MB with a Q8_0 head). Its proposals may change; the
    output cannot (tests/test_greedy_identity.py)."""
    from dynasd.kernels import kernels_in_use, weight_bytes_per_forward

    draft = embedded_pair.draft
    if kernel_variant() is None:
        pytest.skip("no kernel variant here: the draft keeps its float32 weights")
    assert not [path for path, m in draft.named_modules() if type(m) is torch.nn.Linear]
    assert isinstance(draft.lm_head.rows, BlockLinear) and draft.lm_head.rows.kind == Q4_1
    assert {m.kind for m in draft.model.layers.modules() if isinstance(m, BlockLinear)} == {Q8_0}
    assert 16e6 < weight_bytes_per_forward(draft) < 18e6
    assert kernels_in_use(draft).startswith("8- and 4-bit blocks, ")


def test_the_tensor_table_is_the_one_the_gguf_package_reads(tmp_path):
    """read_blocks skips the metadata instead of parsing it (the gguf package's reader peaked at 164 MB on the
    embedded file, its ~100,000 tokenizer strings); names, shapes and offsets are the package's, on a small file and
    on the embedded one (string arrays and all) where it is installed."""
    from gguf import GGUFReader

    from dynasd.kernels.block_weights import gguf_tensor_table
    from dynasd.loading.embedded import installed_gguf

    path = tmp_path / "small.gguf"
    write_gguf(small_llama(), path)
    for file in [path, installed_gguf()]:
        if file is None:
            continue
        reference = {tensor.name: (tensor.tensor_type.name, [int(n) for n in tensor.shape], int(tensor.data_offset))
                     for tensor in GGUFReader(str(file)).tensors}
        table = {name: (kind, shape, offset) for name, kind, shape, offset in gguf_tensor_table(file)}
        assert table.keys() == reference.keys()
        for name, (kind, shape, offset) in table.items():
            assert (shape, offset) == reference[name][1:], name
            assert kind == reference[name][0] or reference[name][0] not in (Q4_1, Q8_0), name


def test_a_gguf_models_layers_become_blocks_with_the_same_logits(kernel, tmp_path):
    model = small_llama()
    write_gguf(model, tmp_path / "small.gguf")
    ids = torch.tensor([[5, 17, 90, 3, 44, 61]])
    with torch.no_grad():
        reference = model(ids).logits
    assert use_gguf_blocks(model, tmp_path / "small.gguf", kernel) == []
    assert isinstance(model.lm_head, BlockLinear) and isinstance(model.model.embed_tokens, BlockEmbedding)
    assert not [m for m in model.modules() if type(m) is torch.nn.Linear]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-4, atol=1e-4)


def mapped_ranges(path) -> list[tuple[int, int]]:
    """The address ranges of this process's memory maps of the file `path` (/proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == str(path):
                start, end = (int(address, 16) for address in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's maps (Linux)")
def test_a_model_in_blocks_keeps_no_tensor_in_its_checkpoints_memory_map(kernel, tmp_path):
    """A model read from a safetensors file holds its weights as views of the file's memory map; once its layers are
    blocks, nothing of it may still point there (the map, with the pages the load touched, would stay in the
    process: 13 MB for the embedded target), and no float32 matrix is left beside the blocks."""
    from safetensors.torch import save_model
    from transformers import LlamaForCausalLM

    model = small_llama(seed=2)
    write_gguf(model, tmp_path / "small.gguf")
    save_model(model, str(tmp_path / "model.safetensors"))
    model.config.save_pretrained(str(tmp_path))
    loaded = LlamaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    checkpoint = (tmp_path / "model.safetensors").resolve()

    def in_the_map() -> list[str]:
        ranges = mapped_ranges(checkpoint)
        return [name for name, tensor in loaded.named_parameters()
                if any(start <= tensor.data_ptr() < end for start, end in ranges)]

    if not in_the_map():
        pytest.skip("this transformers version copies a checkpoint's weights at load (nothing to let go of)")
    assert use_gguf_blocks(loaded, tmp_path / "small.gguf", kernel) == []
    assert in_the_map() == []
    assert not mapped_ranges(checkpoint)
    assert all(tensor.dim() == 1 for tensor in loaded.parameters())  # the norms; every matrix is in blocks


def test_a_layer_whose_blocks_do_not_match_keeps_its_float32_weight(kernel, tmp_path):
    model = small_llama(seed=1)
    write_gguf(model, tmp_path / "small.gguf", corrupt="blk.1.ffn_up.weight")
    with pytest.warns(UserWarning, match="float32 weights kept for model.layers.1.mlp.up_proj"):
        kept = use_gguf_blocks(model, tmp_path / "small.gguf", kernel)
    assert kept == ["model.layers.1.mlp.up_proj: its blocks do not expand to the loaded weight"]
    assert type(model.model.layers[1].mlp.up_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[1].mlp.down_proj, BlockLinear)


def test_other_architectures_keep_their_float32_weights(kernel, tmp_path):
    """Their GGUF names, q/k row order or biases are not Llama's: nothing is swapped, the file is not even read."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    model = Qwen2ForCausalLM(config).eval()
    assert use_gguf_blocks(model, tmp_path / "absent.gguf", kernel) == [
        "Qwen2ForCausalLM: only Llama models are kept in GGUF blocks"]
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear


# ---------------------------------------------------------------------------------------------------------------
# which models get blocks

def test_only_a_float32_target_on_a_cpu_with_a_kernel_variant_gets_blocks():
    assert plan_for(torch.device("cpu")).gguf_blocks == (kernel_variant() is not None)
    assert not plan_for(torch.device("cpu"), weights="fp32").gguf_blocks
    assert not plan_for(torch.device("cpu"), dtype=torch.bfloat16).gguf_blocks
    assert not plan_for(torch.device("cpu"), decides_output=False).gguf_blocks  # drafts are not GGUF files
    assert not plan_for(torch.device("cpu"), compiled_kernel=False).gguf_blocks
    assert not plan_for(torch.device("cuda")).gguf_blocks


def test_an_unknown_weight_mode_is_refused_in_one_line():
    with pytest.raises(ModelLoadError, match="weights must be one of gguf, fp32, got 'int3'"):
        load_pair("tiny-random", weights="int3")


@pytest.mark.slow
@pytest.mark.parametrize("arithmetic", ["int8", "float32"])
def test_the_embedded_target_in_blocks_decodes_as_in_float32(embedded_pair, arithmetic):
    """Both weight modes hold the same values. In float32 arithmetic the blocks give the float32 weights' logits
    within rounding; in 8-bit activations (the default) the distributions stay within a few thousandths of a nat
    of them. Greedy identity is checked within each arithmetic (every lossless method against ar), and the first
    tokens also agree across modes on this prompt. The float32 weights are loaded here, only where the blocks are
    used (x86 with AVX-512 or AVX2)."""
    from dynasd.decoders import make_decoder
    from dynasd.options import DecoderOptions

    blocks = embedded_pair if arithmetic == "int8" else pair_on("embedded", "cpu", arithmetic=arithmetic)
    if not plan_for(blocks.device).gguf_blocks:
        assert type(blocks.target.model.layers[0].mlp.up_proj) is not BlockLinear
        pytest.skip("no kernel variant here: the embedded target keeps float32 weights (plan_for)")
    plain = pair_on("embedded", "cpu", weights="fp32")
    target = blocks.target
    assert isinstance(target.model.layers[0].mlp.up_proj, BlockLinear) and isinstance(target.lm_head, BlockLinear)
    assert target.lm_head.arithmetic == arithmetic
    assert blocks.draft.get_input_embeddings().shared is target.get_input_embeddings()  # shared, not a float32 copy
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in list(target.parameters()) + list(target.buffers())}
    assert sum(held.values()) < 100 * 2**20  # the file's ~96 MB of blocks and norms, not ~540 MB of float32
    ids = blocks.encode_prompt("Name three rivers in Europe.")
    with torch.no_grad():
        x = torch.tensor([ids])
        logits, reference_logits = target(x).logits, plain.target(x).logits
    if arithmetic == "float32":
        torch.testing.assert_close(logits, reference_logits, rtol=1e-3, atol=2e-3)
    else:  # measured: KL 0.006 nats on average, 0.05 at most; 97% of the argmaxes the same
        reference, rounded = torch.log_softmax(reference_logits, -1), torch.log_softmax(logits, -1)
        divergence = (reference.exp() * (reference - rounded)).sum(-1)
        assert 0 < divergence.mean() < 0.02 and divergence.max() < 0.2
        assert (logits.argmax(-1) == reference_logits.argmax(-1)).float().mean() >= 0.9

    def tokens(pair, method, **options):
        return make_decoder(pair, DecoderOptions(method=method, **options)).generate(ids, 24).new_token_ids

    reference = tokens(blocks, "ar")
    assert tokens(plain, "ar")[:8] == reference[:8]
    for method, options in [("sd", {}), ("mcsd", {}), ("pld", {}), ("mcsd", {"k_config": (2, 1, 1, 1), "lookup": 8})]:
        assert tokens(blocks, method, **options) == reference, (method, options)


def test_the_bench_loads_one_pair_per_weight_mode_asked_for():
    from dynasd.bench.specs import parse_methods

    specs = {spec.label: spec for spec in parse_methods("ar,sd:weights=fp32,pld:kernels=torch:weights=gguf")}
    assert specs["ar"].pair_key("gguf") == "fast"
    assert specs["sd:weights=fp32"].pair_key("gguf") == "fast/weights=fp32"
    assert specs["sd:weights=fp32"].pair_key("fp32") == "fast"  # the run's own default
    assert specs["pld:kernels=torch:weights=gguf"].pair_key("fp32") == "torch/weights=gguf"


def test_a_bad_weight_mode_is_refused_by_the_bench_and_the_command_line(capsys):
    from dynasd.bench.specs import parse_methods
    from dynasd.cli import main
    from dynasd.options import OptionsError

    with pytest.raises(OptionsError, match="weights must be gguf or fp32, got 'q2'"):
        parse_methods("ar:weights=q2")
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--pair", "tiny-random", "--weights", "q2", "--prompt", "hi"])
    assert exit_info.value.code == 2 and "invalid choice: 'q2'" in capsys.readouterr().err
