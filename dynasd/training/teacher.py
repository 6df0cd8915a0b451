"""The target as teacher: it answers prompts (generation) and labels answers it reads teacher-forced.

Why a module of its own: generated data, reference answers, the draft's on-policy answers, the held-out reference
and the decision models' data all come from these two uses of the target. With greedy decoding the next token of
the target's own answer *is* its argmax, so generated text needs no labels; any other text gets the target's
argmax (and top-k) at every answer position from one batched forward.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import LogitsProcessorList

from .batches import collate, make_batches
from .sequences import Sequence, load_sequences, save_sequences


class InverseCdfSampling:
    """A logits processor that turns greedy decoding into sampling at `temperature`: it draws each row's token by
    inverting the cumulative distribution of softmax(logits / T) with one uniform number and leaves only that
    token finite. Why: torch.multinomial (and any per-token noise) over a 49k-token vocabulary costs ~60 ms per batch
    of 32 on this CPU, more than the draft's forward; a cumsum and a binary search cost a few."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        cdf = (scores.float() / self.temperature).softmax(-1).cumsum(-1)
        # the smallest index whose cumulative probability exceeds u: never a zero-probability token
        u = torch.rand(cdf.shape[0], 1) * cdf[:, -1:]
        chosen = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
        return torch.full_like(scores, float("-inf")).scatter_(-1, chosen, 0.0)


@torch.inference_mode()
def generate_answers(model, prompts: list[list[int]], pad_id: int, eos_ids: set[int], max_new_tokens: int,
                     topk: int = 0, temperature: float = 0.0) -> list[Sequence]:
    """Greedy answers (or sampled at `temperature` > 0) for one batch of prompts (left-padded), cut after the first
    end-of-sequence token. With `topk`, also the model's top-k tokens and log-probabilities at every answer position
    (soft targets, free: generation computes these logits anyway). `model` is usually the target; the onpolicy
    stage passes the draft."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    sampling = LogitsProcessorList([InverseCdfSampling(temperature)] if temperature > 0 else [])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         logits_processor=sampling, pad_token_id=pad_id, eos_token_id=sorted(eos_ids),
                         return_dict_in_generate=True, output_logits=bool(topk))
    top_ids = top_logp = None
    if topk:  # [batch, steps, k]
        top = [step.float().log_softmax(-1).topk(topk, dim=-1) for step in out.logits]
        top_logp = torch.stack([t.values for t in top], dim=1)
        top_ids = torch.stack([t.indices for t in top], dim=1)
    seqs = []
    for row, p in enumerate(prompts):
        answer = out.sequences[row, width:].tolist()
        for i, tok in enumerate(answer):
            if tok in eos_ids:
                answer = answer[:i + 1]
                break
        seq = Sequence(list(p) + answer, len(p))
        if topk:
            seq.topk_ids = top_ids[row, :len(answer)].tolist()
            seq.topk_logp = [[round(v, 3) for v in r] for r in top_logp[row, :len(answer)].tolist()]
        seqs.append(seq)
    return seqs


@torch.inference_mode()
def teacher_forced(target, seqs: list[Sequence], pad_id: int, topk: int = 0, batch_tokens: int = 2048
                   ) -> list[Sequence]:
    """The target reads each sequence in batched forwards (no generation, several times cheaper per token) and
    gives, at every answer position, its argmax as the label and, with `topk`, its top-k tokens and
    log-probabilities (the soft targets of `batches.collate_soft`)."""
    out = [Sequence(list(s.ids), s.answer_start, [], [] if topk else None, [] if topk else None) for s in seqs]
    for batch in make_batches(seqs, batch_tokens):
        ids, rows, cols, _ = collate([seqs[i] for i in batch], pad_id)
        # the head only where a label is needed: it is the costliest layer
        logits = target.lm_head(target.model(input_ids=ids).last_hidden_state[rows, cols]).float()
        # collate lists each row's answer positions in order, so appending rebuilds every sequence's labels
        for r, t in zip(rows.tolist(), logits.argmax(-1).tolist()):
            out[batch[r]].labels.append(t)
        if topk:
            top = logits.log_softmax(-1).topk(topk, dim=-1)
            for r, i, v in zip(rows.tolist(), top.indices.tolist(), top.values.tolist()):
                out[batch[r]].topk_ids.append(i)
                out[batch[r]].topk_logp.append([round(x, 3) for x in v])
    return out


def target_argmax_labels(target, seqs: list[Sequence], pad_id: int, batch_tokens: int = 2048) -> list[Sequence]:
    """Replace each answer token by the target's teacher-forced argmax (the exact T = 0 reference)."""
    return [Sequence(s.ids[:s.answer_start] + t.labels, s.answer_start)
            for s, t in zip(seqs, teacher_forced(target, seqs, pad_id, batch_tokens=batch_tokens))]


def cached_labels(target, seqs: list[Sequence], path: Path, pad_id: int) -> list[Sequence]:
    """`target_argmax_labels`, computed once and kept in `path` (the held-out reference of every later run)."""
    if path.is_file():
        return load_sequences([path])
    labels = target_argmax_labels(target, seqs, pad_id)
    save_sequences(path, labels)
    return labels
