"""`train-draft --stage train`: K of the target's layers (layer_draft.py) learn to agree with the target.

The draft starts from the candidate layer list whose untrained draft agrees most (`--layers auto`), given layers,
an exported draft (`--init-from`) or a checkpoint (`--resume`). The softmax runs over the tokens that occur in the
training text (the 49152-wide head is ~8x a layer; the rest of the vocabulary never appears as a label), while
agreement is always measured over the full vocabulary, on held-out prompts labelled by a teacher-forced target
forward in the dtype the engine runs (fp32), so the agreement reported is against the engine's target. The loss is
cross-entropy to the target's argmax (top-1 agreement is what sd accepts at T = 0), plus optionally to its stored
top-k distribution. The best checkpoint by held-out agreement is kept in `--out/best`.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from ..loading.models import load_pair
from .agreement import agreement
from .batches import collate, collate_soft, make_batches, vocabulary_rows
from .export import keep_if_best
from .layer_draft import (
    best_untrained_layers,
    draft_from_export,
    draft_from_target,
    parse_layers,
)
from .sequences import Sequence, load_sequences
from .teacher import cached_labels
from .train_loop import TrainClock, batch_for_step, optimise, save_checkpoint


def training_vocabulary(args, train: list[Sequence], eos: set[int], vocab_size: int
                        ) -> tuple[list[int], list[int], int | None]:
    """The training softmax's tokens (`--train-vocab data`: the `--vocab-max` most frequent labels, always with the
    end-of-sequence tokens; `full`: every token), every training label, and how many distinct labels there were
    (None with `full`). The engine restricts the draft's head to exactly these tokens (head_tokens.json)."""
    labels = [t for s in train for t in (s.labels if s.labels is not None else s.ids[s.answer_start:])]
    if args.train_vocab != "data":
        return list(range(vocab_size)), labels, None
    counts = Counter(labels)
    keep = [t for t, _ in counts.most_common() if t not in eos][:max(0, args.vocab_max - len(eos))]
    return sorted(set(keep) | eos), labels, len(counts)


def starting_draft(args, target, ckpt: dict | None, heldout_labels, heldout, pad: int, log):
    """The draft before training and its source layers: a checkpoint's layers (its weights are loaded later, with
    the optimiser), an exported draft (`--init-from`), the best untrained candidate (`--layers auto`) or
    `--layers`."""
    if ckpt is not None:
        layers = ckpt["layers"]
    elif args.init_from:  # continue from an exported draft (its layers, a new optimiser)
        draft = draft_from_export(target, args.init_from)
        return draft, list(draft.config.dynasd_source_layers)
    elif args.layers == "auto":
        candidates = [parse_layers(c) for c in args.init_candidates.split(";")]
        layers, scores = best_untrained_layers(target, candidates, heldout_labels, heldout, pad)
        log({"stage": "init", "untrained_agreement": {",".join(map(str, k)): round(v, 4)
                                                      for k, v in scores.items()}})
    else:
        layers = parse_layers(args.layers)
    return draft_from_target(target, layers), layers


def train_stage(args, log) -> dict:
    out = Path(args.out)
    data_dir = out / "data"
    train_files = sorted(data_dir.glob("train-*.jsonl"))
    if not train_files or not (data_dir / "heldout.jsonl").is_file():
        raise FileNotFoundError(f"no generated data in {data_dir} (run the generate stage first)")
    train = load_sequences(train_files)
    heldout = load_sequences([data_dir / "heldout.jsonl"])
    pair = load_pair(args.pair, device="cpu", dtype="fp32", fast_kernels=False)
    target, pad = pair.target, pair.pad_id
    for p in target.parameters():
        p.requires_grad_(False)

    heldout_labels = cached_labels(target, heldout, out / "heldout-fp32-labels.jsonl", pad)
    # A second held-out set, self-written instructions (--prompt-source self): reported, and with --select-on mean
    # averaged with the first to pick the best checkpoint.
    self_heldout = self_labels = None
    if (data_dir / "heldout-self.jsonl").is_file():
        self_heldout = load_sequences([data_dir / "heldout-self.jsonl"])
        self_labels = cached_labels(target, self_heldout, out / "heldout-self-fp32-labels.jsonl", pad)

    ckpt_path = out / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=False) if args.resume and ckpt_path.is_file() else None
    draft, layers = starting_draft(args, target, ckpt, heldout_labels, heldout, pad, log)

    vocab, train_labels, distinct_labels = training_vocabulary(args, train, set(pair.eos_token_ids), pair.vocab_size)
    label_map = vocabulary_rows(vocab, pair.vocab_size)
    head = draft.lm_head.weight[torch.tensor(vocab)].detach()
    (out / "head_tokens.json").write_text(json.dumps({"token_ids": vocab}))
    heldout_targets = [t for s in heldout_labels for t in s.ids[s.answer_start:]]
    in_vocab = set(vocab)
    coverage = {"train_label_coverage": round(sum(t in in_vocab for t in train_labels) / len(train_labels), 5),
                "heldout_label_coverage": round(sum(t in in_vocab for t in heldout_targets) / len(heldout_targets), 5)}
    soft_seqs = sum(s.topk_ids is not None for s in train)

    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    step, best, seconds_before = 0, -1.0, 0.0
    if ckpt is not None:
        draft.load_state_dict(ckpt["draft"], strict=False)
        opt.load_state_dict(ckpt["optimizer"])
        step, best, seconds_before = ckpt["step"], ckpt["best_agreement"], ckpt.get("train_seconds", 0.0)
    torch.manual_seed(args.seed + step)
    batches = make_batches(train, args.batch_tokens)
    log({"stage": "train", "layers": layers, "train_sequences": len(train), "batches_per_epoch": len(batches),
         "train_answer_tokens": sum(len(s.ids) - s.answer_start for s in train), "train_vocab": len(vocab),
         "heldout_answer_tokens": sum(len(s.ids) - s.answer_start for s in heldout), "resumed_at": step,
         "distinct_labels": distinct_labels, **coverage,
         "soft_target_sequences": soft_seqs, "init_from": args.init_from if ckpt is None else None})

    def evaluate(step: int) -> None:
        nonlocal best
        draft.eval()
        agree = agreement(draft, heldout_labels, heldout, pad)
        metrics = {"step": step, "agreement": agree}
        score = agree
        if self_heldout is not None:
            metrics["self_instruct_agreement"] = agreement(draft, self_labels, self_heldout, pad)
            if args.select_on == "mean":
                score = (agree + metrics["self_instruct_agreement"]) / 2
                metrics["selected_on_mean"] = score
        draft.train()
        best = keep_if_best(draft, out / "best", score, best, metrics, vocab)
        save_checkpoint(ckpt_path, draft, opt, step=step, best_agreement=best, layers=layers,
                        train_seconds=clock.total())
        log({"step": step, "heldout_agreement": round(agree, 4), "best": round(best, 4),
             **({"self_instruct_agreement": round(metrics["self_instruct_agreement"], 4)} if self_heldout else {}),
             "elapsed_s": round(clock.elapsed(), 1)})

    def loss_at(step: int) -> tuple[torch.Tensor, int]:
        batch = [train[i] for i in batches[batch_for_step(step, len(batches), args.seed)]]
        ids, rows, cols, labels = collate(batch, pad, label_map)
        keep = labels >= 0
        hidden = draft.model(input_ids=ids).last_hidden_state[rows[keep], cols[keep]]
        logits = hidden @ head.T
        loss = F.cross_entropy(logits, labels[keep])
        if args.soft_weight and soft_seqs:
            # + cross-entropy to the target's top-k distribution (renormalised over the kept tokens)
            soft_ids, soft_p = collate_soft(batch, label_map, args.soft_k)
            soft_ids, soft_p = soft_ids[keep], soft_p[keep]
            has = soft_p.sum(-1) > 0
            if bool(has.any()):
                logq = logits[has].log_softmax(-1).gather(1, soft_ids[has].clamp(min=0))
                loss = loss + args.soft_weight * -(soft_p[has] * logq).sum(-1).mean()
        return loss, int(keep.sum())

    clock = TrainClock(seconds_before)
    step = optimise(args, draft, opt, params, step, clock, loss_at, evaluate, log, desc="train-draft")
    return {"layers": layers, "step": step, "best_agreement": best}
