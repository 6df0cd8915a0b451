"""Quality without an external judge: how likely a language model finds each method's text, given its prompt.

The score of an output is the mean log-likelihood per token of its tokens under the target, teacher-forced on the
prompt it answered (its own conversation, for a later turn), with the target's plain distribution (T = 1, no
top-k or top-p); perplexity is exp(-score). One target forward per output, outside the timing window.

Why this unit: a lossless method's text is distributed as the target's own, so its score is ar's (identical at
T = 0, where the texts are identical; the same in expectation when sampling at the same temperature). A lossy
method (ti-mcsd with width > 1) commits tokens the target ranks lower, and its score shows by how much, in one unit
beside ar's, without an outside model. The paper measured the same drop with GPT-4 as a judge. A judge of one's
own (`--judge PATH`, any local causal LM) scores the same texts the same way, re-tokenised with its tokenizer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..loading.models import _load_any


@dataclass
class Judge:
    """A causal LM that scores text: the target itself (the same token ids) or another model (the text is
    re-tokenised with its own tokenizer)."""

    name: str
    model: torch.nn.Module
    tokenizer: object | None = None  # None: scores the target's token ids as they are

    @torch.inference_mode()
    def log_likelihood(self, context_ids: list[int], answer_ids: list[int], pair=None) -> float | None:
        """Summed log-probability of `answer_ids` after `context_ids` (the target's token ids); None for an empty
        answer."""
        if self.tokenizer is not None:
            decode = pair.tokenizer.decode
            context_ids = self.tokenizer(decode(context_ids, skip_special_tokens=False),
                                         add_special_tokens=False)["input_ids"]
            answer_ids = self.tokenizer(decode(answer_ids, skip_special_tokens=False),
                                        add_special_tokens=False)["input_ids"]
        return sequence_log_likelihood(self.model, context_ids, answer_ids)


def sequence_log_likelihood(model: torch.nn.Module, context_ids: list[int], answer_ids: list[int]) -> float | None:
    """Σ log p(answer_i | context, answer_<i) under `model`, in one forward (logits only where they are needed)."""
    if not answer_ids or not context_ids:
        return None
    device = next(model.parameters()).device
    ids = torch.tensor([list(context_ids) + list(answer_ids)], dtype=torch.long, device=device)
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=len(answer_ids) + 1).logits[0, :-1].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor(answer_ids, dtype=torch.long, device=device)
    return float(log_probs.gather(1, targets[:, None]).sum())


def load_judge(path: str, device: torch.device) -> Judge:
    """A judge from a local path or hub id (as `--target` takes them), in fp32 on the bench's device."""
    model, tokenizer = _load_any(path, torch.float32, None)
    return Judge(name=path, model=model.to(device).eval(), tokenizer=tokenizer)


def perplexity(log_likelihood: float | None, tokens: int) -> float | None:
    return math.exp(-log_likelihood / tokens) if log_likelihood is not None and tokens else None
