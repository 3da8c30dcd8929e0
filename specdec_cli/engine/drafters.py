"""Drafters propose the next k tokens. The engine verifies whatever they propose, so none can
change the output; they only change how fast it comes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from .kv import Branches, Sequence
from .sampling import NonFiniteLogits, Sampler, draw, entropy
from .tree import ForkRule, draft_tree


@dataclass(frozen=True, slots=True)
class Draft:
    tokens: list[int]
    q: np.ndarray | None  # (k, n_vocab) draft probabilities when sampled from a model; else None
    source: str = "none"  # the drafter that proposed it: "none" | "lookup" | "model"
    k: int = 0  # the draft length chosen this round (fewer tokens when a match, p-min or the text ran out)
    predicted: float | None = None  # expected tokens this round emits, by the cost model (auto only)
    confidence: tuple[float, ...] = ()  # model: the draft's probability of each token it drafted
    entropy: float | None = None  # model: mean entropy (nats) of its distributions over the drafted tokens
    match: int | None = None  # lookup: the copied stretch it continues (suffix match, or a copy followed through edits)
    notice: str | None = None  # the drafter stopped drafting for good this round, and why (said to the user once)
    # Trees (engine/tree.py): the parent of each token (-1: the last committed token) and, per token,
    # the branches whose path runs through it. None: a chain, the usual case.
    parents: tuple[int, ...] | None = None
    branches: tuple[tuple[int, ...], ...] | None = None

    @property
    def n_branches(self) -> int:
        return 1 if self.branches is None else 1 + max((max(bs) for bs in self.branches if bs), default=0)


EMPTY = Draft([], None)


class Drafter(Protocol):
    name: str

    def prefill(self, tokens: list[int]) -> None: ...

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft: ...

    def observe(
        self, draft: Draft, accepted: int, token: int, verify_seconds: float, draft_seconds: float, path: list[int]
    ) -> None:
        """The round's outcome: `accepted` draft tokens kept (at positions `path` of the draft: 0..accepted-1
        for a chain, a root-to-node path for a tree), then the target's `token`. Learners learn here."""

    def rollback(self, n: int, winner: int = 0) -> None:
        """Back to the committed text's first n tokens; after a tree round, by way of branch `winner`."""

    def check(self, committed: list[int]) -> None: ...


class NoDrafter:
    """Plain target-only decoding, through the same engine, so statistics compare like for like."""

    name = "none"

    def prefill(self, tokens: list[int]) -> None:
        pass

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        return EMPTY

    def observe(
        self, draft: Draft, accepted: int, token: int, verify_seconds: float, draft_seconds: float, path: list[int]
    ) -> None:
        pass

    def rollback(self, n: int, winner: int = 0) -> None:
        pass

    def check(self, committed: list[int]) -> None:
        pass


class ModelDrafter:
    """A small GGUF model in its own context, one decode per drafted token.

    p_min (llama.cpp's semantics): stop drafting when the draft's probability for its own next token
    falls below it; that token is not proposed. branches > 1: draft a tree (engine/tree.py), forking
    where the runner-up token has probability >= p_split.

    Only ids below `vocab` (the target's vocabulary size) are ever proposed: llama.cpp pairs vocabularies
    that differ by up to 128 ids, and the target cannot decode an id it lacks. Dropping them from the
    draft's distribution keeps the acceptance rule exact (q is whatever the draft sampled from).
    A draft whose logits turn non-finite (NaN weights) stops drafting for good: `failed`."""

    name = "model"

    def __init__(
        self, seq: Sequence, p_min: float = 0.0, branches: int = 1, p_split: float = 0.1, max_nodes: int = 63,
        vocab: int | None = None,
    ):  # fmt: skip
        self.tree = Branches(seq)
        self.p_min = p_min
        self.branches = branches
        self.p_split = p_split
        self.max_nodes = max_nodes  # a tree's nodes + 1 must fit the target's output rows
        self.vocab = min(vocab or seq.ctx.n_vocab, seq.ctx.n_vocab)  # ids a draft may propose
        self.failed = False

    @property
    def seq(self) -> Sequence:
        return self.tree.main

    def prefill(self, tokens: list[int]) -> None:
        self.seq.append(tokens)

    def lag(self, committed: list[int]) -> int:
        """Tokens the next draft decode must feed before it can draft (1 when the cache is in step)."""
        return len(committed) - len(self.seq)

    def propose(
        self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator,
        keep_going: Callable[[list[float]], bool] | None = None, fork_pays: ForkRule | None = None,
    ) -> Draft:  # fmt: skip
        """Draft up to k tokens; `keep_going(confidences)` may end the draft early (auto's stopping rule),
        `fork_pays` may veto a fork (auto's cost model)."""
        if self.failed:
            return Draft([], None, self.name, k)
        try:
            if self.branches > 1:
                return self._propose_tree(committed, k, sampler, rng, keep_going, fork_pays)
            return self._propose_chain(committed, k, sampler, rng, keep_going)
        except NonFiniteLogits as e:
            # Nothing drafted from these logits can be trusted; the round goes on as plain decoding.
            self.failed = True
            why = f"draft {self.seq.ctx.model.name} produced non-finite logits ({e}): it no longer drafts; the output is unaffected"
            return Draft([], None, self.name, k, notice=why)

    def _propose_chain(self, committed, k, sampler, rng, keep_going) -> Draft:        # The cache may lag the committed text (after a fully accepted round the draft never saw its own
        # last token; auto may not have drafted for a while): the first decode feeds the whole gap.
        feed = committed[len(self.seq) :]
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        confidence: list[float] = []
        h = 0.0  # summed entropy of the drafted tokens' distributions
        for _ in range(k):
            dist = sampler.dist(self.seq.append(feed)[0][: self.vocab])
            d = int(dist.argmax()) if sampler.greedy else draw(dist, rng)
            if dist[d] < self.p_min:
                break
            tokens.append(d)
            confidence.append(float(dist[d]))
            h += entropy(dist)
            if not sampler.greedy:
                qs.append(dist)
            if self.seq.ctx.model.is_eog(d):  # nothing after the end of the text can be used
                break
            if keep_going is not None and not keep_going(confidence):
                break
            feed = [d]
        return Draft(
            tokens, np.stack(qs) if qs else None, self.name, k, confidence=tuple(confidence),
            entropy=h / len(tokens) if tokens else None,
        )  # fmt: skip

    def _propose_tree(self, committed, k, sampler, rng, keep_going, fork_pays) -> Draft:
        # Near the end of the context a tree must also fit the cache cells left (a chain needs only positions),
        # and with a tiny context, one decode batch.
        ctx = self.seq.ctx
        room = min(self.max_nodes, ctx.n_ctx - len(committed), ctx.n_batch - 1)
        t = draft_tree(
            self.tree, committed, k, sampler, rng, self.branches, self.p_split, self.p_min, fork_pays, keep_going, room,
            self.vocab,
        )  # fmt: skip
        forked = len(t.tips) > 1  # without a fork it is a chain, verified the usual way
        return Draft(
            t.tokens, np.stack(t.q) if t.q else None, self.name, k, confidence=tuple(t.confidence),
            entropy=float(np.mean(t.entropy)) if t.tokens else None,
            parents=tuple(t.parents) if forked else None, branches=t.branches() if forked else None,
        )  # fmt: skip

    def observe(
        self, draft: Draft, accepted: int, token: int, verify_seconds: float, draft_seconds: float, path: list[int]
    ) -> None:
        pass

    def rollback(self, n: int, winner: int = 0) -> None:
        self.tree.settle(winner, n)

    def check(self, committed: list[int]) -> None:
        self.tree.check(committed)

