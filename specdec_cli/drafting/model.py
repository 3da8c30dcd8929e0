"""The draft model: a small GGUF in its own context, one decode per drafted token (per depth of a tree).

A chain is a tree of one branch, so there is one drafting loop (`draft_tree`). With --branches N, wherever
the draft's runner-up token has probability >= p_split and fewer than N branches exist, the branch's
sequence is forked (seq_cp: the cells are shared, not copied) and the fork continues from the runner-up.
All branches advance together: one draft decode per depth carries each branch's newest token in its own
sequence, and the target verifies the whole tree in one batch (engine/shapes.py).

Nothing is fed to the draft model before a round it drafts in: its context is opened (the model loaded) at its
first draft, and then holds a window of the text (drafting/window.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from types import EllipsisType
from typing import Callable

import numpy as np

from ..engine.constraint import Follow, State, best_allowed
from ..engine.drafter import Draft, Drafter
from ..engine.kv import Branches, Sequence
from ..engine.sampling import NonFiniteLogits, Sampler, draw, entropy, softmax_summary
from ..engine.shapes import CHAIN, Tree
from ..errors import SpecdecError
from . import window


STATS_EVERY = 8  # a greedy chain's statistics: from the rows at positions divisible by this (draft_tree)


class DraftPolicy:
    """When a draft stops early and whether a fork pays. This one: never early, wherever p_split allows;
    auto's cost model is another (drafting/auto.py)."""

    reads_confidence = False  # whether keep_going and fork_pays read the draft's probabilities

    def keep_going(self, confidence: list[float]) -> bool:
        """Draft another token after these (the draft's probabilities of the tokens drafted so far)?"""
        return True

    def fork_pays(self, confidence: list[float], runner_up: float, left: int, nodes: int) -> bool:
        """Fork here (confidences along the branch so far, the runner-up's probability, depths left,
        nodes so far)?"""
        return True


FIXED = DraftPolicy()


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
    ):
        self.follow = Follow(grammar) if grammar is not None else None
        self._open = seq if callable(seq) else (lambda: seq)
        self.loaded = loaded  # whether opening it loads nothing (the draft model is loaded already)
        self.cache: Branches | None = None  # the draft's sequence and a tree's forks, once opened
        self.p_min = p_min
        self.max_branches = max_branches
        self.p_split = p_split
        self.max_nodes = max_nodes  # a tree's nodes + 1 must fit the target's output rows
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
            self._open_now()  # free (no decode): what its cache holds of the text counts (a server's next turn)
        if self.cache is None:  # not loaded: nothing fed yet
            return window.to_feed(0, 0, len(committed) - 1, size) + 1
        seq = self.seq
        return window.to_feed(seq.covers, seq.dropped, len(committed) - 1, window.fit(seq.ctx, size)) + 1

    def _open_now(self) -> bool:
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
        if not self.failed and self._open_now() and self._readable(committed):
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
        # A tree must also fit the cache cells left near the end of the context, and one decode batch; a
        # chain needs only positions (k fits them already).
        room = k if self.max_branches == 1 else min(self.max_nodes, ctx.n_ctx - len(self.seq) - 1, ctx.n_batch - 1)
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


@dataclass
class Nodes:
    """A tree while it is drafted: nodes in creation order (a parent always before its children)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: the last committed token
    q: list[np.ndarray] = field(default_factory=list)  # sampling: the distribution node i was drawn from
    confidence: list[float] = field(default_factory=list)  # the draft's probability of node i's token
    entropy: list[float] = field(default_factory=list)  # NaN, as confidence, where not computed (STATS_EVERY)
    tips: list[int] = field(default_factory=list)  # tips[b]: branch b's deepest node (-1: none yet)
    # A sampled chain's q, row i node i's, written in place by the sampler in float32: no copy of them all at the
    # end (a row of 150k ids is 0.6 MB to write).
    rows: np.ndarray | None = None

    def add(self, token: int, parent: int, q: np.ndarray | None, confidence: float, entropy: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        if q is not None:
            self.q.append(q)
        self.confidence.append(confidence)
        self.entropy.append(entropy)
        return len(self.tokens) - 1

    def q_rows(self) -> np.ndarray | None:
        """(nodes, vocabulary): each node's q, sampling; None when greedy."""
        if not self.q:
            return None
        return self.rows[: len(self.q)] if self.rows is not None else np.stack(self.q)

    def path(self, node: int) -> list[int]:
        """The nodes from the root down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def shape(self) -> Tree:
        """The finished tree: for every node its parent and the branches whose path runs through it."""
        through: list[list[int]] = [[] for _ in self.tokens]
        for b, tip in enumerate(self.tips):
            for node in self.path(tip):
                through[node].append(b)
        return Tree(tuple(self.parents), tuple(tuple(bs) for bs in through))


def draft_tree(
    cache: Branches,
    committed: list[int],
    k: int,
    sampler: Sampler,
    rng: np.random.Generator,
    *,
    max_branches: int = 1,
    p_split: float = 1.0,
    p_min: float = 0.0,
    policy: DraftPolicy = FIXED,
    max_nodes: int = 63,
    vocab: int | None = None,
    state: State | None = None,
) -> Nodes:
    """Draft a tree at most k deep, with at most max_branches branches (1: a chain) and max_nodes nodes,
    of ids below `vocab`, each allowed by the grammar from `state` on (None: unconstrained); `cache` holds
    the forks afterwards."""
    if k <= 0:
        return Nodes(tips=[-1])
    ctx = cache.main.ctx
    feed = committed[cache.main.covers :]  # the gap the cache lags behind (at least the last token)
    first = cache.main.append(feed)[0][:vocab]
    rows = [first.copy() if max_branches > 1 else first]  # rows[i]: logits after active branch i's newest token
    seqs = {0: cache.main}  # where each branch decodes: a recurrent chain's goes on in a copy (below)
    chain_q = not sampler.greedy and max_branches == 1
    # A greedy chain needs only each row's argmax unless p-min or the policy reads the draft's probabilities;
    # then they are statistics (the draft's entropy), taken from one row in STATS_EVERY: a full-row exp pass,
    # ~0.1 ms on 150k ids, was most of a GPU round's host time.
    summed = p_min > 0.0 or policy.reads_confidence
    tree = Nodes(tips=[-1], rows=np.empty((k, len(first)), np.float32) if chain_q else None)
    active = [0]
    states = {0: state}  # each branch's grammar state after its newest token
    for depth in range(k):
        spare = max_nodes - len(tree.tokens) - len(active)  # nodes left for forks at this depth
        if spare < 0:  # the verify batch would not fit
            break
        batch: list[tuple[int, int]] = []  # (branch, token) to decode for the next depth
        for b, row in zip(list(active), rows):
            st = states.get(b)
            forks = len(cache) < max_branches and spare > 0
            # Sampling draws from the masked row (q); greedy takes the best allowed token, its confidence
            # (the cost model's predictor) read from the plain row: no whole-vocabulary mask per token.
            if sampler.greedy and not forks:  # a chain keeps no distribution: one exp pass gives what it reads
                dist, best = None, 1.0
                if summed or (len(committed) + depth) % STATS_EVERY == 0:
                    top, total, nats = softmax_summary(row)
                    best = 1.0 / total
                else:  # (the max: for the finiteness check below; argmax lands on a NaN or +inf there is)
                    top, total, nats = (row.max() if st is not None else None), math.nan, math.nan
            elif sampler.greedy:
                dist = sampler.dist(row)
                best, nats = dist.max(), entropy(dist)
            else:
                out = tree.rows[len(tree.tokens)] if tree.rows is not None else None
                dist, nats = sampler.probs_entropy(row if st is None else st.mask(row), out)
                best = dist.max() if p_min > 0.0 else 1.0  # (no p-min: no pass over the row for its max)
            # p-min looks at the most likely token, not the sampled one: a stop that depended on the
            # sampled token would change what a proposal is distributed as (greedy: the same token).
            if best < p_min:  # the branch stops
                active.remove(b)
                continue
            d = draw(dist, rng) if not sampler.greedy else int(row.argmax()) if st is None else best_allowed(row, st)
            if dist is None and not math.isfinite(top := row[d] if top is None else top):
                raise NonFiniteLogits(f"logits hold {top}")
            confidence = float(np.exp(row[d] - top)) / total if dist is None else float(dist[d])
            parent = tree.tips[b]
            tree.tips[b] = tree.add(d, parent, None if sampler.greedy else dist, confidence, nats)
            candidates = [(b, d)]
            if forks:
                sibling = _sibling(tree, parent, dist, row, d, st, sampler, rng, policy, p_split, k - depth)
                if sibling is not None:
                    spare -= 1
                    nb = cache.fork(b)  # shares branch b's cells up to the parent
                    seqs[nb] = cache.seqs[nb]
                    tree.tips.append(sibling)
                    active.append(nb)
                    candidates.append((nb, tree.tokens[sibling]))
            for br, t in candidates:
                if st is not None and not ctx.model.is_eog(t):
                    states[br] = st.after(t)
                if ctx.model.is_eog(t):  # nothing after the end of the text can be used
                    active.remove(br)
                else:
                    batch.append((br, t))
        if 0 in active and not policy.keep_going([tree.confidence[i] for i in tree.path(tree.tips[0])]):
            break
        if depth == k - 1 or not batch:
            break
        rows = _decode(cache, seqs, batch, max_branches, vocab)
        active = [br for br, _ in batch]
    return tree


def _sibling(
    tree: Nodes,
    parent: int,
    dist: np.ndarray,
    row: np.ndarray,
    d: int,
    st: State | None,
    sampler: Sampler,
    rng: np.random.Generator,
    policy: DraftPolicy,
    p_split: float,
    left: int,
) -> int | None:
    """A fork beside node d (a new node, or None): the runner-up where it has p_split and the policy says a fork
    pays. It is drawn from q without the token already drafted here (shapes.multi_draft_accept's rule)."""
    rest = dist.copy()
    rest[d] = 0.0
    r = int(rest.argmax()) if st is None or not sampler.greedy else _runner_up(row, d, st)
    if r is None:
        return None
    path = [tree.confidence[i] for i in tree.path(parent)]
    if not (rest[r] >= p_split and rest[r] > 0 and policy.fork_pays(path, float(rest[r]), left, len(tree.tokens))):
        return None
    q2 = rest / rest.sum()
    x = r if sampler.greedy else draw(q2, rng)
    return tree.add(x, parent, None if sampler.greedy else q2, float(dist[x]), entropy(q2))


def _decode(cache: Branches, seqs: dict, batch: list[tuple[int, int]], max_branches: int, vocab: int | None):
    """The next depth's logits rows: a chain's one-token decode, or one decode over every branch's newest token."""
    if max_branches == 1:
        ((b, t),) = batch
        if cache.main.ctx.max_rollback is not None and seqs[0] is cache.main:
            # A recurrent state cannot drop draft tokens from a string of one-token decodes: they go to
            # a copy of it (seq_cp shares it; llama.cpp copies it at the copy's first decode).
            seqs[0] = cache.seqs[cache.fork(0)]
        return [seqs[0].append([t])[0][:vocab]]
    out = cache.decode([t for _, t in batch], [(br,) for br, _ in batch])
    return [out[i][:vocab].copy() for i in range(len(batch))]


def _runner_up(row: np.ndarray, best: int, state: State) -> int | None:
    """Greedy: the best token the grammar allows after `best` (None: it allows no other, as where a tool call's
    name is forced: the masked row is all -inf then, and its argmax, token 0, is no token to draft)."""
    rest = row.copy()
    rest[best] = -np.inf
    r = best_allowed(rest, state)
    return r if state.allows(r) else None
