"""The acceptance rules. Pure numpy over token ids and probability rows: no llama.cpp here.

Shapes: k draft tokens; target rows p has k+1 rows (row i checks draft i; row k gives the bonus).
Both rules return (m, token): m draft tokens accepted, then one token from the target, a
correction when m < k or the bonus when m == k. Every round therefore emits m + 1 tokens.
"""

from __future__ import annotations

import numpy as np

from .sampling import draw


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
    and on rejection sample from p with d removed.
    """
    for i, d in enumerate(draft):
        q_d = 1.0 if q is None else q[i, d]
        if rng.random() * q_d < p[i, d]:
            continue
        if q is None:
            residual = p[i].copy()
            residual[d] = 0.0
        else:
            residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0.0:  # p == q up to rounding: a rejection had probability ~0
            residual = p[i]
        return i, draw(residual, rng)
    return len(draft), draw(p[len(draft)], rng)
