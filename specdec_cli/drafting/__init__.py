"""The drafting strategies, and `build`: the drafter for a run, in one call.

model.py drafts with a small model (a chain is a tree of one branch); lookup.py copies from the text, the
user's instruction (hints.py) and earlier answers (corpus.py, kept on disk by cache.py); auto.py chooses
among them every round by the cost model (cost.py). Adding a drafter: a module here with a `Drafter`
subclass, and one line in DRAFTERS (the command line's choices follow it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..engine.drafter import Drafter, NoDrafter
from ..engine.kv import Sequence
from ..errors import UsageError
from .auto import AutoDrafter
from .corpus import Corpus
from .cost import Costs
from .forced import Forced
from .lookup import LookupDrafter
from .model import ModelDrafter


@dataclass(frozen=True, kw_only=True)
class Sources:
    """What a run can draft from. Costs and the draft's sequence are asked for only by a drafter that uses
    them: measuring the costs takes about a second (and clears the caches), and comes first."""

    k: int | None  # tokens per draft; None: auto (the cost model chooses every round)
    costs: Callable[[], Costs]
    draft: Callable[[], Sequence] | None  # takes the draft model's sequence; None: no draft model loaded
    p_min: float = 0.0
    branches: int = 1  # the draft model's tree: at most this many branches
    p_split: float = 0.1
    max_nodes: int = 63  # a tree's nodes + 1 must fit the target's output rows
    vocab: int | None = None  # the target's vocabulary: ids a draft may propose
    lookup_branches: int = 1  # a lookup tree's leaves (each forks the target's state)
    instruction: str = ""
    corpus: Corpus | None = None  # earlier answers (the lookup cache)
    grammar: Callable[[], Any] | None = None  # a constrained run: the grammar's start state (a new one per call)
    tokenize: Callable[[str], list[int]] = lambda text: []
    piece: Callable[[int], bytes] = lambda token: b""

    def draft_model(self) -> ModelDrafter | None:
        if self.draft is None:
            return None
        grammar = self.grammar() if self.grammar is not None else None  # its rows masked as the target's
        return ModelDrafter(self.draft(), self.p_min, self.branches, self.p_split, self.max_nodes, self.vocab, grammar)

    def lookup(self) -> LookupDrafter:
        return LookupDrafter.for_instruction(self.instruction, self.corpus, self.tokenize, self.piece)

    def auto(self, lookup: bool = True, model: bool = True) -> AutoDrafter:
        costs = self.costs()
        forced = Forced(self.grammar(), self.tokenize, self.piece) if self.grammar is not None else None
        return AutoDrafter(
            costs,
            self.lookup() if lookup else None,
            self.draft_model() if model else None,
            self.lookup_branches,
            forced=forced,
        )


def _model(s: Sources) -> Drafter:
    if s.draft is None:
        raise UsageError("--drafter model needs a draft model", hint="pass --draft PATH")
    # -k auto: the cost model chooses each round's length (and may decode plainly)
    return s.draft_model() if s.k is not None else s.auto(lookup=False)


DRAFTERS: dict[str, Callable[[Sources], Drafter]] = {
    "auto": Sources.auto,
    "model": _model,
    "lookup": lambda s: LookupDrafter() if s.k is not None else s.auto(model=False),
    "none": lambda s: NoDrafter(),
}


def build(name: str, sources: Sources) -> Drafter:
    """The drafter called `name` (one of DRAFTERS) over what the run offers."""
    return DRAFTERS[name](sources)
