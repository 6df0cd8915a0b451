"""`train-feature-draft --stage features`: what a feature draft learns from, the target's own states.

The target reads the token sequences of a `train-draft` data folder (its own greedy answers to training prompts,
`python -m dynasd train-draft --stage generate`) once, teacher-forced, and keeps its final normed hidden state at
every position plus, at every answer position, its argmax and top-k log-probabilities: a `FeatureSequence`,
stored per shard as `features/<shard>.pt` (fp16 states). Why stored: training reads every sequence many times, and
one target forward per sequence costs more than many draft steps.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..models import load_pair
from .batches import make_batches
from .sequences import load_sequences


@dataclass
class FeatureSequence:
    """A token sequence with the target's states at every position and its labels at the answer positions
    (answer_start - 1 .. len - 2, each predicting the next token)."""

    ids: list[int]
    answer_start: int
    states: torch.Tensor          # [len, hidden] fp16
    labels: torch.Tensor          # [answers] target argmax
    topk_ids: torch.Tensor        # [answers, k]
    topk_logp: torch.Tensor       # [answers, k]


@torch.inference_mode()
def target_features(target, seqs, pad_id: int, topk: int, batch_tokens: int = 2048) -> list[FeatureSequence]:
    """One teacher-forced target forward per batch of `seqs` (`Sequence`s): states, argmax and top-k per answer."""
    out: list[FeatureSequence | None] = [None] * len(seqs)
    for batch in make_batches(seqs, batch_tokens):
        width = max(len(seqs[i].ids) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        for r, i in enumerate(batch):  # right padding: causal attention never reads it
            ids[r, :len(seqs[i].ids)] = torch.tensor(seqs[i].ids)
        states = target.model(input_ids=ids).last_hidden_state
        for r, i in enumerate(batch):
            s = seqs[i]
            answer = states[r, s.answer_start - 1:len(s.ids) - 1]
            logp = target.lm_head(answer).float().log_softmax(-1)
            top = logp.topk(topk, dim=-1)
            out[i] = FeatureSequence(list(s.ids), s.answer_start, states[r, :len(s.ids)].to(torch.float16).clone(),
                                     logp.argmax(-1), top.indices.to(torch.int32), top.values.to(torch.float16))
    return out


def features_stage(args, log) -> None:
    data_dir, feature_dir = Path(args.data) / "data", Path(args.out) / "features"
    feature_dir.mkdir(parents=True, exist_ok=True)
    shards = sorted(data_dir.glob("*.jsonl"))
    if not shards:
        raise FileNotFoundError(f"no generated data in {data_dir} (run `train-draft --stage generate` first)")
    pair = load_pair(args.pair, device="cpu", dtype="fp32")  # inference only: the fast kernels are welcome
    start, tokens = time.time(), 0
    for shard in tqdm(shards, desc="features", unit="shard"):
        path = feature_dir / f"{shard.stem}.pt"
        if path.is_file():
            continue
        seqs = [s for s in load_sequences([shard]) if len(s.ids) > s.answer_start]
        feats = target_features(pair.target, seqs, pair.pad_id, args.topk)
        torch.save([vars(f) for f in feats], path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        tokens += sum(len(s.ids) for s in seqs)
        log({"stage": "features", "shard": shard.stem, "sequences": len(seqs), "tokens": tokens,
             "tokens_per_s": round(tokens / (time.time() - start), 1)})


def load_features(paths) -> list[FeatureSequence]:
    return [FeatureSequence(**record) for path in paths for record in torch.load(path, weights_only=False)]


def batch_of(seqs: list[FeatureSequence], pad_id: int):
    """Right-padded ids, input states (the target's state one position earlier, zeros at 0), and per answer
    position (row, column) with its label, top-k and the target's own state there."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    states = torch.zeros(len(seqs), width, seqs[0].states.shape[1])
    rows, cols = [], []
    for r, s in enumerate(seqs):
        n = len(s.ids)
        ids[r, :n] = torch.tensor(s.ids)
        states[r, :n] = s.states.float()
        rows += [r] * (n - s.answer_start)
        cols += range(s.answer_start - 1, n - 1)
    inputs = torch.zeros_like(states)
    inputs[:, 1:] = states[:, :-1]
    rows_t, cols_t = torch.tensor(rows), torch.tensor(cols)
    labels = torch.cat([s.labels for s in seqs])
    topk_ids = torch.cat([s.topk_ids for s in seqs]).long()
    topk_logp = torch.cat([s.topk_logp for s in seqs]).float()
    return ids, inputs, rows_t, cols_t, labels, topk_ids, topk_logp, states[rows_t, cols_t]
