"""`python -m dynasd bench`: Spec-Bench-style comparison of decoders on one pair, measured the same way for all.

Fairness rules (method.md section 7, and the reference code's defects in section 9):
- every method decodes the same prompts, in the same process, interleaved prompt by prompt (the method order
  rotates from prompt to prompt), so load from other processes falls on all of them alike;
- one timing window for every method: wall time around the whole `generate` call (prefill + decoding), taken by
  this runner, never by the method itself; the same for `hf-assisted` (transformers' own assisted generation)
  and `llama.cpp` (llama-cpp-python on the target's GGUF file, bench/llama_cpp_peer.py);
- the same warm-up: one short untimed run per (method, temperature) before anything is timed;
- tokens past max-new-tokens or after the first end-of-sequence token are never counted;
- speedup is tokens/s over ar's tokens/s on the same prompts in the same run.

Outputs in --out: runs.jsonl (one object per prompt, method and temperature), summary.json (one object per
method, temperature and category, plus category "all"), meta.json (what was run, where), report.html (Plotly).

Methods (`--methods`, comma-separated): ar, sd, mcsd, ti-mcsd, pld, hf-assisted, llama.cpp, each optionally
followed by `:key=value` options and/or a `+dyn` suffix; a comma followed by a digit continues the previous option,
so `mcsd:k=2,2,1:stop=confidence:th=0.3,ar` is two methods. The decoder option flags (--gamma, --k-config, ...)
set every method that reads them; a method's own options override them. See bench/specs.py and docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from ..device_info import device_line
from ..kernels import weight_bytes_per_forward
from ..kernels.block_weights import read_blocks
from ..options import DecoderOptions, add_model_arguments, add_option_arguments, load_pair_from, options_from_args
from ..prompts import follow_up_ids, select_prompts
from ..stopping.decision_models import DecisionModel
from ..stopping.policies import load_decision_model
from .llama_cpp_peer import LlamaCppPeer, check_gguf_target, gguf_path, without_unavailable_llama_cpp
from .llama_cpp_peer import meta as llama_cpp_meta
from .measure import ForwardClock, Measured, make_method_decoder, run_method
from .presets import PRESETS, apply_preset
from .quality import Judge, load_judge, perplexity
from .specs import (
    HF_ASSISTED,
    LLAMA_CPP,
    OPTION_HELP,
    REFERENCE,
    MethodSpec,
    _split_methods,
    decoder_options,
    parse_methods,
    parse_temperatures,
)
from .summary import ACCEPTANCE_DENOMINATOR, QUALITY_NOTE, _ratio, add_fidelity, markdown_tables, summarize

# ---------------------------------------------------------------------------------------------------------------
# the command

def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_option_arguments(p, exclude=("method",))  # for every method that reads them; a spec's options override
    p.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="defaults for the flags below that are not given: "
                        + "; ".join(f"{name}: {preset.description}" for name, preset in PRESETS.items()))
    p.add_argument("--prompts", nargs="+", default=None,
                   help="prompt files, read in order: Spec-Bench JSON Lines (question_id, category, turns) or "
                        "TriviaQA/PIQA-style JSON lists ('question' or 'goal'; category: the file's name, or "
                        "CATEGORY=PATH)")
    p.add_argument("--categories", default=None, help="comma-separated categories (default: all in the files)")
    p.add_argument("--limit", type=int, default=None, help="first N prompts per category, by question_id")
    p.add_argument("--turns", type=int, default=None,
                   help="turns decoded per question (default 1; MT-bench questions have 2): each later turn's "
                        "user message follows the method's own answer, and every turn is timed")
    p.add_argument("--judge", default=None,
                   help="a local causal LM (folder, .gguf or hub id) that scores every output's log-likelihood "
                        "beside the target's own score (off by default)")
    p.add_argument("--no-quality", action="store_true",
                   help="skip the quality score (the target's log-likelihood of every output)")
    p.add_argument("--methods", default=None,
                   help="comma-separated: ar, sd, mcsd, ti-mcsd, hf-assisted, llama.cpp, with variants such as "
                        "mcsd:k=2,2,1:stop=confidence:th=0.4 or mcsd+dyn (= stop=confidence), or a recipe as "
                        "recipe=KEY (`dynasd recipes` lists them). llama.cpp: "
                        "llama-cpp-python (optional: pip install llama-cpp-python, or the peers extra) decoding "
                        "the target's GGUF file (the embedded pair or --target FILE.gguf) autoregressively, fed "
                        "the same token ids, greedy at T=0, same sampling settings and seed at T>0; it counts one "
                        "target forward per token (1.0 tokens per forward, as ar) and re-reads the whole "
                        "conversation each turn; skipped with one line when the package is missing. Options: "
                        + "; ".join(f"{key}: {meaning}" for key, meaning in OPTION_HELP.items()))
    p.add_argument("--temperatures", default=None, help="comma-separated, e.g. 0,0.7 (default: --temperature)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="token budget per turn (default 64)")
    p.add_argument("--out", default="runs/bench", help="output folder")
    p.add_argument("--warmup-tokens", type=int, default=8, help="length of the untimed warm-up run per method")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument("--plotlyjs", default="inline", choices=["inline", "cdn"],
                   help="report.html: embed plotly.js (works offline) or load it from the CDN")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _record(prompt: dict, spec: MethodSpec, temperature: float, seed: int, m: Measured, turn: int,
            max_new_tokens: int) -> dict:
    calls, seconds, positions = (m.forwards.get(k, {}) for k in ("calls", "seconds", "positions"))
    return {
        "prompt_id": prompt["id"], "category": prompt["category"], "turn": turn, "method": spec.label,
        "base_method": spec.method, "options": dict(spec.options), "temperature": temperature, "seed": seed,
        "max_new_tokens": max_new_tokens, "prompt_tokens": len(m.context_ids), "new_tokens": len(m.token_ids),
        "seconds": m.seconds, "tokens_per_s": len(m.token_ids) / m.seconds if m.seconds > 0 else None,
        "target_forwards": m.target_forwards,
        "tokens_per_target_forward": _ratio(len(m.token_ids), m.target_forwards) if m.target_forwards else None,
        "accepted_draft_levels": m.accepted_draft_levels, "attempted_draft_levels": m.attempted_draft_levels,
        "acceptance_rate": _ratio(m.accepted_draft_levels, m.attempted_draft_levels)
        if m.attempted_draft_levels else None,
        "acceptance_histogram": m.acceptance_histogram, "draft_tokens_proposed": m.proposed_tokens,
        "draft_tokens_accepted": m.accepted_tokens,
        "target_forward_calls": calls.get("target", 0), "draft_forward_calls": calls.get("draft", 0),
        "target_forward_seconds": seconds.get("target", 0.0), "draft_forward_seconds": seconds.get("draft", 0.0),
        "target_positions": positions.get("target", 0), "draft_positions": positions.get("draft", 0),
        "phase_seconds": m.phase_seconds, "finished": m.finished, "lossless": m.lossless,
        "token_ids": m.token_ids, "text": m.text,
    }


def add_quality(record: dict, context_ids: list[int], pair, judges: list[Judge]) -> None:
    """The quality fields of one record (quality.py): the target's log-likelihood of the output given its own
    conversation, and a judge's when there is one. Outside every timing window."""
    n = record["new_tokens"]
    for prefix, judge in zip(("", "judge_"), judges):
        total = judge.log_likelihood(context_ids, record["token_ids"], pair) if n else None
        scored = n if judge.tokenizer is None else (len(judge.tokenizer(
            pair.tokenizer.decode(record["token_ids"], skip_special_tokens=False),
            add_special_tokens=False)["input_ids"]) if n else 0)
        record[prefix + "log_likelihood"] = total
        record[prefix + "scored_tokens"] = scored if total is not None else 0
        record[prefix + "mean_log_likelihood"] = total / scored if total is not None and scored else None
        record[prefix + "perplexity"] = perplexity(total, scored)


def _meta(args, pair, prompts, specs, temperatures) -> dict:
    return {
        "command": "python -m dynasd " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else None,
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "pair": pair.name, "draft": pair.draft_label, "device": str(pair.device), "dtype": str(pair.dtype),
        "device_line": device_line(pair),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, "
                   f"{torch.get_num_threads()} torch threads" + (f", {torch.cuda.get_device_name(pair.device)}"
                                                                 if pair.device.type == "cuda" else ""),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "prompts_files": [str(p) for p in args.prompts], "prompt_ids": [[p["category"], p["id"]] for p in prompts],
        "preset": args.preset, "turns": args.turns, "judge": args.judge,
        "quality": None if args.no_quality else QUALITY_NOTE,
        "methods": [s.label for s in specs], "temperatures": temperatures, "top_p": args.top_p, "top_k": args.top_k,
        "max_new_tokens": args.max_new_tokens, "seed": args.seed, "warmup_tokens": args.warmup_tokens,
        "chat_template": not args.no_chat,
        "timing_window": "wall time around one whole generate call (prefill + decode), taken by the runner",
        "acceptance_denominator": ACCEPTANCE_DENOMINATOR,
        "hf_assisted_counts": "target_forwards = target forward calls (first = prefill + first verify); "
                              "attempted = assistant forward calls; accepted = new tokens - target forwards",
        **llama_cpp_meta(specs, pair),
    }


@dataclass(frozen=True)
class PlannedMethod:
    """What one spec runs with: its decoder options (hf-assisted reads only their sampling settings; each run
    sets its temperature and seed) and its decision model, read from disk once for every run."""

    options: DecoderOptions
    decision_model: DecisionModel | None = None


def plan_methods(args: argparse.Namespace, specs: list[MethodSpec]) -> dict[str, PlannedMethod]:
    """Every spec's options, checked, by label. Raises for a bad option, a missing decision model or llama.cpp on
    a pair without a GGUF target, before any model pair is needed."""
    check_gguf_target(args, specs)
    base = options_from_args(args)
    plan = {}
    for spec in specs:
        if spec.method in (HF_ASSISTED, LLAMA_CPP):  # not our decoders: the sampling settings of the target alone
            plan[spec.label] = PlannedMethod(decoder_options(base, MethodSpec(REFERENCE, REFERENCE)))
        else:
            options = decoder_options(base, spec)
            plan[spec.label] = PlannedMethod(options, load_decision_model(options.stop, options.decision_model))
    return plan


def conversation_follow_ups(pair, prompt: dict, turns: int, chat: bool) -> list:
    """For a question with several turns, one function per later turn (up to `turns` in all): given the method's
    conversation so far and its last answer, the tokens that go on from there and the user text
    (prompts.follow_up_ids). Earlier answers' contents are not read by the template rendering that matters."""
    users = prompt["turns"][:turns]

    def follow_up(index: int):
        def tokens(context: list[int], answer_ids: list[int]):
            messages = []
            for user in users[:index + 1]:
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": "..."}]
            messages.append({"role": "user", "content": users[index + 1]})
            return follow_up_ids(pair.tokenizer, messages, answer_ids, pair.eos_token_ids, chat), users[index + 1]
        return tokens

    return [follow_up(i) for i in range(len(users) - 1)]


@dataclass(frozen=True)
class WeightBytes:
    """The weight bytes one forward of a method's target and draft reads (dynasd.kernels.weight_bytes_per_forward;
    for llama.cpp the GGUF file's blocks, which it reads at every token)."""

    target: int
    draft: int
    llama_cpp: bool = False

    @staticmethod
    def of(pair, llama_cpp_args: argparse.Namespace | None = None) -> "WeightBytes":
        if llama_cpp_args is not None:
            blocks = read_blocks(gguf_path(llama_cpp_args))
            return WeightBytes(sum(source.n_bytes for _, source in blocks.values()), 0, llama_cpp=True)
        draft = weight_bytes_per_forward(pair.draft) if pair.draft is not None else 0
        return WeightBytes(weight_bytes_per_forward(pair.target), draft)

    def read(self, m: Measured) -> int:
        """The weight bytes a run read: its forwards as the forward clock counted them (llama.cpp: one per token)."""
        if self.llama_cpp:
            return self.target * (m.target_forwards or 0)
        calls = m.forwards.get("calls", {})
        return self.target * calls.get("target", 0) + self.draft * calls.get("draft", 0)


def benchmark(args: argparse.Namespace, pairs: dict, prompts: list[dict], specs: list[MethodSpec],
              temperatures: list[float], out: Path, progress: bool = True,
              plan: dict[str, PlannedMethod] | None = None, judge: Judge | None = None) -> list[dict]:
    """Run everything, write runs.jsonl as it goes, return the records (one per prompt, method, temperature and
    turn). `pairs`: the loaded pair by MethodSpec.pair_key ("fast", and others such as "torch" or
    "fast/weights=fp32" when a method asks for them); `plan`: plan_methods' (made here if None); `judge`: a second
    model that scores every output."""
    apply_preset(args)
    plan = plan or plan_methods(args, specs)
    pair = pairs["fast"]
    pair_of = {spec.label: pairs[spec.pair_key(args.weights, args.arithmetic)] for spec in specs}
    chat = not args.no_chat
    encoded = [pair.encode_prompt(p["text"], chat=chat) for p in prompts]
    follow_ups = [conversation_follow_ups(pair, p, args.turns, chat) for p in prompts]
    judges = [] if getattr(args, "no_quality", False) else [Judge("target", pair.target)] + ([judge] if judge else [])

    def options_for(spec: MethodSpec, temperature: float, seed: int) -> DecoderOptions:
        return replace(plan[spec.label].options, temperature=temperature, seed=seed)

    def run_one(spec: MethodSpec, temperature: float, seed: int, ids: list[int], max_new_tokens: int, text: str,
                later_turns=()) -> list[Measured]:
        if spec.method == LLAMA_CPP:
            return llama_cpp_model.run_conversation(options_for(spec, temperature, seed), ids, max_new_tokens,
                                                    later_turns)
        return run_method(spec, pair_of[spec.label], options_for(spec, temperature, seed), ids, max_new_tokens,
                          text, clock_of[spec.label], plan[spec.label].decision_model, later_turns)

    # Build every decoder once up front so what only a pair can refuse (no feature draft) fails before any minute
    # is spent.
    for spec in specs:
        if spec.method not in (HF_ASSISTED, LLAMA_CPP):
            make_method_decoder(spec, pair_of[spec.label], options_for(spec, temperatures[0], args.seed),
                                plan[spec.label].decision_model)
    clocks = {kind: ForwardClock(loaded) for kind, loaded in pairs.items()}
    clock_of = {spec.label: clocks[spec.pair_key(args.weights, args.arithmetic)] for spec in specs}
    # llama.cpp's model, loaded once for the whole run (outside every timing window)
    llama_cpp_model = LlamaCppPeer.load(args, pair) if any(spec.method == LLAMA_CPP for spec in specs) else None
    bytes_of = {spec.label: WeightBytes.of(pair_of[spec.label], args if spec.method == LLAMA_CPP else None)
                for spec in specs}
    records: list[dict] = []
    total = len(specs) * len(temperatures) * (len(prompts) + 1)
    bar = tqdm(total=total, file=sys.stderr, disable=not progress, unit="run", dynamic_ncols=True)
    try:
        with (out / "runs.jsonl").open("w", encoding="utf-8") as sink:
            for temperature in temperatures:
                for spec in specs:  # the same untimed warm-up for every method
                    bar.set_description(f"warm-up {spec.label} T={temperature:g}")
                    run_one(spec, temperature, args.seed, encoded[0], args.warmup_tokens, prompts[0]["text"])
                    bar.update()
                for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
                    seed = args.seed + index
                    shift = index % len(specs)  # rotate the order so no method always runs first
                    batch = []
                    for spec in specs[shift:] + specs[:shift]:
                        bar.set_description(f"{prompt['category']} #{prompt['id']} {spec.label} T={temperature:g}")
                        turns = run_one(spec, temperature, seed, ids, args.max_new_tokens, prompt["text"],
                                        follow_ups[index])
                        for turn, measured in enumerate(turns, 1):
                            record = _record(prompt, spec, temperature, seed, measured, turn, args.max_new_tokens)
                            record["weight_bytes_read"] = bytes_of[spec.label].read(measured)
                            if judges:
                                add_quality(record, measured.context_ids, pair, judges)
                            batch.append(record)
                        bar.update()
                    order = [s.label for s in specs]
                    batch.sort(key=lambda r: (r["turn"], order.index(r["method"])))
                    for turn in sorted({r["turn"] for r in batch}):
                        add_fidelity([r for r in batch if r["turn"] == turn])
                    for record in batch:
                        sink.write(json.dumps(record) + "\n")
                    sink.flush()
                    records += batch
    finally:
        bar.close()
        for clock in clocks.values():
            clock.close()
        if llama_cpp_model is not None:
            llama_cpp_model.close()
    return records


def execute(args: argparse.Namespace) -> int:
    # Every mistake a user can make fails here, before a model is loaded.
    chosen = apply_preset(args)
    if chosen:
        print(f"preset {args.preset}: " + " ".join(chosen), file=sys.stderr)
    if args.turns < 1:
        raise ValueError("--turns must be at least 1")
    specs = parse_methods(args.methods)
    temperatures = parse_temperatures(args.temperatures) if args.temperatures else [args.temperature]
    plan = plan_methods(args, specs)
    specs = without_unavailable_llama_cpp(specs)  # after the checks: a pair without a GGUF target is refused
    for temperature in temperatures:
        replace(options_from_args(args).for_method(REFERENCE), temperature=temperature).validate()
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be at least 1")
    if args.max_new_tokens < 1 or args.warmup_tokens < 1:
        raise ValueError("--max-new-tokens and --warmup-tokens must be at least 1")
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    prompts = select_prompts(args.prompts, categories, args.limit)
    if REFERENCE not in _split_methods(args.methods):
        print("note: added ar, the reference for speedup and fidelity", file=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    pairs = {"fast": load_pair_from(args)}
    for spec in specs:
        key = spec.pair_key(args.weights, args.arithmetic)
        if key not in pairs:
            kernels = spec.option("kernels", "fast")
            pairs[key] = load_pair_from(args, fast_kernels=kernels != "plain", compiled_kernel=kernels == "fast",
                                        weights=spec.option("weights", args.weights),
                                        arithmetic=spec.option("arithmetic", args.arithmetic))
    judge = load_judge(args.judge, pairs["fast"].device) if args.judge and not args.no_quality else None
    meta = _meta(args, pairs["fast"], prompts, specs, temperatures)
    records = benchmark(args, pairs, prompts, specs, temperatures, out, progress=not args.no_progress, plan=plan,
                        judge=judge)
    summary = summarize(records)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    written = ["runs.jsonl", "summary.json", "meta.json"]
    if not args.no_report:
        from .report import write_report

        write_report(out / "report.html", summary, meta, plotlyjs=args.plotlyjs)
        written.append("report.html")
    print(f"{meta['pair']}: {meta['draft']}; {meta['device']} {meta['dtype']}; {len(prompts)} prompts, "
          f"{'up to ' + str(args.turns) + ' turns each, ' if args.turns > 1 else ''}"
          f"max {args.max_new_tokens} new tokens per turn; {meta['date_utc']} UTC\n{meta['device_line']}\n")
    print(markdown_tables(summary))
    print(f"wrote {', '.join(str(out / name) for name in written)}", file=sys.stderr)
    return 0
