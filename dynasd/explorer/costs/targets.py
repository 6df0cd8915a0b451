"""Targets of larger real shapes, measured on this device in the embedded target's own arithmetic.

Why: whether speculation pays depends on what a draft forward costs against a target forward, and on a CPU on what
every extra verify row costs; both change with the target's size. The shapes below are the configurations of
public models (written here, from their config.json: no hub access), built with seeded random weights in the
embedded target's arithmetic (Q4_1 blocks for the layers, a tied Q8_0 head and embedding, 8-bit activations, this
project's block kernels and compiled layers: dynasd/kernels/), so that their forwards cost here what the real
models' would. Weights do not change a forward's cost; random ones are never used to decode anything.

Each shape's forward over 1..64 rows is measured once per device, at first use (measuring.py, one part a shape),
by the rules of the device's own costs (cost.py): every row count timed in interleaved rounds, the median kept,
the load recorded, kept in the cache folder beside the device's costs by cost.settle's rule. A model whose layers'
blocks exceed WHOLE_BYTES (a 7B model is 27 GB in float32 and ~4 GB in blocks) is not built whole: forwards of
SCALED_DEPTHS real-shaped layers with the real head are measured and the layers' cost is scaled to the model's
layer count (a forward's layers run one after another, each at the same cost), and the result says so.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from ...device_info import device_key, machine_line
from ...kernels import accelerate_model, plan_for
from ...kernels.block_weights import BLOCK, INT8, Q4_1, Q8_0, RAW_BYTES, BlockEmbedding, BlockLinear, block_kernel
from ...loading.embedded import cache_dir
from .cost import (
    CALIBRATION_CONTEXT,
    CALIBRATION_ROUNDS,
    CALIBRATION_ROWS,
    MeasuredCosts,
    load_average,
    measure_models,
)

WHOLE_BYTES = 512 * 2**20    # layers in blocks up to this are built whole; beyond, SCALED_DEPTHS and scaled
SCALED_DEPTHS = (1, 5)  # far apart: the per-layer cost is their difference over 4, its noise cut by 4
Q4_1_BYTES_PER_WEIGHT = 20 / 32   # a 32-weight block: float16 d and m, 16 bytes of codes
Q8_0_BYTES_PER_WEIGHT = 34 / 32   # a 32-weight block: float16 d, 32 codes


@dataclass(frozen=True)
class TargetShape:
    """A Llama-style model's configuration: what sets a forward's cost."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True
    rope_theta: float = 10000.0

    @property
    def layer_weights(self) -> int:
        kv = self.hidden // self.heads * self.kv_heads
        return self.hidden * (2 * self.hidden + 2 * kv) + 3 * self.hidden * self.intermediate

    @property
    def parameters(self) -> int:
        """Every weight (the norms left out: a few thousand)."""
        return self.layers * self.layer_weights + self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def block_bytes(self) -> int:
        """What one forward reads in the embedded target's arithmetic: Q4_1 layers, a Q8_0 head."""
        return int(self.layers * self.layer_weights * Q4_1_BYTES_PER_WEIGHT
                   + self.vocab * self.hidden * Q8_0_BYTES_PER_WEIGHT)

    @property
    def scaled(self) -> bool:
        return self.layers * self.layer_weights * Q4_1_BYTES_PER_WEIGHT > WHOLE_BYTES


# The configurations (config.json of HuggingFaceTB/SmolLM2-135M-Instruct, -360M-Instruct, -1.7B-Instruct and
# meta-llama/Llama-2-7b-hf). The first is the embedded target's own shape.
EMBEDDED_SHAPE = TargetShape("SmolLM2-135M", 576, 30, 9, 3, 1536, 49152, rope_theta=100000.0)
BIGGER_TARGETS = (
    TargetShape("SmolLM2-360M", 960, 32, 15, 5, 2560, 49152, rope_theta=100000.0),
    TargetShape("SmolLM2-1.7B", 2048, 24, 32, 32, 8192, 49152, rope_theta=130000.0),
    TargetShape("Llama-2-7B", 4096, 32, 32, 32, 11008, 32000, tied=False),
)


def shape_of_config(name: str, config) -> TargetShape:
    """The shape of a loaded model's transformers config (a draft's, for its parameter count)."""
    return TargetShape(name, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                       getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                       config.intermediate_size, config.vocab_size,
                       tied=bool(getattr(config, "tie_word_embeddings", True)))


def draft_shape_of(pair) -> TargetShape | None:
    """The default draft's shape, with the rows its output layer really has (a reduced head: models.SubsetHead)."""
    draft = pair.default_draft()
    if draft is None or getattr(draft, "config", None) is None:
        return None
    shape = shape_of_config("the draft", draft.config)
    head = getattr(draft, "lm_head", None)
    token_ids = getattr(head, "token_ids", None)
    if token_ids is not None:  # the draft's head scores only these tokens; its embedding is the target's, shared
        shape = replace(shape, vocab=int(token_ids.numel()))
    return shape


# -- building a shape in blocks -----------------------------------------------------------------------------------

def random_blocks(kind: str, rows: int, columns: int, generator: torch.Generator) -> torch.Tensor:
    """(rows, columns / 32, bytes) raw GGUF blocks of `kind` with random codes and scales of a trained layer's
    size (weights within about ±0.08): the cost of a product does not depend on the values."""
    blocks = columns // BLOCK
    raw = torch.randint(0, 256, (rows, blocks, RAW_BYTES[kind]), dtype=torch.uint8, generator=generator)
    d = (0.005 + 0.01 * torch.rand(rows, blocks, 1, generator=generator)).half()
    raw[..., 0:2] = d.view(torch.uint8)
    if kind == Q4_1:
        raw[..., 2:4] = (-7.5 * d.float()).half().view(torch.uint8)  # m: the codes 0..15 centred on zero
    return raw


def build_target(shape: TargetShape, layers: int | None = None, seed: int = 0) -> torch.nn.Module:
    """`shape` (or its first `layers` layers, with the real head) as a Llama model in the embedded target's
    arithmetic, never holding float32 weights: built on the meta device, its linear layers replaced by block
    layers over random blocks, then accelerated as the embedded target is (kernels.accelerate_model)."""
    kernel = block_kernel()
    if kernel is None:
        raise RuntimeError("no block kernel runs on this CPU: the embedded target's arithmetic is not available")
    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=layers or shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, max_position_embeddings=4096, tie_word_embeddings=True,
                         rope_theta=shape.rope_theta)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    raw = random_blocks(Q4_1, child.out_features, child.in_features, generator)
                    setattr(parent, name, BlockLinear(Q4_1, raw, kernel, INT8))
    head = BlockLinear(Q8_0, random_blocks(Q8_0, shape.vocab, shape.hidden, generator), kernel, INT8)
    model.lm_head, model.model.embed_tokens = head, BlockEmbedding(head)
    for module in model.modules():  # what is left on the meta device: the norms' weights
        for name, parameter in list(module._parameters.items()):
            if parameter is not None and parameter.is_meta:
                module._parameters[name] = torch.nn.Parameter(torch.ones(parameter.shape), requires_grad=False)
    with torch.device("cpu"):
        model.model.rotary_emb = LlamaRotaryEmbedding(config)
    model.eval()
    return accelerate_model(model, plan_for(torch.device("cpu")))


# -- measuring and keeping ----------------------------------------------------------------------------------------

def target_costs_file(shape: TargetShape) -> Path:
    """Where this device's costs of a shape are kept: beside the device's own (cost.costs_file), per machine."""
    slug = shape.name.lower().replace(".", "_")
    return cache_dir() / "costs" / f"target-{slug}-{device_key(None)}.json"


def scaled_timings(shape: TargetShape, by_depth: dict[int, dict[int, float]]) -> dict[int, float]:
    """Forward seconds of the whole model from forwards of SCALED_DEPTHS layers: the line through the depths,
    read at the model's layer count (its intercept is the head, the embedding and the rest of a forward)."""
    low, high = sorted(by_depth)
    return {rows: by_depth[low][rows] + (by_depth[high][rows] - by_depth[low][rows]) / (high - low)
            * (shape.layers - low) for rows in by_depth[low]}


def measure_targets(shapes: tuple[TargetShape, ...], rows: tuple[int, ...] = CALIBRATION_ROWS,
                    rounds: int = CALIBRATION_ROUNDS, context: int = CALIBRATION_CONTEXT, load=None,
                    ) -> dict[str, MeasuredCosts]:
    """Measure `shapes` on this device, all in the same interleaved rounds (whether each is kept is
    measuring.py's to say, by cost.settle's rule)."""
    load = load or load_average
    models: dict[str, torch.nn.Module] = {}
    for shape in shapes:
        for depth in (SCALED_DEPTHS if shape.scaled else (shape.layers,)):
            models[f"{shape.name}@{depth}"] = build_target(shape, depth)
    context_ids = [(17 + 31 * i) % min(s.vocab for s in shapes) for i in range(context)]
    timings, conditions = measure_models(models, context_ids, rows, rounds, load=load)
    del models
    measured_at = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    results = {}
    for shape in shapes:
        if shape.scaled:
            whole = scaled_timings(shape, {d: timings[f"{shape.name}@{d}"] for d in SCALED_DEPTHS})
            how = (f"forwards of {' and '.join(map(str, SCALED_DEPTHS))} real-shaped layers with the real head, "
                   f"scaled to its {shape.layers} layers")
        else:
            whole = timings[f"{shape.name}@{shape.layers}"]
            how = f"forwards of the whole model ({shape.layers} layers)"
        how += (f", random weights in Q4_1 blocks (Q8_0 head), 8-bit activations; the median of {rounds} "
                f"interleaved rounds over {', '.join(map(str, rows))} rows behind {context} tokens")
        results[shape.name] = MeasuredCosts(whole, measured_at, how, machine_line(), conditions=conditions)
    return results
