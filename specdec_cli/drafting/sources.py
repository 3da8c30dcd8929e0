"""What a run can draft from (`Sources`), assembled from its settings, its target and what the session holds
(`for_run`): the one place a drafter's inputs are put together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..engine.kv import Sequence
from ..errors import SpecdecError
from .auto import AutoDrafter, can_pay
from .corpus import Corpus
from .cost import Costs
from .bridge import Bridge
from .forced import Forced
from .foreign import ForeignDrafter
from .lookup import LookupDrafter, line_ends
from .dflash import DFlashCache, DFlashDrafter
from .eagle3 import Eagle3Drafter
from .hidden import FeatureCache, HiddenDrafter
from .model import ModelDrafter
from .mtp import HeadCache, MtpDrafter
from .prediction import Prediction

DRAFT_WINDOW = 2048  # the draft model's window: the text's first 512 tokens and its last 1,536 (window.py)


@dataclass(frozen=True, kw_only=True)
class Sources:
    """What a run can draft from. Costs and the draft's sequence are asked for only by a drafter that uses
    them: measuring the costs takes about a second (and clears the caches), and comes first; the draft's
    sequence is taken (the draft model loaded, where it was not) at its first draft."""

    k: int | None  # tokens per draft; None: auto (the cost model chooses every round)
    costs: Callable[[], Costs]
    draft: Callable[[], Sequence] | None  # takes the draft model's sequence; None: no draft model
    draft_loaded: Callable[[], bool] = lambda: True  # whether taking it loads nothing (the draft model is loaded)
    heads: Callable[[], HeadCache] | None = None  # the target's MTP heads (opened on first use); None: it has none
    hidden: Callable[[], FeatureCache] | None = None  # an EAGLE-3 or DFlash draft's cache (opened on first use)
    hidden_kind: str | None = None  # its drafter's name ("eagle3", "dflash")
    keep: Callable[[], None] = lambda: None  # keeps the cost curve with a draft's figures auto has just timed
    is_eog: Callable[[int], bool] = lambda token: False
    p_min: float = 0.0
    branches: int = 1  # the draft model's tree: at most this many branches
    p_split: float = 0.1
    max_nodes: int = 63  # a tree's nodes + 1 must fit the target's output rows
    n_ctx: int | None = None  # the target's context (its cells): a tree's nodes take one each (None: unbounded)
    vocab: int | None = None  # the target's vocabulary: ids a draft may propose
    window: int | None = DRAFT_WINDOW  # the draft model's window (None: the whole text)
    max_tokens: int | None = None  # the answer's bound
    lookup_branches: int = 1  # a lookup tree's leaves (each forks the target's state)
    instruction: str = ""
    corpus: Corpus | None = None  # earlier answers (the lookup cache)
    prediction: tuple[int, ...] = ()  # the predicted answer's tokens (OpenAI's `prediction`), tokenized as `tokenize`
    grammar: Callable[[], Any] | None = None  # a constrained run: the grammar's start state (a new one per call)
    tokenize: Callable[[str], list[int]] = lambda text: []
    piece: Callable[[int], bytes] = lambda token: b""
    bridge: Bridge | None = None  # a draft of another vocabulary: the text between its tokens and the target's

    def draft_model(self) -> ModelDrafter | ForeignDrafter | None:
        if self.draft is None:
            return None
        if self.bridge is not None:  # its own ids, every one of them, unmasked: the engine cuts what a grammar rejects
            inner = ModelDrafter(self.draft, self.p_min, window=self.window, loaded=self.draft_loaded, n_ctx=self.n_ctx)
            return ForeignDrafter(inner, self.bridge)
        grammar = self.grammar() if self.grammar is not None else None  # its rows masked as the target's
        return ModelDrafter(
            self.draft,
            self.p_min,
            self.branches,
            self.p_split,
            self.max_nodes,
            self.vocab,
            grammar,
            self.window,
            self.draft_loaded,
            self.n_ctx,
        )

    def mtp(self) -> MtpDrafter | None:
        if self.heads is None:
            return None
        grammar = self.grammar() if self.grammar is not None else None
        return MtpDrafter(self.heads(), self.p_min, self.vocab, grammar, self.is_eog)

    def hidden_drafter(self, lazy: bool = False) -> HiddenDrafter | None:
        """The EAGLE-3 or DFlash drafter (None: no such draft); a DFlash block is -k wide (its trained block at most);
        lazy: fed from its first draft on (auto's)."""
        if self.hidden is None:
            return None
        cache = self.hidden()
        grammar = self.grammar() if self.grammar is not None else None
        kw = dict(p_min=self.p_min, vocab=self.vocab, grammar=grammar, is_eog=self.is_eog, lazy=lazy)
        if isinstance(cache, DFlashCache):
            return DFlashDrafter(cache, self.k, **kw)
        return Eagle3Drafter(cache, **kw)

    def model_source(self, heads: bool = False) -> ModelDrafter | MtpDrafter | HiddenDrafter | None:
        """Auto's model source: the draft where there is one (a draft model, or one that reads the target's hidden
        states) and `heads` does not ask for the heads, else the target's own heads where they open (llama.cpp may
        refuse them a context: auto then drafts without them), else none."""
        if self.hidden is not None and not heads:
            return self.hidden_drafter(lazy=True)
        if self.draft is not None and not heads:
            return self.draft_model()
        try:
            return self.mtp()
        except SpecdecError:
            return None

    def lookup(self) -> LookupDrafter:
        return LookupDrafter.for_instruction(self.instruction, self.corpus, self.tokenize, self.piece, self.predicted())

    def predicted(self) -> Prediction | None:
        """The predicted answer as lookup's first source (a new cursor per drafter); None without one."""
        return Prediction(self.prediction, line_ends(self.piece)) if self.prediction else None

    def auto(self, lookup: bool = True, model: bool = True, heads: bool = False) -> AutoDrafter:
        """heads: the target's heads as the model source even where there is a draft model (mtp -k auto)."""
        costs = self.costs()
        forced = Forced(self.grammar(), self.tokenize, self.piece) if self.grammar is not None else None
        # A draft of the target's hidden states is kept in step from the prompt on, whether it drafts or not: where
        # its figures are known (the kept curve has them) and it cannot pay, it is not even loaded.
        known = self.hidden is not None and not heads and costs.draft_source == self.hidden_kind
        hopeless = known and not can_pay(costs, self.hidden_kind == "dflash")
        source = self.model_source(heads) if model and not hopeless else None
        if isinstance(source, (MtpDrafter, HiddenDrafter)) and costs.use_draft(source.name, source.time_one):
            self.keep()  # its figures, timed once (milliseconds), kept with the curve
        if isinstance(source, HiddenDrafter) and not can_pay(costs, source.per_round):
            source.cache.detach()  # (it would read every row of the target's, the prompt's too, for nothing)
            source = None
        return AutoDrafter(
            costs,
            self.lookup() if lookup else None,
            source,
            self.lookup_branches,
            forced=forced,
            max_tokens=self.max_tokens,
        )


class Settings(Protocol):
    """What of a run's settings its drafters read (options.RunConfig)."""

    draft_tokens: int | None
    p_min: float
    branches: int
    p_split: float
    draft_window: int
    max_tokens: int | None


class Target(Protocol):
    """What of the target model its drafters read (backend/native.Model)."""

    n_vocab: int
    rollback: str

    def is_eog(self, token: int) -> bool: ...
    def piece(self, token: int) -> bytes: ...


def for_run(
    run: Settings,
    target: Target,
    *,
    costs: Callable[[], Costs],
    draft: Callable[[], Sequence] | None,
    draft_loaded: Callable[[], bool],
    heads: Callable[[], HeadCache] | None,
    hidden: Callable[[], FeatureCache] | None = None,
    hidden_kind: str | None = None,
    keep: Callable[[], None] = lambda: None,
    slides: bool,
    tokenize: Callable[[str], list[int]],
    instruction: str,
    corpus: Corpus | None,
    prediction: tuple[int, ...],
    grammar: Callable[[], Any] | None,
    max_nodes: int,
    max_leaves: int,
    n_ctx: int | None = None,
    bridge: Bridge | None = None,
) -> Sources:
    """A run's sources: `slides`, whether the draft's cache can slide over a window of the text (a recurrent state,
    or sliding-window layers of its own, hold the whole text); `max_nodes`, a tree's nodes (its verify batch must fit
    the target's output rows); `max_leaves`, a lookup tree's leaves where the target's cells fork (else a chain)."""
    return Sources(
        k=run.draft_tokens,
        costs=costs,
        draft=draft,
        draft_loaded=draft_loaded,
        heads=heads,
        hidden=hidden,
        hidden_kind=hidden_kind,
        keep=keep,
        is_eog=target.is_eog,
        p_min=run.p_min,
        branches=run.branches,
        p_split=run.p_split,
        max_nodes=max_nodes,
        n_ctx=n_ctx,
        vocab=target.n_vocab,
        window=run.draft_window or None if slides else None,
        max_tokens=run.max_tokens,
        lookup_branches=max_leaves if target.rollback == "cells" else 1,
        instruction=instruction,
        corpus=corpus,
        prediction=prediction,
        tokenize=tokenize,
        grammar=grammar,
        piece=target.piece,
        bridge=bridge,
    )
