"""`python -m dynasd bench`: Spec-Bench-style comparison of decoders on one pair, measured the same way for all.

Fairness rules (method.md section 7, and the reference code's defects in section 9):
- every method decodes the same prompts, in the same process, interleaved prompt by prompt (the method order
  rotates from prompt to prompt), so load from other processes falls on all of them alike;
- one timing window for every method: wall time around the whole `generate` call (prefill + decoding), taken by
  this runner, never by the method itself; the same for `hf-assisted` (transformers' own assisted generation);
- the same warm-up: one short untimed run per (method, temperature) before anything is timed;
- tokens past max-new-tokens or after the first end-of-sequence token are never counted;
- speedup is tokens/s over ar's tokens/s on the same prompts in the same run.

Outputs in --out: runs.jsonl (one object per prompt, method and temperature), summary.json (one object per
method, temperature and category, plus category "all"), meta.json (what was run, where), report.html (Plotly).

Methods (`--methods`, comma-separated): ar, sd, mcsd, ti-mcsd, pld, hf-assisted, each optionally followed by
`:key=value` options and/or a `+dyn` suffix; a comma followed by a digit continues the previous option, so
`mcsd:k=4,2,2,1:stop=confidence:th=0.3,ar` is two methods. See METHOD_OPTIONS and docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_METHODS = "ar,sd,mcsd,ti-mcsd,hf-assisted"
REFERENCE = "ar"
ACCEPTANCE_DENOMINATOR = "draft levels attempted (one per draft level of a step's live tree; target roots excluded)"
FIDELITY_AT_SAMPLING = "T>0: outputs are random samples, so token identity with ar is not a fidelity measure"

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
    from .stopping import STOP_POLICIES

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
    from .stopping import make_stop_policy
    from .tree import parse_branching

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


# ---------------------------------------------------------------------------------------------------------------
# prompts

def select_prompts(path: str | Path, categories: list[str] | None, limit: int | None) -> list[dict]:
    """Per category, the first `limit` prompts by question_id; categories in the order given (or of the file)."""
    from .cli import read_prompts

    prompts = read_prompts(path, categories=categories)
    order = categories or list(dict.fromkeys(p["category"] for p in prompts))
    missing = [c for c in order if not any(p["category"] == c for p in prompts)]
    if missing:
        known = ", ".join(dict.fromkeys(p["category"] for p in read_prompts(path)))
        raise ValueError(f"no prompts in category {', '.join(missing)} (categories in the file: {known})")
    chosen = []
    for category in order:
        group = sorted((p for p in prompts if p["category"] == category), key=lambda p: (str(type(p["id"])), p["id"]))
        chosen += group[:limit] if limit else group
    if any(not p["text"].strip() for p in chosen):
        raise ValueError("a selected prompt is empty")
    return chosen


# ---------------------------------------------------------------------------------------------------------------
# measuring one run

class ForwardClock:
    """Counts and times every forward call of the target and the draft: from the input embedding's start to the
    output layer's end (hooks on those two modules; on the whole model where it has no such pair).

    Why not the whole model: our decoders run its layers through dynasd/lean_forward.py, which skips the model's
    own forward, while every path calls the embedding first and the output layer last. The hooks see transformers'
    assisted generation exactly as they see our decoders, so the draft/verify split is measured the same way for
    every method. On CUDA each forward is synchronized so its time is real.
    """

    def __init__(self, pair) -> None:
        self.cuda = pair.device.type == "cuda"
        self.seconds = {"target": 0.0, "draft": 0.0}
        self.calls = {"target": 0, "draft": 0}
        self._handles = []
        self._started: dict[str, float] = {}
        drafts = [d for d in (pair.draft, getattr(pair, "feature_draft", None)) if d is not None]
        for role, model in [("target", pair.target)] + [("draft", d) for d in drafts]:
            first, last = model.get_input_embeddings(), model.get_output_embeddings()
            if first is None or last is None:
                first = last = model
            self._handles.append(first.register_forward_pre_hook(self._pre(role)))
            self._handles.append(last.register_forward_hook(self._post(role)))

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def _pre(self, role: str):
        def hook(module, inputs):
            self._sync()
            self._started[role] = time.perf_counter()
        return hook

    def _post(self, role: str):
        def hook(module, inputs, output):
            self._sync()
            self.seconds[role] += time.perf_counter() - self._started.pop(role)
            self.calls[role] += 1
        return hook

    def reset(self) -> None:
        self.seconds = {"target": 0.0, "draft": 0.0}
        self.calls = {"target": 0, "draft": 0}

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class Measured:
    """What one timed run produced; counts that a method cannot report are None."""

    token_ids: list[int]
    text: str
    seconds: float                        # the one timing window: wall time around the whole generate call
    target_forwards: int | None           # verify rounds (tokens per target forward = new tokens / this)
    accepted_draft_levels: int | None
    attempted_draft_levels: int | None
    finished: str
    lossless: bool
    phase_seconds: dict = field(default_factory=dict)  # the decoder's own split (our methods only)


def truncate(ids: list[int], max_new_tokens: int, eos_ids) -> tuple[list[int], str]:
    """Cut after the first end-of-sequence token or at max_new_tokens, whichever comes first."""
    ids = list(ids[:max_new_tokens])
    for i, token in enumerate(ids):
        if token in eos_ids:
            return ids[: i + 1], "eos"
    return ids, "length" if len(ids) >= max_new_tokens else ""


def draft_level_counts(trace) -> tuple[int, int]:
    """(accepted, attempted) draft levels: a live level counts once per step, target-root levels not at all."""
    from .trace import PROPOSED_ORIGINS

    accepted = attempted = 0
    for step in trace.steps:
        attempted += len({n.level for n in step.nodes if n.origin in PROPOSED_ORIGINS})
        accepted += sum(step.nodes[i].origin in PROPOSED_ORIGINS for i in step.accepted_path)
    return accepted, attempted


def make_method_decoder(args: argparse.Namespace, spec: MethodSpec, pair, sampling, seed: int):
    from .cli import decoder_from

    return decoder_from(method_args(args, spec), spec.method, pair, sampling, seed)


def _synchronize(pair) -> None:
    if pair.device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def run_decoder(args, spec, pair, sampling, seed, ids, max_new_tokens, prompt_text) -> Measured:
    decoder = make_method_decoder(args, spec, pair, sampling, seed)
    _synchronize(pair)
    started = time.perf_counter()
    trace = decoder.generate(ids, max_new_tokens, prompt_text=prompt_text)
    _synchronize(pair)
    seconds = time.perf_counter() - started
    token_ids, finished = truncate(trace.new_token_ids, max_new_tokens, pair.eos_token_ids)
    accepted, attempted = draft_level_counts(trace) if spec.method != "ar" else (None, None)
    # The decoder's own phases; "rest" is prefill plus per-step bookkeeping (text, traces) outside them.
    phases = {"draft": sum(s.draft_seconds for s in trace.steps),
              "verify": sum(s.verify_seconds for s in trace.steps),
              "accept": sum(s.accept_seconds for s in trace.steps)}
    phases["rest"] = seconds - sum(phases.values())
    return Measured(token_ids, pair.decode(token_ids), seconds, trace.target_forwards, accepted, attempted,
                    trace.finished or finished, trace.lossless, phases)


def run_hf_assisted(args, spec, pair, sampling, seed, ids, max_new_tokens, prompt_text,
                    clock: ForwardClock | None = None) -> Measured:
    """transformers' `generate(assistant_model=...)` with the same pair, sampling settings and token budget.

    HF defaults apply unless the spec overrides them (num_assistant_tokens 20, constant schedule, assistant
    confidence threshold 0.4). With `lookup=N` it runs transformers' prompt lookup decoding instead
    (`prompt_lookup_num_tokens=N`, no assistant model): the peer of our `pld`.
    The draft's generation config is restored afterwards: HF's heuristic schedule
    writes its state into it, which would leak from one run into the next.
    """
    import torch
    import transformers

    eos = sorted(pair.eos_token_ids)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=not sampling.greedy, eos_token_id=eos or None,
                  pad_token_id=eos[0] if eos else None)
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    input_ids = torch.tensor([ids], dtype=torch.long, device=pair.device)
    attention = torch.ones_like(input_ids)
    draft_calls_before = clock.calls["draft"] if clock else 0
    target_calls_before = clock.calls["target"] if clock else 0
    saved_config = copy.deepcopy(pair.draft.generation_config)
    verbosity = transformers.logging.get_verbosity()
    try:
        assistant = pair.draft.generation_config  # transformers reads the assistant's settings from here
        if spec.option("n") is not None:
            assistant.num_assistant_tokens = int(spec.option("n"))
        if spec.option("schedule") is not None:
            assistant.num_assistant_tokens_schedule = spec.option("schedule")
        if spec.option("th") is not None:
            assistant.assistant_confidence_threshold = float(spec.option("th"))
        transformers.logging.set_verbosity_error()  # HF warns on every call about flags it passes to itself
        torch.manual_seed(seed)
        _synchronize(pair)
        started = time.perf_counter()
        with torch.inference_mode():
            if spec.option("lookup") is not None:
                out = pair.target.generate(input_ids, attention_mask=attention,
                                           prompt_lookup_num_tokens=int(spec.option("lookup")), **kwargs)
            else:
                out = pair.target.generate(input_ids, attention_mask=attention, assistant_model=pair.draft,
                                           **kwargs)
        _synchronize(pair)
        seconds = time.perf_counter() - started
    finally:
        transformers.logging.set_verbosity(verbosity)
        pair.draft.generation_config = saved_config
    token_ids, finished = truncate(out[0, len(ids):].tolist(), max_new_tokens, pair.eos_token_ids)
    rounds = accepted = attempted = None
    if clock:
        # The first target forward is prefill and first verification at once; each forward is one round that
        # commits its accepted candidates plus one target token; each assistant forward yields one candidate.
        rounds = clock.calls["target"] - target_calls_before
        attempted = clock.calls["draft"] - draft_calls_before
        accepted = max(0, len(token_ids) - rounds)
    return Measured(token_ids, pair.decode(token_ids), seconds, rounds, accepted, attempted, finished, True)


def run_method(args, spec, pair, sampling, seed, ids, max_new_tokens, prompt_text,
               clock: ForwardClock | None = None) -> Measured:
    if spec.method == "hf-assisted":
        return run_hf_assisted(args, spec, pair, sampling, seed, ids, max_new_tokens, prompt_text, clock)
    return run_decoder(args, spec, pair, sampling, seed, ids, max_new_tokens, prompt_text)


# ---------------------------------------------------------------------------------------------------------------
# fidelity and the summary (pure functions of the run records)

def differing_share(tokens: list[int], reference: list[int]) -> float:
    """Share of token positions that differ from the reference: every position from the first divergence on
    counts as differing (a later coincidental match is not agreement), over the longer of the two outputs."""
    length = max(len(tokens), len(reference))
    if length == 0:
        return 0.0
    first = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
    return (length - first) / length


def add_fidelity(records: list[dict]) -> None:
    """identical_to_ar / differing_share for the records of one prompt and temperature (ar among them)."""
    reference = next((r for r in records if r["method"] == REFERENCE), None)
    for record in records:
        if record["temperature"] > 0 or reference is None:
            record["identical_to_ar"] = record["differing_share"] = None
            record["compared_tokens"] = 0
            continue
        record["identical_to_ar"] = record["token_ids"] == reference["token_ids"]
        record["differing_share"] = differing_share(record["token_ids"], reference["token_ids"])
        record["compared_tokens"] = max(len(record["token_ids"]), len(reference["token_ids"]))


def _ratio(num, den):
    return num / den if den else None


def _aggregate(method: str, temperature: float, category: str, runs: list[dict]) -> dict:
    tokens = sum(r["new_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    forwards = [r["target_forwards"] for r in runs]
    attempted = [r["attempted_draft_levels"] for r in runs]
    accepted = [r["accepted_draft_levels"] for r in runs]
    draft_s = sum(r["draft_forward_seconds"] for r in runs)
    target_s = sum(r["target_forward_seconds"] for r in runs)
    compared = sum(r["compared_tokens"] for r in runs)
    identical = [r["identical_to_ar"] for r in runs]
    fidelity_known = temperature == 0 and all(v is not None for v in identical)
    return {
        "method": method,
        "base_method": runs[0]["base_method"],
        "temperature": temperature,
        "category": category,
        "n_prompts": len(runs),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": _ratio(tokens, seconds),
        "speedup_vs_ar": None,  # filled in by summarize
        "target_forwards": None if None in forwards else sum(forwards),
        "tokens_per_target_forward": None if None in forwards else _ratio(tokens, sum(forwards)),
        "accepted_draft_levels": None if None in accepted else sum(accepted),
        "attempted_draft_levels": None if None in attempted else sum(attempted),
        "acceptance_rate": None if None in attempted else _ratio(sum(accepted), sum(attempted)),
        "acceptance_denominator": ACCEPTANCE_DENOMINATOR,
        "draft_seconds": draft_s,
        "verify_seconds": target_s,
        "other_seconds": seconds - draft_s - target_s,
        "draft_share": _ratio(draft_s, seconds),
        "verify_share": _ratio(target_s, seconds),
        "lossless": all(r["lossless"] for r in runs),
        "identical_to_ar": all(identical) if fidelity_known else None,
        "identical_share": sum(identical) / len(runs) if fidelity_known else None,
        "differing_token_share": (sum(r["differing_share"] * r["compared_tokens"] for r in runs) / compared
                                  if fidelity_known and compared else (0.0 if fidelity_known else None)),
        "fidelity_note": None if temperature == 0 else FIDELITY_AT_SAMPLING,
    }


def summarize(records: list[dict]) -> list[dict]:
    """One row per (method, temperature, category), then per (method, temperature) over all categories.

    Rates are ratios of sums (total tokens / total seconds), so long outputs weigh more, as in Spec-Bench.
    """
    methods = list(dict.fromkeys(r["method"] for r in records))
    temperatures = sorted({r["temperature"] for r in records})
    categories = list(dict.fromkeys(r["category"] for r in records))
    rows = []
    for temperature in temperatures:
        for category in categories + ["all"]:
            group = [r for r in records if r["temperature"] == temperature
                     and (category == "all" or r["category"] == category)]
            block = [_aggregate(m, temperature, category, [r for r in group if r["method"] == m])
                     for m in methods if any(r["method"] == m for r in group)]
            reference = next((row for row in block if row["method"] == REFERENCE), None)
            for row in block:
                if reference and reference["tokens_per_s"] and row["tokens_per_s"] is not None:
                    row["speedup_vs_ar"] = row["tokens_per_s"] / reference["tokens_per_s"]
            rows += block
    return rows


# ---------------------------------------------------------------------------------------------------------------
# the printed table

def _fmt(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


def markdown_tables(summary: list[dict]) -> str:
    lines = ["| method | T | prompts | tokens/s | speedup vs ar | tokens / target fwd | acceptance | "
             "time: draft / verify / other | identical to ar | differing tokens |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in (r for r in summary if r["category"] == "all"):
        other = None if row["draft_share"] is None else 1 - row["draft_share"] - row["verify_share"]
        split = (f"{_fmt(row['draft_share'], '.0%')} / {_fmt(row['verify_share'], '.0%')} / {_fmt(other, '.0%')}")
        identical = (f"{row['identical_share']:.0%}" if row["identical_share"] is not None else "n/a (T>0)")
        lines.append(f"| {row['method']}{'' if row['lossless'] else ' (lossy)'} | {row['temperature']:g} | "
                     f"{row['n_prompts']} | {_fmt(row['tokens_per_s'], '.1f')} | "
                     f"{_fmt(row['speedup_vs_ar'], '.2f')}x | {_fmt(row['tokens_per_target_forward'], '.2f')} | "
                     f"{_fmt(row['acceptance_rate'], '.2f')} | {split} | {identical} | "
                     f"{_fmt(row['differing_token_share'], '.1%', 'n/a')} |")
    categories = list(dict.fromkeys(r["category"] for r in summary if r["category"] != "all"))
    methods = list(dict.fromkeys(r["method"] for r in summary))
    for temperature in sorted({r["temperature"] for r in summary}):
        lines += ["", f"Speedup vs ar by category, T={temperature:g}:", "",
                  "| category | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
        for category in categories:
            cells = []
            for method in methods:
                row = next((r for r in summary if r["method"] == method and r["category"] == category
                            and r["temperature"] == temperature), None)
                cells.append(_fmt(row and row["speedup_vs_ar"], ".2f"))
            lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# the command

def add_arguments(p: argparse.ArgumentParser) -> None:
    from .cli import add_method_arguments, add_model_arguments

    add_model_arguments(p)
    add_method_arguments(p)  # defaults for every method; a method's own :key=value options override them
    p.add_argument("--prompts", required=True, help="Spec-Bench JSON Lines (question_id, category, turns)")
    p.add_argument("--categories", default=None, help="comma-separated categories (default: all in the file)")
    p.add_argument("--limit", type=int, default=None, help="first N prompts per category, by question_id")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated: ar, sd, mcsd, ti-mcsd, hf-assisted, with variants such as "
                        "mcsd:k=4,2,2,1:stop=confidence:th=0.4 or mcsd+dyn (= stop=confidence). Options: "
                        + "; ".join(f"{key}: {meaning}" for key, meaning in OPTION_HELP.items()))
    p.add_argument("--temperatures", default=None, help="comma-separated, e.g. 0,0.7 (default: --temperature)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="prompt i is decoded with seed+i by every method")
    p.add_argument("--out", default="runs/bench", help="output folder")
    p.add_argument("--warmup-tokens", type=int, default=8, help="length of the untimed warm-up run per method")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument("--plotlyjs", default="inline", choices=["inline", "cdn"],
                   help="report.html: embed plotly.js (works offline) or load it from the CDN")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _record(prompt: dict, spec: MethodSpec, temperature: float, seed: int, m: Measured, clock: ForwardClock,
            max_new_tokens: int) -> dict:
    return {
        "prompt_id": prompt["id"], "category": prompt["category"], "method": spec.label,
        "base_method": spec.method, "options": dict(spec.options), "temperature": temperature, "seed": seed,
        "max_new_tokens": max_new_tokens, "new_tokens": len(m.token_ids), "seconds": m.seconds,
        "tokens_per_s": len(m.token_ids) / m.seconds if m.seconds > 0 else None,
        "target_forwards": m.target_forwards,
        "tokens_per_target_forward": _ratio(len(m.token_ids), m.target_forwards) if m.target_forwards else None,
        "accepted_draft_levels": m.accepted_draft_levels, "attempted_draft_levels": m.attempted_draft_levels,
        "acceptance_rate": _ratio(m.accepted_draft_levels, m.attempted_draft_levels)
        if m.attempted_draft_levels else None,
        "target_forward_calls": clock.calls["target"], "draft_forward_calls": clock.calls["draft"],
        "target_forward_seconds": clock.seconds["target"], "draft_forward_seconds": clock.seconds["draft"],
        "phase_seconds": m.phase_seconds, "finished": m.finished, "lossless": m.lossless,
        "token_ids": m.token_ids, "text": m.text,
    }


def _meta(args, pair, prompts, specs, temperatures) -> dict:
    import torch
    import transformers

    return {
        "command": "python -m dynasd " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else None,
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "pair": pair.name, "draft": pair.draft_label, "device": str(pair.device), "dtype": str(pair.dtype),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, "
                   f"{torch.get_num_threads()} torch threads" + (f", {torch.cuda.get_device_name(pair.device)}"
                                                                 if pair.device.type == "cuda" else ""),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "prompts_file": str(args.prompts), "prompt_ids": [[p["category"], p["id"]] for p in prompts],
        "methods": [s.label for s in specs], "temperatures": temperatures, "top_p": args.top_p, "top_k": args.top_k,
        "max_new_tokens": args.max_new_tokens, "seed": args.seed, "warmup_tokens": args.warmup_tokens,
        "chat_template": not args.no_chat,
        "timing_window": "wall time around one whole generate call (prefill + decode), taken by the runner",
        "acceptance_denominator": ACCEPTANCE_DENOMINATOR,
        "hf_assisted_counts": "target_forwards = target forward calls (first = prefill + first verify); "
                              "attempted = assistant forward calls; accepted = new tokens - target forwards",
    }


def benchmark(args: argparse.Namespace, pairs: dict, prompts: list[dict], specs: list[MethodSpec],
              temperatures: list[float], out: Path, progress: bool = True) -> list[dict]:
    """Run everything, write runs.jsonl as it goes, return the records. `pairs`: the loaded pair by `kernels`
    option ("fast", and "torch" or "plain" when a method asks for it)."""
    from tqdm import tqdm

    from .sampling import SamplingConfig

    pair = pairs["fast"]
    pair_of = {spec.label: pairs[spec.option("kernels", "fast")] for spec in specs}
    encoded = [pair.encode_prompt(p["text"], chat=not args.no_chat) for p in prompts]
    samplings = {t: SamplingConfig(temperature=t, top_k=args.top_k, top_p=args.top_p) for t in temperatures}
    # Build every decoder once up front so a bad option fails before any minute is spent.
    for spec in specs:
        if spec.method != "hf-assisted":
            make_method_decoder(args, spec, pair_of[spec.label], samplings[temperatures[0]], args.seed)
    clocks = {kind: ForwardClock(loaded) for kind, loaded in pairs.items()}
    clock_of = {spec.label: clocks[spec.option("kernels", "fast")] for spec in specs}
    records: list[dict] = []
    total = len(specs) * len(temperatures) * (len(prompts) + 1)
    bar = tqdm(total=total, file=sys.stderr, disable=not progress, unit="run", dynamic_ncols=True)
    try:
        with (out / "runs.jsonl").open("w", encoding="utf-8") as sink:
            for temperature in temperatures:
                sampling = samplings[temperature]
                for spec in specs:  # the same untimed warm-up for every method
                    bar.set_description(f"warm-up {spec.label} T={temperature:g}")
                    run_method(args, spec, pair_of[spec.label], sampling, args.seed, encoded[0],
                               args.warmup_tokens, prompts[0]["text"], clock_of[spec.label])
                    bar.update()
                for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
                    seed = args.seed + index
                    shift = index % len(specs)  # rotate the order so no method always runs first
                    batch = []
                    for spec in specs[shift:] + specs[:shift]:
                        bar.set_description(f"{prompt['category']} #{prompt['id']} {spec.label} T={temperature:g}")
                        clock = clock_of[spec.label]
                        clock.reset()
                        measured = run_method(args, spec, pair_of[spec.label], sampling, seed, ids,
                                              args.max_new_tokens, prompt["text"], clock)
                        batch.append(_record(prompt, spec, temperature, seed, measured, clock, args.max_new_tokens))
                        bar.update()
                    batch.sort(key=lambda r: [s.label for s in specs].index(r["method"]))
                    add_fidelity(batch)
                    for record in batch:
                        sink.write(json.dumps(record) + "\n")
                    sink.flush()
                    records += batch
    finally:
        bar.close()
        for clock in clocks.values():
            clock.close()
    return records


def run(args: argparse.Namespace) -> int:
    from .cli import load_pair_from
    from .sampling import SamplingConfig

    # Every mistake a user can make fails here, before a model is loaded.
    specs = parse_methods(args.methods)
    temperatures = parse_temperatures(args.temperatures) if args.temperatures else [args.temperature]
    for temperature in temperatures:
        SamplingConfig(temperature=temperature, top_k=args.top_k, top_p=args.top_p)
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be at least 1")
    if args.max_new_tokens < 1 or args.warmup_tokens < 1:
        raise ValueError("--max-new-tokens and --warmup-tokens must be at least 1")
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    prompts = select_prompts(args.prompts, categories, args.limit)
    for spec in specs:
        check_spec(args, spec)
    if REFERENCE not in _split_methods(args.methods):
        print("note: added ar, the reference for speedup and fidelity", file=sys.stderr)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    pairs = {"fast": load_pair_from(args)}
    if any(spec.option("kernels") == "torch" for spec in specs):
        pairs["torch"] = load_pair_from(args, compiled_kernel=False)
    if any(spec.option("kernels") == "plain" for spec in specs):
        pairs["plain"] = load_pair_from(args, fast_kernels=False)
    meta = _meta(args, pairs["fast"], prompts, specs, temperatures)
    records = benchmark(args, pairs, prompts, specs, temperatures, out, progress=not args.no_progress)
    summary = summarize(records)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    written = ["runs.jsonl", "summary.json", "meta.json"]
    if not args.no_report:
        from .report import write_report

        write_report(out / "report.html", summary, meta, plotlyjs=args.plotlyjs)
        written.append("report.html")
    print(f"{meta['pair']}: {meta['draft']}; {meta['device']} {meta['dtype']}; {len(prompts)} prompts, "
          f"max {args.max_new_tokens} new tokens; {meta['date_utc']} UTC\n")
    print(markdown_tables(summary))
    print(f"wrote {', '.join(str(out / name) for name in written)}", file=sys.stderr)
    return 0
