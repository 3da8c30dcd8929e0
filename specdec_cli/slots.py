"""Where a generation runs in a session: the contexts it decodes in, what they kept from its last run, its cache_salt.
A command's runs have the session's own (`Session.home`); a server with --parallel N has N slots (`shares`), each a
share of the same contexts (backend/slot_context.py) whose decodes go through the steps (backend/steps.py), and auto
weighs a draft's rows against the rows the others put in the same step (drafting/cost.py's `Loaded`). In exact mode
each slot has a target context of its own: a shared cache interleaves the requests' cells, and attention sums a row's
cells in the order they lie (docs/exact.md), so a row would depend on the others' requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .backend.slot_context import SlotContext
from .backend.steps import Steps
from .drafting.cost import Costs, Loaded
from .engine.context import Context
from .engine.kv import Kept
from .once import Once


@dataclass(eq=False)
class Slot:
    target: Context
    draft: Callable[[], Context] | None  # its draft context, opened at its first draft (None: no draft model)
    kept: Kept
    salt: str | None = None  # the cache_salt of the run whose cells its caches keep (reused by its own)

    def costs(self, get: Callable[[], Costs]) -> Callable[[], Costs]:
        """The costs its auto drafter weighs: with others in its steps, a draft's rows at the step's margin."""
        if isinstance(self.target, SlotContext):
            return lambda: Loaded(get(), self.target)
        return get


def shares(
    n: int,
    targets: list[Context],
    draft: Callable[[], Context] | None,
    steps: Steps,
    n_ctx: int,
    draft_n_ctx: int | None,
    seqs: tuple[int, int],
    kept: Callable[[], Kept],
) -> list[Slot]:
    """One slot per share: of the one target context (sequences i * seqs[0] ...), or of its own (exact mode's), and
    of the draft's context (sequences i * seqs[1] ...)."""
    out = []
    for i in range(n):
        own = len(targets) > 1
        target = SlotContext(targets[i if own else 0], steps, 0 if own else i * seqs[0], seqs[0], n_ctx)
        opened = None
        if draft is not None:
            base = i * seqs[1]
            opened = Once(
                lambda base=base, lead=target: SlotContext(draft(), steps, base, seqs[1], draft_n_ctx, lead=lead)
            )
        out.append(Slot(target, opened, kept()))
    return out
