"""Autoregressive decoding with the target alone: one forward per token, the reference for everything else."""
from __future__ import annotations

import torch

from ..cache import CachedModel
from ..sampling import argmax_rows, logits_to_probs, sample_one
from ..trace import StepTrace
from .base import Decoder


class ARDecoder(Decoder):
    method = "ar"

    def _prefill(self) -> None:
        self.target = CachedModel(self.pair.target)
        self._read_prompt()

    def _extend(self, kept: int) -> None:
        self.target.crop(kept)
        self._read_prompt()

    def _read_prompt(self) -> None:
        # Everything not cached but the last token; the last one is fed by the first step (uniform step cost).
        pending = self.committed[self.target.cached_len:-1]
        if pending:
            self.target.prefill(pending)

    def _step(self) -> StepTrace:
        context_len = len(self.committed)
        root_token = self.pair.token_strings(self.committed[-1:])[0]
        started = self._clock()
        logits = self.target.prefill(self.committed[self.target.cached_len:])[-1]
        verified = self._clock()
        if self.sampling.greedy:
            token = argmax_rows(logits[None])[0]
            accepted = self._clock()
            probs = torch.softmax(logits, -1)  # for the views' p of the token only: not the method's time
        else:
            probs = logits_to_probs(logits, self.sampling)
            token = sample_one(probs, self.generator)
            accepted = self._clock()
        self.committed.append(token)
        return StepTrace(index=self.steps_taken, context_len=context_len, nodes=[], max_nodes=0, max_depth=0,
                         live_depth=0, root_rows=1, verify_mask=[], position_ids=[context_len - 1],
                         accepted_path=[], committed=[token], committed_tokens=self.pair.token_strings([token]),
                         committed_origins=["target"], final_parent=-1,
                         final_p=float(probs[token]), root_token=root_token, verify_seconds=verified - started,
                         accept_seconds=accepted - verified, target_forwards=1)
