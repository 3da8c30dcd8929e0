"""The acceptance rules. Pure numpy over token ids and probability rows: no llama.cpp here.

Shapes: k draft tokens; target rows p has k+1 rows (row i checks draft i; row k gives the bonus).
Both rules return (m, token): m draft tokens accepted, then one token from the target, a
correction when m < k or the bonus when m == k. Every round therefore emits m + 1 tokens.
"""

from __future__ import annotations

import numpy as np

from .sampling import block_sums, draw, is_distribution


def greedy_accept(target_argmax: list[int], draft: list[int]) -> tuple[int, int]:
    """Temperature 0: accept while the target's own choice equals the draft token."""
    m = 0
    while m < len(draft) and target_argmax[m] == draft[m]:
        m += 1
    return m, target_argmax[m]


def speculative_accept(
    p: np.ndarray, q: np.ndarray | None, draft: list[int], rng: np.random.Generator
) -> tuple[int, int]:
    """Leviathan et al. 2023 / Chen et al. 2023: the output is distributed exactly as sampling from p.

    # q(d) <= p(d): always accept; otherwise accept with probability p(d) / q(d).
    # First rejection: sample from norm(max(0, p - q)); all accepted: sample the bonus from p[k].
    q is None for a deterministic drafter (a point mass on d): accept with probability p(d),
    and on rejection sample from p with d removed. A q row that is not a probability vector (a broken
    draft: NaN weights) is a rejection with certainty, the token drawn from p itself: still exact.
    """
    for i, d in enumerate(draft):
        if q is not None and not is_distribution(q[i]):
            return i, draw(p[i], rng)
        q_d = 1.0 if q is None else q[i, d]
        if rng.random() * q_d < p[i, d]:
            continue
        residual = _without(p[i], q, i, d)
        blocks = block_sums(residual)
        if blocks.sum() <= 0.0:  # p == q up to rounding: a rejection had probability ~0
            return i, draw(p[i], rng)
        return i, draw(residual, rng, blocks)
    return len(draft), draw(p[len(draft)], rng)


# --- trees: several drafted continuations verified in one target pass --------------------------------
# A tree of n draft nodes: tokens[i] with parents[i] (-1: the last committed token). Target rows p has
# n+1 rows: row 0 after the last committed token, row i+1 after node i. Both rules return (path, token):
# the accepted nodes from the root down, then one token from the target. A chain is the tree
# parents = (-1, 0, 1, ...), on which both rules reduce to the ones above.


def greedy_tree_accept(target_argmax: list[int], tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """Temperature 0: walk down while some child carries the target's own choice."""
    path: list[int] = []
    node = -1
    while True:
        want = target_argmax[node + 1]
        child = next((i for i, d in enumerate(tokens) if parents[i] == node and d == want), None)
        if child is None:
            return path, want
        path.append(child)
        node = child


def multi_draft_accept(
    p: np.ndarray, q: np.ndarray | None, tokens: list[int], parents: list[int], rng: np.random.Generator
) -> tuple[list[int], int]:
    """SpecInfer (Miao et al. 2024) multi-step speculative sampling: the output is distributed exactly as p.

    # At a node, try its children in turn: accept d with probability min(1, r(d) / q_c(d)), r starting at p;
    # on a rejection r <- norm(max(0, r - q_c)). No child accepted: sample from the final r.
    q[c] is the distribution child c was drawn from given its earlier siblings (the draft's q with
    earlier siblings removed), or q is None for point masses (deterministic drafts). A child whose q
    is not a probability vector is rejected with certainty, leaving r as it was: still exact.
    """
    path: list[int] = []
    node = -1
    while True:
        r = p[node + 1]
        for c in (i for i, parent in enumerate(parents) if parent == node):
            d = tokens[c]
            if q is not None and not is_distribution(q[c]):
                continue
            q_d = 1.0 if q is None else q[c, d]
            if rng.random() * q_d < r[d]:
                path.append(c)
                node = c
                break
            residual = _without(r, q, c, d)
            total = float(block_sums(residual).sum())
            if total > 0.0:  # (~0: the rejection had probability ~0)
                residual *= residual.dtype.type(1.0 / total)
                r = residual
        else:
            return path, draw(r, rng)


def _without(r: np.ndarray, q: np.ndarray | None, i: int, d: int) -> np.ndarray:
    """max(0, r - q[i]), unnormalised, a new row: r without draft token d's share (q None: a point mass on d,
    so r with d removed). One subtraction and a clamp in place: a temporary more costs as much over 150k ids."""
    if q is None:
        out = r.copy()
        out[d] = 0.0
        return out
    out = np.subtract(r, q[i])
    return np.maximum(out, 0.0, out=out)
