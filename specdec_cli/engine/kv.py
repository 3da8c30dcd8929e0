"""KV-cache sequences with fork, rollback and keep, and the bookkeeping that makes them safe.

A `Sequence` owns what one llama.cpp sequence holds: the token ids at positions 0..len-1.
Every decode appends to it and every rollback truncates it, so the engine can always say, and
in debug mode check, that a cache holds exactly a prefix of the committed text, or (a draft's window,
drafting/window.py) the text's first `sinks` tokens and then its tail, with the middle left out.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..errors import SpecdecError
from .context import Context


class KVInvariantError(AssertionError):
    """A cache holds something other than what its Sequence says (only checked with --debug)."""


def clear(ctx: Context, seq_ids: Iterable[int]) -> None:
    """Empty these sequences of a context (removing a whole sequence never fails: nothing to check)."""
    for s in seq_ids:
        ctx.seq_rm(s, -1, -1)


class Sequence:
    def __init__(self, ctx: Context, seq_id: int = 0, tokens: list[int] | None = None):
        self.ctx = ctx
        self.seq_id = seq_id
        self.tokens: list[int] = list(tokens or [])  # what the cache holds, at positions 0..len-1
        # A window (`cut`): the cache holds the text's first `sinks` tokens, then the text from sinks +
        # `dropped` on, renumbered; 0 and 0: a prefix of the text, as every target's and most drafts' are.
        self.sinks = 0
        self.dropped = 0
        # A recurrent cache (ctx.max_rollback not None) can drop only tokens of its last decode, one
        # rollback per decode (llama.cpp's snapshots): how many it can drop now.
        self._undo = 0

    @classmethod
    def empty(cls, ctx: Context, seq_id: int = 0) -> Sequence:
        """Sequence `seq_id` in a cache cleared of anything an earlier generation left (forks included)."""
        clear(ctx, range(ctx.n_seq))
        return cls(ctx, seq_id)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def covers(self) -> int:
        """How much of the text it stands for: its first `covers` tokens (some of the middle left out)."""
        return len(self.tokens) + self.dropped

    def append(self, tokens: list[int], outputs: str | int = "last") -> np.ndarray:
        """Decode `tokens` after what the cache holds; return logits rows ("last", "all", or i: the
        rows of tokens[i:]; of the last n_batch chunk, when a long prompt needs several)."""
        logits = None
        step = self.ctx.n_batch
        for start in range(0, len(tokens), step):  # long prompts go in n_batch chunks
            chunk = tokens[start : start + step]
            out = outputs if isinstance(outputs, str) else max(outputs - start, 0)
            logits = self.ctx.decode(chunk, len(self.tokens), self.seq_id, out)
            self.tokens.extend(chunk)
            self.decoded(len(chunk))
        return logits

    def restored(self, tokens: list[int]) -> None:
        """The cache holds `tokens` at positions 0..len-1, its cells read back from a saved state (a server's
        prefix cache) rather than decoded: nothing to roll back into."""
        self.tokens, self.sinks, self.dropped, self._undo = list(tokens), 0, 0, 0

    def decoded(self, n: int) -> None:
        """A decode of n tokens in this sequence: a recurrent state's snapshots are those of its last n - 1
        (the state after the first is the oldest kept), as far as the context keeps snapshots."""
        if self.ctx.max_rollback is not None:
            self._undo = min(n - 1, self.ctx.max_rollback)

    @property
    def floor(self) -> int:
        """The shortest this sequence can roll back to without clearing it."""
        return 0 if self.ctx.max_rollback is None else len(self.tokens) - self._undo

    def rollback(self, n: int) -> None:
        """Forget the text from token n on, so the cache stands for its first n tokens (or fewer, if it had
        fewer). A window whose tail starts after n keeps only what it holds of the text's first n: its sinks.

        A recurrent state goes back only to a snapshot of its last decode: further back, the sequence is
        cleared and holds nothing (a prefix all the same: the next decode feeds the text again)."""
        if n >= self.covers:
            return
        if self.dropped and n <= self.sinks + self.dropped:  # the tail goes whole: a prefix again
            n, self.sinks, self.dropped = min(n, self.sinks), 0, 0
        else:
            n -= self.dropped  # the position that text token n sits at
        recurrent = self.ctx.max_rollback is not None
        if recurrent and len(self.tokens) - n > self._undo:
            clear(self.ctx, [self.seq_id])
            n = 0
        elif not self.ctx.seq_rm(self.seq_id, n, -1):
            raise SpecdecError(f"{self.ctx.model.name}: llama.cpp refused to remove positions {n}.. from its cache")
        self._undo = 0  # llama.cpp: one rollback per decode
        del self.tokens[n:]

    def shared(self, text: list[int]) -> int:
        """The longest prefix of `text` it stands for. A window's left-out middle is not compared: its tail
        was computed without it (a draft's guesses may lean on it; the target never does)."""
        held = [(i, t) for i, t in enumerate(self.tokens[: self.sinks])]
        held += [(self.sinks + self.dropped + j, t) for j, t in enumerate(self.tokens[self.sinks :])]
        return min(next((i for i, t in held if i >= len(text) or text[i] != t), self.covers), len(text))

    def cut(self, sinks: int, n: int) -> None:
        """Leave out the next n tokens of the text after the first `sinks` (the attention sinks, which stay):
        the cells of those it holds go and the rest of its tail moves down (llama.cpp's K-shift,
        `ctx.can_shift`); those it does not hold yet are never fed."""
        if (self.dropped and sinks != self.sinks) or len(self.tokens) < sinks:
            raise ValueError(f"cannot leave out tokens after {sinks} sinks of a window of {len(self.tokens)}")
        held = min(n, len(self.tokens) - sinks)
        if held:
            self.ctx.seq_rm(self.seq_id, sinks, sinks + held)
            self.ctx.seq_add(self.seq_id, sinks + held, -1, -held)
            del self.tokens[sinks : sinks + held]
        self.sinks = sinks
        self.dropped += n

    def park(self) -> Any:
        """Its cells read out of the cache and freed (`unpark` puts them back); None where llama.cpp could not read
        them (they stay)."""
        try:
            state = self.ctx.seq_state(self.seq_id)
        except OSError:
            return None
        clear(self.ctx, [self.seq_id])
        return state

    def unpark(self, state: Any) -> bool:
        """Its cells back from `park`'s state, as they were (a window's positions too); False where llama.cpp did not
        read them back (the sequence is then empty)."""
        clear(self.ctx, [self.seq_id])
        self._undo = 0  # (a recurrent state comes back without the snapshots of its last decode)
        if self.ctx.set_seq_state(state, self.seq_id) == len(state):
            return True
        clear(self.ctx, [self.seq_id])
        self.tokens, self.sinks, self.dropped = [], 0, 0
        return False

    def fork(self, seq_id: int) -> Sequence:
        """A new sequence `seq_id` sharing this one's cells (no copy of the KV data in a unified cache)."""
        clear(self.ctx, [seq_id])
        self.ctx.seq_cp(self.seq_id, seq_id, -1, -1)
        fork = Sequence(self.ctx, seq_id, self.tokens)
        fork.sinks, fork.dropped = self.sinks, self.dropped
        return fork

    def check(self, committed: list[int]) -> None:
        """Debug invariant: the cache holds exactly our tokens, and they are a prefix of `committed` (a
        window's: its sinks, then the text from sinks + dropped on)."""
        n = len(self.tokens)
        lo, hi = self.ctx.seq_pos_range(self.seq_id)
        # A recurrent state stands for every position up to its last: llama.cpp reports that one as min and max.
        expected = (0 if self.ctx.max_rollback is None else n - 1, n - 1) if n else (-1, -1)
        if (lo, hi) != expected:
            raise KVInvariantError(
                f"{self.ctx.model.name} seq {self.seq_id}: cache holds positions {lo}..{hi}, expected {expected}"
            )
        text = committed[: self.sinks] + committed[self.sinks + self.dropped : self.covers]
        if self.tokens != text or self.covers > len(committed):
            raise KVInvariantError(f"{self.ctx.model.name} seq {self.seq_id}: cached tokens differ from committed text")


class Branches:
    """One context's main sequence (seq id 0) and its forks (1, 2, ...) for a tree round.

    A fork shares its source's cells (seq_cp in a unified cache copies no KV data). After the round
    `settle` makes the winning branch the main sequence again and drops every other one, so between
    rounds a context holds exactly one sequence: a prefix of the committed text.
    """

    def __init__(self, main: Sequence):
        self.seqs = [main]

    @property
    def main(self) -> Sequence:
        return self.seqs[0]

    def __len__(self) -> int:
        return len(self.seqs)

    def fork(self, branch: int = 0) -> int:
        """Open a new branch holding what `branch` holds now; returns its index (= its seq id)."""
        new = len(self.seqs)
        self.seqs.append(self.seqs[branch].fork(self.main.seq_id + new))
        return new

    def decode(self, tokens: list[int], branches: list[tuple[int, ...]], first_out: int = 0) -> np.ndarray:
        """ONE decode of tokens[i] in every branch of branches[i], each after what its branches hold;
        a token shared by several branches is computed once. Returns a logits row per token from
        tokens[first_out] on. Any order in which a token comes after its branch's earlier ones works."""
        length = [len(s) for s in self.seqs]
        pos = []
        for i, bs in enumerate(branches):
            p = length[bs[0]]
            if any(length[b] != p for b in bs):
                raise ValueError(f"token {i} is shared by branches of different lengths")
            pos.append(p)
            for b in bs:
                length[b] += 1
        seqs = [tuple(self.seqs[b].seq_id for b in bs) for bs in branches]
        out = self.main.ctx.decode_tree(tokens, pos, seqs, first_out)
        for t, bs in zip(tokens, branches):
            for b in bs:
                self.seqs[b].tokens.append(t)
        for b in {b for bs in branches for b in bs}:
            self.seqs[b].decoded(1)  # no snapshot kept for a rollback: trees never run on recurrent models
        return out

    def settle(self, winner: int, n: int) -> None:
        """Keep branch `winner` as the main sequence, drop the others, and roll back to n tokens."""
        ctx, main = self.main.ctx, self.main
        if winner:
            w = self.seqs[winner]
            ctx.seq_keep(w.seq_id)  # every cell outside the winner is freed, the main sequence's included
            ctx.seq_cp(w.seq_id, main.seq_id, -1, -1)
            clear(ctx, [w.seq_id])
            main.tokens, main._undo, main.sinks, main.dropped = w.tokens, w._undo, w.sinks, w.dropped
        else:
            clear(ctx, [s.seq_id for s in self.seqs[1:]])
        del self.seqs[1:]
        main.rollback(n)

    def check(self, committed: list[int]) -> None:
        """Debug invariant between rounds: the main sequence is a prefix of `committed`, no fork is left."""
        self.main.check(committed)
        for s in range(self.main.seq_id + 1, self.main.ctx.n_seq):
            if self.main.ctx.seq_pos_range(s) != (-1, -1):
                raise KVInvariantError(f"{self.main.ctx.model.name} seq {s}: a dropped branch still holds cells")


class Kept:
    """What each context's main sequence held when the last run ended, for the next run to start from:
    empty, or (reuse) the longest prefix it shares with the new prompt (a server's chat turns).

    `version()` changes when something else emptied the caches (a cost-curve measurement): what was kept
    is then gone. A run that fails keeps nothing: its sequences are never handed back (`keep`).

    In a cache that other runs decode in at the same time (`parks`: a server's slots share one), what a run kept is
    parked between its runs: read out into memory and its cells freed. Every decode attends over every used cell
    of a shared cache (llama.cpp masks the others' out, but visits them), so idle cells slow everyone else's: 1,150
    kept cells made a lone token of the 1.5B target 2% slower on 2 cores (80.9 against 79.3 ms), and one client of
    a four-slot server 4.5% slower than of a one-slot one."""

    def __init__(self, version: Callable[[], int], parks: Callable[[Context], bool] = lambda ctx: False):
        self._version = version
        self._parks = parks
        self._held: dict[Context, Sequence] = {}  # what a finished run left in each cache
        self._parked: dict[Context, Any] = {}  # the cells of those parked (read out of their cache)
        self._at = version()  # the version they were kept at
        self._taken: dict[Context, Sequence] = {}  # the current run's sequences
        self._fit = True  # whether the current run's cells may serve a later run (begin)

    def begin(self, fit: bool = True) -> None:
        """A run starts: what a run before it took and did not keep (it failed) is not handed on. `fit`: its
        cells may serve a later run (not in exact mode without reuse, whose prompt goes through other kernels)."""
        self._taken.clear()
        self._fit = fit

    def take(self, ctx: Context, tokens: list[int], reuse: bool) -> Sequence:
        """Sequence 0 of a context for a run on `tokens`: empty, or (reuse) what it held after the run
        before, back to the longest prefix it shares with the prompt but its last token (forks dropped)."""
        seq, state = self._held.pop(ctx, None), self._parked.pop(ctx, None)
        if reuse and seq is not None and self._at == self._version() and (state is None or seq.unpark(state)):
            clear(ctx, range(1, ctx.n_seq))
            seq.rollback(seq.shared(tokens[:-1]))
        else:
            seq = Sequence.empty(ctx)
        self._taken[ctx] = seq
        return seq

    def keep(self) -> None:
        """The run ended cleanly (its caches rolled back to its text): the next run may start from them (parked,
        where others decode in the same cache)."""
        for ctx, seq in self._taken.items():
            if self._fit:
                self._held[ctx] = seq
            if self._parks(ctx):
                self._park(ctx, seq if self._fit else None)
        self._taken.clear()
        self._at = self._version()

    @contextmanager
    def unparked(self, ctx: Context) -> Iterator[Sequence | None]:
        """`held(ctx)` with its cells in the cache meanwhile (a prefix store reads them), parked again after."""
        seq, state = self.held(ctx), self._parked.pop(ctx, None)
        if seq is not None and state is not None and not seq.unpark(state):
            self._held.pop(ctx, None)  # (nothing left to keep)
            seq = None
        try:
            yield seq
        finally:
            if seq is not None and state is not None:
                self._park(ctx, seq)

    def _park(self, ctx: Context, seq: Sequence | None) -> None:
        """Every cell of the run's sequences freed, what `seq` holds read out first (kept in `_parked`)."""
        state = seq.park() if seq is not None and len(seq) else None
        if state is not None:
            self._parked[ctx] = state
        elif seq is not None and len(seq):
            return  # (llama.cpp could not read them out: they stay, and serve the next run where they are)
        clear(ctx, range(ctx.n_seq))

    def held(self, ctx: Context) -> Sequence | None:
        """What a context kept from the last run (None: nothing, or emptied since): a server saves its prompt."""
        seq = self._held.get(ctx)
        return seq if seq is not None and self._at == self._version() else None
