"""Token sequences kept compactly: one compressed NumPy file per shard (ids as uint16, offsets, answer starts).

Why: the feature draft's training text is committed so that it never has to be written again, while everything
derived from it (the target's states, argmax and top-k) is recomputed from it in minutes. As JSON Lines the same
ids took ~5x the bytes; here 1M tokens are ~1.5 MB. Only token ids are kept: no labels, no states.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .sequences import Sequence

SUFFIX = ".npz"


def save_token_shard(path: Path, seqs: list[Sequence]) -> None:
    """Write one shard atomically (a stopped stage resumes by skipping the shards already there)."""
    if any(not 0 <= t < 2 ** 16 for s in seqs for t in s.ids):
        raise ValueError("token ids must fit 16 bits to be stored in a token shard")
    lengths = np.array([len(s.ids) for s in seqs], dtype=np.int64)
    ids = np.fromiter((t for s in seqs for t in s.ids), dtype=np.uint16, count=int(lengths.sum()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        np.savez_compressed(handle, ids=ids, offsets=np.concatenate([[0], lengths.cumsum()]),
                            answer_starts=np.array([s.answer_start for s in seqs], dtype=np.int32))
    tmp.replace(path)


def load_token_shards(paths) -> list[Sequence]:
    seqs = []
    for path in paths:
        with np.load(path) as shard:
            ids, offsets, starts = shard["ids"].astype(np.int64), shard["offsets"], shard["answer_starts"]
        seqs += [Sequence(ids[offsets[i]:offsets[i + 1]].tolist(), int(starts[i])) for i in range(len(starts))]
    return seqs


def token_shards(folder: Path, prefix: str = "") -> list[Path]:
    return sorted(Path(folder).glob(f"{prefix}*{SUFFIX}"))
