"""`python -m dynasd train-decision`: build a decision-model dataset from a pair and train the hard and soft models.

Dataset (method.md section 6), computed directly from teacher-forced forwards rather than through a decoder:
- "fork": the target answers prompts greedily; at every answer position the draft forks `width` children drawn
  from its softmax at temperature T (T = 1 in the paper). Each child is one row: the parent's draft features
  (entropy + top-10 probabilities of the T = 1 softmax, what the stop policy sees; the final hidden state),
  hard label 1 iff the child is the target's argmax, soft label min(1, p_T(x) / q_T(x)).
- "chain": from random cut points of those answers the draft samples a chain of `chain_depth` tokens at each of
  `chain_temperatures`; one forward of both models over prefix + chain labels every level. Deeper levels read
  draft-written context, which the fork never shows the model.
Training: BCE (soft targets allowed), Adam 1e-3, batch 50, seeded, validation split by prompt, best validation loss
kept, written with `DecisionModel.save` (decision.json + model.safetensors).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..options import add_model_arguments, load_pair_from
from ..stopping.decision_models import DecisionModel, hard_features
from .prompt_files import read_train_prompts
from .run_log import open_log
from .sequences import Sequence, load_sequences
from .teacher import generate_answers


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits.float() / temperature, dim=-1)


def _rows(draft_logits, draft_hidden, target_logits, tokens, temperature, level, group):
    """Rows for drafted `tokens` (n, k) drawn from `draft_logits` (n, V) at `temperature`."""
    q_t, p_t = _probs(draft_logits, temperature), _probs(target_logits, temperature)
    qx, px = q_t.gather(-1, tokens), p_t.gather(-1, tokens)
    soft = torch.where(qx > 0, (px / qx.clamp_min(1e-12)).clamp(max=1.0), torch.zeros_like(qx))
    hard = (tokens == target_logits.argmax(-1, keepdim=True)).float()
    k = tokens.shape[1]
    feats = hard_features(torch.softmax(draft_logits.float(), dim=-1))
    n = len(tokens)
    return {"hard_features": feats.repeat_interleave(k, 0), "hidden": draft_hidden.half().repeat_interleave(k, 0),
            "label_hard": hard.flatten(), "label_soft": soft.flatten(),
            "level": torch.full((n * k,), level, dtype=torch.int16),
            "temperature": torch.full((n * k,), temperature), "group": torch.full((n * k,), group)}


@torch.inference_mode()
def build_dataset(pair, sequences: list[Sequence], width: int = 10, fork_temperature: float = 1.0,
                  chain_depth: int = 4, chain_temperatures=(0.0, 1.0), chains_per_sequence: int = 2, seed: int = 0,
                  progress: bool = True) -> dict[str, torch.Tensor]:
    """Fork and chain rows for `sequences` (prompt + target answer)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    parts = []
    for group, seq in enumerate(tqdm(sequences, desc="decision data", unit="seq", disable=not progress)):
        ids = torch.tensor([seq.ids])
        d_out = pair.draft(input_ids=ids, output_hidden_states=True)
        t_logits = pair.target(input_ids=ids).logits[0]
        positions = torch.arange(seq.answer_start - 1, len(seq.ids) - 1)
        d_logits, d_hidden = d_out.logits[0, positions], d_out.hidden_states[-1][0, positions]
        q = _probs(d_logits, fork_temperature)
        children = torch.multinomial(q, width, replacement=True, generator=gen)
        parts.append(_rows(d_logits, d_hidden, t_logits[positions], children, fork_temperature, 1, group))
        for temperature in chain_temperatures:
            for _ in range(chains_per_sequence):
                cut = rng.randrange(seq.answer_start, len(seq.ids))
                chain = list(seq.ids[:cut])
                for _ in range(chain_depth):  # short chains on a tiny draft: plain re-forwards are cheap enough
                    logits = pair.draft(input_ids=torch.tensor([chain]), logits_to_keep=1).logits[0, -1]
                    chain.append(int(torch.multinomial(_probs(logits, temperature), 1, generator=gen)))
                ids = torch.tensor([chain])
                d_out = pair.draft(input_ids=ids, output_hidden_states=True)
                t_logits = pair.target(input_ids=ids).logits[0]
                pos = torch.arange(cut - 1, cut - 1 + chain_depth)
                tokens = torch.tensor(chain[cut:])[:, None]
                for level in range(1, chain_depth + 1):
                    i = pos[level - 1:level]
                    parts.append(_rows(d_out.logits[0, i], d_out.hidden_states[-1][0, i], t_logits[i],
                                       tokens[level - 1:level], temperature, level, group))
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


def train_model(kind: str, data: dict[str, torch.Tensor], epochs: int = 10, batch_size: int = 50,
                lr: float = 1e-3, val_share: float = 0.1, seed: int = 0, log=lambda record: None,
                progress: bool = True) -> tuple[DecisionModel, dict]:
    """BCE on `label_hard` (hard model) or `label_soft` (soft model); the split is by prompt, not by row."""
    torch.manual_seed(seed)
    x = data["hard_features"] if kind == "hard" else data["hidden"].float()
    y = data["label_hard"] if kind == "hard" else data["label_soft"]
    groups = data["group"].unique().tolist()
    random.Random(seed).shuffle(groups)
    val_groups = torch.tensor(groups[:max(1, int(len(groups) * val_share))])
    is_val = torch.isin(data["group"], val_groups)
    xt, yt, xv, yv = x[~is_val], y[~is_val], x[is_val], y[is_val]
    model = DecisionModel(kind, x.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    with torch.no_grad():
        best = {"epoch": 0, "val_loss": float(bce(model(xv), yv)), "state": {k: v.clone() for k, v in
                                                                         model.state_dict().items()}}
    log({"kind": kind, "epoch": 0, "val_loss": round(best["val_loss"], 5), "train_rows": len(xt), "val_rows": len(xv)})
    gen = torch.Generator().manual_seed(seed)
    for epoch in tqdm(range(1, epochs + 1), desc=f"train-decision {kind}", unit="epoch", disable=not progress):
        model.train()
        total = 0.0
        for batch in torch.randperm(len(xt), generator=gen).split(batch_size):
            loss = bce(model(xt[batch]), yt[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(batch)
        model.eval()
        with torch.no_grad():
            val_loss = float(bce(model(xv), yv))
        log({"kind": kind, "epoch": epoch, "train_loss": round(total / len(xt), 5), "val_loss": round(val_loss, 5)})
        if val_loss < best["val_loss"]:
            best = {"epoch": epoch, "val_loss": val_loss,
                    "state": {k: v.clone() for k, v in model.state_dict().items()}}
    model.load_state_dict(best["state"])
    with torch.no_grad():
        pred = torch.sigmoid(model(xv))
        accuracy = float(((pred >= 0.5).float() == (yv >= 0.5).float()).float().mean())
    metrics = {"best_epoch": best["epoch"], "val_loss": round(best["val_loss"], 5),
               "val_accuracy_at_0.5": round(accuracy, 4), "val_label_mean": round(float(yv.mean()), 4),
               "train_rows": len(xt), "val_rows": len(xv)}
    return model.eval(), metrics


# ---------------------------------------------------------------------------------------------------------------
# command

def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--prompts", nargs="+", default=None,
                   help="JSON prompt files or folders (objects with 'question' or 'goal') whose prompts the target "
                        "answers; needed unless --sequences")
    p.add_argument("--sequences", nargs="+", default=None,
                   help="use these prompt+answer files (JSON Lines written by train-draft, e.g. its held-out "
                        "shard) instead of generating answers")
    p.add_argument("--skip-prompts", type=int, default=20000,
                   help="skip this many prompts of the seeded shuffle (train-draft uses the first ones)")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=64, help="length of the target's answers")
    p.add_argument("--width", type=int, default=10, help="fork width (children per position)")
    p.add_argument("--fork-temperature", type=float, default=1.0)
    p.add_argument("--chain-depth", type=int, default=4)
    p.add_argument("--chain-temperatures", default="0,1", help="comma list; empty for none")
    p.add_argument("--chains-per-sequence", type=int, default=2)
    p.add_argument("--kinds", default="hard,soft")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--val-share", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="runs/decision", help="working folder: dataset.pt, log.jsonl, models")
    p.add_argument("--reuse-data", action="store_true", help="train on OUT/dataset.pt if it exists")
    p.add_argument("--export-prefix", default=None,
                   help="write the models to PREFIX-hard and PREFIX-soft (e.g. assets/decision-smollm2)")


def answered_sequences(args: argparse.Namespace, pair) -> list[Sequence]:
    """`--sequences` as written by train-draft, or the target's greedy answers to `--num-prompts` of `--prompts`
    (after `--skip-prompts` of their seeded shuffle, the ones train-draft trains on)."""
    if args.sequences:
        return load_sequences(args.sequences)[:args.num_prompts]
    texts = read_train_prompts(args.prompts)
    random.Random(args.seed).shuffle(texts)
    texts = texts[args.skip_prompts:][:args.num_prompts] or texts[:args.num_prompts]
    encoded = sorted((pair.encode_prompt(t) for t in texts), key=len)
    sequences = []
    for i in range(0, len(encoded), 16):
        sequences += generate_answers(pair.target, encoded[i:i + 16], pair.pad_id, set(pair.eos_token_ids),
                                      args.max_new_tokens)
    return sequences


def execute(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    data_path = out / "dataset.pt"
    reuse = args.reuse_data and data_path.is_file()
    if not reuse and not args.sequences and not args.prompts:
        raise ValueError("train-decision needs --prompts FILE_OR_DIR (TriviaQA/PIQA-style JSON) or --sequences "
                         "FILE.jsonl (train-draft's data)")
    log = open_log(out)

    if reuse:
        data = torch.load(data_path)
    else:
        start = time.time()
        pair = load_pair_from(args)
        sequences = answered_sequences(args, pair)
        temps = tuple(float(t) for t in args.chain_temperatures.split(",") if t.strip())
        data = build_dataset(pair, sequences, args.width, args.fork_temperature, args.chain_depth, temps,
                             args.chains_per_sequence, args.seed)
        torch.save(data, data_path)
        log({"stage": "data", "rows": len(data["label_hard"]), "sequences": len(sequences),
             "label_hard_mean": round(float(data["label_hard"].mean()), 4),
             "label_soft_mean": round(float(data["label_soft"].mean()), 4),
             "elapsed_s": round(time.time() - start, 1)})
    results = {}
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        model, metrics = train_model(kind, data, args.epochs, args.batch_size, args.lr, args.val_share, args.seed,
                                     log)
        log({"kind": kind, "final": metrics})
        extra = {"label": "target argmax == drafted token" if kind == "hard" else "min(1, p(x)/q(x))",
                 "width": args.width, "fork_temperature": args.fork_temperature, "chain_depth": args.chain_depth,
                 "chain_temperatures": args.chain_temperatures, "num_prompts": args.num_prompts,
                 "seed": args.seed, **metrics}
        model.save(out / kind, extra)
        if args.export_prefix:
            model.save(f"{args.export_prefix}-{kind}", extra)
        results[kind] = metrics
    print(json.dumps(results))
    log.close()
    return 0
