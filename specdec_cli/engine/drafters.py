"""Drafters propose the next k tokens. The engine verifies whatever they propose, so none can
change the output; they only change how fast it comes."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Callable

import numpy as np

from .kv import Branches, Sequence
from .sampling import NonFiniteLogits, Sampler, draw, entropy
from .tree import CHAIN, Chain, ForkRule, Tree, draft_tree


@dataclass(frozen=True, slots=True)
class Draft:
    tokens: list[int]
    q: np.ndarray | None  # (k, n_vocab) draft probabilities when sampled from a model; else None
    _: KW_ONLY  # the rest by name: several share a type, and a swapped pair would pass silently
    source: str = "none"  # the drafter that proposed it: "none" | "lookup" | "model"
    k: int = 0  # the draft length chosen this round (fewer tokens when a match, p-min or the text ran out)
    predicted: float | None = None  # expected tokens this round emits, by the cost model (auto only)
    confidence: tuple[float, ...] = ()  # model: the draft's probability of each token it drafted
    entropy: float | None = None  # model: mean entropy (nats) of its distributions over the drafted tokens
    match: int | None = None  # lookup: the copied stretch it continues (suffix match, or a copy followed through edits)
    notice: str | None = None  # the drafter stopped drafting for good this round, and why (said to the user once)
    shape: Chain | Tree = CHAIN  # how the tokens hang together: a chain, or a tree (engine/tree.py)


EMPTY = Draft([], None)


@dataclass(slots=True, kw_only=True)  # not frozen: one is built every round, and frozen ones build slower
class Outcome:
    """What the target made of a draft: it accepted the draft tokens at `path` (0..m-1 for a chain, the
    nodes from the root down for a tree), then gave its own `token`."""

    path: list[int]
    token: int
    draft_seconds: float
    verify_seconds: float
    sure: bool | None = None  # the target gave its own token >= 90% (speculative.SURE); if wants_confidence

    @property
    def accepted(self) -> int:
        return len(self.path)


class Drafter:
    """What the engine asks of a drafter. Only `propose` has no default: a drafter without a cache or a
    learner has nothing to prefill, observe, roll back or check (HF's CandidateGenerator)."""

    name = "none"
    wants_confidence = False  # Outcome.sure: a pass over one logits row each round (~0.03 ms), only if asked

    def prefill(self, tokens: list[int]) -> None:
        """The prompt but its last token, once, before the first round (a cache may hold a prefix of it)."""

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        """Up to k tokens to follow `committed`."""
        raise NotImplementedError

    def observe(self, draft: Draft, outcome: Outcome) -> None:
        """The round's outcome. Learners learn here."""

    def rollback(self, n: int, winner: int = 0) -> None:
        """Back to the committed text's first n tokens; after a tree round, by way of branch `winner`."""

    def check(self, committed: list[int]) -> None:
        """Debug: raise unless every cache holds a prefix of `committed`."""


class NoDrafter(Drafter):
    """Plain target-only decoding, through the same engine, so statistics compare like for like."""

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        return EMPTY


class ModelDrafter(Drafter):
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
        self._notice: str | None = None  # why it failed, until a round has carried it to the user

    @property
    def seq(self) -> Sequence:
        return self.tree.main

    def prefill(self, tokens: list[int]) -> None:
        if self._readable(tokens) and self._fits(len(tokens) + 1):
            self.seq.append(tokens[len(self.seq) :])  # the cache may hold a prefix already (a server's reuse)

    def _readable(self, tokens: list[int]) -> bool:
        """Whether the draft has every id of `tokens` (the target's vocabulary may be up to 128 ids larger:
        llama.cpp pairs them). If not, it stops drafting for good: it cannot follow the text."""
        top = max(tokens, default=-1)
        if top >= self.seq.ctx.n_vocab:
            self._fail(f"cannot read token {top} of the text (its vocabulary has {self.seq.ctx.n_vocab} ids)")
        return not self.failed

    def _fits(self, n: int) -> bool:
        """Whether a text of n tokens fits the draft's context, which may be shorter than the target's (the
        draft's own trained length). If not, it stops drafting for good: the text only grows."""
        if n > self.seq.ctx.n_ctx:
            self._fail(f"has a context of {self.seq.ctx.n_ctx:,} tokens (as it was trained) and the text outgrew it")
        return not self.failed

    def _fail(self, why: str) -> None:
        self.failed = True
        self._notice = f"draft {self.seq.ctx.model.name} {why}: it no longer drafts; the output is unaffected"

    def take_notice(self) -> str | None:
        """Why drafting stopped, once: the round that carries it to the user clears it."""
        notice, self._notice = self._notice, None
        return notice

    def lag(self, committed: list[int]) -> int:
        """Tokens the next draft decode must feed before it can draft (1 when the cache is in step)."""
        return len(committed) - len(self.seq)

    def propose(
        self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator,
        keep_going: Callable[[list[float]], bool] | None = None, fork_pays: ForkRule | None = None,
    ) -> Draft:  # fmt: skip
        """Draft up to k tokens; `keep_going(confidences)` may end the draft early (auto's stopping rule),
        `fork_pays` may veto a fork (auto's cost model)."""
        k = min(k, self.seq.ctx.n_ctx - len(committed) + 1)  # d_k is never decoded: d_k-1 takes the last cell
        if not self.failed and self._readable(committed[len(self.seq) :]) and self._fits(len(committed)):
            try:
                if self.branches > 1:
                    return self._propose_tree(committed, k, sampler, rng, keep_going, fork_pays)
                return self._propose_chain(committed, k, sampler, rng, keep_going)
            except NonFiniteLogits as e:  # nothing drafted from these logits can be trusted
                self._fail(f"produced non-finite logits ({e})")
        # The round goes on as plain decoding.
        return Draft([], None, source=self.name, k=k, notice=self.take_notice())

    def _propose_chain(self, committed, k, sampler, rng, keep_going) -> Draft:
        # The cache may lag the committed text (after a fully accepted round the draft never saw its own
        # last token; auto may not have drafted for a while): the first decode feeds the whole gap.
        feed = committed[len(self.seq) :]
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        confidence: list[float] = []
        h = 0.0  # summed entropy of the drafted tokens' distributions
        seq = self.seq
        for _ in range(k):
            dist = sampler.dist(seq.append(feed)[0][: self.vocab])
            # p-min looks at the most likely token, not the sampled one: a stop that depended on the
            # sampled token would change what a proposal is distributed as (greedy: the same token).
            if dist.max() < self.p_min:
                break
            d = int(dist.argmax()) if sampler.greedy else draw(dist, rng)
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
            if seq is self.seq and seq.ctx.model.recurrent and len(tokens) < k:
                # A recurrent state cannot drop draft tokens from a string of one-token decodes: they go to
                # a copy of it (seq_cp shares it; llama.cpp copies it at the copy's first decode).
                seq = self.tree.seqs[self.tree.fork(0)]
        return Draft(
            tokens, np.stack(qs) if qs else None, source=self.name, k=k, confidence=tuple(confidence),
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
            t.tokens, np.stack(t.q) if t.q else None, source=self.name, k=k, confidence=tuple(t.confidence),
            entropy=float(np.mean(t.entropy)) if t.tokens else None, shape=t.shape() if forked else CHAIN,
        )  # fmt: skip

    def rollback(self, n: int, winner: int = 0) -> None:
        if len(self.tree) > 1 and self.branches == 1:  # a recurrent draft's copy (_propose_chain)
            winner = int(n >= len(self.tree.seqs[1]))  # it holds only accepted tokens: it takes the main's place
        self.tree.settle(winner, n)

    def check(self, committed: list[int]) -> None:
        self.tree.check(committed)
