"""The speculative decoding loop: a generator of events over token ids.

Committed text x[0..n); at the start of every round the target's cache holds x[0..n-1) and
`last` = x[n-1] is still to be fed. One round:
  1. draft k tokens d1..dk (the drafter's business);
  2. verify: ONE target decode over [last, d1..dk] at positions n-1..n-1+k, logits at every row;
  3. accept the longest accepted prefix d1..dm, then the target's correction (m < k) or bonus (m = k);
  4. roll both caches back to the committed text, in `finally`, so an early stop leaves them consistent.
A tree draft (--branches, engine/tree.py) is verified the same way: one target decode over every
branch, each in its own forked sequence; the longest accepted branch wins and becomes the main one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .acceptance import greedy_accept, greedy_tree_accept, multi_draft_accept, speculative_accept
from .detok import Detokenizer
from .drafters import Draft, Drafter
from ..errors import SpecdecError
from .events import Event, Notice, Origin, Prefilled, Round, Stopped, Token
from .kv import Branches, Sequence
from .sampling import NonFiniteLogits, Sampler


@dataclass(frozen=True)
class Settings:
    draft_tokens: int = 4  # k: tokens drafted per round
    max_tokens: int = 256
    sampler: Sampler = Sampler()
    seed: int | None = None
    debug: bool = False  # check the KV invariant after every round


def generate(main: Sequence, drafter: Drafter, prompt: list[int], settings: Settings) -> Iterator[Event]:
    """Yield Prefilled, then Token... Round per round, then Stopped. The output is what the target
    alone would produce (greedy: identical; sampling: identically distributed)."""
    target = Branches(main)
    model = main.ctx.model
    rng = np.random.default_rng(settings.seed)
    detok = Detokenizer(model.piece)

    t0 = time.perf_counter()
    main.append(prompt[:-1])
    drafter.prefill(prompt[:-1])
    yield Prefilled(len(prompt), time.perf_counter() - t0)

    committed = list(prompt)
    n_ctx = main.ctx.n_ctx
    while True:
        generated = len(committed) - len(prompt)
        if generated >= settings.max_tokens:
            yield Stopped("max_tokens", detok.flush())
            return
        room = n_ctx - len(committed)  # the verify batch needs positions n-1 .. n-1+k < n_ctx
        if room < 0:
            yield Stopped("context", detok.flush())
            return
        # Never draft past the token budget, the context or one decode batch: those tokens could not be used.
        k = min(settings.draft_tokens, room, main.ctx.n_batch - 1, settings.max_tokens - generated - 1)

        t_round = time.perf_counter()
        winner = 0
        try:
            draft = drafter.propose(committed, k, settings.sampler, rng)
            t_draft = time.perf_counter()
            rows = _verify(target, committed[-1], draft)
            t_verify = time.perf_counter()
            try:
                path, token = _accept(rows, draft, settings.sampler, rng)
            except NonFiniteLogits as e:
                raise SpecdecError(
                    f"target {model.name} produced non-finite logits ({e}) at position {len(committed)}",
                    hint="its weights are damaged or overflow: check the file (`specdec models verify`), or try another quantisation",
                ) from None
            if path and draft.branches is not None:
                winner = min(draft.branches[path[-1]])  # every branch through the last accepted node has it
            m = len(path)
            new = [*(draft.tokens[i] for i in path), token]
            origins = [Origin.DRAFT] * m + [_final_origin(path, draft)]
            rejected = origins[-1] == Origin.CORRECTION
            for i, t in enumerate(new):  # nothing after an end-of-generation token is output
                if model.is_eog(t):
                    new, origins = new[:i], origins[:i]
                    eog = True
                    break
            else:
                eog = False
            committed += new
        finally:
            rollback(target, drafter, len(committed) - 1, winner)
        seconds = time.perf_counter() - t_round
        if draft.notice:
            yield Notice(draft.notice)

        drafter.observe(draft, m, token, t_verify - t_draft, t_draft - t_round, path)
        if settings.debug:
            target.check(committed)
            drafter.check(committed)
        for t, origin in zip(new, origins):
            yield Token(t, origin, detok.push(t))
        accepted = min(m, len(new) + eog)  # an accepted end-of-generation draft token counts
        yield Round(
            len(draft.tokens), accepted, len(new) + eog, t_draft - t_round, t_verify - t_draft, seconds,
            draft.source, draft.k, draft.predicted, draft.entropy, rejected, draft.n_branches, winner,
        )  # fmt: skip
        if eog:
            yield Stopped("eos", detok.flush())
            return


def rollback(target: Branches, drafter: Drafter, n: int, winner: int = 0) -> None:
    """Rewind both caches to the committed text minus its last token (which the next round feeds).

    After a tree round branch `winner` becomes the main sequence in both contexts and every other
    branch is dropped. When every draft token was accepted the draft cache is one token short (it
    never decoded dk); that is fine: a cache may hold a prefix, and the drafter feeds the gap next round.
    """
    target.settle(winner, n)
    drafter.rollback(n, winner)


def _verify(target: Branches, last: int, draft: Draft) -> np.ndarray:
    """ONE target decode; row 0 follows the last committed token, row i+1 follows draft token i."""
    if draft.branches is None:
        return target.main.append([last, *draft.tokens], outputs="all")
    for _ in range(draft.n_branches - 1):
        target.fork(0)  # every branch starts from the committed text
    return target.decode([last, *draft.tokens], [tuple(range(draft.n_branches)), *draft.branches])


def _accept(rows: np.ndarray, draft: Draft, sampler: Sampler, rng) -> tuple[list[int], int]:
    """(accepted draft positions, the target's token) by the rule for the draft's shape."""
    if sampler.greedy:
        argmax = rows.argmax(axis=1)
        # argmax lands on a NaN or +inf when a row has one: checking the chosen values checks the rows.
        if not np.isfinite(rows[np.arange(len(argmax)), argmax]).all():
            raise NonFiniteLogits("logits hold NaN or infinity")
        argmax = argmax.tolist()
        if draft.parents is not None:
            return greedy_tree_accept(argmax, draft.tokens, list(draft.parents))
        m, token = greedy_accept(argmax, draft.tokens)
        return list(range(m)), token
    p = np.stack([sampler.probs(r) for r in rows])
    q = draft.q
    if q is not None and q.shape[1] != p.shape[1]:  # vocabularies may differ by padding (<= 128 ids)
        q = _fit(q, p.shape[1])
    if draft.parents is not None:
        return multi_draft_accept(p, q, draft.tokens, list(draft.parents), rng)
    m, token = speculative_accept(p, q, draft.tokens, rng)
    return list(range(m)), token


def _fit(q: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((q.shape[0], n))
    w = min(n, q.shape[1])
    out[:, :w] = q[:, :w]
    return out


def _final_origin(path: list[int], draft: Draft) -> Origin:
    if not draft.tokens:
        return Origin.PLAIN
    if draft.parents is None:
        return Origin.BONUS if len(path) == len(draft.tokens) else Origin.CORRECTION
    end = path[-1] if path else -1  # a bonus follows a fully accepted branch: a node with no children
    return Origin.CORRECTION if end in draft.parents else Origin.BONUS
