"""Top-1 agreement of a token draft with the target: the share of answer positions where the draft's argmax is the
target's.

Why a module of its own: it is the quantity sd accepts at T = 0, so the train stage picks its starting layers and
keeps its checkpoints by it, and scripts/draft_agreement.py and the tests measure shipped drafts with it.
"""
from __future__ import annotations

import torch

from .batches import collate, make_batches
from .sequences import Sequence


@torch.inference_mode()
def agreement(draft, labelled: list[Sequence], context: list[Sequence], pad_id: int, batch_tokens: int = 2048
              ) -> float:
    """Share of answer positions where the draft's full-vocabulary argmax equals the target's argmax.
    `context` holds the token ids the models read, `labelled` the target's argmax at each answer position."""
    hits = total = 0
    for batch in make_batches(context, batch_tokens):
        ids, rows, cols, _ = collate([context[i] for i in batch], pad_id)
        _, _, _, labels = collate([labelled[i] for i in batch], pad_id)
        top = draft.lm_head(draft.model(input_ids=ids).last_hidden_state[rows, cols]).argmax(-1)
        hits += int((top == labels).sum())
        total += len(labels)
    return hits / max(total, 1)
