"""DFlash (Chen et al. 2026): a block-diffusion draft that proposes a whole block in one decode.

Every committed position's target features are injected into the draft's cache (its keys and values: `inject`).
A round decodes the block [last, MASK x w] at positions n - 1 .. n - 1 + w, attending both ways over the block and
the injected text; the block's row i is the draft's token for position n - 1 + i. The block is always w + 1 rows,
w = -k (at most the trained block less the anchor: llama.cpp clamps it so), whatever the round then keeps of it:
the block's rows attend to each other, so its width is part of what it computes. A DFlash2 draft (a selector over
each row's candidates) gives its block as a lattice, walked from the anchor: the best successor of each choice.
As in llama.cpp's common_speculative_impl_draft_dflash.
"""

from __future__ import annotations

import time

import numpy as np

from ..option_limits import MAX_DRAFT_TOKENS
from .hidden import FeatureCache, HiddenDrafter, Picks


class DFlashCache(FeatureCache):
    def _feed(self, pos0: int, features: np.ndarray, outputs: str) -> None:
        self.ctx.decode(None, np.arange(pos0, pos0 + len(features)), features, "none")


class DFlashDrafter(HiddenDrafter):
    name = "dflash"
    per_round = True

    def __init__(self, cache: DFlashCache, width: int | None = None, **kw):
        """width: the block's mask rows (-k; None: the trained block's, less the anchor)."""
        super().__init__(cache, **kw)
        block = cache.ctx.file.max_draft
        self.width = min(width or block, block, MAX_DRAFT_TOKENS)  # (a verify batch's rows are bounded: options)

    def _draft(self, committed, k, sampler, rng, policy):
        cache, ctx = self.cache, self.cache.ctx
        n = len(committed)
        lag = cache.lag(committed)
        cache.feed(n - 1)
        if cache.end != n - 1:  # rows the target reused and the draft never saw: its cells go on from here
            cache.restart(n - 1)  # (a block must continue them: llama.cpp refuses a batch past a gap)
        w = min(self.width, ctx.n_ctx - n)  # a block past the context's end has no cells: narrower there
        if w < 1:
            return self._drafted(Picks(), k, 0, lag, None)
        t0 = time.perf_counter()
        mask = ctx.file.mask
        ctx.decode([committed[-1]] + [mask] * w, np.arange(n - 1, n + w), None, "lattice" if ctx.dflash2 else "all")
        seconds = time.perf_counter() - t0
        st = self._state(committed)
        k = min(k, w)
        if ctx.dflash2:  # a walk, not a distribution: a deterministic draft (lossless as lookup's are)
            tokens, confidence = self._walk(ctx.lattice(w + 1), k, committed[-1])
            return self._drafted(Picks(tokens, [], confidence, []), k, 1, lag, seconds)
        picks = Picks()
        for i in range(1, k + 1):
            got = self._row(ctx.logits(i), st, sampler, rng)
            if got is None:
                break
            d = picks.add(got)
            if self.is_eog(d) or not policy.keep_going(picks.confidence):
                break
            if st is not None:
                st = st.after(d)
        return self._drafted(picks, k, 1, lag, seconds)

    def _walk(self, lattice: np.ndarray, k: int, anchor: int) -> tuple[list[int], list[float]]:
        """DFlash2's block: row i holds top_k candidate ids, then top_k x top_k transition scores (from each of the
        previous row's candidates; row 1's from the anchor, its first block). Each step takes the best successor of
        the last choice; p_min cuts where that step's softmax puts less on it."""
        top_k = self.cache.ctx.top_k
        tokens, confidence, pred = [], [], 0
        for i in range(1, k + 1):
            row = lattice[i]
            scores = row[top_k + pred * top_k : top_k + (pred + 1) * top_k].astype(np.float64)
            if not np.isfinite(scores).all():
                break
            pred = int(np.argmax(scores))
            p = 1.0 / float(np.exp(scores - scores[pred]).sum())
            if self.p_min > 0 and p < self.p_min:
                break
            token = int(row[pred])
            if not 0 <= token < self.vocab:
                break
            tokens.append(token)
            confidence.append(p)
            if self.is_eog(token):
                break
        return tokens, confidence

    def _decode_once(self) -> None:
        ctx = self.cache.ctx
        block = [0] + [ctx.file.mask] * self.width
        ctx.decode(block, np.arange(len(block)), None, "lattice" if ctx.dflash2 else "all")
