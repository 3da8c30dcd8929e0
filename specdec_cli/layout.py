"""How a session's contexts are laid out for its slots: one function (`layout`) gives every context's size, its
sequences and its output rows, the target's and the draft's alike, and what each slot gets of them.

A slot gets a whole context's worth of positions (`n_ctx`: -c, or the models' fit) and its own sequences: a tree's
branches in the target's (a recurrent target drafts no tree: its own sequence), a draft model's branches in the
draft's (a recurrent draft also a copy to draft in), one sequence in a draft of the target's hidden states (beside
the target's, as long). The slots share one target context (N x n_ctx cells, N x its sequences), except in exact
mode with several slots, where each has a target context of its own (a shared cache interleaves the requests' cells,
and attention sums a row's cells in the order they lie: docs/exact.md). A step decodes up to MAX_STEP_ROWS slots'
whole verify batches at once; a context of its own, one slot's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .backend.native import Model
from .errors import UsageError
from .options import MAX_BRANCHES, MAX_DRAFT_TOKENS

DEFAULT_SLOTS = 4  # a server's slots where -np is not given and memory allows (llama-server's own default: 4)
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ
MAX_STEP_ROWS = 4  # a step's output room: this many slots' full verify batches (more wait a step)
VERIFY_ROWS = MAX_DRAFT_TOKENS + 1  # a verify batch's rows at most (ModelDrafter caps a tree's nodes so)


@dataclass(frozen=True)
class Shape:
    """A llama.cpp context to open: its cells, sequences and output rows; `count` of them."""

    n_ctx: int
    n_seq: int
    max_outputs: int
    count: int = 1


@dataclass(frozen=True)
class Layout:
    slots: int
    n_ctx: int  # a slot's positions (the target's; the draft model's may be fewer: `draft_n_ctx`)
    draft_n_ctx: int | None
    seqs: tuple[int, int]  # a slot's sequences in the target's context and in the draft's
    snapshots: int  # recurrent-state snapshots per target sequence
    target: Shape
    draft: Shape | None  # a draft model's context (None: none; a hidden-state draft's context is its own: below)

    @property
    def cells(self) -> tuple[int, int]:
        """The target's cells and recurrent states over every slot (what the memory check counts)."""
        return self.slots * self.n_ctx, self.slots * self.seqs[0] * (1 + self.snapshots)

    @property
    def own(self) -> bool:
        """Each slot a target context of its own."""
        return self.target.count > 1

    def base(self, slot: int) -> tuple[int, int]:
        """The slot's first sequence in the target's context and in the draft's."""
        return (0 if self.own else slot * self.seqs[0]), slot * self.seqs[1]


def layout(
    slots: int,
    n_ctx: int,
    draft_n_ctx: int | None,
    target: Model,
    draft: Model | None,
    hidden: bool = False,
    exact: bool = False,
    snapshots: int = 0,
) -> Layout:
    """The contexts for `slots` slots of `n_ctx` positions each (module docstring). `draft`: a draft model (its
    vocab-only facts); `hidden`: the draft reads the target's hidden states instead (one sequence, the target's
    length); `snapshots`: a recurrent target's per sequence (one per draft token it may drop)."""
    seqs = (
        MAX_BRANCHES if target.rollback == "cells" else 1,
        1 if hidden else MAX_BRANCHES if draft is not None and not draft.recurrent else 2,
    )
    if hidden:
        draft_n_ctx = n_ctx
    if slots * max(seqs) + 1 > MAX_SEQUENCES:
        raise UsageError(
            f"--parallel {slots}: {slots} slots of {max(seqs)} sequences each are more than llama.cpp's "
            f"{MAX_SEQUENCES} sequences in one context",
            hint=f"use --parallel {(MAX_SEQUENCES - 1) // max(seqs)} or fewer",
        )
    shared = min(slots, MAX_STEP_ROWS) * VERIFY_ROWS
    if exact and slots > 1:  # (a context of its own decodes one slot's rows at a time)
        shape = Shape(n_ctx, seqs[0], VERIFY_ROWS, count=slots)
    else:
        shape = Shape(slots * n_ctx, slots * seqs[0], shared)
    model = Shape(slots * draft_n_ctx, slots * seqs[1], shared) if draft is not None and not hidden else None
    return Layout(slots, n_ctx, draft_n_ctx, seqs, snapshots, shape, model)
