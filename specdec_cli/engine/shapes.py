"""A draft's shape, `Chain` (the usual case) or `Tree`: how the engine verifies and accepts it, so the
round loop is the same for both.

A tree's branches (drafted by drafting/tree.py, or lookup's alternatives) are verified in ONE target
decode, each in its own forked sequence, a token shared by several branches once with all their
sequence ids (`Branches.decode`); the acceptance rules in acceptance.py walk it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .acceptance import greedy_accept, greedy_tree_accept, multi_draft_accept, speculative_accept
from .kv import Branches


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
        if order == sorted(order):  # most lookup trees: already in node order, and 17 rows copied cost ~1 ms
            return rows
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
