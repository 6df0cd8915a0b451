"""A GGUF target's weights kept in the quantized blocks they ship in, multiplied from there on CPU.

Why: transformers de-quantizes a GGUF file to float32 at load, so every forward of the embedded target reads
~540 MB of weights, though the file holds them in ~96 MB (Q4_1 layers, a Q8_0 embedding shared with the output
layer). A forward on CPU is bound by those reads. Here each linear layer whose GGUF tensor is Q4_1 or Q8_0 becomes a
`BlockLinear` over the file's own blocks (block_linear.cpp expands them to float32 in registers), the embedding a
`BlockEmbedding` that expands only the rows it looks up, and the float32 copies are dropped.

What changes: nothing in the weights. Q4_1's `d * q + m` and Q8_0's `d * q` are exact in float32, so every layer
is checked at load to expand to exactly the float32 weight transformers made from the same file (a layer that does
not match, or whose type this file does not know, keeps its float32 weight, with a warning). Where the model was
read from a converted checkpoint (converted.py, `dynasd_float32_file`), the check reads that file in slices of a few
MB, each through a mapping closed at once: the model's own float32 weights are memory-mapped from it and never
touched, so they never become part of the process's memory (a generate's peak: 1.4 GB before, see
docs/benchmarks.md). Products are summed
in another order than MKL's, so logits differ from the float32 path's by float rounding (~1e-5 relative), and
greedy identity is a property within one weight mode (tests/test_block_weights.py).
"""
from __future__ import annotations

import mmap
import struct
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from .compile import kernel_once
from .fast_linear import panels_back_to_back
from .memory import return_freed_memory

PANEL = 32  # output columns per panel (block_linear.cpp)
BLOCK = 32  # inputs per quantization block
Q4_1, Q8_0 = "Q4_1", "Q8_0"
FORMAT_CODE = {Q4_1: 0, Q8_0: 1}  # the kernel's `format` argument
RAW_BYTES = {Q4_1: 20, Q8_0: 34}  # bytes per block in the file: d, (m,) codes
KERNEL_NAME = "dynasd_block_linear"
KERNEL_SOURCE = Path(__file__).with_name("block_linear.cpp")


def block_kernel(variant: str | None = None):
    """The compiled `block_linear(x, panels, format)` op in `variant` (default: the one this process uses,
    compile.kernel_variant), or None where there is none or it cannot be built here (warned once)."""
    return kernel_once(KERNEL_NAME, KERNEL_SOURCE,
                       lambda name: getattr(torch.ops, f"dynasd_blocks_{name}").block_linear, variant)


def kernel_library(kernel):
    """The torch.ops namespace a compiled block kernel was registered in (one per variant): its library's other
    operators (block_layers, exact_attention) are read from there."""
    return getattr(torch.ops, kernel._qualified_op_name.partition("::")[0])


def exact_attention_op(variant: str | None = None):
    """The compiled exact_attention (exact_attention.h) of the block kernel's library in `variant`."""
    return kernel_library(block_kernel(variant)).exact_attention


# ---------------------------------------------------------------------------------------------------------------
# the file's blocks

def read_blocks(path: Path) -> dict[str, tuple[str, "BlockSource"]]:
    """GGUF tensor name -> (type, where its raw blocks lie in the file) for every Q4_1 and Q8_0 tensor of the file.

    Read from the file's header by `gguf_tensor_table`: the gguf package's reader also parses every metadata value
    into numpy objects (the tokenizer's ~100,000 strings: 164 MB at its peak for the embedded target)."""
    blocks = {}
    for name, kind, shape, offset in gguf_tensor_table(Path(path)):
        if kind in RAW_BYTES:
            columns, rows = shape[0], int(np.prod(shape[1:], dtype=np.int64))
            n_bytes = rows * (columns // BLOCK) * RAW_BYTES[kind]
            blocks[name] = (kind, BlockSource(Path(path), offset, n_bytes, rows))
    return blocks


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGML_TYPES = {3: Q4_1, 8: Q8_0}  # ggml's type ids of the two formats read here; other tensors are named by id


def gguf_tensor_table(path: Path) -> list[tuple[str, str, list[int], int]]:
    """(name, type, shape as GGUF gives it (columns first), absolute offset of its data) of every tensor of a GGUF
    file (version 2 or 3, little-endian), read from its header; metadata values are skipped, not parsed."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF" or struct.unpack_from("<I", data, 4)[0] not in (2, 3):
            raise ValueError(f"{path} is not a GGUF file of version 2 or 3")
        tensors, fields = struct.unpack_from("<QQ", data, 8)
        at, alignment = 24, 32

        def string(at: int) -> tuple[str, int]:
            length = struct.unpack_from("<Q", data, at)[0]
            return data[at + 8:at + 8 + length].decode("utf-8", errors="replace"), at + 8 + length

        def skip(kind: int, at: int, count: int = 1) -> int:
            if kind in _GGUF_SCALARS:
                return at + count * struct.calcsize("<" + _GGUF_SCALARS[kind])
            for _ in range(count):
                if kind == _GGUF_STRING:
                    at += 8 + struct.unpack_from("<Q", data, at)[0]
                elif kind == _GGUF_ARRAY:
                    item, items = struct.unpack_from("<IQ", data, at)
                    at = skip(item, at + 12, items)
                else:
                    raise ValueError(f"{path}: unknown GGUF value type {kind}")
            return at

        for _ in range(fields):
            key, at = string(at)
            kind = struct.unpack_from("<I", data, at)[0]
            if key == "general.alignment" and kind == 4:
                alignment = struct.unpack_from("<I", data, at + 4)[0]
            at = skip(kind, at + 4)
        table = []
        for _ in range(tensors):
            name, at = string(at)
            dims = struct.unpack_from("<I", data, at)[0]
            shape = list(struct.unpack_from(f"<{dims}Q", data, at + 4))
            kind, offset = struct.unpack_from("<IQ", data, at + 4 + 8 * dims)
            at += 4 + 8 * dims + 12
            table.append((name, _GGML_TYPES.get(kind, f"type {kind}"), shape, offset))
        start = (at + alignment - 1) // alignment * alignment
    return [(name, kind, shape, start + offset) for name, kind, shape, offset in table]


class BlockSource:
    """One tensor's raw blocks in a GGUF file, read on demand with plain file reads: through the reader's memory
    map the file's pages would stay in the process's memory while it lives (~96 MB for the embedded target)."""

    def __init__(self, path: Path, offset: int, n_bytes: int, rows: int) -> None:
        self.path, self.offset, self.n_bytes, self.rows = path, offset, n_bytes, rows

    def read(self, kind: str) -> np.ndarray:
        """The (rows, blocks per row, bytes per block) uint8 blocks, a private copy."""
        data = np.fromfile(self.path, dtype=np.uint8, count=self.n_bytes, offset=self.offset)
        return data.reshape(self.rows, -1, RAW_BYTES[kind])


def dequantize(kind: str, raw: torch.Tensor) -> torch.Tensor:
    """(rows, blocks, bytes) raw blocks -> the (rows, blocks * 32) float32 weight they encode, as GGUF defines it."""
    d = raw[..., 0:2].contiguous().view(torch.float16).float()
    if kind == Q4_1:
        m = raw[..., 2:4].contiguous().view(torch.float16).float()
        codes = raw[..., 4:20]
        q = torch.cat([codes & 15, codes >> 4], dim=-1).float()
        return (d * q + m).reshape(raw.shape[0], -1)
    q = raw[..., 2:34].contiguous().view(torch.int8).float()
    return (d * q).reshape(raw.shape[0], -1)


def to_panels(kind: str, raw: torch.Tensor) -> torch.Tensor:
    """(rows, blocks, bytes) raw blocks -> (rows / 32, blocks, bytes) panels in block_linear.cpp's layout: per
    panel and block, the 32 columns' d (and m), then for each of the block's 32 inputs the 32 columns' codes."""
    rows, blocks, _ = raw.shape
    panels = raw.reshape(rows // PANEL, PANEL, blocks, -1).transpose(1, 2)  # (P, B, 32 columns, bytes)
    d = panels[..., 0:2].reshape(*panels.shape[:2], -1)  # the 32 columns' float16 d, back to back
    if kind == Q4_1:
        m = panels[..., 2:4].reshape(*panels.shape[:2], -1)
        codes = panels[..., 4:20]
        q = torch.cat([codes & 15, codes >> 4], dim=-1)  # (P, B, column, input)
        q = q.transpose(2, 3)  # (P, B, input, column)
        packed = q[..., :16] | (q[..., 16:] << 4)  # byte j: column j low, column j + 16 high
        return torch.cat([d, m, packed.reshape(*panels.shape[:2], -1)], dim=-1).contiguous()
    codes = panels[..., 2:34].transpose(2, 3)  # (P, B, input, column)
    return torch.cat([d, codes.reshape(*panels.shape[:2], -1)], dim=-1).contiguous()


INT8_PANEL = 8  # output columns per panel of the 8-bit-activation layout (block_int8.h)
INT8_FORMAT_CODE = {Q4_1: 2, Q8_0: 3}


def to_int8_panels(kind: str, raw: torch.Tensor) -> torch.Tensor:
    """(rows, blocks, bytes) raw blocks -> (rows / 8, blocks, bytes) panels in block_int8.h's layout: per panel and
    block, the 8 columns' d (and m), then the codes in the order the integer products read them (Q4_1: per load t,
    byte 4c + j = column c's input 8t + j, low nibble, and 8t + 4 + j, high; Q8_0: per step s, byte 2c + j = column
    c's input 2s + j)."""
    rows, blocks, _ = raw.shape
    panels = raw.reshape(rows // INT8_PANEL, INT8_PANEL, blocks, -1).transpose(1, 2)  # (P, B, 8 columns, bytes)
    shape = panels.shape[:2]
    d = panels[..., 0:2].reshape(*shape, -1)
    if kind == Q4_1:
        m = panels[..., 2:4].reshape(*shape, -1)
        codes = panels[..., 4:20]
        q = torch.cat([codes & 15, codes >> 4], dim=-1)  # (P, B, column, input 0..31)
        q = q.reshape(*shape, INT8_PANEL, 4, 2, 4).permute(0, 1, 3, 2, 5, 4)  # (P, B, t, column, j, half)
        packed = q[..., 0] | (q[..., 1] << 4)
        return torch.cat([d, m, packed.reshape(*shape, -1)], dim=-1).contiguous()
    codes = panels[..., 2:34].reshape(*shape, INT8_PANEL, 16, 2).permute(0, 1, 3, 2, 4)  # (P, B, s, column, j)
    return torch.cat([d, codes.reshape(*shape, -1)], dim=-1).contiguous()


SLICE_ROWS = 1024  # rows converted at a time by in_row_slices: a whole number of panels of either layout


def in_row_slices(convert, kind: str, raw: torch.Tensor) -> torch.Tensor:
    """`convert(kind, raw)` (to_panels or to_int8_panels) computed SLICE_ROWS rows at a time into one output.

    Why: a conversion's intermediate copies are several times its input, and all of them at once for the largest
    layer (the token draft's 16,384-row head) were the top of a load's peak memory (~30 MB over it). A panel holds
    whole rows, so each slice's panels are exactly those of the whole conversion."""
    rows = raw.shape[0]
    if rows <= SLICE_ROWS:
        return convert(kind, raw)
    first = convert(kind, raw[:SLICE_ROWS])
    panel_rows = SLICE_ROWS // first.shape[0]
    panels = first.new_empty((rows // panel_rows, *first.shape[1:]))
    panels[:first.shape[0]] = first
    for start in range(SLICE_ROWS, rows, SLICE_ROWS):
        part = raw[start:start + SLICE_ROWS]
        panels[start // panel_rows:(start + part.shape[0]) // panel_rows] = convert(kind, part)
    return panels


def llama_rope_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order transformers gives a Llama GGUF's q/k weights (its reverse of llama.cpp's rope permutation)."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)


# ---------------------------------------------------------------------------------------------------------------
# the modules

FLOAT32, INT8 = "float32", "int8"
ARITHMETICS = (INT8, FLOAT32)  # how block products treat their inputs: 8-bit blocks (integer products), or float32


class BlockLinear(torch.nn.Module):
    """y = x @ W.T with W in quantized panels (no bias: the GGUF models this file serves have none).

    `arithmetic`: "float32" expands each weight to float32 and multiplies the input as it is (block_linear.cpp);
    "int8" quantizes each input row to 8-bit blocks and multiplies in integers (block_int8.h): a row costs a
    fraction, and its result is still bitwise independent of the rows beside it. The two lay their panels out
    differently, so a layer is made for one."""

    def __init__(self, kind: str, raw: torch.Tensor, kernel, arithmetic: str = FLOAT32) -> None:
        super().__init__()
        if arithmetic not in ARITHMETICS:
            raise ValueError(f"arithmetic must be one of {', '.join(ARITHMETICS)}, got {arithmetic!r}")
        self.kind, self.kernel, self.arithmetic = kind, kernel, arithmetic
        self.format = INT8_FORMAT_CODE[kind] if arithmetic == INT8 else FORMAT_CODE[kind]
        self.out_features, self.in_features = raw.shape[0], raw.shape[1] * BLOCK
        panels = in_row_slices(to_int8_panels if arithmetic == INT8 else to_panels, kind, raw)
        # A buffer, not a parameter: code that reads a model's dtype from its first parameter must not see uint8.
        self.register_buffer("panels", panels, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # float32: plan_for gives blocks to float32 targets only
        return self.kernel(x, self.panels, self.format)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.kind} blocks, {self.arithmetic} arithmetic"


class FusedBlocks:
    """Block layers that read the same input (q/k/v, gate/up) as one kernel call over their panels back to back.

    Why: each kernel call has a fixed cost (thread fork/join, an output tensor) that a one-token forward pays 7
    times per layer; fused, 4 times. Every output column is still its own sum, so the results are bitwise those of
    the separate layers, whose panels become views of the fused ones (no extra memory)."""

    def __init__(self, layers: list[BlockLinear]) -> None:
        self.kernel, self.format = layers[0].kernel, layers[0].format
        self.sizes = [layer.out_features for layer in layers]
        self.panels = panels_back_to_back(layers)

    @staticmethod
    def of(layers: list[torch.nn.Module]) -> "FusedBlocks | None":
        """Fused layers, or None where they cannot be (not all block layers of one kind and input width)."""
        first = layers[0]
        if not all(isinstance(layer, BlockLinear) and layer.format == first.format
                   and layer.in_features == first.in_features for layer in layers):
            return None
        return FusedBlocks(list(layers))

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(self.kernel(x, self.panels, self.format).split(self.sizes, dim=-1))


class BlockEmbedding(torch.nn.Module):
    """An embedding whose rows are expanded from the output layer's Q8_0 panels on lookup (a tied model keeps one
    copy of its largest matrix: 30 MB here, instead of 113 MB as float32).

    A lookup reads each row's scales and codes where they lie in the panels (block_linear.cpp's block_embedding),
    not the rows' whole panels (18 KB each for the embedded target), which for a few tokens is several times less
    to read."""

    def __init__(self, head: BlockLinear) -> None:
        super().__init__()
        if head.kind != Q8_0:
            raise ValueError("BlockEmbedding reads Q8_0 panels")
        self.head = head
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self.lookup = kernel_library(head.kernel).block_embedding

    @property
    def weight(self) -> torch.Tensor:
        """The whole float32 matrix (for code that copies it, e.g. a draft sharing the embedding; not for lookups)."""
        return self(torch.arange(self.num_embeddings))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lookup(ids, self.head.panels, self.head.format)


# ---------------------------------------------------------------------------------------------------------------
# a draft's layers quantized to blocks

def fits_draft_blocks(layer: torch.nn.Module) -> bool:
    """Whether use_draft_blocks swaps `layer`: a bias-free nn.Linear whose outputs fill whole panels and whose inputs
    whole blocks."""
    return (type(layer) is torch.nn.Linear and layer.bias is None and not layer.out_features % PANEL
            and not layer.in_features % BLOCK)


def draft_block_kind(path: str) -> str:
    """The blocks a draft's layer at `path` (its name in the model) is quantized to: Q4_1 for the output layer (a
    SubsetHead's rows, or a full head), Q8_0 for the decoder layers.

    Why: measured on the embedded draft (AMD EPYC, AVX2 only, 2 threads, forwards interleaved with the target's, so
    each one reads its weights from memory): one row 2.06 ms all Q8_0, 1.75 with a Q4_1 head, 1.44 all Q4_1; top-1
    agreement on the target's greedy answers to 39 Spec-Bench prompts (2,393 tokens) 0.349, 0.347 and 0.337. The
    head's 4 bits cost next to no agreement; the layers' cost about as much as they save."""
    return Q4_1 if path == "lm_head" or path.startswith("lm_head.") else Q8_0


def use_draft_blocks(model: torch.nn.Module, kernel, arithmetic: str = FLOAT32) -> int:
    """Swap every bias-free nn.Linear of `model` whose shape fits the kernel's panels for a `BlockLinear` of the
    kind draft_block_kind names, quantized by gguf's own quantizer (llama.cpp's rules: per block of 32 inputs, Q8_0
    d = max |w| / 127, q = round(w / d); Q4_1 d = (max - min) / 15, m = min); returns how many were swapped. For
    drafts only: a draft proposes, the target decides, so rounding a draft's weights can change its proposals, never
    a lossless method's output.

    Why: a one-row draft forward is bound by the bytes it reads, and the embedded draft's float16 panels are 40 MB
    (half of them its 16,384-token head) against the target's 96 MB of blocks; as these blocks 17 MB (all Q8_0: 21)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    # Held by name, not as modules: each float32 layer is freed as soon as its blocks replace it, so the blocks of
    # one layer reuse the memory of the layers before it (a held list kept every one of them to the end).
    fitting = [(path, name) for path, module in model.named_modules()
               for name, child in module.named_children() if fits_draft_blocks(child)]
    for path, name in fitting:
        module = model.get_submodule(path)
        weight = getattr(module, name).weight
        kind = draft_block_kind(f"{path}.{name}" if path else name)
        raw = quantize(weight.detach().float().numpy(), getattr(GGMLQuantizationType, kind))
        raw = torch.from_numpy(raw.reshape(weight.shape[0], -1, RAW_BYTES[kind]))
        del weight
        setattr(module, name, BlockLinear(kind, raw, kernel, arithmetic))
    return len(fitting)


# ---------------------------------------------------------------------------------------------------------------
# swapping a loaded model's layers

_LLAMA_LAYER_TENSORS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                        "mlp.down_proj": "ffn_down"}


def _gguf_names(model: torch.nn.Module) -> dict[str, str]:
    """Module path -> GGUF tensor name, for a Llama model loaded from a GGUF file."""
    names = {"model.embed_tokens": "token_embd.weight", "lm_head": "output.weight"}
    for index in range(model.config.num_hidden_layers):
        for module, tensor in _LLAMA_LAYER_TENSORS.items():
            names[f"model.layers.{index}.{module}"] = f"blk.{index}.{tensor}.weight"
    return names


def _raw_for(model, path: str, raw: np.ndarray) -> torch.Tensor:
    raw = torch.from_numpy(raw)
    config = model.config
    if path.endswith("q_proj"):
        raw = raw[llama_rope_rows(raw.shape[0], config.num_attention_heads)]
    elif path.endswith("k_proj"):
        raw = raw[llama_rope_rows(raw.shape[0], config.num_key_value_heads)]
    return raw


CHECK_ROWS = 2048  # rows compared at a time: a few MB of float32


def saved_key(weights: Path, keys: list[str]) -> str | None:
    """The first of `keys` that the safetensors file `weights` holds (a tied embedding is saved once, under either
    name), or None."""
    with safe_open(str(weights), framework="pt") as file:
        held = set(file.keys())
    return next((key for key in keys if key in held), None)


def _expands_to_weight(model: torch.nn.Module, path: str, module: torch.nn.Module, kind: str, raw: torch.Tensor,
                       tied: bool) -> bool:
    """Whether `raw` expands to exactly `module`'s float32 weight, compared CHECK_ROWS rows at a time. The weight's
    rows are read from the model's converted checkpoint where it has one (a mapping opened and closed per slice, so
    no page of the model's own mapping is touched), else from the module."""
    saved = getattr(model, "dynasd_float32_file", None)
    key = None
    if saved is not None:
        shared = ["model.embed_tokens.weight", "lm_head.weight"]  # a tied weight is saved once, under either name
        key = saved_key(saved, shared if tied and path in ("model.embed_tokens", "lm_head") else [f"{path}.weight"])
    for start in range(0, raw.shape[0], CHECK_ROWS):
        stop = min(start + CHECK_ROWS, raw.shape[0])
        if key is not None:
            with safe_open(str(saved), framework="pt") as file:
                rows = file.get_slice(key)[start:stop]
        else:
            rows = module.weight.detach()[start:stop]
        if rows.shape != (stop - start, raw.shape[1] * BLOCK) or \
                not torch.equal(dequantize(kind, raw[start:stop]), rows.float()):
            return False
    return True


def use_gguf_blocks(model: torch.nn.Module, gguf_path: Path, kernel, arithmetic: str = FLOAT32) -> list[str]:
    """Swap `model`'s linear layers and tied embedding for block modules over `gguf_path`'s blocks, in place, and
    drop their float32 weights. Returns the module paths that kept float32 weights, each with why.

    Llama models only: the tensor names and the q/k row order are Llama's (other architectures name, order or bias
    their projections otherwise), and a layer with a bias keeps its float32 weight."""
    if type(model).__name__ != "LlamaForCausalLM":
        return [f"{type(model).__name__}: only Llama models are kept in GGUF blocks"]
    kept: list[str] = []
    blocks = read_blocks(gguf_path)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    modules = dict(model.named_modules())
    for path, tensor in _gguf_names(model).items():
        module = modules.get(path)
        if tensor not in blocks:
            if module is not None and (path != "lm_head" or not tied):
                kept.append(f"{path}: its GGUF tensor is not Q4_1 or Q8_0")
            continue
        kind, source = blocks[tensor]
        if module is None or getattr(module, "bias", None) is not None:
            kept.append(f"{path}: no such bias-free layer in the model")
            continue
        raw = _raw_for(model, path, source.read(kind))
        if raw.shape[0] % PANEL or not _expands_to_weight(model, path, module, kind, raw, tied):
            kept.append(f"{path}: its blocks do not expand to the loaded weight")
            continue
        layer = BlockLinear(kind, raw, kernel, arithmetic)
        if path == "model.embed_tokens":
            if kind != Q8_0 or not tied:
                kept.append(f"{path}: only a tied Q8_0 embedding is kept in blocks")
                continue
            model.lm_head = layer
            model.model.embed_tokens = BlockEmbedding(layer)
            return_freed_memory()  # the largest layer's intermediate copies (~60 MB)
        else:
            parent, _, name = path.rpartition(".")
            setattr(modules[parent], name, layer)
    if kept:
        warnings.warn("dynasd: float32 weights kept for " + "; ".join(kept), stacklevel=2)
    else:
        _own_parameters(model)
    del modules
    return_freed_memory()  # the reads' and checks' copies (~30 MB), before the next swaps of this model add theirs
    return kept


def _own_parameters(model: torch.nn.Module) -> None:
    """Copy the float32 parameters left beside the blocks (the norms: ~0.3 MB) out of the checkpoint they were
    loaded from. A model read from a safetensors file keeps its weights as views of the file's memory map, and the
    map, with every page of it the load touched (~13-21 MB here), stays in the process while one view lives."""
    with torch.no_grad():
        for module in model.modules():
            for name, param in module._parameters.items():
                if param is not None:
                    module._parameters[name] = torch.nn.Parameter(param.detach().clone(),
                                                                  requires_grad=param.requires_grad)
