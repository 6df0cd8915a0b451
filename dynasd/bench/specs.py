"""The bench's method syntax: `mcsd:k=4,2,2,1:stop=confidence` -> a MethodSpec and the decoder options it sets."""
from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass


DEFAULT_METHODS = "ar,sd,mcsd,ti-mcsd,hf-assisted"
REFERENCE = "ar"

# what each option means (docs and --help), and which options each method takes
OPTION_HELP = {
    "gamma": "sd: draft chain length",
    "k": "mcsd: tree shape (4,2,2,1); ti-mcsd: general static shape (2,4,4,1,1)",
    "w": "ti-mcsd: number of target-initialized chains (width)",
    "d": "ti-mcsd: draft tokens per chain (depth)",
    "stop": "a stop policy of dynasd.stopping (confidence, decision, cumulative): end drafting early",
    "th": "stop threshold; hf-assisted: assistant_confidence_threshold",
    "decision": "folder of a trained decision model (stop=decision or cumulative)",
    "replacement": "mcsd: 1 = draw siblings with replacement",
    "lookup": "sd/mcsd/pld: prompt lookup, up to this many looked-up tokens per step (0 = off; pld: 8); "
              "hf-assisted: prompt_lookup_num_tokens (transformers' own prompt lookup, no draft model)",
    "ngram": "sd/mcsd/pld: prompt lookup's shortest matching n-gram",
    "draft": "sd/mcsd/ti-mcsd: tokens (the pair's draft, default) or features (its feature draft, which also reads "
             "the target's hidden states; dynasd/feature_draft.py)",
    "n": "hf-assisted: num_assistant_tokens",
    "schedule": "hf-assisted: num_assistant_tokens_schedule (constant, heuristic, heuristic_transient)",
    "kernels": "any method: fast (default: packed grouped-query attention, dynasd/gqa_attention.py, KV caches "
               "that grow in place, dynasd/cache.py, and on CPU linear layers with few-row weight layouts and a "
               "compiled kernel, dynasd/fast_linear.py), torch (the same without the compiled kernel) or plain "
               "(stock transformers modules and cache), to measure those changes side by side",
}
TREE_KEYS = {"stop", "th", "decision", "draft"}
METHOD_OPTIONS: dict[str, set[str]] = {name: keys | {"kernels"} for name, keys in {
    "ar": set(),
    "sd": {"gamma", "lookup", "ngram"} | TREE_KEYS,
    "mcsd": {"k", "replacement", "lookup", "ngram"} | TREE_KEYS,
    "ti-mcsd": {"w", "d", "k"} | TREE_KEYS,
    "pld": {"lookup", "ngram"},
    "hf-assisted": {"n", "th", "schedule", "lookup"},
}.items()}
KERNELS = ("fast", "torch", "plain")


# ---------------------------------------------------------------------------------------------------------------
# method specs

@dataclass(frozen=True)
class MethodSpec:
    """One benchmarked method: `label` is how it was written and names it in every output."""

    label: str
    method: str
    options: tuple[tuple[str, str], ...] = ()

    def option(self, key: str, default=None):
        return dict(self.options).get(key, default)


def _split_methods(text: str) -> list[str]:
    """Split on commas, except a comma followed by a digit, which continues a list value such as k=4,2,2,1."""
    items: list[str] = []
    for piece in text.split(","):
        piece = piece.strip()
        if items and piece[:1].isdigit():
            items[-1] += "," + piece
        elif piece:
            items.append(piece)
    return items


def parse_method(text: str) -> MethodSpec:
    """'mcsd:k=4,2,2,1:stop=confidence' -> MethodSpec; 'mcsd+dyn' is 'mcsd:stop=confidence'."""
    label = text.strip()
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
    from ..stopping import STOP_POLICIES

    if options.get("kernels", "fast") not in KERNELS:
        raise ValueError(f"kernels must be fast, torch or plain, got '{options['kernels']}' in '{label}'")
    if options.get("draft", "tokens") not in ("tokens", "features"):
        raise ValueError(f"draft must be tokens or features, got '{options['draft']}' in '{label}'")
    if "stop" in options and options["stop"] not in STOP_POLICIES:
        raise ValueError(f"stop must be one of {', '.join(STOP_POLICIES)}, got '{options['stop']}' in '{label}'")
    return MethodSpec(label=label, method=head, options=tuple(sorted(options.items())))


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


def method_args(args: argparse.Namespace, spec: MethodSpec) -> argparse.Namespace:
    """The CLI's method options with this spec's overrides (what `decoder_from` reads)."""
    ns = copy.copy(args)
    options = dict(spec.options)
    for key, attr, convert in (("gamma", "gamma", int), ("w", "width", int), ("d", "depth", int),
                               ("th", "threshold", float), ("stop", "stop", str), ("lookup", "lookup", int),
                               ("ngram", "lookup_ngram", int),
                               ("decision", "decision_model", str), ("draft", "draft_kind", str)):
        if key in options:
            try:
                setattr(ns, attr, convert(options[key]))
            except ValueError as exc:
                raise ValueError(f"{spec.label}: {key} must be a number, got '{options[key]}'") from exc
    if "k" in options:
        setattr(ns, "ti_k_config" if spec.method == "ti-mcsd" else "k_config", options["k"])
    if "replacement" in options:
        ns.with_replacement = options["replacement"] not in ("0", "false", "no")
    if ns.stop != "none":
        ns.dynamic_depth = True
    return ns


def check_spec(args: argparse.Namespace, spec: MethodSpec) -> None:
    """Raise ValueError for a bad option before any model is loaded."""
    from ..stopping import make_stop_policy
    from ..tree import parse_branching

    if spec.method == "hf-assisted":
        for key, convert in (("n", int), ("th", float), ("lookup", int)):
            if spec.option(key) is not None:
                try:
                    convert(spec.option(key))
                except ValueError as exc:
                    raise ValueError(f"{spec.label}: {key} must be a number, got '{spec.option(key)}'") from exc
        if spec.option("schedule") not in (None, "constant", "heuristic", "heuristic_transient"):
            raise ValueError(f"{spec.label}: schedule must be constant, heuristic or heuristic_transient")
        return
    ns = method_args(args, spec)
    parse_branching(ns.k_config)
    if ns.ti_k_config:
        parse_branching(ns.ti_k_config)
    make_stop_policy(ns.stop, ns.threshold, ns.decision_model)


