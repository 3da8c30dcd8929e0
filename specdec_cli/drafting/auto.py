"""`--drafter auto` / `-k auto`: every round, choose plain decoding, lookup or the draft model, and how
many tokens to draft, to maximise expected tokens per second:

    rate(k) = E[tokens | k] / (draft cost(k) + t(k+1)),   E[tokens | k] = 1 + sum_j prod_{i<=j} a_i

with t(n) the measured verify cost (drafting/cost.py: `rate`) and a_i each drafter's predicted
acceptance, learned online: lookup's as a function of match length, the draft model's from its own
token probabilities. Plain decoding (k = 0, rate 1 / t(1)) is always a candidate, so auto drafts only
where the model of this machine says it pays. The whole decision is `AutoDrafter.propose`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

import numpy as np

from ..engine.drafter import EMPTY, Draft, Drafter, Outcome
from ..engine.sampling import Sampler
from ..engine.shapes import CHAIN, Tree
from .cost import Costs, best_length, best_tree, expected_tokens, rate
from .forced import Forced
from .lookup import Candidate, LookupDrafter
from .model import DraftPolicy, ModelDrafter
from .hidden import HiddenDrafter
from .mtp import MtpDrafter
from .window import MIN_WINDOW

# Per-token acceptance priors, by bucket. Two pseudo-observations each: a handful of rounds outweigh them.
PRIOR_STRENGTH = 2.0
LOOKUP_EDGES = (1, 2, 3, 4, 5, 7, 9, 13, 17, 33)  # match-length buckets: [1], [2], ..., [17, 32], [33, ...)
LOOKUP_PRIOR = (0.2, 0.35, 0.45, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85)  # longer matches copy more reliably
# The other candidates (lookup.Candidate.source), same buckets: another occurrence is the copy's runner-up;
# an edited line's next source line is about even; an earlier answer needs a long match to be trusted (a
# run whose requests do not repeat must not pay for the cache: it drafts from it only once it has been right).
# The predicted answer (drafting/prediction.py; bucket: the stretch followed since its cursor was anchored) is the
# user's word that the answer repeats it: trusted from its first token, more than any copy the text offers.
SOURCE_PRIORS = {
    "prediction": (0.6, 0.7, 0.75, 0.8, 0.85, 0.85, 0.9, 0.9, 0.9, 0.95),
    "copy": LOOKUP_PRIOR,
    "line-copy": (0.5, 0.6, 0.7, 0.75, 0.8, 0.8, 0.85, 0.85, 0.9, 0.9),
    "other": (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55),
    "line": (0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85),
    "cache": (0.05, 0.05, 0.1, 0.15, 0.2, 0.25, 0.35, 0.45, 0.55, 0.65),
}
# What a grammar forces (drafting/forced.py), a bucket per kind (forced.SURE .. END): the grammar is sure (the
# model may split it otherwise); optional whitespace as the answer wrote it after the same character every time
# before, after its one time before, a guess; the end of the text where the grammar may end; the last token
# before a choice of closing characters (the model may write it merged with the one it chooses).
GRAMMAR_KINDS = (1, 2, 3, 4, 5, 6)
GRAMMAR_PRIOR = (0.95, 0.92, 0.75, 0.4, 0.7, 0.5)
PROMISE_PRIOR = 8.0  # tokens: a dozen rounds of broken promises halve a source's; one wrong draft does not
HOT_PRIOR = 0.3  # a token at a likely edit point (lookup.Candidate.hot)
CONFIDENCE_EDGES = tuple(i / 10 for i in range(10))  # the draft's probability of its token, in tenths
MODEL_PRIOR = 0.7  # a same-family draft is accepted ~70-90% of the time; explored optimistically (upper bound)
# Another family's draft, through text (drafting/foreign.py): where the two split a word apart it costs a token, and
# what it would write is its family's (README: SmolLM2-135M 67%, Gemma 3 270M 43% for Qwen2.5-Coder-1.5B).
FOREIGN_PRIOR = 0.35
ANSWER = 256  # tokens an answer may still run to when the run sets no bound (it pays back a draft's prefill)


class Buckets:
    """Online acceptance per bucket of a predictor (match length, confidence): Beta counts with a prior."""

    # Plain lists and bisect: asked dozens of times a round (every candidate token), numpy's per-call cost
    # would be most of the round's bookkeeping.
    def __init__(self, edges: tuple[float, ...], prior: tuple[float, ...]):
        self.edges = list(edges)
        self.hits = [p * PRIOR_STRENGTH for p in prior]
        self.total = [PRIOR_STRENGTH] * len(prior)

    def _i(self, x: float) -> int:
        return max(bisect.bisect_right(self.edges, x) - 1, 0)

    def mean(self, x: float) -> float:
        i = self._i(x)
        return self.hits[i] / self.total[i]

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


@dataclass
class Promise:
    """How much of what a source promised came: the extra tokens (beyond the one every round emits) its chosen
    rounds realised over those predicted, with a prior of PROMISE_PRIOR tokens kept. Predictions of the
    chosen are optimistic (the best of several estimates is chosen because it is high): this scales them."""

    predicted: float = PROMISE_PRIOR
    realised: float = PROMISE_PRIOR

    def observe(self, predicted: float, emitted: int) -> None:
        self.predicted += max(predicted - 1.0, 0.0)
        self.realised += emitted - 1

    @property
    def kept(self) -> float:
        return min(self.realised / self.predicted, 1.0)


def can_pay(costs: Costs, block: bool, k: int = 16) -> bool:
    """Whether drafting with a model source beats plain decoding on this curve at the acceptance auto expects of it
    before it has seen any (MODEL_PRIOR, a same-family draft's). A source that costs to keep in step whether it drafts
    or not (one fed every row of the target's, the prompt's included) is kept only where it does: exploring it
    optimistically, as auto explores a draft model (whose prompt waits until it drafts), would cost every run its
    prompt's feed for drafts that then rarely pay."""
    n, _, _ = best_length([MODEL_PRIOR] * k, costs, costs.drafting(k, 0.0, block))
    return n > 0


class AutoDrafter(Drafter):
    """Chooses, every round, between plain decoding and the drafters it was given. Its state is what it
    has learned (acceptance, costs); what a round considered travels in the Draft (`offers`, `decodes`)."""

    name = "auto"

    def __init__(
        self,
        costs: Costs,
        lookup: LookupDrafter | None,
        draft_model: ModelDrafter | MtpDrafter | HiddenDrafter | None,
        max_branches: int = 1,
        forced: Forced | None = None,
        max_tokens: int | None = None,
    ):
        self.costs = costs
        self.max_tokens = max_tokens  # the answer's bound: what is left of it pays back the draft model's prefill
        self._prompt = 0
        # The model source: the draft model, or the target's own heads (drafting/mtp.py), by its Draft.source.
        self.model_source = draft_model.name if draft_model is not None else "model"
        self.promises = {"lookup": Promise(), self.model_source: Promise()}  # by Draft.source
        self.lookup = lookup
        self.forced = forced  # a constrained run: what its grammar forces next, one more candidate
        self.draft_model = draft_model
        self.max_branches = max_branches  # a lookup tree's leaves: one target sequence each
        # Per source, and per the target's confidence in its last token: where it hesitated, the answer is
        # choosing its words (prose, an edit) and copies less; where it was sure, it is most likely copying.
        self.source_accept = {
            (source, sure): Buckets(LOOKUP_EDGES, prior) for source, prior in SOURCE_PRIORS.items() for sure in (0, 1)
        } | {("grammar", sure): Buckets(GRAMMAR_KINDS, GRAMMAR_PRIOR) for sure in (0, 1)}
        self._sure = 1  # the target gave its last token >= 90% (Outcome.sure): lookup's chances are learned apart
        self.hot_rate = Rate(HOT_PRIOR * PRIOR_STRENGTH)
        self.model_accept = Buckets(CONFIDENCE_EDGES, tuple(e + 0.05 for e in CONFIDENCE_EDGES))  # calibrated
        self.model_rate = Rate(getattr(draft_model, "prior", MODEL_PRIOR) * PRIOR_STRENGTH)

    @property
    def prompt_rows(self) -> int:
        return self.draft_model.prompt_rows if self.draft_model is not None else 0

    def begin(self, tokens: list[int]) -> int | None:
        return self.draft_model.begin(tokens) if self.draft_model is not None else None

    def prefill(self, tokens: list[int]) -> None:
        self._prompt = len(tokens) + 1
        if self.draft_model is not None:
            self.draft_model.prefill(tokens)  # (its grammar: the model itself is fed only where it drafts)
        if self.forced is not None:
            self.forced.prefill(tokens)

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        """The draft with the best expected tokens per second: plain decoding's, lookup's best tree of its
        candidates, or the draft model's best chain (or tree) at its learned acceptance. A tie goes to the
        cheaper: plain decoding, then lookup."""
        offers = self.lookup.candidates(committed, k) if self.lookup is not None and k > 0 else []
        forced = self.forced.candidate(committed, k) if self.forced is not None and k > 0 else None
        if forced is not None:  # first: where it and a copy agree, the trie keeps the grammar's chance
            offers = [forced, *(c for c in offers if c.tokens != forced.tokens)]
        best, draft = rate(1.0, 0.0, self.costs, 0), replace(EMPTY, predicted=1.0)  # plain decoding
        if offers:
            lookup_rate, lookup_draft = self._lookup_tree(offers, k)
            if lookup_rate > best:
                best, draft = lookup_rate, lookup_draft
        model = self.draft_model
        if model is not None and not model.failed and k > 0:
            policy = self._model_pays(committed, k, best)
            if policy is not None:
                draft = self._draft_model(committed, k, sampler, rng, policy)
        notice = model.take_notice() if model is not None else None  # the model stopped, unasked
        if offers or notice:  # every offer learns from the round (observe); the target's confidence helps
            draft = replace(draft, offers=tuple(offers), wants_confidence=bool(offers), notice=notice or draft.notice)
        return draft

    def _model_pays(self, committed: list[int], k: int, best: float) -> CostPolicy | None:
        """The draft model's round, where it pays: first at its optimistic acceptance as if its cache were in
        step, against the best other offer; then what bringing it in step costs (loading it, its window's
        prefill, a catch-up after rounds it did not draft in) must be paid back by this round, or by the rest
        of the answer at its learned acceptance (there the window is the largest that pays, MIN_WINDOW at least)."""
        costs, model, kept = self.costs, self.draft_model, self.promises[self.model_source].kept
        block = getattr(model, "per_round", False)  # DFlash: one decode drafts them all
        # Optimism explores alone; beside others its cost is theirs too: there the draft is priced at what is known
        # of it (4 clients each explored a draft that did not pay at the bound's 0.96: 0.91x the old server's rate).
        hope = (self.model_rate.mean if costs.shared else self.model_rate.upper) * kept
        k_warm, warm, _ = best_length([hope] * k, costs, costs.drafting(k, 0.0, block))
        if not k_warm or warm <= best:
            return None
        spend = self._spend(committed, k, model.window)
        k_now, now, _ = best_length([hope] * k, costs, costs.drafting(k, spend, block))
        if k_now and now > best:
            return CostPolicy(costs, self.model_accept, self.model_rate.mean, spend, now, block)
        if costs.shared:
            # Not amortised beside others' rows: the rest of the answer does not run at this step's prices (a chunk
            # of another's prompt beside it makes a draft look cheap; its prompt is read in a few steps). An editor's
            # /infill fed its 1,551-token window into the draft beside a chat prompt's chunks, each feed a step of
            # its own, and its 16 tokens took 36 s against 12 s alone.
            return None
        # Amortised: the seconds the rest of the answer saves, drafted at the learned acceptance, not plain.
        _, learned, _ = best_length([self.model_rate.mean * kept] * k, costs, costs.drafting(k, 0.0, block))
        left = (self.max_tokens or ANSWER) - (len(committed) - self._prompt)
        saving = left * (costs.plain - 1.0 / learned)
        size = model.window
        while spend > saving and not model.opened and size is not None and size // 2 >= MIN_WINDOW:
            size //= 2  # a smaller window: less to prefill, drafts a little less often right
            spend = self._spend(committed, k, size)
        if spend > saving:
            return None
        if not model.opened:
            model.window = size
        return CostPolicy(costs, self.model_accept, self.model_rate.mean, 0.0, warm, block)

    def _spend(self, committed: list[int], k: int, size: int | None) -> float:
        """Seconds to bring the draft model in step before it drafts: its load (if not loaded yet) and the
        decode that feeds what its window (of `size`) lacks, beyond the one-token decode of any draft."""
        model, costs = self.draft_model, self.costs
        load = 0.0 if model.opened or model.loaded() else costs.draft_load or 0.0
        gap = model.lag(committed, k, size)
        feed = model.feed_seconds(costs, gap) if isinstance(model, HiddenDrafter) else costs.catch_up(gap)
        return load + feed

    def _lookup_tree(self, offers: list[Candidate], k: int) -> tuple[float, Draft | None]:
        """(rate, draft): every candidate a node of one tree, as wide as this machine's cost curve says pays
        (k nodes at most: the engine's k already fits the context, the batch and the token budget)."""
        scored = [(c.tokens, self._chances(c)) for c in offers]
        tokens, parents, e, tree_rate = best_tree(scored, self.costs, k, self.max_branches, k)
        if not tokens:
            return 0.0, None
        shape = Tree.of(parents) if len(set(parents)) < len(parents) else CHAIN
        depth = shape.depth() if isinstance(shape, Tree) else len(tokens)
        mine = next((_nodes(tokens, parents, c.tokens) for c in offers if c.source == "prediction"), ())
        draft = Draft(tokens, None, source="lookup", k=depth, predicted=e, match=offers[0].match, shape=shape)
        return tree_rate, replace(draft, from_prediction=mine)

    def _chances(self, c: Candidate) -> list[float]:
        """Token i of a candidate is right if its match, by then match + i tokens long, holds on; at a
        likely edit point, with the chance learned for those. A copy's first token's chance is scaled by how much
        of its promises lookup kept (every node's reach, and so the extra tokens, scale with it)."""
        buckets = self.source_accept[c.source, self._sure]
        chances = [self.hot_rate.mean if i == c.hot else buckets.mean(c.bucket(i)) for i in range(len(c.tokens))]
        if chances and c.source != "grammar":  # (what a grammar forces is not a guess that promises too much)
            chances[0] *= self.promises["lookup"].kept
        return chances

    def _draft_model(self, committed: list[int], k: int, sampler: Sampler, rng, policy: CostPolicy) -> Draft:
        draft = self.draft_model.propose(committed, k, sampler, rng, policy)
        if isinstance(draft.shape, Tree):  # a tree is verified whole
            return replace(draft, predicted=self._tree_tokens(draft))
        accept = [self.model_accept.mean(c) for c in draft.confidence]
        # The decodes are spent; verify only the prefix that maximises this round's expected rate.
        spent = policy.catch_up + draft.decodes * (self.costs.draft or 0.0)
        e = expected_tokens(accept)
        keep = int(np.argmax(rate(e, spent, self.costs, np.arange(len(accept) + 1))))
        q = draft.q[:keep] if draft.q is not None and keep else None
        return replace(
            draft,
            tokens=draft.tokens[:keep],
            q=q,
            confidence=draft.confidence[:keep],
            predicted=float(e[keep]),
            k=keep,
        )

    def _tree_tokens(self, draft: Draft) -> float:
        """Expected tokens from a tree round: 1 + the sum over nodes of P(its whole path is accepted)."""
        reach = []
        for i, parent in enumerate(draft.shape.parents):
            reach.append((reach[parent] if parent >= 0 else 1.0) * self.model_accept.mean(draft.confidence[i]))
        return 1.0 + float(sum(reach))

    def observe(self, draft: Draft, outcome: Outcome) -> None:
        n, path = len(draft.tokens), outcome.path
        self.costs.observe_verify(n + 1, outcome.verify_seconds)
        if n and draft.predicted is not None and draft.source in self.promises:
            self.promises[draft.source].observe(draft.predicted, len(path) + 1)
        # Every candidate lookup offered learns from the text the round produced, drafted or not: the
        # target's tokens are the verdict on each one's tokens up to and including its first wrong one.
        produced = [*(draft.tokens[i] for i in path), outcome.token]
        for c in draft.offers:
            right = 0
            while right < min(len(c.tokens), len(produced)) and c.tokens[right] == produced[right]:
                right += 1
            for i in range(min(right + 1, len(c.tokens), len(produced))):
                if i == c.hot:
                    self.hot_rate.observe(i < right)
                else:
                    self.source_accept[c.source, self._sure].observe(c.bucket(i), i < right)
        self._sure = int(outcome.sure is None or outcome.sure)
        if draft.source == self.model_source:
            # Checked: the accepted nodes, then every child of the last one (all rejected).
            rejected = draft.shape.children(path[-1] if path else -1, n)
            for i, ok in [(i, True) for i in path] + [(c, False) for c in rejected]:
                self.model_accept.observe(draft.confidence[i], ok)
                self.model_rate.observe(ok)
            # A round that loaded the draft model, or fed it a window, says little of what a token costs; a drafter
            # that times its own decodes (those that drafted alone) says exactly.
            if draft.decode_seconds is not None:
                self.costs.observe_draft(draft.decode_seconds)
            elif draft.decodes and 0 <= draft.fed <= 1:
                self.costs.observe_draft(outcome.draft_seconds / draft.decodes)

    def rollback(self, n: int, draft: Draft, winner: int = 0) -> None:
        if self.draft_model is not None:
            # A lookup tree's branches live in the target's context only: the draft has just its main sequence
            # (the heads, which mirror the target's cache, follow its winner whoever drafted).
            mine = draft.source == self.model_source or self.draft_model.follows_target
            self.draft_model.rollback(n, draft, winner if mine else 0)

    def check(self, committed: list[int]) -> None:
        if self.draft_model is not None:
            self.draft_model.check(committed)


def _nodes(tokens: list[int], parents: list[int], path: list[int]) -> tuple[int, ...]:
    """The nodes of a draft tree (its tokens, each with its parent) that spell a prefix of `path`."""
    out, node = [], -1
    for t in path:
        node = next((i for i, (u, p) in enumerate(zip(tokens, parents)) if p == node and u == t), None)
        if node is None:
            break
        out.append(node)
    return tuple(out)


class CostPolicy(DraftPolicy):
    """The draft model's stopping and forking rules for one round, by the cost model: `catch_up` is the
    extra cost of its first decode, `chosen` the rate that drafting was chosen for, `a_next` the chance
    of a token not yet drafted."""

    reads_confidence = True

    def __init__(
        self, costs: Costs, accept: Buckets, a_next: float, catch_up: float, chosen: float, block: bool = False
    ):
        self.costs, self.accept, self.a_next, self.catch_up, self.chosen = costs, accept, a_next, catch_up, chosen
        self.block = block  # the draft's tokens come from one decode (DFlash): another costs only its verify

    def keep_going(self, confidence: list[float]) -> bool:
        """Draft one more token only if the round's expected rate with it beats stopping here."""
        accept = [self.accept.mean(c) for c in confidence]
        j = len(accept)
        cost = self.costs.drafting(j + 1, self.catch_up, self.block)
        e = expected_tokens([*accept, self.a_next])
        return rate(e[j + 1], cost[j], self.costs, j + 1) > rate(e[j], cost[j - 1], self.costs, j)

    def fork_pays(self, confidence: list[float], runner_up: float, left: int, nodes: int) -> bool:
        """A fork pays for its verify and draft tokens only with the tokens after its first one: where the
        runner-up is right, the round's correction would have given that one anyway."""
        reach = float(np.prod([self.accept.mean(c) for c in confidence]))
        gain = reach * self.accept.mean(runner_up) * sum(self.a_next**i for i in range(1, left))
        # The fork's draft tokens ride in batched draft decodes: priced at this hardware's marginal batch cost.
        marginal = self.costs.verify(2) / self.costs.verify(1) - 1.0
        draft = (left - 1) * (self.costs.draft or 0.0) * marginal
        extra = self.costs.verify(nodes + 1 + left) - self.costs.verify(nodes + 1) + draft
        return gain > self.chosen * extra
