"""Drafters propose the next k tokens. The engine verifies whatever they propose, so none can
change the output; they only change how fast it comes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from .kv import Sequence
from .sampling import Sampler, draw


@dataclass(frozen=True, slots=True)
class Draft:
    tokens: list[int]
    q: np.ndarray | None  # (k, n_vocab) draft probabilities when sampled from a model; else None
    source: str = "none"  # the drafter that proposed it: "none" | "lookup" | "model"
    k: int = 0  # the draft length chosen this round (fewer tokens when a match, p-min or the text ran out)
    predicted: float | None = None  # expected tokens this round emits, by the cost model (auto only)
    confidence: tuple[float, ...] = ()  # model: the draft's probability of each token it drafted
    entropy: float | None = None  # model: mean entropy (nats) of its distributions over the drafted tokens
    match: int | None = None  # lookup: how many tokens of the text's suffix matched earlier text


EMPTY = Draft([], None)


class Drafter(Protocol):
    name: str

    def prefill(self, tokens: list[int]) -> None: ...

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft: ...

    def observe(self, draft: Draft, accepted: int, token: int, verify_seconds: float, draft_seconds: float) -> None:
        """The round's outcome: `accepted` draft tokens kept, then the target's `token`. Learners learn here."""

    def rollback(self, n: int) -> None: ...

    def check(self, committed: list[int]) -> None: ...


class NoDrafter:
    """Plain target-only decoding, through the same engine, so statistics compare like for like."""

    name = "none"

    def prefill(self, tokens: list[int]) -> None:
        pass

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        return EMPTY

    def observe(self, draft: Draft, accepted: int, token: int, verify_seconds: float, draft_seconds: float) -> None:
        pass

    def rollback(self, n: int) -> None:
        pass

    def check(self, committed: list[int]) -> None:
        pass


class ModelDrafter:
    """A small GGUF model in its own context, one decode per drafted token.

    p_min (llama.cpp's semantics): stop drafting when the draft's probability for its own next token
    falls below it; that token is not proposed."""

    name = "model"

    def __init__(self, seq: Sequence, p_min: float = 0.0):
        self.seq = seq
        self.p_min = p_min

    def prefill(self, tokens: list[int]) -> None:
        self.seq.append(tokens)

    def lag(self, committed: list[int]) -> int:
        """Tokens the next draft decode must feed before it can draft (1 when the cache is in step)."""
        return len(committed) - len(self.seq)

    def propose(
        self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator,
        keep_going: Callable[[list[float]], bool] | None = None,
    ) -> Draft:  # fmt: skip
        """Draft up to k tokens; `keep_going(confidences)` may end the draft early (auto's stopping rule)."""
        # The cache may lag the committed text (after a fully accepted round the draft never saw its own
        # last token; auto may not have drafted for a while): the first decode feeds the whole gap.
        feed = committed[len(self.seq) :]
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        confidence: list[float] = []
        entropy = 0.0
        for _ in range(k):
            row = self.seq.append(feed)[0]
            q = sampler.probs(row) if not sampler.greedy else None
            d = int(row.argmax()) if q is None else draw(q, rng)
            p_d, h = _confidence(row, d, q)
            if p_d < self.p_min:
                break
            tokens.append(d)
            confidence.append(p_d)
            entropy += h
            if q is not None:
                qs.append(q)
            if self.seq.ctx.model.is_eog(d):  # nothing after the end of the text can be used
                break
            if keep_going is not None and not keep_going(confidence):
                break
            feed = [d]
        return Draft(
            tokens, np.stack(qs) if qs else None, self.name, k, confidence=tuple(confidence),
            entropy=entropy / len(tokens) if tokens else None,
        )  # fmt: skip

    def observe(self, draft: Draft, accepted: int, token: int, verify_seconds: float, draft_seconds: float) -> None:
        pass

    def rollback(self, n: int) -> None:
        self.seq.rollback(n)

    def check(self, committed: list[int]) -> None:
        self.seq.check(committed)


def _confidence(logits: np.ndarray, d: int, q: np.ndarray | None) -> tuple[float, float]:
    """(probability of d, entropy in nats) under q, or under softmax(logits) when greedy."""
    if q is not None:
        nz = q[q > 0]
        return float(q[d]), float(-(nz * np.log(nz)).sum())
    z = logits - logits.max()
    e = np.exp(z)
    s = float(e.sum())
    return float(e[d]) / s, float(np.log(s) - (e * z).sum() / s)
