"""What the loop asks of a drafter, and what a draft and its verdict carry. Drafters propose the next k
tokens; the engine verifies whatever they propose, so none can change the output, only how fast it comes.
The strategies themselves live in drafting/."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np

from .sampling import Sampler
from .shapes import CHAIN, Chain, Tree


@dataclass(frozen=True, slots=True)
class Draft:
    tokens: list[int]
    q: np.ndarray | None  # (k, n_vocab) draft probabilities when sampled from a model; else None
    _: KW_ONLY  # the rest by name: several share a type, and a swapped pair would pass silently
    # Who drafted the tokens: "none" (plain decoding) | "lookup" | "model" | "mtp" (auto: the one it chose).
    source: str = "none"
    k: int = 0  # the draft length chosen this round (fewer tokens when a match, p-min or the text ran out)
    predicted: float | None = None  # expected tokens this round emits, by the cost model (auto only)
    confidence: tuple[float, ...] = ()  # model: the draft's probability of each token it drafted
    entropy: float | None = None  # model: mean entropy (nats) of its distributions over the drafted tokens
    match: int | None = None  # lookup: the copied stretch it continues (suffix match, or a copy followed through edits)
    notice: str | None = None  # the drafter stopped drafting for good this round, and why (said to the user once)
    shape: Chain | Tree = CHAIN  # how the tokens hang together: a chain, or a tree (engine/shapes.py)
    from_prediction: tuple[int, ...] = ()  # lookup: the indices of the tokens the predicted answer proposed
    # What the round considered, for the drafter's `observe` (so no drafter keeps "this round" in itself):
    offers: tuple[Any, ...] = ()  # auto: lookup's candidates, each learns from the round's text, drafted or not
    decodes: int = 0  # draft-model decodes spent (auto may verify fewer tokens): the draft's cost per token
    fed: int = 0  # tokens of the text the draft model was fed before it drafted (a window, a catch-up); -1: loaded
    # Another tokenizer's draft (drafting/foreign.py): its own tokens decoded this round, the catch-up's included
    # (`tokens` are the target's); None: the draft shares the target's tokens.
    draft_fed: int | None = None
    decode_seconds: float | None = None  # seconds per draft decode, as the drafter timed those that drafted alone
    # Outcome.sure: an exp pass over one logits row (~0.05 ms), asked only where a learner uses it (auto, when
    # lookup offered something: where it offers nothing, most of most answers, the pass is saved).
    wants_confidence: bool = False


EMPTY = Draft([], None)


@dataclass(slots=True, kw_only=True)  # not frozen: one is built every round, and frozen ones build slower
class Outcome:
    """What the target made of a draft: it accepted the draft tokens at `path` (0..m-1 for a chain, the
    nodes from the root down for a tree), then gave its own `token`."""

    path: list[int]
    token: int
    draft_seconds: float
    verify_seconds: float
    sure: bool | None = None  # the target gave its own token >= 90% (speculative.SURE); if the draft asked


class Drafter:
    """What the engine asks of a drafter. Only `propose` has no default: a drafter without a cache or a
    learner has nothing to prefill, observe, roll back or check (HF's CandidateGenerator)."""

    name = "none"
    # The prompt's last tokens whose target rows it reads (their hidden states: drafting/mtp.py): the prompt's
    # decode outputs them (0: its last row alone, as always).
    prompt_rows = 0
    # Its cache mirrors the target's (the MTP heads'): its rollback follows the target's winning branch, whoever
    # drafted the round; else the winner is one of its own branches, where it drafted a tree.
    follows_target = False

    def begin(self, tokens: list[int]) -> int | None:
        """The prompt but its last token, before the target decodes it (a drafter fed the target's rows of it); the
        position from which it needs the target's rows where a reused prefix would leave some out (None: none)."""

    def prefill(self, tokens: list[int]) -> None:
        """The prompt but its last token, once, before the first round (a cache may hold a prefix of it)."""

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        """Up to k tokens to follow `committed`; `rng` draws them where the sampler samples (greedy: None)."""
        raise NotImplementedError

    def observe(self, draft: Draft, outcome: Outcome) -> None:
        """The round's outcome. Learners learn here."""

    def rollback(self, n: int, draft: Draft, winner: int = 0) -> None:
        """Back to the committed text's first n tokens; after a tree round, by way of branch `winner`."""

    def check(self, committed: list[int]) -> None:
        """Debug: raise unless every cache holds a prefix of `committed`."""


class NoDrafter(Drafter):
    """Plain target-only decoding, through the same engine, so statistics compare like for like."""

    def propose(self, committed: list[int], k: int, sampler: Sampler, rng: np.random.Generator) -> Draft:
        return EMPTY
