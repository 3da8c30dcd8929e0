"""EAGLE-3 (Li et al. 2025): a one-layer decoder over the target's features, drafting a chain.

The target's layer inputs at three of its layers, side by side, are its features; the draft's encoder (`fc`) maps a
position's features to g. Its decoder at position p takes (the token at p + 1, g[p]) and predicts the token at
p + 2; its own pre-norm state there is the next step's g. So with the text x[0..n) committed (the target has decoded
x[0..n-1)), a round feeds the pairs (x[p+1], g[p]) of the positions not yet fed up to n - 2, the last of which
drafts d1 (the token at n), then (d1, h) at n - 1 drafts d2, and so on: llama.cpp's
common_speculative_impl_draft_eagle3, which keeps the same cells (every committed pair) between rounds.
"""

from __future__ import annotations

import time

import numpy as np

from .hidden import FeatureCache, HiddenDrafter, Picks


class Eagle3Cache(FeatureCache):
    SHIFT = 1  # the cell at p holds (x[p+1], g[p])

    def _feedable(self, n: int) -> int:
        return max(min(n, len(self.text) - 1 - self.end), 0)  # a pair needs its next token

    def _feed(self, pos0: int, features: np.ndarray, outputs: str) -> None:
        """Encode the feature rows of positions pos0.. (one encode) and decode their pairs; `outputs` "last": the last
        pair gives its logits and pre-norm state, decoded alone (llama.cpp's eagle3 graph outputs a batch's first
        rows, whichever are asked for: its loop decodes the pair it drafts from by itself, and so must we)."""
        g = self.ctx.encode(features)
        n = len(g)
        tokens = self.text[pos0 + 1 : pos0 + 1 + n]
        alone = outputs == "last"
        if n > alone:
            self.ctx.decode(tokens[: n - alone], np.arange(pos0, pos0 + n - alone), g[: n - alone], "none")
        if alone:
            self.ctx.decode(tokens[-1:], [pos0 + n - 1], g[-1:], "last")


class Eagle3Drafter(HiddenDrafter):
    name = "eagle3"

    def _draft(self, committed, k, sampler, rng, policy):
        cache, ctx = self.cache, self.cache.ctx
        n = len(committed)
        at = n - 2  # the last position the target has decoded: its g drafts the token after `last`
        if at < 0:
            return self._drafted(Picks(), k, 0, 0, None)
        lag = cache.lag(committed)
        # The pairs not fed yet and this one's, in one decode: its output drafts. Without its row (the target reused
        # its cells) there is nothing to draft from yet.
        if at not in cache.rows or not cache.feed(at + 1, "last") or cache.end != at + 1:
            return self._drafted(Picks(), k, 0, lag, None)
        st = self._state(committed)
        picks, decodes, alone = Picks(), 1, 0.0
        h = ctx.prenorm(-1)
        logits = ctx.logits(-1)
        for i in range(k):
            got = self._row(logits, st, sampler, rng)
            if got is None:
                break
            d = picks.add(got)
            if i == k - 1 or self.is_eog(d) or not policy.keep_going(picks.confidence):
                break
            if st is not None:
                st = st.after(d)
            t0 = time.perf_counter()
            ctx.decode([d], [n - 1 + i], h[None, :], "last")  # (d, its pre-norm state) at the next position
            alone += time.perf_counter() - t0
            decodes += 1
            h, logits = ctx.prenorm(-1), ctx.logits(-1)
        seconds = alone / (decodes - 1) if decodes > 1 else None
        return self._drafted(picks, k, decodes, lag, seconds)

    def _decode_once(self) -> None:
        self.cache.ctx.decode([0], [0], np.zeros((1, self.cache.ctx.n_embd), np.float32), "last")
