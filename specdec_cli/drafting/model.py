"""The draft model: a small GGUF in its own context, one decode per drafted token (per depth of a tree:
drafting/tree.py, which drafts the chain or tree from its logits).

Nothing is fed to the draft model before a round it drafts in: its context is opened (the model loaded) at its
first draft, and then holds a window of the text (drafting/window.py).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from types import EllipsisType
from typing import Callable

import numpy as np

from ..engine.constraint import Follow, State
from ..engine.drafter import Draft, Drafter
from ..engine.kv import Branches, Sequence
from ..engine.sampling import NonFiniteLogits, Sampler
from ..engine.shapes import CHAIN
from ..errors import SpecdecError
from . import window
from .tree import FIXED, DraftPolicy, draft_tree


class ModelDrafter(Drafter):
    """p_min (llama.cpp's semantics): stop drafting when the draft's probability for its own next token
    falls below it; that token is not proposed. max_branches > 1: draft a tree, forking where the
    runner-up token has probability >= p_split.

    Only ids below `vocab` (the target's vocabulary size) are ever proposed: llama.cpp pairs vocabularies
    that differ by up to 128 ids, and the target cannot decode an id it lacks. Dropping them from the
    draft's distribution keeps the acceptance rule exact (q is whatever the draft sampled from).
    A draft whose logits turn non-finite (NaN weights) stops drafting for good: `failed`.

    A constrained run (`grammar`: its state before the first generated token) masks the draft's rows as the
    target's are: its proposals are tokens the grammar allows, and a sampled draft's q is the masked distribution.

    `seq`: the draft's sequence, or how to open it (load the model, take its context) at the first draft.
    `window`: the tokens of the text's tail its cache holds when it drafts (window.py; None: the whole text).
    `loaded`: whether the draft model is loaded (opening it may load it)."""

    name = "model"

    def __init__(
        self,
        seq: Sequence | Callable[[], Sequence],
        p_min: float = 0.0,
        max_branches: int = 1,
        p_split: float = 0.1,
        max_nodes: int = 63,
        vocab: int | None = None,
        grammar: State | None = None,
        window: int | None = None,
        loaded: Callable[[], bool] = lambda: True,
        n_ctx: int | None = None,
    ):
        self.follow = Follow(grammar) if grammar is not None else None
        self._open = seq if callable(seq) else (lambda: seq)
        self.loaded = loaded  # whether opening it loads nothing (the draft model is loaded already)
        self.cache: Branches | None = None  # the draft's sequence and a tree's forks, once opened
        self.p_min = p_min
        self.max_branches = max_branches
        self.p_split = p_split
        self.max_nodes = max_nodes  # a tree's nodes + 1 must fit the target's output rows
        self.n_ctx = n_ctx  # the target's cells (None: unbounded): its verify batch takes one per node
        self._vocab = vocab  # ids a draft may propose: below the target's vocabulary and its own
        self.window = window
        self.failed = False
        self._notice: str | None = None  # why it failed, until a round has carried it to the user
        self._read = 0  # the text's tokens checked to be in the draft's vocabulary (`_readable`)

    @property
    def opened(self) -> bool:
        return self.cache is not None

    @property
    def seq(self) -> Sequence:
        """The draft's main sequence, opened (the draft model loaded) on first use."""
        if self.cache is None:
            self.cache = Branches(self._open())
        return self.cache.main

    @property
    def vocab(self) -> int:
        n = self.seq.ctx.n_vocab
        return min(self._vocab or n, n)

    def prefill(self, tokens: list[int]) -> None:
        if self.follow is not None:
            self.follow.prefill(tokens)

    def _readable(self, tokens: list[int]) -> bool:
        """Whether the draft has every id of the text (the target's vocabulary may be up to 128 ids larger:
        llama.cpp pairs them). If not, it stops drafting for good: it cannot follow the text."""
        top = max(tokens[self._read :], default=-1)
        self._read = len(tokens)
        if top >= self.seq.ctx.n_vocab:
            self._fail(f"cannot read token {top} of the text (its vocabulary has {self.seq.ctx.n_vocab} ids)")
        return not self.failed

    def _fits(self, n: int, size: int | None) -> bool:
        """Whether a text of n tokens fits the draft's context, which may be shorter than the target's (the
        draft's own trained length): a window always does; a whole text that outgrows it stops the draft for
        good (the text only grows)."""
        if size is None and n > self.seq.ctx.n_ctx:
            self._fail(f"has a context of {self.seq.ctx.n_ctx:,} tokens (as it was trained) and the text outgrew it")
        return not self.failed

    def _fail(self, why: str) -> None:
        self.failed = True
        self._notice = f"draft {self.seq.ctx.model.name} {why}: it no longer drafts; the output is unaffected"

    def take_notice(self) -> str | None:
        """Why drafting stopped, once: the round that carries it to the user clears it."""
        notice, self._notice = self._notice, None
        return notice

    def lag(self, committed: list[int], k: int = 1, size: int | None | EllipsisType = ...) -> int:
        """Tokens the next draft must feed before it can draft (1 when the cache is in step): what its window
        of `size` (... : its own; None: the whole text) lacks, and the last token."""
        size = self.window if size is ... else size
        if self.cache is None and self.loaded():
            self.open_now()  # free (no decode): what its cache holds of the text counts (a server's next turn)
        if self.cache is None:  # not loaded: nothing fed yet
            return window.to_feed(0, 0, len(committed) - 1, size) + 1
        seq = self.seq
        return window.to_feed(seq.covers, seq.dropped, len(committed) - 1, window.fit(seq.ctx, size)) + 1

    def open_now(self) -> bool:
        """Open it (load the draft model, take its sequence) if not yet; False, and it fails for good (the run goes
        on plainly), where the draft model cannot be loaded."""
        try:
            _ = self.seq  # opens it
        except SpecdecError as e:
            self.failed = True
            self._notice = (
                f"the draft model could not be loaded ({e.message}): it does not draft; the output is unaffected"
            )
        return self.cache is not None

    def propose(
        self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator, policy: DraftPolicy = FIXED
    ) -> Draft:
        """Draft up to k tokens; `policy` may end the draft early or veto a fork (auto's cost model)."""
        opened = self.cache is not None
        if not self.failed and self.open_now() and self._readable(committed):
            size = window.fit(self.seq.ctx, self.window)
            if self._fits(len(committed), size):
                try:
                    # fed: what the window lacked; -1 where it was opened (loaded) just now, for this draft
                    fed = window.to_feed(self.seq.covers, self.seq.dropped, len(committed) - 1, size) if opened else -1
                    window.prepare(self.seq, committed[:-1], size)  # the draft's prefill: its window, now
                    k = min(k, self.seq.ctx.n_ctx - len(self.seq))  # d_k is never decoded: d_k-1 takes the last cell
                    return replace(self._draft(committed, k, sampler, rng, policy), fed=fed)
                except NonFiniteLogits as e:  # nothing drafted from these logits can be trusted
                    self._fail(f"produced non-finite logits ({e})")
        # The round goes on as plain decoding.
        return Draft([], None, source=self.name, k=k, notice=self.take_notice())

    def _draft(self, committed: list[int], k: int, sampler: Sampler, rng, policy: DraftPolicy) -> Draft:
        ctx = self.seq.ctx
        # A tree must also fit the cells left near the end of both contexts (the target's verify batch takes a
        # cell per node: its room, not the draft's window, bounds it), and one decode batch; a chain needs only
        # positions (k fits them already).
        room = k
        if self.max_branches > 1:
            target = self.n_ctx - len(committed) if self.n_ctx is not None else self.max_nodes
            room = min(self.max_nodes, ctx.n_ctx - len(self.seq) - 1, ctx.n_batch - 1, target)
        t = draft_tree(
            self.cache,
            committed,
            k,
            sampler,
            rng,
            max_branches=self.max_branches,
            p_split=self.p_split,
            p_min=self.p_min,
            policy=policy,
            max_nodes=room,
            vocab=self.vocab,
            state=self.follow.at(committed) if self.follow is not None else None,
        )
        forked = len(t.tips) > 1  # without a fork it is a chain, verified the usual way
        return Draft(
            t.tokens,
            t.q_rows(),
            source=self.name,
            k=k,
            confidence=tuple(t.confidence),
            entropy=statistics.fmean(measured) if (measured := [h for h in t.entropy if h == h]) else None,
            shape=t.shape() if forked else CHAIN,
            decodes=0 if forked else len(t.tokens),  # a tree's batched decodes say little of one token's cost
        )

    def rollback(self, n: int, draft: Draft | None = None, winner: int = 0) -> None:
        if self.cache is None:
            return
        if len(self.cache) > 1 and self.max_branches == 1:  # a recurrent draft's copy (draft_tree)
            winner = int(n >= self.cache.seqs[1].covers)  # it holds only accepted tokens: it takes the main's place
        self.cache.settle(winner, n)

    def check(self, committed: list[int]) -> None:
        if self.cache is not None:
            self.cache.check(committed)
