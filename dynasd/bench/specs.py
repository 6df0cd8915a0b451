"""The bench's method syntax: `mcsd:k=2,2,1:stop=confidence` -> a MethodSpec, and the DecoderOptions it runs.

A spec's keys are the decoder options' `bench_key`s (dynasd/options.py) for the options its method reads, plus those
that are the bench's own: `kernels`, `weights` and `arithmetic` (which loaded pair runs the method) and, for
transformers' assisted generation (`hf-assisted`, not one of our decoders), its settings n, th, schedule and
lookup. `llama.cpp` (the target's GGUF file run by llama-cpp-python: bench/llama_cpp_peer.py) takes no key.
`recipe=KEY` is the named configuration's spec (dynasd/recipes.py), so a script names a recipe without a process
of its own to look it up.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..loading.models import ARITHMETICS, DEFAULT_ARITHMETIC, WEIGHT_MODES
from ..options import METHODS, OPTIONS, DecoderOptions, Option, OptionsError
from ..recipes import BY_KEY as RECIPES_BY_KEY

DEFAULT_METHODS = "ar,sd,mcsd,ti-mcsd,hf-assisted"
REFERENCE = "ar"
HF_ASSISTED = "hf-assisted"
LLAMA_CPP = "llama.cpp"
KERNELS = ("fast", "torch", "plain")
PAIR_KEYS = ("kernels", "weights", "arithmetic")  # the bench's keys that pick the loaded pair, not a decoder option
SCHEDULES = ("constant", "heuristic", "heuristic_transient")
RECIPE = "recipe="  # recipe=narrow-cpu: that recipe's spec

# hf-assisted's own keys: how each is read, and what it sets in transformers
HF_ASSISTED_KEYS = {
    "n": (int, "num_assistant_tokens"),
    "th": (float, "assistant_confidence_threshold"),
    "schedule": (str, "num_assistant_tokens_schedule (" + ", ".join(SCHEDULES) + ")"),
    "lookup": (int, "prompt_lookup_num_tokens (transformers' own prompt lookup, no draft model)"),
}
KERNELS_HELP = ("any method: fast (default: packed grouped-query attention, dynasd/kernels/gqa_attention.py, KV "
                "caches that grow in place, dynasd/cache.py, and on CPU linear layers with few-row weight layouts "
                "and a compiled kernel, dynasd/kernels/fast_linear.py), torch (the same without the compiled "
                "kernel) or plain (stock transformers modules and cache), to measure those changes side by side")
WEIGHTS_HELP = ("any method: gguf (a GGUF target's weights in the file's quantized blocks on CPU, "
                "dynasd/kernels/block_weights.py) or fp32 (transformers' float32 copy); default: --weights")
ARITHMETIC_HELP = ("any method: int8 (block weights times rows quantized to 8-bit blocks, integer products) or "
                   "float32 (the expanded weights times the float rows); default: --arithmetic")


def spec_option(method: str, key: str) -> Option | None:
    """The decoder option `key` sets for `method` (`k` is mcsd's k_config and ti-mcsd's ti_k_config)."""
    return next((o for o in OPTIONS.values() if o.bench_key == key and o.read_by(method)), None)


METHOD_OPTIONS: dict[str, set[str]] = {
    **{method: {o.bench_key for o in OPTIONS.values() if o.bench_key and o.read_by(method)} | set(PAIR_KEYS)
       for method in METHODS},
    HF_ASSISTED: set(HF_ASSISTED_KEYS) | set(PAIR_KEYS),
    LLAMA_CPP: set(),  # llama.cpp's own engine on the target's GGUF: no pair copy, no settings of ours to vary
}


def _option_help() -> dict[str, str]:
    """What each key means (--help and docs): the options it sets, hf-assisted's reading, kernels."""
    meanings: dict[str, list[str]] = {}
    for o in OPTIONS.values():
        if o.bench_key:
            meanings.setdefault(o.bench_key, []).append(o.described())
    for key, (_, meaning) in HF_ASSISTED_KEYS.items():
        meanings.setdefault(key, []).append(f"{HF_ASSISTED}: {meaning}")
    meanings["kernels"] = [KERNELS_HELP]
    meanings["weights"] = [WEIGHTS_HELP]
    meanings["arithmetic"] = [ARITHMETIC_HELP]
    return {key: "; ".join(parts) for key, parts in meanings.items()}


OPTION_HELP = _option_help()


# ---------------------------------------------------------------------------------------------------------------
# method specs

@dataclass(frozen=True)
class MethodSpec:
    """One benchmarked method: `label` is how it was written and names it in every output; `options` holds its
    key=value pairs as written."""

    label: str
    method: str
    options: tuple[tuple[str, str], ...] = ()

    def option(self, key: str, default=None):
        return dict(self.options).get(key, default)

    def pair_key(self, weights: str, arithmetic: str = DEFAULT_ARITHMETIC) -> str:
        """Which loaded pair runs this method: its `kernels`, and its `weights` and `arithmetic` where they differ
        from the run's defaults ("fast", "torch", "fast/weights=fp32", "fast/arithmetic=float32", ...)."""
        key = self.option("kernels", "fast")
        for name, default in (("weights", weights), ("arithmetic", arithmetic)):
            own = self.option(name, default)
            key += "" if own == default else f"/{name}={own}"
        return key


def _split_methods(text: str) -> list[str]:
    """Split on commas, except a comma followed by a digit, which continues a list value such as k=2,2,1."""
    items: list[str] = []
    for piece in text.split(","):
        piece = piece.strip()
        if items and piece[:1].isdigit():
            items[-1] += "," + piece
        elif piece:
            items.append(piece)
    return items


def parse_method(text: str) -> MethodSpec:
    """'mcsd:k=2,2,1:stop=confidence' -> MethodSpec; 'mcsd+dyn' is 'mcsd:stop=confidence'. Each value is checked
    on its own here; `decoder_options` checks them together. 'recipe=KEY' is that recipe's spec, labelled as
    the spec (what ran, in every output)."""
    label = text.strip()
    if label.startswith(RECIPE):
        key = label[len(RECIPE):]
        if key not in RECIPES_BY_KEY:
            raise ValueError(f"unknown recipe '{key}' in '{label}' (known: {', '.join(RECIPES_BY_KEY)})")
        return parse_method(RECIPES_BY_KEY[key].bench_spec())
    head, *parts = label.split(":")
    options: dict[str, str] = {}
    if head.endswith("+dyn"):
        head = head[: -len("+dyn")]
        options["stop"] = "confidence"
    if head not in METHOD_OPTIONS:
        raise ValueError(f"unknown method '{head}' in '{label}' (use {', '.join(METHOD_OPTIONS)})")
    for part in parts:
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"method option '{part}' in '{label}' must look like key=value")
        if key not in METHOD_OPTIONS[head]:
            allowed = ", ".join(sorted(METHOD_OPTIONS[head])) or "none"
            raise ValueError(f"{head} takes no option '{key}' (options: {allowed})")
        options[key] = value
    spec = MethodSpec(label=label, method=head, options=tuple(sorted(options.items())))
    problems = [p for key, value in spec.options if (p := _value_problem(spec, key, value))]
    if problems:
        raise OptionsError([f"{label}: {p}" for p in problems])
    return spec


def _value_problem(spec: MethodSpec, key: str, value: str) -> str | None:
    if key == "kernels":
        return None if value in KERNELS else f"kernels must be fast, torch or plain, got '{value}'"
    if key == "weights":
        return None if value in WEIGHT_MODES else f"weights must be {' or '.join(WEIGHT_MODES)}, got '{value}'"
    if key == "arithmetic":
        return None if value in ARITHMETICS else f"arithmetic must be {' or '.join(ARITHMETICS)}, got '{value}'"
    if spec.method == HF_ASSISTED:
        convert, _ = HF_ASSISTED_KEYS[key]
        if key == "schedule":
            return None if value in SCHEDULES else f"schedule must be {', '.join(SCHEDULES)}, got '{value}'"
        try:
            convert(value)
        except ValueError:
            return f"{key} must be a number, got '{value}'"
        return None
    try:
        spec_option(spec.method, key).coerce(value)
    except ValueError as exc:
        return str(exc)
    return None


def parse_methods(text: str) -> list[MethodSpec]:
    specs = [parse_method(item) for item in _split_methods(text)]
    if not specs:
        raise ValueError("--methods is empty")
    labels = [s.label for s in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"method listed twice: {', '.join(duplicates)}")
    if REFERENCE not in labels:
        specs.insert(0, MethodSpec(REFERENCE, REFERENCE))  # speedup and fidelity are measured against ar
    return specs


def parse_temperatures(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise ValueError(f"--temperatures must be comma-separated numbers, got '{text}'") from exc
    if not values:
        raise ValueError("--temperatures is empty")
    return sorted(set(values))


def decoder_options(base: DecoderOptions, spec: MethodSpec) -> DecoderOptions:
    """The options one of our methods runs with: the command line's (those the method reads; the others are not
    its business), then the spec's own key=value overrides. Validated: raises OptionsError naming the spec."""
    overrides = {spec_option(spec.method, key).name: value for key, value in spec.options if key not in PAIR_KEYS}
    try:
        typed = {name: OPTIONS[name].coerce(value) for name, value in overrides.items()}
        return replace(base.for_method(spec.method), **typed).validate()
    except ValueError as exc:
        problems = exc.problems if isinstance(exc, OptionsError) else [str(exc)]
        raise OptionsError([f"{spec.label}: {p}" for p in problems]) from None
