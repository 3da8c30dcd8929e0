"""The speculative decoding loop: a generator of events over token ids.

Committed text x[0..n); at the start of every round the target's cache holds x[0..n-1) and
`last` = x[n-1] is still to be fed. One round:
  1. draft k tokens d1..dk (the drafter's business);
  2. verify: ONE target decode over [last, d1..dk] at positions n-1..n-1+k, logits at every row;
  3. accept the longest accepted prefix d1..dm, then the target's correction (m < k) or bonus (m = k);
  4. roll both caches back to the committed text, in `finally`, so an early stop leaves them consistent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .acceptance import greedy_accept, speculative_accept
from .detok import Detokenizer
from .drafters import Drafter
from .events import Event, Origin, Prefilled, Round, Stopped, Token
from .kv import Sequence
from .sampling import Sampler


@dataclass(frozen=True)
class Settings:
    draft_tokens: int = 4  # k: tokens drafted per round
    max_tokens: int = 256
    sampler: Sampler = Sampler()
    seed: int | None = None
    debug: bool = False  # check the KV invariant after every round


def generate(target: Sequence, drafter: Drafter, prompt: list[int], settings: Settings) -> Iterator[Event]:
    """Yield Prefilled, then Token... Round per round, then Stopped. The output is what the target
    alone would produce (greedy: identical; sampling: identically distributed)."""
    model = target.ctx.model
    rng = np.random.default_rng(settings.seed)
    detok = Detokenizer(model.piece)

    t0 = time.perf_counter()
    target.append(prompt[:-1])
    drafter.prefill(prompt[:-1])
    yield Prefilled(len(prompt), time.perf_counter() - t0)

    committed = list(prompt)
    n_ctx = target.ctx.n_ctx
    while True:
        generated = len(committed) - len(prompt)
        if generated >= settings.max_tokens:
            yield Stopped("max_tokens", detok.flush())
            return
        room = n_ctx - len(committed)  # the verify batch needs positions n-1 .. n-1+k < n_ctx
        if room < 0:
            yield Stopped("context", detok.flush())
            return
        # Never draft past the token budget or the context: those tokens could not be used.
        k = min(settings.draft_tokens, room, settings.max_tokens - generated - 1)

        t_round = time.perf_counter()
        try:
            draft = drafter.propose(committed, k, settings.sampler, rng)
            t_draft = time.perf_counter()
            rows = target.append([committed[-1], *draft.tokens], outputs="all")
            t_verify = time.perf_counter()
            m, token = _accept(rows, draft.tokens, draft.q, settings.sampler, rng)
            new = [*draft.tokens[:m], token]
            origins = [Origin.DRAFT] * m + [_final_origin(m, len(draft.tokens))]
            for i, t in enumerate(new):  # nothing after an end-of-generation token is output
                if model.is_eog(t):
                    new, origins = new[:i], origins[:i]
                    eog = True
                    break
            else:
                eog = False
            committed += new
        finally:
            rollback(target, drafter, len(committed) - 1)
        seconds = time.perf_counter() - t_round

        drafter.observe(draft, m, token, t_verify - t_draft, t_draft - t_round)
        if settings.debug:
            target.check(committed)
            drafter.check(committed)
        for t, origin in zip(new, origins):
            yield Token(t, origin, detok.push(t))
        accepted = min(m, len(new) + eog)  # an accepted end-of-generation draft token counts
        yield Round(
            len(draft.tokens), accepted, len(new) + eog, t_draft - t_round, t_verify - t_draft, seconds,
            draft.source, draft.k, draft.predicted, draft.entropy,
        )  # fmt: skip
        if eog:
            yield Stopped("eos", detok.flush())
            return


def rollback(target: Sequence, drafter: Drafter, n: int) -> None:
    """Rewind both caches to the committed text minus its last token (which the next round feeds).

    When every draft token was accepted the draft cache is one token short (it never decoded dk);
    that is fine: a cache may hold a prefix, and the drafter feeds the gap next round.
    """
    target.rollback(n)
    drafter.rollback(n)


def _accept(rows: np.ndarray, draft: list[int], q: np.ndarray | None, sampler: Sampler, rng) -> tuple[int, int]:
    if sampler.greedy:
        return greedy_accept(rows.argmax(axis=1).tolist(), draft)
    p = np.stack([sampler.probs(r) for r in rows])
    if q is not None and q.shape[1] != p.shape[1]:  # vocabularies may differ by padding (<= 128 ids)
        q = _fit(q, p.shape[1])
    return speculative_accept(p, q, draft, rng)


def _fit(q: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((q.shape[0], n))
    w = min(n, q.shape[1])
    out[:, :w] = q[:, :w]
    return out


def _final_origin(m: int, k: int) -> Origin:
    if k == 0:
        return Origin.PLAIN
    return Origin.BONUS if m == k else Origin.CORRECTION
