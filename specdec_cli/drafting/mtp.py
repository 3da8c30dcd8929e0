"""The target's own draft heads (MTP, NextN): the drafter that reads the target's hidden states.

A head at position p takes (the token at p, the target's hidden state at p - 1) and predicts the token at p + 1
(backend/mtp.py). Its cells must hold the committed text, as the target's do, so every round first feeds the
pairs of the positions committed since the last (the target's own rows of its last verify: nothing is decoded
twice), then the last committed token's pair, whose row gives the first draft token. A model with one head drafts
on from its own hidden state (one decode per token); a model with several chains them, head i drafting token
i + 1, each in its own sequence.

What the heads hold lasts between runs (`HeadCache`, a session's), as the target's cache does; what they are fed
is bounded: the prompt's last PROMPT_ROWS positions (their rows are the target's prefill outputs, so the heads
cost the prefill almost nothing) and then every position the answer commits.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..backend.mtp import HeadSeqs
from ..engine.constraint import Follow, State
from ..engine.drafter import Draft, Drafter
from ..engine.sampling import NonFiniteLogits, Sampler
from .hidden import pick
from .model import FIXED, DraftPolicy

PROMPT_ROWS = 32  # the prompt's last positions the heads are fed: as many target output rows (logits too, ~0.5%
# of a 1,000-token prefill); the heads' attention reaches back that far into the prompt, and over the whole answer
MAX_LAG = 256  # positions the heads may fall behind (rounds without them); further, they start afresh nearer
KEEP = 64  # the target's hidden states kept behind the heads' last position (a run that rolls back a little)


class HeadCache:
    """The heads' cells: the text at positions start..end-1 (the same in every head's sequence), and the target's
    hidden states of recent positions, by position (those the next pairs need)."""

    def __init__(self, heads: HeadSeqs):
        self.heads = heads
        self.start = 0
        self.text: list[int] = []
        self.hidden: dict[int, np.ndarray] = {}

    @property
    def end(self) -> int:
        return self.start + len(self.text)

    def settle(self, n: int, winner: int = 0) -> None:
        """The target's rows since the last call: those of branch `winner` (its sequence id) at positions
        below n are committed text's; the others (rejected draft tokens, losing branches) are dropped."""
        for pos, seqs, rows in self.heads.taken:
            for p, s, row in zip(pos, seqs, rows):
                if p < n and winner in s:
                    self.hidden[p] = row
        self.heads.taken.clear()
        for p in [p for p in self.hidden if p < n - MAX_LAG - 2]:  # never fed in time: `pairs` starts afresh
            del self.hidden[p]

    def begin(self, tokens: list[int]) -> None:
        """A run on `tokens` (the prompt but its last token, decoded by the target now): keep the cells of what
        it shares with the text they hold, and take the prompt's rows."""
        shared = 0
        if self.start <= len(tokens):
            mine, theirs = self.text, tokens[self.start :]
            while shared < min(len(mine), len(theirs)) and mine[shared] == theirs[shared]:
                shared += 1
        if shared == 0:
            self.restart(0)
        else:
            self.heads.forget(self.start + shared)
            del self.text[shared:]
        self.hidden = {p: h for p, h in self.hidden.items() if p < self.end}  # of this text: below its shared end
        self.settle(len(tokens))

    def detach(self) -> None:
        """Its rows of the target's decodes no longer kept (a run that does not draft with the heads)."""
        self.heads.detach()

    def time_one(self) -> float:
        """Seconds per one-token decode of a head (auto's cost of a drafted token until it observes its own); the
        timing empties the heads, so they start afresh."""
        seconds = self.heads.time_one()
        self.restart(0)
        return seconds

    def restart(self, start: int) -> None:
        """Empty every head; the next pair fed is position `start`'s."""
        self.heads.forget(-1)
        self.start, self.text = start, []

    def pairs(self, committed: list[int]) -> tuple[list[int], np.ndarray]:
        """The pairs (token, hidden state before it) of the committed positions the heads lack, as far as the
        target's rows reach; where the heads lag too far, or the rows that would bring them in step are gone
        (a restored cache, a long run of rounds without them), they start afresh where the rows begin."""
        last = len(committed) - 1
        if self.end > last:  # cells of positions the text no longer has (the heads never hold drafts between rounds)
            self.heads.forget(last)
            del self.text[max(last - self.start, 0) :]
        if self.end - 1 not in self.hidden or last - self.end > MAX_LAG:
            held = sorted(p for p in self.hidden if p >= last - MAX_LAG - 1)
            # the newest unbroken stretch's first row (its oldest kept, where there is no gap)
            run = next((p for p in reversed(held) if p - 1 not in self.hidden), held[0] if held else None)
            self.restart((run if run is not None else last) + 1)
        n = 0
        while self.end + n <= last and self.end + n - 1 in self.hidden:
            n += 1
        positions = range(self.end, self.end + n)
        hidden = (
            np.stack([self.hidden[p - 1] for p in positions]) if n else np.zeros((0, self.heads.n_embd), np.float32)
        )
        return [committed[p] for p in positions], hidden

    def fed(self, tokens: list[int]) -> None:
        self.text += tokens
        for p in [p for p in self.hidden if p < self.end - KEEP]:
            del self.hidden[p]

    def check(self, committed: list[int]) -> None:
        """Debug: every head holds exactly positions start..end-1, and their text is the committed text's."""
        from ..engine.kv import KVInvariantError

        want = (self.start, self.end - 1) if self.text else (-1, -1)
        for head in range(self.heads.n):
            if self.heads.pos_range(head) != want:
                raise KVInvariantError(f"MTP head {head} holds positions {self.heads.pos_range(head)}, expected {want}")
        if self.text != committed[self.start : self.end]:
            raise KVInvariantError("MTP heads' cached tokens differ from the committed text")


class MtpDrafter(Drafter):
    """Drafts with the target's NextN heads (`cache`, held between runs). p_min: stop where the head's probability
    for its own next token is below it (llama.cpp's semantics, as the draft model's); a model with chained heads
    drafts at most one token per head. Sampling draws from the head's distribution (q) for the acceptance rule.
    Speaks the draft model's part to auto (`lag`, `opened`, `window`, `failed`): auto weighs it the same way."""

    name = "mtp"
    prompt_rows = PROMPT_ROWS
    window = None  # its cells hold every committed position since it started (nothing to choose)
    opened = True  # its context is the target's companion: no load before its first draft
    follows_target = True  # its cells mirror the target's: a rollback follows the target's winning branch

    def __init__(
        self,
        cache: HeadCache,
        p_min: float = 0.0,
        vocab: int | None = None,
        grammar: State | None = None,
        is_eog=lambda t: False,
    ):
        self.cache = cache
        self.p_min = p_min
        self.vocab = vocab
        self.follow = Follow(grammar) if grammar is not None else None
        self.is_eog = is_eog
        self.failed = False
        self._notice: str | None = None
        cache.heads.attach()  # before the prompt's decode: its last rows are the heads' first

    def loaded(self) -> bool:
        return True

    def time_one(self) -> tuple[float, None, None]:
        """(seconds a head's decode takes, no catch-up or feed figure: they are the target curve's scaled)."""
        return self.cache.time_one(), None, None

    def take_notice(self) -> str | None:
        notice, self._notice = self._notice, None
        return notice

    def prefill(self, tokens: list[int]) -> None:
        self.cache.begin(tokens)
        if self.follow is not None:
            self.follow.prefill(tokens)

    def lag(self, committed: list[int], k: int = 1, size=None) -> int:
        """Pairs the next draft feeds: the positions committed since the heads were last fed (1 in step)."""
        return min(max(len(committed) - self.cache.end, 1), MAX_LAG + 1)  # further behind, they start afresh

    def propose(
        self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator, policy: DraftPolicy = FIXED
    ) -> Draft:
        if self.failed:
            return Draft([], None, source=self.name, k=k, notice=self.take_notice())
        cache, heads = self.cache, self.cache.heads
        tokens, hidden = cache.pairs(committed)
        lag = len(tokens)
        if cache.end + lag < len(committed) or not tokens:  # the rows to draft from are not there yet: feed what is
            if tokens:
                for head in range(heads.n):
                    heads.decode(head, tokens, cache.end, hidden)
                cache.fed(tokens)
            return Draft([], None, source=self.name, k=k, fed=lag)
        k = min(k, heads.n) if heads.n > 1 else k
        try:
            return replace(self._draft(tokens, hidden, committed, k, sampler, rng, policy), fed=lag - 1)
        except NonFiniteLogits as e:
            self.cache.restart(0)  # some heads were fed the pairs, not all: none are trusted
            self.failed = True
            self._notice = (
                f"the MTP heads produced non-finite logits ({e}): they no longer draft; the output is unaffected"
            )
            return Draft([], None, source=self.name, k=k, notice=self.take_notice())

    def _draft(self, tokens, hidden, committed, k, sampler, rng, policy) -> Draft:
        """k tokens at most from the pairs (`tokens`, `hidden`: the last is the last committed token's)."""
        cache, heads = self.cache, self.cache.heads
        first = cache.end  # the pairs' first position
        st = self.follow.at(committed) if self.follow is not None else None
        drafted: list[int] = []
        q: list[np.ndarray] = []
        confidence: list[float] = []
        entropies: list[float] = []
        chain_h: list[np.ndarray] = []
        decodes = 0
        try:
            logits, h = heads.decode(0, tokens, first, hidden)
            decodes += 1
            for i in range(k):
                got = pick(logits[: self.vocab], st, sampler, rng, self.p_min)
                if got is None:
                    break
                d, dist, p, nats = got
                if dist is not None:
                    q.append(dist)
                confidence.append(p)
                drafted.append(d)
                entropies.append(nats)
                chain_h.append(h)
                if i == k - 1 or self.is_eog(d) or not policy.keep_going(confidence):
                    break
                if st is not None:
                    st = st.after(d)
                if heads.n > 1:  # head i + 1 over the pairs and the chain so far
                    chain = np.concatenate([hidden, np.stack(chain_h)])
                    logits, h = heads.decode(i + 1, [*tokens, *drafted], first, chain)
                else:  # the one head on from its own hidden state
                    logits, h = heads.decode(0, [d], first + len(tokens) + i, h[None, :])
                decodes += 1
            for head in range(decodes if heads.n > 1 else heads.n, heads.n):  # heads this round did not reach
                heads.decode(head, tokens, first, hidden)
                decodes += 1
        finally:
            heads.forget(first + len(tokens))  # the drafts' cells go; the pairs are committed text
        cache.fed(tokens)
        return Draft(
            drafted,
            np.stack(q) if q else None,
            source=self.name,
            k=k,
            confidence=tuple(confidence),
            entropy=sum(entropies) / len(entropies) if entropies else None,
            decodes=decodes if drafted else 0,  # every decode this round spent (the cost model's per token)
        )

    def rollback(self, n: int, draft: Draft | None = None, winner: int = 0) -> None:
        self.cache.settle(n, winner)

    def check(self, committed: list[int]) -> None:
        self.cache.check(committed)
