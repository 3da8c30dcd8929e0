"""Tree drafting: the draft model forks where it hesitates, and the target verifies every branch at once.

While drafting, wherever the draft's runner-up token has probability >= p_split and fewer than
`n_max` branches exist, the branch's draft sequence is forked (seq_cp: the cells are shared, not
copied) and the fork continues from the runner-up. All branches advance together: one draft decode
per depth carries each branch's newest token in its own sequence. The target then decodes the whole
tree in ONE batch, a token shared by several branches once with all their sequence ids
(`Branches.decode`), and the acceptance rules in acceptance.py walk it.

A draft's shape, `Chain` (the usual case) or `Tree`, says how the engine verifies and accepts it, so
the round loop is the same for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .acceptance import greedy_accept, greedy_tree_accept, multi_draft_accept, speculative_accept
from .kv import Branches
from .sampling import Sampler, draw, entropy

# fork_pays(confidences along the branch so far, runner-up probability, depths left, nodes so far) -> fork?
ForkRule = Callable[[list[float], float, int, int], bool]


class Chain:
    """d1..dk, each after the one before: verified in the main sequence, accepted as a prefix."""

    branches = 1

    def __repr__(self) -> str:
        return "CHAIN"

    def verify(self, target: Branches, feed: list[int], tokens: list[int]) -> np.ndarray:
        """ONE target decode of what the cache lacks (`feed`: the last committed token, or more) and the
        draft; row 0 follows the last committed token, row i+1 follows draft token i."""
        return target.main.append([*feed, *tokens], outputs=len(feed) - 1)

    def greedy_accept(self, argmax: list[int], tokens: list[int]) -> tuple[list[int], int]:
        m, token = greedy_accept(argmax, tokens)
        return list(range(m)), token

    def accept(self, p: np.ndarray, q: np.ndarray | None, tokens: list[int], rng) -> tuple[list[int], int]:
        m, token = speculative_accept(p, q, tokens, rng)
        return list(range(m)), token

    def winner(self, path: list[int]) -> int:
        return 0

    def whole(self, path: list[int], n: int) -> bool:
        """Was a whole branch accepted (then the target's token is a bonus, else a correction)?"""
        return len(path) == n

    def children(self, node: int, n: int) -> list[int]:
        """The nodes that follow `node` (-1: the last committed token) in a draft of n tokens."""
        return [node + 1] if node + 1 < n else []

    def in_order(self, path: list[int]) -> int:
        """How many accepted tokens lie in KV cells in position order: a chain's cells follow each other."""
        return len(path)


CHAIN = Chain()


@dataclass(frozen=True, slots=True)
class Tree:
    """Node i follows parents[i] (-1: the last committed token); through[i] are the branches whose path
    runs through node i: the target decodes it once, in each of their sequences."""

    parents: tuple[int, ...]
    through: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, parents: list[int]) -> Tree:
        """The tree of these parents (each before its children), a branch per leaf in node order."""
        leaves = sorted(set(range(len(parents))) - set(parents))
        through: list[list[int]] = [[] for _ in parents]
        for b, leaf in enumerate(leaves):
            node = leaf
            while node >= 0:
                through[node].append(b)
                node = parents[node]
        return cls(tuple(parents), tuple(tuple(sorted(bs)) for bs in through))

    @property
    def branches(self) -> int:
        return 1 + max((max(bs) for bs in self.through if bs), default=0)

    def depth(self) -> int:
        """Nodes on the longest path from the root."""
        depth: list[int] = []
        for parent in self.parents:
            depth.append(depth[parent] + 1 if parent >= 0 else 1)
        return max(depth, default=0)

    def verify(self, target: Branches, feed: list[int], tokens: list[int]) -> np.ndarray:
        """ONE target decode over every branch, each in its own forked sequence, nodes in `layout` order;
        rows as a chain's: row 0 follows the last committed token, row i+1 follows node i."""
        n = self.branches
        for _ in range(n - 1):
            target.fork(0)  # every branch starts from the committed text
        order = self.layout()
        everyone = tuple(range(n))
        rows = target.decode(
            [*feed, *(tokens[i] for i in order)],
            [everyone] * len(feed) + [self.through[i] for i in order],
            first_out=len(feed) - 1,
        )
        out = np.empty_like(rows)
        out[0] = rows[0]
        out[1 + np.asarray(order, dtype=int)] = rows[1:]
        return out

    def layout(self) -> list[int]:
        """The nodes depth first, a node's first child right after it: branch 0's path is one run of
        cells, as is each fork's path from where it leaves its parent's (kv.Branches places a batch's
        tokens in consecutive free cells)."""
        children: list[list[int]] = [[] for _ in self.parents]
        stack: list[int] = []
        for node, parent in enumerate(self.parents):
            (children[parent] if parent >= 0 else stack).append(node)
        out: list[int] = []
        stack.reverse()
        while stack:
            node = stack.pop()
            out.append(node)
            stack += reversed(children[node])
        return out

    def in_order(self, path: list[int]) -> int:
        """How many accepted nodes, from the first, lie in the cells right after the last committed
        token's, in position order (in `layout`, path[i] is the i-th node)."""
        where = {node: i for i, node in enumerate(self.layout())}
        return next((i for i, node in enumerate(path) if where[node] != i), len(path))

    def greedy_accept(self, argmax: list[int], tokens: list[int]) -> tuple[list[int], int]:
        return greedy_tree_accept(argmax, tokens, list(self.parents))

    def accept(self, p: np.ndarray, q: np.ndarray | None, tokens: list[int], rng) -> tuple[list[int], int]:
        return multi_draft_accept(p, q, tokens, list(self.parents), rng)

    def winner(self, path: list[int]) -> int:
        """The branch whose accepted prefix is kept: every branch through the last accepted node has it."""
        return min(self.through[path[-1]]) if path else 0

    def whole(self, path: list[int], n: int) -> bool:
        return (path[-1] if path else -1) not in self.parents  # it ends at a leaf

    def children(self, node: int, n: int) -> list[int]:
        return [c for c, p in enumerate(self.parents) if p == node]


@dataclass
class Nodes:
    """A tree while it is drafted: nodes in creation order (a parent always before its children)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: the last committed token
    q: list[np.ndarray] = field(default_factory=list)  # sampling: the distribution node i was drawn from
    confidence: list[float] = field(default_factory=list)  # the draft's probability of node i's token
    entropy: list[float] = field(default_factory=list)
    tips: list[int] = field(default_factory=list)  # tips[b]: branch b's deepest node (-1: none yet)

    def add(self, token: int, parent: int, q: np.ndarray | None, confidence: float, entropy: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        if q is not None:
            self.q.append(q)
        self.confidence.append(confidence)
        self.entropy.append(entropy)
        return len(self.tokens) - 1

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
    branches: Branches, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator,
    n_max: int, p_split: float, p_min: float = 0.0,
    fork_pays: ForkRule | None = None, keep_going: Callable[[list[float]], bool] | None = None,
    max_nodes: int = 63, vocab: int | None = None,
) -> Nodes:  # fmt: skip
    """Draft a tree at most k deep, with at most n_max branches and max_nodes nodes, of ids below `vocab`;
    `branches` holds the forks afterwards."""
    if k <= 0:
        return Nodes(tips=[-1])
    model = branches.main.ctx.model
    feed = committed[len(branches.main) :]  # the gap the cache lags behind (at least the last token)
    rows = [branches.main.append(feed)[0][:vocab].copy()]  # rows[i]: logits after active branch i's newest token
    tree = Nodes(tips=[-1])
    active = [0]
    for depth in range(k):
        spare = max_nodes - len(tree.tokens) - len(active)  # nodes left for forks at this depth
        if spare < 0:  # the verify batch would not fit
            break
        batch: list[tuple[int, int]] = []  # (branch, token) to decode for the next depth
        for b, row in zip(list(active), rows):
            dist = sampler.dist(row)
            if dist.max() < p_min:  # llama.cpp's p-min (on the likeliest token: see ModelDrafter): the branch stops
                active.remove(b)
                continue
            d = int(dist.argmax()) if sampler.greedy else draw(dist, rng)
            parent = tree.tips[b]
            tree.tips[b] = tree.add(d, parent, None if sampler.greedy else dist, float(dist[d]), entropy(dist))
            candidates = [(b, d)]
            rest = dist.copy()
            rest[d] = 0.0
            r = int(rest.argmax())
            if (
                len(branches) < n_max and spare > 0 and rest[r] >= p_split and rest[r] > 0
                and (fork_pays is None or fork_pays(
                    [tree.confidence[i] for i in tree.path(parent)], float(rest[r]), k - depth, len(tree.tokens)
                ))
            ):  # fmt: skip
                # The sibling is drawn from q without the tokens already drafted here (multi_draft_accept).
                q2 = rest / rest.sum()
                x = r if sampler.greedy else draw(q2, rng)
                spare -= 1
                nb = branches.fork(b)  # shares branch b's cells up to the parent
                tree.tips.append(tree.add(x, parent, None if sampler.greedy else q2, float(dist[x]), entropy(q2)))
                active.append(nb)
                candidates.append((nb, x))
            for br, t in candidates:
                if model.is_eog(t):  # nothing after the end of the text can be used
                    active.remove(br)
                else:
                    batch.append((br, t))
        if (
            keep_going is not None
            and 0 in active
            and not keep_going([tree.confidence[i] for i in tree.path(tree.tips[0])])
        ):
            break
        if depth == k - 1 or not batch:
            break
        out = branches.decode([t for _, t in batch], [(br,) for br, _ in batch])
        rows = [out[i][:vocab].copy() for i in range(len(batch))]
        active = [br for br, _ in batch]
    return tree
