"""Drafters propose the next k tokens. The engine verifies whatever they propose, so none can
change the output; they only change how fast it comes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .kv import Sequence
from .sampling import Sampler, draw


@dataclass(frozen=True, slots=True)
class Draft:
    tokens: list[int]
    q: np.ndarray | None  # (k, n_vocab) draft probabilities when sampled from a model; else None


EMPTY = Draft([], None)


class Drafter(Protocol):
    name: str

    def prefill(self, tokens: list[int]) -> None: ...

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft: ...

    def rollback(self, n: int) -> None: ...

    def check(self, committed: list[int]) -> None: ...


class NoDrafter:
    """Plain target-only decoding, through the same engine, so statistics compare like for like."""

    name = "none"

    def prefill(self, tokens: list[int]) -> None:
        pass

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        return EMPTY

    def rollback(self, n: int) -> None:
        pass

    def check(self, committed: list[int]) -> None:
        pass


class ModelDrafter:
    """A small GGUF model in its own context, one decode per drafted token."""

    name = "model"

    def __init__(self, seq: Sequence):
        self.seq = seq

    def prefill(self, tokens: list[int]) -> None:
        self.seq.append(tokens)

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        # The cache may lag the committed text by one token (after a fully accepted round the draft
        # never saw its own last token); feeding the gap with the next token costs one decode, not two.
        feed = committed[len(self.seq) :]
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        for _ in range(k):
            row = self.seq.append(feed)[0]
            if sampler.greedy:
                d = int(row.argmax())
            else:
                q = sampler.probs(row)
                d = draw(q, rng)
                qs.append(q)
            tokens.append(d)
            if self.seq.ctx.model.is_eog(d):  # nothing after the end of the text can be used
                break
            feed = [d]
        return Draft(tokens, np.stack(qs) if qs else None)

    def rollback(self, n: int) -> None:
        self.seq.rollback(n)

    def check(self, committed: list[int]) -> None:
        self.seq.check(committed)
