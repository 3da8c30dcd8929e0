"""Drafting a tree from the draft model's logits, one draft decode per depth; a chain is a tree of one branch,
so there is one drafting loop (`draft_tree`).

With --branches N, wherever the draft's runner-up token has probability >= p_split and fewer than N branches
exist, the branch's sequence is forked (seq_cp: the cells are shared, not copied) and the fork continues from the
runner-up. All branches advance together: one draft decode per depth carries each branch's newest token in its
own sequence, and the target verifies the whole tree in one batch (engine/shapes.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..engine.constraint import State, best_allowed
from ..engine.kv import Branches
from ..engine.sampling import NonFiniteLogits, Sampler, draw, entropy, softmax_summary
from ..engine.shapes import Tree

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
    summed = p_min > 0.0 or policy.reads_confidence  # a greedy chain's every row read whole (_summary)
    tree = Nodes(tips=[-1], rows=np.empty((k, len(first)), np.float32) if chain_q else None)
    active, states = [0], {0: state}  # states: each branch's grammar state after its newest token
    for depth in range(k):
        spare = max_nodes - len(tree.tokens) - len(active)  # nodes left for forks at this depth
        if spare < 0:  # the verify batch would not fit
            break
        stats = summed or (len(committed) + depth) % STATS_EVERY == 0  # a greedy chain's, at this depth
        batch: list[tuple[int, int]] = []  # (branch, token) to decode for the next depth
        for b, row in zip(list(active), rows):
            st = states.get(b)
            forks = len(cache) < max_branches and spare > 0
            if sampler.greedy and not forks:  # a chain keeps no distribution: one exp pass gives what it reads
                dist, (best, top, total, nats) = None, _summary(row, st, stats)
            else:
                out = tree.rows[len(tree.tokens)] if tree.rows is not None else None
                dist, best, nats = _distribution(row, st, sampler, p_min, out)
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


def _summary(row: np.ndarray, st: State | None, stats: bool) -> tuple[float, float | None, float, float]:
    """A greedy chain's row, of which it keeps no distribution: (the best token's probability, the row's top logit,
    its softmax total, its entropy), from one exp pass where `stats`; else the top alone (NaN: not computed).
    A greedy chain needs only each row's argmax unless p-min or the policy reads the draft's probabilities; else
    they are statistics (the draft's entropy), taken from one row in STATS_EVERY: a full-row exp pass, ~0.1 ms on
    150k ids, was most of a GPU round's host time."""
    if stats:
        top, total, nats = softmax_summary(row)
        return 1.0 / total, top, total, nats
    # (the max: for draft_tree's finiteness check; argmax lands on a NaN or +inf there is)
    return 1.0, (row.max() if st is not None else None), math.nan, math.nan


def _distribution(
    row: np.ndarray, st: State | None, sampler: Sampler, p_min: float, out: np.ndarray | None
) -> tuple[np.ndarray, float, float]:
    """(q, the best token's probability, q's entropy). Sampling draws from the masked row (into `out`, a sampled
    chain's row of Nodes.rows); greedy takes the best allowed token, its confidence (the cost model's predictor)
    read from the plain row: no whole-vocabulary mask per token."""
    if sampler.greedy:
        dist = sampler.dist(row)
        return dist, dist.max(), entropy(dist)
    dist, nats = sampler.probs_entropy(row if st is None else st.mask(row), out)
    return dist, (dist.max() if p_min > 0.0 else 1.0), nats  # (no p-min: no pass over the row for its max)


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
