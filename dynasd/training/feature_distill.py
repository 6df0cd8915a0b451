"""`python -m dynasd train-feature-draft`: train a feature draft (dynasd/loading/feature_model.py) for the pair's
target.

Three stages, each resumable from the files it leaves in `--out`:
1. features (feature_data.py): the target reads the token sequences of a `train-draft` data folder once,
   teacher-forced, and keeps its states, argmax and top-k log-probabilities per shard.
2. train (feature_training.py): a draft of the target's `--layers` plus the input mixer learns from
   (token i, target state i-1) the target's argmax, its top-k distribution and its state i; the best checkpoint by
   held-out agreement (depth 1 and 2) is kept.
3. export (export.py): config.json (with `dynasd_feature_draft`) + fp16 weights without the shared embedding,
   loaded by `models.load_distilled_draft` like the token draft.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .draft_text import text_stage
from .export import export_best
from .feature_data import FeatureSequence, features_stage  # noqa: F401 (FeatureSequence: re-exported, see below)
from .feature_training import build_feature_draft, initial_state_scale, train_stage  # noqa: F401 (re-exported)
from .run_log import open_log

# Re-exported: tests/test_feature_draft.py imports FeatureSequence, build_feature_draft and initial_state_scale
# from this module; their homes are feature_data.py and feature_training.py.


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", default="embedded", help="model pair whose target the draft serves")
    p.add_argument("--data", default=None,
                   help="instead of --text: a train-draft working folder whose data/ holds generated sequences "
                        "(heldout*.jsonl are kept for measuring agreement)")
    p.add_argument("--out", default="runs/feature-draft", help="working folder: features, checkpoint, log, best")
    p.add_argument("--stage", default="all", choices=["all", "text", "features", "train", "export"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    p.add_argument("--export", default=None, help="folder to write the best draft to (e.g. "
                                                  "assets/draft-smollm2-features)")
    p.add_argument("--topk", type=int, default=8, help="features: top-k log-probabilities kept per position")
    p.add_argument("--select-prompts", default=None,
                   help="features: benchmark prompts (Spec-Bench JSON Lines) whose greedy answers select the "
                        "checkpoint, per category; never trained on")
    p.add_argument("--select-limit", type=int, default=3, help="selection prompts per category")
    p.add_argument("--select-max-new-tokens", type=int, default=64)
    w = p.add_argument_group("text (draft_text.py: the token draft answers training prompts; ids kept compressed)")
    w.add_argument("--text", default="data/feature-draft-text",
                   help="folder of the committed token shards (written by --stage text, read by --stage features)")
    w.add_argument("--prompts", nargs="*", default=[], help="TriviaQA/PIQA-style prompt files or folders")
    w.add_argument("--text-source", default="prompts", choices=["prompts", "local"],
                   help="prompts: --prompts, self-instruct and passage tasks; local: summaries, readings and "
                        "translations over text found on this machine (local_text.py), shards train-local-NNNN")
    w.add_argument("--heldout", type=int, default=64, help="prompts kept apart (the heldout shard)")
    w.add_argument("--text-shards", type=int, default=40, help="training shards to write in all")
    w.add_argument("--shard-prompts", type=int, default=256)
    w.add_argument("--text-writer", default="target", choices=["target", "draft"],
                   help="who answers: the target (greedy: what ar writes) or its token draft (~6x faster, poorer)")
    w.add_argument("--text-batch", type=int, default=64, help="prompts the draft answers at once")
    w.add_argument("--text-max-new-tokens", type=int, default=128)
    w.add_argument("--text-temperature", type=float, default=0.0, help="0: greedy")
    w.add_argument("--text-minutes", type=float, default=0, help="stop starting shards after this long (0: no limit)")
    t = p.add_argument_group("train")
    t.add_argument("--layers", default="last", help="target layers the draft starts from ('last' or e.g. 0,29)")
    t.add_argument("--state-scale", default="auto",
                   help="from scratch: the mixer's initial weight on the states ('auto': embedding length / state "
                        "length, so neither input swamps the other)")
    t.add_argument("--init-from", default=None,
                   help="an exported token draft (e.g. assets/draft-smollm2) to start from instead of --layers")
    t.add_argument("--warm-start", default=None,
                   help="a checkpoint.pt of an earlier run whose draft (same --layers) to start from, with a new "
                        "optimiser and learning-rate schedule (e.g. after more training text was written)")
    t.add_argument("--head-tokens", default=None,
                   help="head_tokens.json of the training softmax (default: the --vocab-max most frequent labels)")
    t.add_argument("--vocab-max", type=int, default=16384)
    t.add_argument("--vocab-fill", default=None,
                   help="a head_tokens.json made from more text: the head takes the --vocab-top most frequent labels, "
                        "then this file's tokens in id order, up to --vocab-max")
    t.add_argument("--vocab-top", type=int, default=2048)
    t.add_argument("--soft-weight", type=float, default=0.5, help="weight of the top-k cross-entropy")
    t.add_argument("--state-weight", type=float, default=1.0, help="weight of the state regression")
    t.add_argument("--state-noise", type=float, default=0.05,
                   help="uniform noise on input states, relative to their RMS")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--minutes", type=float, default=0, help="stop training after this long (0: no limit)")
    t.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per batch")
    t.add_argument("--lr", type=float, default=None,
                   help="the mixer's learning rate (default 1e-3 from scratch, 3e-5 with --init-from: see "
                        "feature_training.train_stage)")
    t.add_argument("--layer-lr-scale", type=float, default=1.0,
                   help="the layers' learning rate relative to the mixer's (--lr)")
    t.add_argument("--warmup", type=int, default=20)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--resume", action="store_true")


def execute(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open_log(out)
    if args.stage == "text":
        text_stage(args, log)
    if args.stage in ("all", "features"):
        features_stage(args, log)
    if args.stage in ("all", "train"):
        result = train_stage(args, log)
        print(json.dumps(result))
    if args.stage in ("all", "export") and args.export:
        export_best(out, args.export)
    log.close()
    return 0
