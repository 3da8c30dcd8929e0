"""KV-cache sequences with fork, rollback and keep, and the bookkeeping that makes them safe.

A `Sequence` owns what one llama.cpp sequence holds: the token ids at positions 0..len-1.
Every decode appends to it and every rollback truncates it, so the engine can always say, and
in debug mode check, that a cache holds exactly a prefix of the committed text.
"""

from __future__ import annotations

import numpy as np

from ..backend.native import Context
from ..errors import SpecdecError


class KVInvariantError(AssertionError):
    """A cache holds something other than what its Sequence says (only checked with --debug)."""


class Sequence:
    def __init__(self, ctx: Context, seq_id: int = 0, tokens: list[int] | None = None):
        self.ctx = ctx
        self.seq_id = seq_id
        self.tokens: list[int] = list(tokens or [])

    @classmethod
    def empty(cls, ctx: Context, seq_id: int = 0) -> Sequence:
        """Sequence `seq_id` cleared of anything an earlier generation left in the cache."""
        ctx.seq_rm(seq_id, -1, -1)  # removing a whole sequence never fails
        return cls(ctx, seq_id)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, tokens: list[int], outputs: str = "last") -> np.ndarray:
        """Decode `tokens` after what the cache holds; return logits rows ("last" or "all")."""
        logits = None
        step = self.ctx.n_batch
        for start in range(0, len(tokens), step):  # long prompts go in n_batch chunks
            chunk = tokens[start : start + step]
            logits = self.ctx.decode(chunk, len(self.tokens), self.seq_id, outputs)
            self.tokens.extend(chunk)
        return logits

    def rollback(self, n: int) -> None:
        """Forget every position >= n, so the cache holds the first n tokens (or fewer, if it had fewer)."""
        if n >= len(self.tokens):
            return
        if not self.ctx.seq_rm(self.seq_id, n, -1):
            raise SpecdecError(
                f"{self.ctx.model.name}: llama.cpp cannot remove a partial sequence from this cache",
                hint="speculative decoding needs a model whose KV cache can roll back (not recurrent/hybrid)",
            )
        del self.tokens[n:]

    def fork(self, seq_id: int) -> Sequence:
        """A new sequence `seq_id` sharing this one's cells (no copy of the KV data in a unified cache)."""
        self.ctx.seq_rm(seq_id, -1, -1)  # removing a whole sequence never fails
        self.ctx.seq_cp(self.seq_id, seq_id, -1, -1)
        return Sequence(self.ctx, seq_id, self.tokens)

    def keep(self) -> None:
        """Drop every other sequence from the cache (the winner of a tree round stays)."""
        self.ctx.seq_keep(self.seq_id)

    def check(self, committed: list[int]) -> None:
        """Debug invariant: the cache holds exactly our tokens, and they are a prefix of `committed`."""
        n = len(self.tokens)
        lo, hi = self.ctx.seq_pos_range(self.seq_id)
        expected = (0, n - 1) if n else (-1, -1)
        if (lo, hi) != expected:
            raise KVInvariantError(
                f"{self.ctx.model.name} seq {self.seq_id}: cache holds positions {lo}..{hi}, expected {expected}"
            )
        if self.tokens != committed[:n]:
            raise KVInvariantError(f"{self.ctx.model.name} seq {self.seq_id}: cached tokens differ from committed text")
