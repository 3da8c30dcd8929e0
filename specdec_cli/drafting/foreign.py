"""A draft model of another family, with another tokenizer: it reads the committed text in its own tokens and drafts
text, which the target verifies as its own tokens for that text (bridge.py says how text crosses over).

Underneath it is the draft model's drafter (model.py), unchanged, over the draft's own ids: its window, catch-up,
lazy load and kept cells work as for a sibling draft. Between rounds its cache holds tokens that spell a prefix of
the committed text (checked with --debug); after a round it keeps the longest run of its tokens whose text the target
kept, and the rest of the text is fed in its own tokens when it next drafts.

It drafts greedily whatever the run samples with: its proposal is then a function of the text alone, accepted with
the target's probability of each token (lookup's rule: exactly the target's distribution), and the draft's argmax
is the proposal most likely to be accepted. It drafts a chain: a tree's branches would be texts, each tokenized
for the target apart (drafts.py refuses --branches with it)."""

from __future__ import annotations

import time
from types import EllipsisType

import numpy as np

from ..engine.drafter import Draft, Drafter
from ..engine.kv import KVInvariantError
from ..engine.sampling import Sampler
from .auto import FOREIGN_PRIOR
from .bridge import Bridge
from .model import ModelDrafter
from .tree import FIXED, DraftPolicy

GREEDY = Sampler()
LEARNED_FEED = 8  # a round that fed the draft more (its window, once) says little of what a drafted token costs
LOOKAHEAD = 1  # draft tokens beyond k: the text after the k-th target token fixes it (bridge.proposal)


class ForeignDrafter(Drafter):
    name = "model"
    foreign = True  # (the statistics mark its rounds: drafted and accepted count target tokens)
    prior = FOREIGN_PRIOR  # auto's acceptance before it has seen any

    def __init__(self, inner: ModelDrafter, bridge: Bridge):
        self.inner, self.bridge = inner, bridge
        self._prompt: int | None = None  # the prompt's length, once prefilled
        self._text: list[int] = []  # the draft's ids its cache stands for, in the text's order (head first)
        self._committed: list[int] | None = None  # the engine's committed text during a round it drafted

    # What auto reads of a draft model (drafting/auto.py), the inner one's.
    @property
    def opened(self) -> bool:
        return self.inner.opened

    @property
    def failed(self) -> bool:
        return self.inner.failed

    @property
    def loaded(self):
        return self.inner.loaded

    @property
    def window(self) -> int | None:
        return self.inner.window

    @window.setter
    def window(self, size: int | None) -> None:
        self.inner.window = size

    def take_notice(self) -> str | None:
        return self.inner.take_notice()

    def prefill(self, tokens: list[int]) -> None:
        self._prompt = len(tokens) + 1  # (the prompt's last token comes with the first round)

    def _synced(self, committed: list[int]) -> list[int] | None:
        if self._prompt is None or self.bridge.prompt_len != self._prompt:
            self._prompt = self._prompt or len(committed)
            self.bridge.begin(committed[: self._prompt])
        return self.bridge.sync(committed)

    def _adopt(self) -> None:
        """The cells its cache was opened with (a server's earlier turn: kv.Kept.take kept the longest prefix of its
        prompt it held), in `_text` before any round of its own; a recurrent state's cells are never tokenized again
        (a rollback into them clears it)."""
        if self.inner.opened and not self._text:
            self._text = self.bridge.head[: self.inner.seq.covers]
            if self.inner.seq.ctx.max_rollback is not None:
                self.bridge.lookbehind = 0

    def lag(self, committed: list[int], k: int = 1, size: int | None | EllipsisType = ...) -> int:
        text = self._synced(committed)
        lag = self.inner.lag(text, k, size) if text else 1
        self._adopt()  # (it may have opened it)
        return lag

    def propose(
        self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator, policy: DraftPolicy = FIXED
    ) -> Draft:
        t0 = time.perf_counter()
        text = self._synced(committed)
        if not text or self.inner.failed or not self.inner.open_now():
            return Draft([], None, source=self.name, k=k, notice=self.inner.take_notice())
        self._adopt()
        seq = self.inner.seq
        shared = seq.shared(text)
        if shared >= len(text):  # nothing new to read (the target wrote a token with no text): its last row is gone
            return Draft([], None, source=self.name, k=k)
        self.inner.rollback(shared)
        self._text = text[: seq.covers]  # (a recurrent state rolled back past its snapshots is cleared)
        before, dropped = seq.covers, seq.dropped
        self._committed = committed  # (the engine's list: at rollback it holds what the round kept)
        d = self.inner.propose(text, k + LOOKAHEAD, GREEDY, None, policy)
        self._text = (text + d.tokens)[: seq.covers]
        # Its own tokens decoded: the text's catch-up and its drafting decodes (not what a slid window left out, nor its
        # prompt, whose feed is the prefill's).
        fed = seq.covers - (seq.dropped - dropped) - max(before, len(self.bridge.head))
        tokens, confidence = self.bridge.proposal(d.tokens, d.confidence, k)
        seconds = time.perf_counter() - t0
        return Draft(
            tokens,
            None,
            source=self.name,
            k=k,
            confidence=tuple(confidence),
            entropy=d.entropy,
            notice=d.notice,
            decodes=len(tokens),  # auto prices a drafted target token: the draft's decodes and the text's round trip
            fed=d.fed,
            decode_seconds=seconds / len(tokens) if tokens and 0 <= d.fed <= LEARNED_FEED else None,
            draft_fed=max(fed, 0),
        )

    def rollback(self, n: int, draft: Draft, winner: int = 0) -> None:
        if self._committed is None or not self.inner.opened:
            return
        self.bridge.follow(self._committed)
        self._committed = None
        head = len(self.bridge.head)
        held = self._text[head:] if len(self._text) >= head else []
        keep = head + self.bridge.kept(held, n) if len(self._text) >= head else len(self._text)
        self.inner.rollback(keep)
        self._text = self._text[: min(keep, self.inner.seq.covers)]

    def check(self, committed: list[int]) -> None:
        """Debug: the draft's cache holds the tokens it says (kv.Sequence.check, in its own ids), and they spell the
        draft's prompt and then a prefix of the committed text."""
        if not self.inner.opened:
            return
        self._adopt()
        self.inner.check(self._text)
        head = self.bridge.head
        if self._text[: len(head)] != head[: len(self._text)]:
            raise KVInvariantError("the draft's cache holds other than its prompt")
        self.bridge.follow(committed)
        held = self._text[len(head) :]
        if len(self.bridge.spelled_by(held, self.bridge.clean(self.bridge.text))) != len(held):
            raise KVInvariantError("the draft's cache holds text the target did not keep")
