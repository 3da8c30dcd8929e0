"""The draft model: a small GGUF in its own context, one decode per drafted token (per depth of a tree).

A chain is a tree of one branch, so there is one drafting loop (`draft_tree`). With --branches N, wherever
the draft's runner-up token has probability >= p_split and fewer than N branches exist, the branch's
sequence is forked (seq_cp: the cells are shared, not copied) and the fork continues from the runner-up.
All branches advance together: one draft decode per depth carries each branch's newest token in its own
sequence, and the target verifies the whole tree in one batch (engine/shapes.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..engine.constraint import Follow, State, best_allowed
from ..engine.drafter import Draft, Drafter
from ..engine.kv import Branches, Sequence
from ..engine.sampling import NonFiniteLogits, Sampler, draw, entropy
from ..engine.shapes import CHAIN, Tree


class DraftPolicy:
    """When a draft stops early and whether a fork pays. This one: never early, wherever p_split allows;
    auto's cost model is another (drafting/auto.py)."""

    def keep_going(self, confidence: list[float]) -> bool:
        """Draft another token after these (the draft's probabilities of the tokens drafted so far)?"""
        return True

    def fork_pays(self, confidence: list[float], runner_up: float, left: int, nodes: int) -> bool:
        """Fork here (confidences along the branch so far, the runner-up's probability, depths left,
        nodes so far)?"""
        return True


FIXED = DraftPolicy()


class ModelDrafter(Drafter):
    """p_min (llama.cpp's semantics): stop drafting when the draft's probability for its own next token
    falls below it; that token is not proposed. max_branches > 1: draft a tree, forking where the
    runner-up token has probability >= p_split.

    Only ids below `vocab` (the target's vocabulary size) are ever proposed: llama.cpp pairs vocabularies
    that differ by up to 128 ids, and the target cannot decode an id it lacks. Dropping them from the
    draft's distribution keeps the acceptance rule exact (q is whatever the draft sampled from).
    A draft whose logits turn non-finite (NaN weights) stops drafting for good: `failed`.

    A constrained run (`grammar`: its state before the first generated token) masks the draft's rows as the
    target's are: its proposals are tokens the grammar allows, and a sampled draft's q is the masked distribution."""

    name = "model"

    def __init__(
        self, seq: Sequence, p_min: float = 0.0, max_branches: int = 1, p_split: float = 0.1, max_nodes: int = 63,
        vocab: int | None = None, grammar: State | None = None,
    ):  # fmt: skip
        self.follow = Follow(grammar) if grammar is not None else None
        self.cache = Branches(seq)  # the draft's sequence, and a tree's forks (or a recurrent state's copy)
        self.p_min = p_min
        self.max_branches = max_branches
        self.p_split = p_split
        self.max_nodes = max_nodes  # a tree's nodes + 1 must fit the target's output rows
        self.vocab = min(vocab or seq.ctx.n_vocab, seq.ctx.n_vocab)  # ids a draft may propose
        self.failed = False
        self._notice: str | None = None  # why it failed, until a round has carried it to the user

    @property
    def seq(self) -> Sequence:
        return self.cache.main

    def prefill(self, tokens: list[int]) -> None:
        if self.follow is not None:
            self.follow.prefill(tokens)
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
        self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator, policy: DraftPolicy = FIXED
    ) -> Draft:
        """Draft up to k tokens; `policy` may end the draft early or veto a fork (auto's cost model)."""
        k = min(k, self.seq.ctx.n_ctx - len(committed) + 1)  # d_k is never decoded: d_k-1 takes the last cell
        if not self.failed and self._readable(committed[len(self.seq) :]) and self._fits(len(committed)):
            try:
                return self._draft(committed, k, sampler, rng, policy)
            except NonFiniteLogits as e:  # nothing drafted from these logits can be trusted
                self._fail(f"produced non-finite logits ({e})")
        # The round goes on as plain decoding.
        return Draft([], None, source=self.name, k=k, notice=self.take_notice())

    def _draft(self, committed: list[int], k: int, sampler: Sampler, rng, policy: DraftPolicy) -> Draft:
        ctx = self.seq.ctx
        # A tree must also fit the cache cells left near the end of the context, and one decode batch; a
        # chain needs only positions (k fits them already).
        room = k if self.max_branches == 1 else min(self.max_nodes, ctx.n_ctx - len(committed), ctx.n_batch - 1)
        t = draft_tree(
            self.cache, committed, k, sampler, rng, max_branches=self.max_branches, p_split=self.p_split,
            p_min=self.p_min, policy=policy, max_nodes=room, vocab=self.vocab,
            state=self.follow.at(committed) if self.follow is not None else None,
        )  # fmt: skip
        forked = len(t.tips) > 1  # without a fork it is a chain, verified the usual way
        return Draft(
            t.tokens, np.stack(t.q) if t.q else None, source=self.name, k=k, confidence=tuple(t.confidence),
            entropy=sum(t.entropy) / len(t.entropy) if t.tokens else None, shape=t.shape() if forked else CHAIN,
            decodes=0 if forked else len(t.tokens),  # a tree's batched decodes say little of one token's cost
        )  # fmt: skip

    def rollback(self, n: int, draft: Draft | None = None, winner: int = 0) -> None:
        if len(self.cache) > 1 and self.max_branches == 1:  # a recurrent draft's copy (draft_tree)
            winner = int(n >= len(self.cache.seqs[1]))  # it holds only accepted tokens: it takes the main's place
        self.cache.settle(winner, n)

    def check(self, committed: list[int]) -> None:
        self.cache.check(committed)


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
    cache: Branches, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator, *,
    max_branches: int = 1, p_split: float = 1.0, p_min: float = 0.0, policy: DraftPolicy = FIXED,
    max_nodes: int = 63, vocab: int | None = None, state: State | None = None,
) -> Nodes:  # fmt: skip
    """Draft a tree at most k deep, with at most max_branches branches (1: a chain) and max_nodes nodes,
    of ids below `vocab`, each allowed by the grammar from `state` on (None: unconstrained); `cache` holds
    the forks afterwards."""
    if k <= 0:
        return Nodes(tips=[-1])
    ctx = cache.main.ctx
    feed = committed[len(cache.main) :]  # the gap the cache lags behind (at least the last token)
    first = cache.main.append(feed)[0][:vocab]
    rows = [first.copy() if max_branches > 1 else first]  # rows[i]: logits after active branch i's newest token
    seqs = {0: cache.main}  # where each branch decodes: a recurrent chain's goes on in a copy (below)
    tree = Nodes(tips=[-1])
    active = [0]
    states = {0: state}  # each branch's grammar state after its newest token
    for depth in range(k):
        spare = max_nodes - len(tree.tokens) - len(active)  # nodes left for forks at this depth
        if spare < 0:  # the verify batch would not fit
            break
        batch: list[tuple[int, int]] = []  # (branch, token) to decode for the next depth
        for b, row in zip(list(active), rows):
            st = states.get(b)
            # Sampling draws from the masked row (q); greedy takes the best allowed token, its confidence
            # (the cost model's predictor) read from the plain row: no whole-vocabulary mask per token.
            dist = sampler.dist(row if st is None or sampler.greedy else st.mask(row))
            # p-min looks at the most likely token, not the sampled one: a stop that depended on the
            # sampled token would change what a proposal is distributed as (greedy: the same token).
            if dist.max() < p_min:  # the branch stops
                active.remove(b)
                continue
            d = draw(dist, rng) if not sampler.greedy else int(dist.argmax()) if st is None else best_allowed(row, st)
            parent = tree.tips[b]
            tree.tips[b] = tree.add(d, parent, None if sampler.greedy else dist, float(dist[d]), entropy(dist))
            candidates = [(b, d)]
            if len(cache) < max_branches and spare > 0:
                rest = dist.copy()
                rest[d] = 0.0
                r = int(rest.argmax()) if st is None or not sampler.greedy else _runner_up(row, d, st)
                if (
                    rest[r] >= p_split and rest[r] > 0
                    and policy.fork_pays([tree.confidence[i] for i in tree.path(parent)], float(rest[r]), k - depth,
                                         len(tree.tokens))
                ):  # fmt: skip
                    # The sibling is drawn from q without the tokens already drafted here (multi_draft_accept).
                    q2 = rest / rest.sum()
                    x = r if sampler.greedy else draw(q2, rng)
                    spare -= 1
                    nb = cache.fork(b)  # shares branch b's cells up to the parent
                    seqs[nb] = cache.seqs[nb]
                    tree.tips.append(tree.add(x, parent, None if sampler.greedy else q2, float(dist[x]), entropy(q2)))
                    active.append(nb)
                    candidates.append((nb, x))
            for br, t in candidates:
                if st is not None and not ctx.model.is_eog(t):
                    states[br] = st.after(t)
                if ctx.model.is_eog(t):  # nothing after the end of the text can be used
                    active.remove(br)
                else:
                    batch.append((br, t))
        if 0 in active and not policy.keep_going([tree.confidence[i] for i in tree.path(tree.tips[0])]):
            break
        if depth == k - 1 or not batch:
            break
        if max_branches == 1:  # a chain: a one-token decode
            (b, t), = batch  # fmt: skip
            if ctx.max_rollback is not None and seqs[0] is cache.main:
                # A recurrent state cannot drop draft tokens from a string of one-token decodes: they go to
                # a copy of it (seq_cp shares it; llama.cpp copies it at the copy's first decode).
                seqs[0] = cache.seqs[cache.fork(0)]
            rows = [seqs[0].append([t])[0][:vocab]]
        else:
            out = cache.decode([t for _, t in batch], [(br,) for br, _ in batch])
            rows = [out[i][:vocab].copy() for i in range(len(batch))]
        active = [br for br, _ in batch]
    return tree


def _runner_up(row: np.ndarray, best: int, state: State) -> int:
    """Greedy: the best token the grammar allows after `best`."""
    rest = row.copy()
    rest[best] = -np.inf
    return best_allowed(rest, state)
