"""Padded batches of `Sequence`s and the answer positions inside them.

Why a module of its own: the teacher's labelling forwards, agreement and the train stage all read sequences in
length-grouped, right-padded batches and pick out the same answer positions; this is that one layout.
"""
from __future__ import annotations

import math

import torch

from .sequences import Sequence


def make_batches(seqs, batch_tokens: int) -> list[list[int]]:
    """Indices of sequences (anything with `.ids`) grouped by length so that each padded batch holds at most
    ~batch_tokens tokens."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids))
    batches, current, width = [], [], 0
    for i in order:
        w = max(width, len(seqs[i].ids))
        if current and w * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, w = [], len(seqs[i].ids)
        current.append(i)
        width = w
    if current:
        batches.append(current)
    return batches


def collate(seqs: list[Sequence], pad_id: int, label_map: torch.Tensor | None = None):
    """Right-padded ids (causal attention never looks right, so no mask is needed) and, for every answer position,
    (row, column, label): the label is the next token, mapped to its row in the training vocabulary."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    rows, cols, labels = [], [], []
    for r, s in enumerate(seqs):
        ids[r, :len(s.ids)] = torch.tensor(s.ids)
        for j, c in enumerate(range(s.answer_start - 1, len(s.ids) - 1)):
            rows.append(r)
            cols.append(c)
            labels.append(s.labels[j] if s.labels is not None else s.ids[c + 1])
    labels_t = torch.tensor(labels, dtype=torch.long)
    if label_map is not None:
        labels_t = label_map[labels_t]
    return ids, torch.tensor(rows), torch.tensor(cols), labels_t


def collate_soft(seqs: list[Sequence], label_map: torch.Tensor, k: int):
    """Soft targets in `collate`'s position order: [positions, k] training-vocabulary rows (-100: none, or outside
    the vocabulary) and the target's probabilities renormalised over the kept ones (0 where none)."""
    ids, logp = [], []
    for s in seqs:
        n = len(s.ids) - s.answer_start
        if s.topk_ids is not None:
            ids += [row[:k] + [-1] * (k - len(row[:k])) for row in s.topk_ids]
            logp += [row[:k] + [-math.inf] * (k - len(row[:k])) for row in s.topk_logp]
        else:
            ids += [[-1] * k] * n
            logp += [[-math.inf] * k] * n
    ids_t = torch.tensor(ids, dtype=torch.long).reshape(-1, k)
    mapped = torch.where(ids_t >= 0, label_map[ids_t.clamp(min=0)], torch.full_like(ids_t, -100))
    probs = torch.tensor(logp, dtype=torch.float).reshape(-1, k).exp() * (mapped >= 0)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
    return mapped, probs


def vocabulary_rows(vocab: list[int] | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """token id -> its row in the training softmax's vocabulary `vocab` (-100, left out of the loss, elsewhere)."""
    label_map = torch.full((vocab_size,), -100, dtype=torch.long)
    label_map[torch.as_tensor(vocab)] = torch.arange(len(vocab))
    return label_map
