"""Constrained decoding (a grammar, a JSON schema), speculated losslessly.

The output must be exactly constrained target-only decoding: every token from the target's row masked by the
grammar state the text reached. So each verify row is masked by the state along its draft path (row 0 by the
committed text's, row i+1 by node i's), and the acceptance rules run unchanged on the masked rows. A draft
token the grammar rejects is never accepted (its row's masked distribution gives it nothing):
- a deterministic draft (lookup, a greedy draft model: a point mass) is cut at it, which changes nothing
  but the verify batch's size;
- a sampled draft keeps it and is cut after it: the rule min(1, p/q) rejects it with certainty and draws
  from norm(max(0, p - q)), which is what keeps sampling exact for any q the draft sampled from.
Nodes below a rejected one have no state: their rows are never reached. Greedy checks a row's best token
first; where the grammar rejects it, the row's TOP best in one grammar pass; the whole row is masked only when
none of those will do (a mask costs ~15 ms on a 150k vocabulary, a check microseconds).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import numpy as np

from .drafter import Draft
from .sampling import Sampler
from .shapes import Tree


class State(Protocol):
    """Where a grammar is after the text so far (backend/grammar.py's GrammarState)."""

    def after(self, token: int) -> State: ...  # the state after an allowed token
    def allows(self, token: int) -> bool: ...
    def allowed(self, ids: np.ndarray) -> np.ndarray: ...  # which of these may come next (one pass)
    def mask(self, row: np.ndarray) -> np.ndarray: ...  # the logits row with rejected tokens at -inf
    def complete(self) -> bool: ...  # the text so far is a whole sentence of the grammar (it may end here)


def along(draft: Draft, state: State, sampler: Sampler) -> tuple[Draft, list[State | None]]:
    """The draft cut where the grammar rejects it (as above), and each verify row's state (None: unreachable)."""
    parents = draft.shape.parents if isinstance(draft.shape, Tree) else range(-1, len(draft.tokens) - 1)
    nodes: list[State | None] = []
    for token, parent in zip(draft.tokens, parents):
        at = state if parent < 0 else nodes[parent]
        nodes.append(at.after(token) if at is not None and at.allows(token) else None)
    if not isinstance(draft.shape, Tree) and None in nodes:
        bad = nodes.index(None)
        keep = bad + (draft.q is not None and not sampler.greedy)  # a sampled draft keeps its rejected token
        draft = replace(
            draft,
            tokens=draft.tokens[:keep],
            q=None if draft.q is None else draft.q[:keep],
            confidence=draft.confidence[:keep],
        )
        nodes = nodes[:keep]
    return draft, [state, *nodes]


TOP = 64  # where the grammar rejects a row's best token, its next best are checked in one pass first


def greedy_rows(rows: np.ndarray, argmax: np.ndarray, states: list[State | None]) -> list[int]:
    """Each row's best token the grammar allows (`argmax`: each row's best token), as argmax over the masked
    row picks it: the highest logit, the lowest id among equals."""
    best = argmax.tolist()
    for i, state in enumerate(states):
        if state is not None and not state.allows(best[i]):
            best[i] = best_allowed(rows[i], state)
    return best


def best_allowed(row: np.ndarray, state: State) -> int:
    """The row's best token the grammar allows, the row's best checked first (greedy_rows)."""
    if state.allows(int(row.argmax())):
        return int(row.argmax())
    top = np.argpartition(row, -TOP)[-TOP:] if len(row) > TOP else np.arange(len(row))
    top = top[np.lexsort((top, -row[top]))]  # by logit, descending; equal logits by id, as argmax orders them
    ok = np.flatnonzero(state.allowed(top))
    # An allowed token whose logit some token outside the checked ones may equal (the partition's edge):
    # that one might have the lower id. The whole row decides then, as it does when none is allowed.
    if ok.size and (len(top) == len(row) or row[top[ok[0]]] > row[top[-1]]):
        return int(top[ok[0]])
    return int(state.mask(row).argmax())


class MaskedProbs:
    """The target's processed distributions, row i masked by states[i] (None: no grammar): computed when the
    acceptance rule first reads a row (it stops at the first rejection), each row once, in float32 (Sampler.probs)."""

    def __init__(self, rows: np.ndarray, states: list[State | None] | None, sampler: Sampler):
        self.rows, self.states, self.sampler = rows, states or [None] * len(rows), sampler
        self._done: dict[int, np.ndarray] = {}
        self.shape = (len(rows), rows.shape[1])

    def __getitem__(self, key):
        i, rest = (key, None) if isinstance(key, (int, np.integer)) else (key[0], key[1])
        if i not in self._done:
            row, state = self.rows[i], self.states[i]
            self._done[i] = self.sampler.probs(state.mask(row) if state is not None else row, wide=False)
        return self._done[i] if rest is None else self._done[i][rest]


class Follow:
    """A grammar's state along the committed text, for a drafter (the engine keeps its own): advanced over each
    token committed since it was last asked. The grammar applies from the token after the prompt."""

    def __init__(self, start: State):
        self.state, self.seen = start, 0

    def prefill(self, tokens: list[int]) -> None:
        """The prompt but its last token (a drafter's prefill)."""
        self.seen = len(tokens) + 1

    def at(self, committed: list[int]) -> State:
        for t in committed[self.seen :]:
            self.state = self.state.after(t)
        self.seen = max(self.seen, len(committed))
        return self.state
