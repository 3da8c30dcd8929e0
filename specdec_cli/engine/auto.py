"""`--drafter auto` / `-k auto`: every round, choose plain decoding, lookup or the draft model, and how
many tokens to draft, to maximise expected tokens per second:

    rate(k) = E[tokens | k] / (draft cost(k) + t(k+1)),   E[tokens | k] = 1 + sum_j prod_{i<=j} a_i

with t(n) the measured verify cost (engine/costmodel.py) and a_i each drafter's predicted acceptance,
learned online: lookup's as a function of match length, the draft model's from its own token
probabilities. Plain decoding (k = 0, rate 1 / t(1)) is always a candidate, so auto drafts only
where the model of this machine says it pays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .costmodel import Costs, best_length, expected_tokens
from .drafters import EMPTY, Draft, Drafter, ModelDrafter, Outcome
from .lookup import LookupDrafter
from .sampling import Sampler
from .tree import Tree

# Per-token acceptance priors, by bucket. Two pseudo-observations each: a handful of rounds outweigh them.
PRIOR_STRENGTH = 2.0
LOOKUP_EDGES = (1, 2, 3, 4, 5, 7, 9, 13, 17, 33)  # match-length buckets: [1], [2], ..., [17, 32], [33, ...)
LOOKUP_PRIOR = (0.2, 0.35, 0.45, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85)  # longer matches copy more reliably
CONFIDENCE_EDGES = tuple(i / 10 for i in range(10))  # the draft's probability of its token, in tenths
MODEL_PRIOR = 0.7  # a same-family draft is accepted ~70-90% of the time; explored optimistically (upper bound)


class Buckets:
    """Online acceptance per bucket of a predictor (match length, confidence): Beta counts with a prior."""

    def __init__(self, edges: tuple[float, ...], prior: tuple[float, ...]):
        self.edges = np.asarray(edges, dtype=float)
        self.hits = np.asarray(prior, dtype=float) * PRIOR_STRENGTH
        self.total = np.full(len(prior), PRIOR_STRENGTH)

    def _i(self, x: float) -> int:
        return max(int(np.searchsorted(self.edges, x, side="right")) - 1, 0)

    def mean(self, x: float) -> float:
        i = self._i(x)
        return float(self.hits[i] / self.total[i])

    def observe(self, x: float, accepted: bool) -> None:
        i = self._i(x)
        self.hits[i] += accepted
        self.total[i] += 1


@dataclass
class Rate:
    """One acceptance rate with a Beta prior; `upper` adds one standard deviation (optimism explores)."""

    hits: float = MODEL_PRIOR * PRIOR_STRENGTH
    total: float = PRIOR_STRENGTH

    @property
    def mean(self) -> float:
        return self.hits / self.total

    @property
    def upper(self) -> float:
        m = self.mean
        return min(m + (m * (1 - m) / (self.total + 1)) ** 0.5, 1.0)

    def observe(self, accepted: bool) -> None:
        self.hits += accepted
        self.total += 1


class AutoDrafter(Drafter):
    """Chooses, every round, between plain decoding and the drafters it was given."""

    name = "auto"

    def __init__(self, costs: Costs, lookup: LookupDrafter | None, model: ModelDrafter | None):
        self.costs = costs
        self.lookup = lookup
        self.model = model
        self.lookup_accept = Buckets(LOOKUP_EDGES, LOOKUP_PRIOR)
        self.model_accept = Buckets(CONFIDENCE_EDGES, tuple(e + 0.05 for e in CONFIDENCE_EDGES))  # calibrated
        self.model_rate = Rate()
        self._shadow: tuple[int, int] | None = None  # (match length, lookup's first token) when lookup sat out
        self._decodes = 0  # draft decodes in the last model round, for its cost per token

    def prefill(self, tokens: list[int]) -> None:
        if self.model is not None:
            self.model.prefill(tokens)

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        draft = self._choose(committed, k, sampler, rng)
        notice = self.model.take_notice() if self.model is not None else None  # the model stopped, unasked
        return replace(draft, notice=notice) if notice else draft

    def _choose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        best_rate, choice = 1.0 / self.costs.plain, "none"
        self._shadow = None
        if self.lookup is not None and k > 0:
            length, cont = self.lookup.continuation(committed, k)
            if cont:
                # Token i+1 of the continuation is right if the match, by then L + i tokens long, holds on.
                accept = [self.lookup_accept.mean(length + i) for i in range(len(cont))]
                k_look, rate, e = best_length(accept, self.costs)
                self._shadow = (length, cont[0])
                if k_look and rate > best_rate:
                    best_rate, choice = rate, "lookup"
                    lookup_draft = Draft(cont[:k_look], None, source="lookup", k=k_look, predicted=e, match=length)
        if self.model is not None and not self.model.failed and k > 0:
            a = self.model_rate.upper
            catch_up = self.costs.catch_up(self.model.lag(committed))
            draft_cost = self._model_cost(k, catch_up)
            k_model, rate, _ = best_length([a] * k, self.costs, draft_cost)
            if k_model and rate > best_rate:
                return self._draft_model(committed, k, sampler, rng, catch_up, rate)
        if choice == "lookup":
            self._shadow = None
            return lookup_draft
        return replace(EMPTY, predicted=1.0)

    def _model_cost(self, k: int, catch_up: float) -> np.ndarray:
        """Seconds to draft 1..k tokens with the model: k decodes, the first one also feeding the gap."""
        return catch_up + np.arange(1, k + 1) * (self.costs.draft or 0.0)

    def _draft_model(self, committed: list[int], k: int, sampler: Sampler, rng, catch_up: float, rate: float) -> Draft:
        a_next = self.model_rate.mean

        def keep_going(confidence: list[float]) -> bool:
            # Draft one more token only if the round's expected rate with it beats stopping here.
            accept = [self.model_accept.mean(c) for c in confidence]
            j = len(accept)
            cost = self._model_cost(j + 1, catch_up)
            e = expected_tokens([*accept, a_next])
            stop = e[j] / (cost[j - 1] + self.costs.verify(j + 1))
            more = e[j + 1] / (cost[j] + self.costs.verify(j + 2))
            return more > stop

        def fork_pays(confidence: list[float], runner_up: float, left: int, nodes: int) -> bool:
            # A fork pays for its verify and draft tokens only with the tokens after its first one:
            # where the runner-up is right, the round's correction would have given that one anyway.
            reach = float(np.prod([self.model_accept.mean(c) for c in confidence]))
            gain = reach * self.model_accept.mean(runner_up) * sum(a_next**i for i in range(1, left))
            # The fork's draft tokens ride in batched draft decodes: priced at this hardware's marginal batch cost.
            marginal = self.costs.verify(2) / self.costs.verify(1) - 1.0
            draft = (left - 1) * (self.costs.draft or 0.0) * marginal
            extra = self.costs.verify(nodes + 1 + left) - self.costs.verify(nodes + 1) + draft
            return gain > rate * extra

        tree = self.model.branches > 1
        draft = self.model.propose(committed, k, sampler, rng, keep_going, fork_pays if tree else None)
        if isinstance(
            draft.shape, Tree
        ):  # a tree is verified whole; its batched decodes say little of one token's cost
            self._decodes = 0
            return replace(draft, predicted=self._tree_tokens(draft))
        accept = [self.model_accept.mean(c) for c in draft.confidence]
        # The decodes are spent; verify only the prefix that maximises this round's expected rate.
        spent = catch_up + len(draft.tokens) * (self.costs.draft or 0.0)
        e = expected_tokens(accept)
        rate = e / (spent + np.array([self.costs.verify(j + 1) for j in range(len(accept) + 1)]))
        keep = int(np.argmax(rate))
        self._decodes = len(draft.tokens)
        q = draft.q[:keep] if draft.q is not None and keep else None
        return replace(
            draft, tokens=draft.tokens[:keep], q=q, confidence=draft.confidence[:keep], predicted=float(e[keep]),
            k=keep,
        )  # fmt: skip

    def _tree_tokens(self, draft: Draft) -> float:
        """Expected tokens from a tree round: 1 + the sum over nodes of P(its whole path is accepted)."""
        reach = []
        for i, parent in enumerate(draft.shape.parents):
            reach.append((reach[parent] if parent >= 0 else 1.0) * self.model_accept.mean(draft.confidence[i]))
        return 1.0 + float(sum(reach))

    def observe(self, draft: Draft, outcome: Outcome) -> None:
        n, path = len(draft.tokens), outcome.path
        self.costs.observe_verify(n + 1, outcome.verify_seconds)
        first = draft.tokens[path[0]] if path else outcome.token  # the round's first new token
        if draft.source == "lookup":
            for i in range(min(outcome.accepted + 1, n)):  # every token up to and including the first rejected one
                self.lookup_accept.observe(draft.match + i, i < outcome.accepted)
        elif self._shadow is not None:
            # Lookup sat out, but its first token is checked for free: the target's token is the verdict.
            length, guess = self._shadow
            self.lookup_accept.observe(length, first == guess)
        if draft.source == "model":
            # Checked: the accepted nodes, then every child of the last one (all rejected).
            rejected = draft.shape.children(path[-1] if path else -1, n)
            for i, ok in [(i, True) for i in path] + [(c, False) for c in rejected]:
                self.model_accept.observe(draft.confidence[i], ok)
                self.model_rate.observe(ok)
            if self._decodes:
                self.costs.observe_draft(outcome.draft_seconds / self._decodes)

    def rollback(self, n: int, winner: int = 0) -> None:
        if self.model is not None:
            self.model.rollback(n, winner)

    def check(self, committed: list[int]) -> None:
        if self.model is not None:
            self.model.check(committed)
