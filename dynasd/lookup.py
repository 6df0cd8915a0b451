"""Prompt lookup: propose the continuation of the last n-gram's most recent earlier occurrence in the context.

Small models repeat their prompt and themselves a lot (lists, code, names, loops at temperature 0), and a lookup
costs microseconds where a draft-model step costs milliseconds. The proposal is deterministic, so its draft
distribution q is one-hot: accepting it with probability p(x) and otherwise sampling from norm(max(p - q, 0)) keeps
speculative sampling exact (see method.md, section 2).
"""
from __future__ import annotations


class NgramIndex:
    """Where each n-gram of the context last ended, for n in [min_ngram, max_ngram], updated incrementally.

    Only n-grams followed by at least one token are indexed, so a lookup of the context's own tail finds an
    *earlier* occurrence with a continuation. One index per run: the context may only grow.
    """

    def __init__(self, min_ngram: int = 2, max_ngram: int = 3) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"lookup n-gram sizes must satisfy 1 <= min <= max, got {min_ngram}, {max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.ends: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # continuation positions e < indexed have been entered for every n

    @classmethod
    def of(cls, tokens: list[int], min_ngram: int = 2, max_ngram: int = 3) -> "NgramIndex":
        """The index a run builds step by step over `tokens`, built at once: equal in every entry, since each
        n-gram keeps the end of its last occurrence whichever way the tokens arrive (a decoder's resume,
        decoders/snapshot.py, rebuilds its index this way)."""
        index = cls(min_ngram, max_ngram)
        index._catch_up(tokens)
        return index

    def _catch_up(self, tokens: list[int]) -> None:
        for end in range(max(self.indexed, self.min_ngram), len(tokens)):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self.ends[tuple(tokens[end - n:end])] = end
        self.indexed = max(self.indexed, len(tokens))

    def propose(self, tokens: list[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens that followed the longest matching tail n-gram last time; [] if none."""
        if len(tokens) <= self.min_ngram or max_tokens < 1:
            return []
        self._catch_up(tokens)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            end = self.ends.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end:end + max_tokens]
        return []
