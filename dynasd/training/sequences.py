"""The records every training stage passes on: a prompt followed by an answer (`Sequence`), and the JSON Lines
shards a working folder's `data/` keeps them in.

Why a module of its own: the generate, label and on-policy stages write these shards, the train stages, the feature
draft's and the decision models' commands read them, and scripts score drafts on them; the record and its file
format are written down once, here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ONPOLICY_TAG = "-onpolicy-"  # in the name of every shard the onpolicy stage writes: f"{shard_prefix}-onpolicy-0000"


@dataclass
class Sequence:
    """A prompt (chat-templated) followed by an answer; labels start at `answer_start`. For the target's own greedy
    answers the label is the next token; for other answers (teacher-forced) `labels` holds the target's argmax at
    each answer position."""

    ids: list[int]
    answer_start: int
    labels: list[int] | None = None
    # optional soft targets: the target's top-k tokens and their log-probabilities at each answer position
    topk_ids: list[list[int]] | None = None
    topk_logp: list[list[float]] | None = None


def save_sequences(path: Path, seqs: list[Sequence]) -> None:
    """Write one shard atomically (a finished shard is never half written: the stages resume by skipping them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")

    def record(s: Sequence) -> dict:
        obj = {"ids": s.ids, "answer_start": s.answer_start, "labels": s.labels}
        if s.topk_ids is not None:
            obj.update(topk_ids=s.topk_ids, topk_logp=s.topk_logp)
        return obj

    tmp.write_text("\n".join(json.dumps(record(s)) for s in seqs) + "\n")
    tmp.replace(path)


def load_sequences(paths) -> list[Sequence]:
    seqs = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                obj = json.loads(line)
                seqs.append(Sequence(obj["ids"], obj["answer_start"], obj.get("labels"), obj.get("topk_ids"),
                                     obj.get("topk_logp")))
    return seqs


def training_shards(data_dir: Path) -> list[Path]:
    """The shards the target answered (generate stage, self-instruct), sorted; on-policy shards of any round,
    whose answers are the draft's, are left out."""
    return [f for f in sorted(data_dir.glob("train-*.jsonl")) if ONPOLICY_TAG not in f.name]
