"""`train-feature-draft --stage features`: what a feature draft learns from, the target's own states.

The target reads the committed training text (token shards, `--stage text`; or a `train-draft` data folder with
`--data`) once, teacher-forced through the engine's kernels, and keeps its final hidden state at every position
(what its output layer reads, and what a verify hands the feature draft) plus, at every answer position, its argmax
and top-k log-probabilities: a `FeatureSequence`, stored per shard as `features/<shard>.pt` (fp16 states) in the
working folder, never committed (recomputed from the ids in minutes). Why stored: training reads every sequence
many times, and one target forward per sequence costs more than many draft steps.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..cache import CachedModel
from ..decoders import make_decoder
from ..loading.models import load_pair
from ..options import DecoderOptions
from ..prompts import select_prompts
from .sequences import Sequence, load_sequences
from .token_store import load_token_shards, token_shards


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
def target_features(target, seqs, topk: int) -> list[FeatureSequence]:
    """The target reads each of `seqs` (`Sequence`s) teacher-forced, one sequence a forward through its runtime
    (the engine's kernels where the pair has them: every row of a sequence in one forward, ~1,100 tokens/s on 2
    cores, twice transformers' padded batches), so the states are exactly those a verify hands the feature draft:
    states, argmax and top-k per answer position."""
    model = CachedModel(target, need_hidden=True)
    out = []
    for s in seqs:
        model.reset()
        # logits from position answer_start - 1 (it predicts the first answer token); the last one predicts nothing
        answers = len(s.ids) - s.answer_start
        logits, states = model.forward(list(s.ids), [], None, [], keep_logits=answers + 1, keep_hidden=len(s.ids))
        logp = logits[:answers].log_softmax(-1)
        top = logp.topk(topk, dim=-1)
        out.append(FeatureSequence(list(s.ids), s.answer_start, states.to(torch.float16).clone(), logp.argmax(-1),
                                   top.indices.to(torch.int32), top.values.to(torch.float16)))
    return out


def sequence_shards(args) -> list[tuple[str, list]]:
    """(name, sequences) of every shard to label: the token shards of `--text` (draft_text.py), or, with `--data`,
    the JSON Lines shards of a `train-draft` working folder."""
    if args.data:
        shards = sorted((Path(args.data) / "data").glob("*.jsonl"))
        return [(shard.stem, lambda shard=shard: load_sequences([shard])) for shard in shards]
    return [(shard.stem, lambda shard=shard: load_token_shards([shard])) for shard in token_shards(Path(args.text))]


SELECT_PREFIX = "select-"  # features/select-<category>.pt: the selection set, one file per benchmark category


@torch.inference_mode()
def selection_sequences(pair, prompts: list[dict], max_new_tokens: int) -> dict[str, list[Sequence]]:
    """Per category, each prompt followed by the target's greedy answer written by the engine's `ar` (the text a
    benchmark run of this pair verifies): what a draft is selected on, never trained on."""
    answered: dict[str, list[Sequence]] = {}
    for prompt in prompts:
        ids = pair.encode_prompt(prompt["text"])
        run = make_decoder(pair, DecoderOptions(method="ar").validate()).generate(ids, max_new_tokens)
        answered.setdefault(prompt["category"], []).append(Sequence(ids + list(run.new_token_ids), len(ids)))
    return answered


def features_stage(args, log) -> None:
    feature_dir = Path(args.out) / "features"
    feature_dir.mkdir(parents=True, exist_ok=True)
    shards = sequence_shards(args)
    if not shards:
        raise FileNotFoundError(f"no training text in {args.data or args.text} (run --stage text first)")
    pair = load_pair(args.pair, device="cpu")  # the engine's kernels and arithmetic: the states a verify gives
    start, tokens = time.time(), 0
    for name, read in tqdm(shards, desc="features", unit="shard"):
        path = feature_dir / f"{name}.pt"
        if path.is_file():
            continue
        seqs = [s for s in read() if len(s.ids) > s.answer_start]
        feats = target_features(pair.target, seqs, args.topk)
        torch.save([vars(f) for f in feats], path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        tokens += sum(len(s.ids) for s in seqs)
        log({"stage": "features", "shard": name, "sequences": len(seqs), "tokens": tokens,
             "tokens_per_s": round(tokens / (time.time() - start), 1)})
    if args.select_prompts and not list(feature_dir.glob(f"{SELECT_PREFIX}*.pt")):
        prompts = select_prompts(args.select_prompts, None, args.select_limit)
        for category, seqs in selection_sequences(pair, prompts, args.select_max_new_tokens).items():
            torch.save([vars(f) for f in target_features(pair.target, seqs, args.topk)],
                       feature_dir / f"{SELECT_PREFIX}{category}.pt")
        log({"stage": "features", "selection_prompts": len(prompts), "source": str(args.select_prompts)})


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
