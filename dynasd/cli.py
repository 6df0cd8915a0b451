"""`python -m dynasd COMMAND`: generate, bench, train-draft, train-feature-draft, train-decision.

Each command lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`. Every error a user
can cause ends as one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from .options import add_model_arguments, load_pair_from
from .prompts import read_prompts

# command -> module; each module has add_arguments(parser) and run(args)
COMMANDS = {
    "generate": ("dynasd.cli", "Decode prompts with one method and print the text (or JSON Lines)."),
    "bench": ("dynasd.bench.command", "Benchmark methods side by side on Spec-Bench prompts (tokens/s, speedup, fidelity)."),
    "train-draft": ("dynasd.training.distill", "Distil a small draft from the target (generate data, train, export)."),
    "train-feature-draft": ("dynasd.training.feature_distill",
                            "Train a draft that also reads the target's hidden states (features, train, export)."),
    "train-decision": ("dynasd.training.decision_training", "Train the hard and soft early-stop decision models."),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; a user needs the error alone."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {message} (see --help)\n")
        raise SystemExit(2)


# ---------------------------------------------------------------------------------------------------------------
# shared options and their parsing (bench and the app reuse these)

def add_method_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gamma", type=int, default=4, help="sd: draft chain length")
    p.add_argument("--k-config", default="4,2,2,1", help="mcsd tree shape, e.g. 4,2,2,1")
    p.add_argument("--ti-k-config", default=None, help="ti-mcsd general static shape, e.g. 2,4,4,1,1")
    p.add_argument("--width", type=int, default=4, help="ti-mcsd: number of target-initialized chains")
    p.add_argument("--depth", type=int, default=4, help="ti-mcsd: draft tokens per chain")
    p.add_argument("--with-replacement", action="store_true", help="mcsd: draw siblings with replacement")
    p.add_argument("--lookup", type=int, default=0,
                   help="sd/mcsd/pld: prompt lookup; when the last n-gram occurred earlier in the context, "
                        "propose up to this many tokens that followed it instead of running the draft model "
                        "(0 = off; pld: 8)")
    p.add_argument("--lookup-ngram", type=int, default=2, help="prompt lookup: shortest n-gram that may match")
    p.add_argument("--dynamic-depth", action="store_true", help="let a stop policy end drafting early")
    p.add_argument("--stop", default="none",
                   help="none, confidence, decision or cumulative (implies --dynamic-depth)")
    p.add_argument("--threshold", type=float, default=0.4, help="stop-policy threshold")
    p.add_argument("--decision-model", default=None, help="folder of a trained decision model")
    p.add_argument("--draft-kind", default="tokens", choices=["tokens", "features"],
                   help="sd/mcsd/ti-mcsd: the pair's draft (tokens) or its feature draft, which also reads the "
                        "target's hidden states (features; dynasd/feature_draft.py)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)


def sampling_from(args: argparse.Namespace):
    from .sampling import SamplingConfig

    return SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def decoder_from(args: argparse.Namespace, method: str, pair, sampling, seed: int):
    from .decoders import make_decoder
    from .stopping import make_stop_policy
    from .tree import parse_branching

    stop = make_stop_policy(args.stop, args.threshold, args.decision_model)
    ti_shape = parse_branching(args.ti_k_config) if args.ti_k_config else None
    return make_decoder(method, pair, sampling, seed=seed, gamma=args.gamma, k_config=parse_branching(args.k_config),
                        width=args.width, depth=args.depth, ti_k_config=ti_shape,
                        without_replacement=not args.with_replacement, dynamic_depth=args.dynamic_depth, stop=stop,
                        lookup=args.lookup, lookup_min_ngram=args.lookup_ngram,
                        feature_draft=args.draft_kind == "features")


# ---------------------------------------------------------------------------------------------------------------
# generate

def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--method", default="mcsd", choices=["ar", "sd", "mcsd", "ti-mcsd", "pld"])
    add_method_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=1, help="independent runs with seeds seed..seed+N-1")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompt", default=None)
    p.add_argument("--prompts", default=None, help="Spec-Bench style JSON Lines file")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of --prompts")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true", help="JSON Lines, one object per run")
    p.add_argument("--trace-out", default=None, help="write the run trace (JSON); with several runs FILE.N.json")


def run(args: argparse.Namespace) -> int:
    from .trace import save_run

    if bool(args.prompt is not None) == bool(args.prompts):
        raise ValueError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    if args.runs < 1:
        raise ValueError("--runs must be at least 1")
    prompts = [{"id": 0, "category": "", "text": args.prompt}] if args.prompt is not None else \
        read_prompts(args.prompts, args.limit)
    if any(not p["text"].strip() for p in prompts):
        raise ValueError("the prompt is empty")
    sampling = sampling_from(args)
    pair = load_pair_from(args)
    total = len(prompts) * args.runs
    index = 0
    for prompt in prompts:
        ids = pair.encode_prompt(prompt["text"], chat=not args.no_chat)
        for seed in range(args.seed, args.seed + args.runs):
            decoder = decoder_from(args, args.method, pair, sampling, seed)
            trace = decoder.generate(ids, args.max_new_tokens, prompt_text=prompt["text"])
            summary = trace.summary()
            if args.json:
                print(json.dumps({"prompt_id": prompt["id"], "category": prompt["category"], "seed": seed,
                                  "method": args.method, "token_ids": trace.new_token_ids, "text": trace.text,
                                  "lossless": trace.lossless, "finished": trace.finished, **summary}), flush=True)
            else:
                print(trace.text)
                print(f"[{args.method} seed={seed}: {summary['new_tokens']} tokens in {summary['steps']} steps, "
                      f"{summary['tokens_per_target_forward']:.2f} tokens/target forward, "
                      f"{summary['tokens_per_s']:.1f} tokens/s{'' if trace.lossless else ', LOSSY'}]",
                      file=sys.stderr)
            if args.trace_out:
                out = Path(args.trace_out)
                save_run(trace, out if total == 1 else out.with_suffix(f".{index}{out.suffix or '.json'}"))
            index += 1
    return 0


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
    from .decoders import RequestError
    from .models import ModelLoadError
    from .trace import TraceError

    args = build_parser().parse_args(argv)
    try:
        return importlib.import_module(args.module).run(args)
    except (ModelLoadError, RequestError, TraceError, ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
