"""The speculative decoding loop: a generator of events over token ids.

Committed text x[0..n); at the start of every round the target's cache holds x[0..n-1) and
`last` = x[n-1] is still to be fed. One round:
  1. draft k tokens d1..dk (the drafter's business);
  2. verify: ONE target decode over [last, d1..dk] at positions n-1..n-1+k, logits at every row;
  3. accept the longest accepted prefix d1..dm, then the target's correction (m < k) or bonus (m = k);
  4. roll both caches back to the committed text, in `finally`, so an early stop leaves them consistent.
A tree draft (--branches) is a draft of another shape (engine/shapes.py): one target decode over every
branch, each in its own forked sequence; the longest accepted branch wins and becomes the main one.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import SpecdecError
from .context import ALONE, Model, StepFigures
from .constraint import MaskedProbs, State, along, greedy_rows
from .drafter import EMPTY, Draft, Drafter, Outcome
from .events import Event, Notice, Origin, Prefilled, Round, Stopped, Token
from .kv import Branches, Sequence
from .sampling import Argmax, NonFiniteLogits, Sampler, draw, total


@dataclass(frozen=True)
class Settings:
    draft_tokens: int = 4  # k: tokens drafted per round
    max_tokens: int = 256
    sampler: Sampler = Sampler()
    seed: int | None = None
    debug: bool = False  # check the KV invariant after every round
    # Exact mode: keep the target's cells in position order (attention sums them in cell order); after a
    # tree round the accepted nodes out of order are decoded again at the front of the next verify batch.
    ordered_cells: bool = False
    # Exact mode: the prompt through the fast kernels; off when a later prompt may reuse the cache.
    prompt_kernels: bool = True
    # A grammar's state before the first generated token: every token is one it allows (engine/constraint.py).
    constraint: State | None = None
    # Log probabilities for each emitted token and its N best alternatives (None: not computed).
    logprobs: int | None = None


REDO = 64  # prompt tokens the target decodes again (reused from an earlier run) for a drafter that needs their rows
SURE = 0.9  # Outcome.sure: the target's probability of its own token was at least this
SURE_GAP = float(np.log(SURE / (1 - SURE)))  # another logit this close holds more than 1 - SURE of the mass


def generate(main: Sequence, drafter: Drafter, prompt: list[int], settings: Settings) -> Iterator[Event]:
    """Yield Prefilled, then Token... Round per round, then Stopped: token ids (text is added by whoever
    knows the model). The output is what the target alone would produce (greedy: identical; sampling:
    identically distributed). `main` holds a prefix of prompt[:-1] (usually nothing); the drafter's cache
    likewise."""
    target = Branches(main)
    model = main.ctx.model
    sampler = settings.sampler
    # Greedy draws nothing: no generator (numpy.random's first import alone is ~20 ms of the first token's time).
    rng = None if sampler.greedy else np.random.default_rng(settings.seed)

    t0 = time.perf_counter()
    need = drafter.begin(prompt[:-1])  # where it needs the target's rows from (those of a reused prefix are not made)
    if need is not None and 0 < len(main) - need <= REDO and need >= main.floor:  # (a recurrent state: not cleared)
        main.rollback(need)
    cached = len(main)  # `main` may hold a prefix of the prompt already
    _prefill(main, drafter, prompt, cached, settings.prompt_kernels)
    yield Prefilled(prompt_tokens=len(prompt), seconds=time.perf_counter() - t0, cached=cached)

    committed = list(prompt)
    state = settings.constraint  # the grammar's state after the committed text (None: unconstrained)
    while True:
        generated = len(committed) - len(prompt)
        room = main.ctx.n_ctx - len(committed)  # the verify batch needs positions n-1 .. n-1+k < n_ctx
        stop = "max_tokens" if generated >= settings.max_tokens else "context" if room < 0 else None
        if stop:
            yield Stopped(reason=stop, complete=state and state.complete())
            return
        if len(committed) - len(main) > main.ctx.n_batch // 2:  # a long lag (ordered_cells, a cleared state) alone
            main.append(committed[len(main) : -1])
        feed = committed[len(main) :]  # what the target's cache lacks: the last token, or more
        k = _room(main, settings, len(feed), generated, room)

        t_round = time.perf_counter()
        draft, winner, n_before, in_order, states, step = EMPTY, 0, len(committed), None, None, ALONE
        try:
            draft = drafter.propose(committed, k, sampler, rng)  # 1. draft
            if state is not None:  # cut where the grammar rejects it; each row's grammar state
                draft, states = along(draft, state, sampler)
            t_draft = time.perf_counter()
            rows = draft.shape.verify(target, feed, draft.tokens)  # 2. ONE target decode
            t_verify, step = time.perf_counter(), main.ctx.last_step
            path, token = _accept(rows, draft, sampler, rng, model, len(committed), states)  # 3. accept
            sure = _sure(rows[path[-1] + 1 if path else 0], token, sampler) if draft.wants_confidence else None
            new = [draft.tokens[i] for i in path] + [token]
            if settings.logprobs is not None:  # read now: a rollback may decode again into the logits' buffer
                probs = _scored(rows, states, path, new, settings.logprobs)
            winner = draft.shape.winner(path)
            # Nothing after an end-of-generation token is output.
            end = next((i for i, t in enumerate(new) if model.is_eog(t)), len(new))
            committed += new[:end]
            if settings.ordered_cells:  # the last committed token's cell is n_before - 1; nodes follow it
                in_order = n_before + draft.shape.in_order(path)
        finally:  # 4. both caches back to the committed text
            rollback(target, drafter, draft, len(committed) - 1, winner, in_order)
        seconds = time.perf_counter() - t_round
        if draft.notice:
            yield Notice(message=draft.notice)

        spent = dict(draft_seconds=t_draft - t_round, verify_seconds=t_verify - t_draft)
        outcome = Outcome(path=path, token=token, sure=sure, **spent)
        drafter.observe(draft, outcome)
        if settings.debug:
            target.check(committed)
            drafter.check(committed)
        if states is not None and end == len(new):  # the grammar's state after the round's tokens
            state = states[path[-1] + 1 if path else 0].after(token)
        origins = [Origin.DRAFT] * len(path) + [_origin(draft, path)]
        for i, (t, origin) in enumerate(zip(new[:end], origins)):
            lp, top = probs[i] if settings.logprobs is not None else (None, ())
            yield Token(id=t, origin=origin, logprob=lp, top=top)
        eog = end < len(new)
        emitted = end + eog  # an end-of-generation token counts, though it is not output
        rejected = origins[-1] == Origin.CORRECTION
        yield _round(draft, outcome, emitted, seconds, rejected=rejected, winner=winner, step=step)
        if eog:
            yield Stopped(reason="eos", complete=True if state is not None else None)  # the grammar allowed it
            return


def _prefill(main: Sequence, drafter: Drafter, prompt: list[int], cached: int, fast: bool) -> None:
    """The prompt but its last token, to the target past its `cached` tokens (through the fast kernels where
    `fast`: every run of a prompt decodes it alike) and to the drafter; the target's rows the drafter reads."""
    with main.ctx.prompt_kernels() if fast else nullcontext():
        todo = prompt[cached:-1]
        main.append(todo, outputs=max(len(todo) - drafter.prompt_rows, 0) if drafter.prompt_rows else "last")
    drafter.prefill(prompt[:-1])


def _room(main: Sequence, settings: Settings, feed: int, generated: int, room: int) -> int:
    """The longest draft this round: never past the token budget, the context or one decode batch (those
    tokens could not be used), nor past a recurrent target's snapshots (it drops a rejected tail only there)."""
    k = min(settings.draft_tokens, room, main.ctx.n_batch - feed, settings.max_tokens - generated - 1)
    return min(k, main.ctx.max_rollback) if main.ctx.max_rollback is not None else k


def rollback(
    target: Branches, drafter: Drafter, draft: Draft, n: int, winner: int = 0, in_order: int | None = None
) -> None:
    """Rewind both caches to the committed text minus its last token (which the next round feeds); the
    target's to its first `in_order` tokens when fewer lie in position order (Settings.ordered_cells).

    After a tree round branch `winner` becomes the main sequence in both contexts and every other
    branch is dropped. When every draft token was accepted the draft cache is one token short (it
    never decoded dk); that is fine: a cache may hold a prefix, and the next round feeds the gap.
    """
    target.settle(winner, n if in_order is None else min(n, in_order))
    drafter.rollback(n, draft, winner)


def _round(
    draft: Draft, outcome: Outcome, emitted: int, seconds: float, *, rejected: bool, winner: int, step: StepFigures
) -> Round:
    accepted = outcome.path[:emitted]  # (nothing after an end-of-generation token)
    predicted = {i for i in draft.from_prediction if i < len(draft.tokens)}  # (a grammar may have cut the draft)
    return Round(
        drafted=len(draft.tokens),
        accepted=len(accepted),
        emitted=emitted,
        draft_seconds=outcome.draft_seconds,
        verify_seconds=outcome.verify_seconds,
        seconds=seconds,
        drafter=draft.source,
        k=draft.k,
        predicted=draft.predicted,
        entropy=draft.entropy,
        rejected=rejected,
        branches=draft.shape.branches,
        winner=winner,
        from_prediction=len(predicted),
        prediction_accepted=sum(i in predicted for i in accepted),
        draft_fed=draft.draft_fed,
        step_rows=step.rows,
        shared=step.rows > step.own,
    )


def _accept(
    rows: np.ndarray, draft: Draft, sampler: Sampler, rng, model: Model, at: int, states: list[State | None] | None
) -> tuple[list[int], int]:
    """(accepted draft positions, the target's token) by the rule for the draft's shape, on rows masked by
    their grammar `states` where constrained; the target's logits at position `at` must be finite."""
    try:
        if sampler.greedy and states is None:  # rows read as the rule walks: none after the first mismatch
            return draft.shape.greedy_accept(Argmax(rows), draft.tokens)
        if sampler.greedy:
            argmax = rows.argmax(axis=1)
            # argmax lands on a NaN or +inf when a row has one: checking the chosen values checks the rows.
            if not np.isfinite(rows[np.arange(len(argmax)), argmax]).all():
                raise NonFiniteLogits("logits hold NaN or infinity")
            return draft.shape.greedy_accept(greedy_rows(rows, argmax, states), draft.tokens)
        if not draft.tokens and states is None:  # the rule's draw from p[0], unnormalised (draw takes weights)
            return [], draw(sampler.weights(rows[0]), rng)
        p = MaskedProbs(rows, states, sampler)  # each row processed when the rule first reads it, as the argmax
        q = draft.q
        if q is not None and q.shape[1] != p.shape[1]:  # vocabularies may differ by padding (<= 128 ids)
            q = _fit(q, p.shape[1])
        return draft.shape.accept(p, q, draft.tokens, rng)
    except NonFiniteLogits as e:
        raise SpecdecError(
            f"target {model.name} produced non-finite logits ({e}) at position {at}",
            hint="its weights are damaged or overflow: check the file (`specdec models verify`), or try another quantisation",
        ) from None


def _scored(rows: np.ndarray, states, path: list[int], new: list[int], n: int) -> list:
    """Each new token's log probability and the n best, by the row that chose it: token i by the row after
    token i-1 (the first by the row after the fed token)."""
    return [log_probs(rows[r], states[r] if states else None, t, n) for t, r in zip(new, [0, *(i + 1 for i in path)])]


def log_probs(row: np.ndarray, state: State | None, token: int, n: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The target's log probability of `token` by one row of its logits (softmax of the raw logits, over the
    tokens the grammar allows where constrained: what the model thinks, not what the sampler then kept), and the
    row's n most likely tokens, most likely first, equal ones by id. float64 throughout: the same row gives the
    same figures whichever drafter produced it."""
    z = (state.mask(row) if state is not None else row).astype(np.float64)
    z -= z.max()
    with np.errstate(divide="ignore"):
        z -= np.log(np.exp(z).sum())
    best = np.argpartition(-z, n)[:n] if 0 < n < len(z) else np.arange(len(z) if n > 0 else 0)
    best = best[np.lexsort((best, -z[best]))]
    return float(z[token]), tuple((int(t), float(z[t])) for t in best)


def _sure(row: np.ndarray, token: int, sampler: Sampler) -> bool:
    """Did the target give its own token a probability of at least SURE (plain softmax at the sampler's
    temperature)? A predictor for the drafter, asked every round, so it must cost little next to a
    decode: any other logit within ln(SURE / (1 - SURE)) of the token's means no (one comparison over the
    row); else the softmax over the row in float32 decides (a predictor: rounding does not matter), one
    exp pass without a temporary per step. Real rows have most logits within 20 of the top: picking
    those out first cost more than the exp (~0.4 ms against ~0.05 on 150k ids)."""
    scale = 1.0 if sampler.greedy else 1.0 / sampler.temp
    top = row[token]
    if np.count_nonzero(row >= top - SURE_GAP / scale) > 1:
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        z = np.subtract(row, top, dtype=np.float32)
        if scale != 1.0:
            z *= scale
        return bool(1.0 / total(np.exp(z, out=z)) >= SURE)


def _fit(q: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((q.shape[0], n), q.dtype)
    w = min(n, q.shape[1])
    out[:, :w] = q[:, :w]
    return out


def _origin(draft: Draft, path: list[int]) -> Origin:
    """The target's own token: plain decoding, a bonus after a whole accepted branch, else a correction."""
    if not draft.tokens:
        return Origin.PLAIN
    return Origin.BONUS if draft.shape.whole(path, len(draft.tokens)) else Origin.CORRECTION
