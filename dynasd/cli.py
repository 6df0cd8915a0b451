"""`python -m dynasd COMMAND`: generate, bench, costs, train-draft, train-feature-draft, train-decision, build-kernels.

Each command lives in its own module exposing `add_arguments(parser)` and `execute(args) -> int`. Every error a user
can cause ends as one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path

from .decoders import RequestError, make_decoder
from .loading.models import ModelLoadError
from .options import (
    DEFAULT_MAX_NEW_TOKENS,
    add_model_arguments,
    add_option_arguments,
    load_pair_from,
    options_from_args,
)
from .prompts import follow_up_ids, read_prompts
from .stopping.policies import load_decision_model
from .trace import TraceError, save_run

# command -> module; each module has add_arguments(parser) and execute(args)
COMMANDS = {
    "generate": ("dynasd.cli", "Decode prompts with one method and print the text (or JSON Lines)."),
    "bench": ("dynasd.bench.command",
              "Benchmark methods side by side on Spec-Bench prompts (tokens/s, speedup, fidelity)."),
    "costs": ("dynasd.bench.costs", "Time one forward over q rows at the levels asked for (weight products, target "
                                    "and drafts, verify engines, the cost table under load), in one table."),
    "train-draft": ("dynasd.training.distill", "Distil a small draft from the target (generate data, train, export)."),
    "train-feature-draft": ("dynasd.training.feature_distill",
                            "Train a draft that also reads the target's hidden states (features, train, export)."),
    "train-decision": ("dynasd.training.decision_training", "Train the hard and soft early-stop decision models."),
    "recipes": ("dynasd.recipes", "Print the named method configurations (the app's Recipe menu) as bench specs."),
    "best-tree": ("dynasd.speed.best_tree", "Find the static tree with the highest expected speed for this draft on "
                                            "this device, check it against ar, and write it as a recipe."),
    "build-kernels": ("dynasd.kernels.build_command",
                      "Build the compiled CPU kernels now rather than at the first model load (make setup runs it)."),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; a user needs the error alone."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {message} (see --help)\n")
        raise SystemExit(2)


# ---------------------------------------------------------------------------------------------------------------
# generate

def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_option_arguments(p)
    p.add_argument("--runs", type=int, default=1, help="independent runs with seeds seed..seed+N-1")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--prompt", default=None)
    p.add_argument("--prompts", default=None, help="Spec-Bench style JSON Lines file")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of --prompts")
    p.add_argument("--follow-up", action="append", default=[], metavar="TEXT",
                   help="with --prompt: a later user message (repeatable); the conversation goes on from the model's "
                        "own answer, the decoder reusing its caches")
    p.add_argument("--turns", type=int, default=1,
                   help="with --prompts: decode up to this many of each question's turns (MT-bench has 2)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true", help="JSON Lines, one object per run")
    p.add_argument("--trace-out", default=None, help="write the run trace (JSON); with several runs FILE.N.json")


def execute(args: argparse.Namespace) -> int:
    if bool(args.prompt is not None) == bool(args.prompts):
        raise ValueError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    if args.runs < 1:
        raise ValueError("--runs must be at least 1")
    if args.follow_up and args.prompt is None:
        raise ValueError("--follow-up goes with --prompt (with --prompts, use --turns)")
    if args.turns < 1:
        raise ValueError("--turns must be at least 1")
    if args.prompt is not None:
        prompts = [{"id": 0, "category": "", "text": args.prompt, "turns": [args.prompt] + args.follow_up}]
    else:
        prompts = [{**p, "turns": p["turns"][:args.turns]} for p in read_prompts(args.prompts, args.limit)]
    if any(not t.strip() for p in prompts for t in p["turns"]):
        raise ValueError("the prompt is empty" if any(not p["text"].strip() for p in prompts)
                         else "a follow-up message is empty")
    options = options_from_args(args).validate()  # every mistake in the options fails before a model loads
    decision_model = load_decision_model(options.stop, options.decision_model)  # read once for every run
    pair = load_pair_from(args)
    total = sum(len(p["turns"]) for p in prompts) * args.runs
    index = 0
    for prompt in prompts:
        ids = pair.encode_prompt(prompt["text"], chat=not args.no_chat)
        for seed in range(args.seed, args.seed + args.runs):
            decoder = make_decoder(pair, replace(options, seed=seed), decision_model)
            for turn, text in enumerate(prompt["turns"], 1):
                if turn == 1:
                    trace = decoder.generate(ids, args.max_new_tokens, prompt_text=text)
                else:
                    trace = decoder.generate_turn(_follow_up(pair, prompt["turns"][:turn], trace, args.no_chat),
                                                  args.max_new_tokens, prompt_text=text)
                _report(args, prompt, seed, turn, options.method, trace)
                if args.trace_out:
                    out = Path(args.trace_out)
                    save_run(trace, out if total == 1 else out.with_suffix(f".{index}{out.suffix or '.json'}"))
                index += 1
    return 0


def _follow_up(pair, users: list[str], trace, no_chat: bool) -> list[int]:
    """The tokens after the last answer: the template's end of turn, the next user message, the next header."""
    messages = []
    for user in users[:-1]:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": "..."}]
    messages.append({"role": "user", "content": users[-1]})
    return follow_up_ids(pair.tokenizer, messages, trace.new_token_ids, pair.eos_token_ids, chat=not no_chat)


def _report(args, prompt: dict, seed: int, turn: int, method: str, trace) -> None:
    summary = trace.summary()
    if args.json:
        print(json.dumps({"prompt_id": prompt["id"], "category": prompt["category"], "seed": seed, "turn": turn,
                          "method": method, "token_ids": trace.new_token_ids, "text": trace.text,
                          "lossless": trace.lossless, "finished": trace.finished, "device": trace.device,
                          **summary}), flush=True)
        return
    print(trace.text)
    print(f"[{method} seed={seed}{f' turn {turn}' if len(prompt['turns']) > 1 else ''}: {summary['new_tokens']} "
          f"tokens in {summary['steps']} steps, {summary['tokens_per_target_forward']:.2f} tokens/target forward, "
          f"{summary['tokens_per_s']:.1f} tokens/s{'' if trace.lossless else ', LOSSY'}]", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m dynasd", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(command)
        command.set_defaults(module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return importlib.import_module(args.module).execute(args)
    except (ModelLoadError, RequestError, TraceError, ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
