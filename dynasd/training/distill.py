"""`python -m dynasd train-draft`: distil a small draft from the target.

Stages, each resumable from the files it leaves in `--out` (`--stage all` runs them in this order):
1. generate (generate.py): the target answers prompts greedily, in batches: TriviaQA questions and PIQA goals read
   from `--prompts`, or (`--prompt-source self`, self_instruct.py) user instructions the target writes itself. With
   greedy decoding the next token of the target's own answer *is* the target's argmax, so the text alone is the
   training signal: cross-entropy on it trains exactly the quantity sd accepts at T = 0 (top-1 agreement).
   Optional data stages: label (generate.py; reference answers read by the target, `--label-prompts`) and onpolicy
   (onpolicy.py; answers the draft writes itself, labelled by the target).
2. train (draft_training.py): the draft is K of the target's own layers (chosen by untrained agreement, e.g.
   [0, 1, 29]) with the target's final norm; the embedding and head stay the target's, frozen and shared, so only
   K layers (+ norm) are stored.
3. export (export.py): config.json + fp16 model.safetensors without embeddings, loaded by
   `models.load_distilled_draft`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .draft_training import train_stage
from .export import export_best, export_draft  # noqa: F401 (export_draft: re-exported, see below)
from .generate import generate_stage, label_stage
from .layer_draft import draft_from_target  # noqa: F401 (re-exported, see below)
from .onpolicy import onpolicy_stage
from .run_log import open_log

# Re-exported: tests/test_feature_draft.py imports draft_from_target and export_draft from this module; their homes
# are layer_draft.py and export.py.

DEFAULT_INIT_CANDIDATES = ("0,1,29", "0,28,29", "0,15,29", "0,1,2", "0,29", "0,1,28,29")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", default="embedded", help="model pair whose target is distilled (embedded, tiny-random)")
    p.add_argument("--prompts", nargs="+", default=None,
                   help="JSON prompt files or folders of them (objects with 'question' or 'goal'; PIQA's with "
                        "'correct_answer' for --label-prompts): needed by the generate stage unless --prompt-source "
                        "self, and by --label-prompts")
    p.add_argument("--out", default="runs/distill", help="working folder: data, checkpoint, log, best export")
    p.add_argument("--stage", default="all", choices=["all", "generate", "label", "onpolicy", "train", "export"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    g = p.add_argument_group("generate")
    g.add_argument("--prompt-source", default="files", choices=["files", "self"],
                   help="files: --prompts; self: the target writes the user instructions itself (self_instruct.py)")
    g.add_argument("--heldout", type=int, default=64, help="prompts kept apart for measuring agreement")
    g.add_argument("--self-heldout", type=int, default=32,
                   help="with --prompt-source self: self-written instructions kept apart (data/heldout-self.jsonl)")
    g.add_argument("--instruction-max-tokens", type=int, default=64,
                   help="with --prompt-source self: longest instruction sampled (T = 1, top-p 0.95)")
    g.add_argument("--instruction-openers", default="none", choices=["none", "tasks"],
                   help="with --prompt-source self: 'tasks' starts each batch's user turns with a generic task word "
                        "(Write, Explain, Translate, Solve, ...; self_instruct.TASK_OPENERS) for more varied tasks; "
                        "the held-out shard is always sampled free")
    g.add_argument("--gen-prompts", type=int, default=2000, help="training prompts to answer")
    g.add_argument("--gen-minutes", type=float, default=0, help="stop generating after this long (0: no limit)")
    g.add_argument("--gen-batch", type=int, default=32)
    g.add_argument("--gen-max-new-tokens", type=int, default=128)
    g.add_argument("--gen-dtype", default="fp32",
                   help="dtype of the target while generating (bf16 is only faster on CPUs with bf16 instructions)")
    g.add_argument("--shard-prompts", type=int, default=128, help="prompts per saved shard")
    g.add_argument("--gen-skip", type=int, default=0,
                   help="skip this many training prompts (already answered by an earlier run with the same seed)")
    g.add_argument("--shard-prefix", default="train", help="file name prefix of generated shards (train-*)")
    g.add_argument("--gen-topk", type=int, default=0,
                   help="also store the target's top-k tokens and log-probabilities per answer position")
    g.add_argument("--label-prompts", type=int, default=0,
                   help="also label this many reference answers (PIQA solutions) with the target's argmax")
    g.add_argument("--label-minutes", type=float, default=0)
    o = p.add_argument_group("onpolicy (onpolicy.py: the draft writes answers to the training prompts, the target "
                             "labels them)")
    o.add_argument("--onpolicy-prompts", type=int, default=0,
                   help="training prompts the draft answers (0: none in --stage all, every prompt in --stage onpolicy)")
    o.add_argument("--onpolicy-minutes", type=float, default=0, help="stop after this long (0: no limit)")
    o.add_argument("--onpolicy-temperature", type=float, default=0.7,
                   help="the draft samples its answers at this temperature (0: greedy)")
    o.add_argument("--onpolicy-prompt-source", default="training", choices=["training", "passage-tasks"],
                   help="the training shards' prompts, or task instructions (summarise, translate, rewrite, ...) "
                        "over the target's answers in them (task_prompts.py)")
    o.add_argument("--onpolicy-draft", default=None,
                   help="exported draft folder that writes (default: the pair's draft, e.g. the shipped one)")
    t = p.add_argument_group("train")
    t.add_argument("--layers", default="auto",
                   help="target layers the draft starts from, e.g. 0,1,29; auto picks the best untrained candidate")
    t.add_argument("--init-candidates", default=";".join(DEFAULT_INIT_CANDIDATES))
    t.add_argument("--train-vocab", default="data", choices=["data", "full"])
    t.add_argument("--select-on", default="heldout", choices=["heldout", "mean"],
                   help="best checkpoint by agreement on data/heldout.jsonl, or by the mean of it and the "
                        "self-instruct held-out set (data/heldout-self.jsonl) when there is one")
    t.add_argument("--vocab-max", type=int, default=16384,
                   help="at most this many output tokens (the most frequent labels + end-of-sequence)")
    t.add_argument("--soft-weight", type=float, default=0.0,
                   help="weight of a cross-entropy to the target's stored top-k distribution (--gen-topk data)")
    t.add_argument("--soft-k", type=int, default=8)
    t.add_argument("--init-from", default=None,
                   help="start from an exported draft folder (e.g. runs/distill/best) instead of target layers")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--minutes", type=float, default=0, help="stop training after this long (0: no limit)")
    t.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per batch")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=20)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--export", default=None,
                   help="folder to write the best draft to (e.g. assets/draft-smollm2)")


def check_prompts(args: argparse.Namespace) -> None:
    """The stages that read prompt files need `--prompts`: no default location is assumed."""
    if args.prompts:
        return
    if args.stage in ("all", "generate") and args.prompt_source == "files":
        raise ValueError("the generate stage needs --prompts FILE_OR_DIR (TriviaQA/PIQA-style JSON), "
                         "or --prompt-source self")
    if args.stage in ("all", "label") and args.label_prompts:
        raise ValueError("--label-prompts needs --prompts FILE_OR_DIR with reference answers ('correct_answer')")


def execute(args: argparse.Namespace) -> int:
    check_prompts(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    log = open_log(out)

    if args.stage in ("all", "generate"):
        generate_stage(args, log)
    if args.stage in ("all", "label") and args.label_prompts:
        label_stage(args, log)
    if args.stage == "onpolicy" or (args.stage == "all" and args.onpolicy_prompts):
        onpolicy_stage(args, log)
    if args.stage in ("all", "train"):
        summary = train_stage(args, log)
        print(json.dumps(summary))
    if args.export:
        export_best(out, args.export)
    log.close()
    return 0
