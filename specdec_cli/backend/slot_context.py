"""One generation's share of a context that several generations use at once (a server's --parallel slots): the
engine's Context protocol over sequences of its own, whose decodes go through the steps (backend/steps.py).

A slot owns the context's sequences base .. base + n_seq - 1 and sees them as 0 .. n_seq - 1, so the engine, its
forks and rollbacks, the prefix cache's scratch sequence, are those of a context of its own; `n_ctx` is its share
of the cells (the pool holds every slot's whole share: one request never runs another out of cells)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable

import numpy as np

from ..option_limits import MAX_DRAFT_TOKENS
from .context import Context, in_one_sequence
from .steps import NORMAL, Left, Part, Steps

MAX_VERIFY = MAX_DRAFT_TOKENS + 1  # a verify batch's rows at most: a decode of more is a prompt's chunk


class SlotContext:
    def __init__(
        self, ctx: Context, steps: Steps, base: int, n_seq: int, n_ctx: int, *, lead: SlotContext | None = None
    ):
        """lead: the slot's target context, where this is its draft's (whose decodes go first, at its priority)."""
        self.ctx, self.steps, self.base, self.n_seq, self.n_ctx, self.lead = ctx, steps, base, n_seq, n_ctx, lead
        self.model, self.n_vocab, self.memory = ctx.model, ctx.n_vocab, ctx.memory
        self.max_rollback, self.can_shift, self.other_backends = ctx.max_rollback, ctx.can_shift, ctx.other_backends
        self.n_batch = min(ctx.n_batch, steps.chunk)  # a prompt goes in chunks of this, between the others' steps
        self.tap = None  # (the target's own heads draft for one generation at a time: not with slots)
        self.priority: Callable[[], int] = lambda: NORMAL
        self.gone: Callable[[], bool] = lambda: False  # its client left: no more decodes (steps.Left)
        self.order = 0  # when its generation started (Steps.order)
        # Its last decode: its own tokens, and the tokens and seconds of the whole step that carried it.
        self.last_step = (0, 0, 0.0)

    @property
    def decode_seconds(self) -> float:
        return self.ctx.decode_seconds

    def decode(self, tokens: list[int], pos0: int, seq_id: int, outputs: str | int) -> np.ndarray:
        return self.decode_tree(tokens, *in_one_sequence(len(tokens), pos0, seq_id, outputs))

    def decode_tree(
        self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], first_out: int = 0
    ) -> np.ndarray:
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch {self.n_batch}")
        if (self.lead or self).gone():
            raise Left("the client left")
        part = Part(
            tokens,
            pos,
            [tuple(self.base + s for s in ss) for ss in seqs],
            first_out,
            prompt=n > MAX_VERIFY,
            target=self.lead is None,
            priority=(self.lead or self).priority(),
            order=(self.lead or self).order,
        )
        self.steps.decode(self.ctx, part)
        self.last_step = (n, part.step_rows, part.step_seconds)
        return part.rows

    def prompt_kernels(self) -> AbstractContextManager[None]:
        return self.ctx.prompt_kernels()  # (exact mode: every slot has a context of its own)

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        return self.ctx.seq_rm(self.base + seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.ctx.seq_cp(self.base + src, self.base + dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        """Every cell of this slot's outside `seq` freed; the other slots' stay."""
        for s in range(self.n_seq):
            if s != seq:
                self.ctx.seq_rm(self.base + s, -1, -1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.ctx.seq_add(self.base + seq, p0, p1, delta)

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        return self.ctx.seq_pos_range(self.base + seq)

    def seq_state(self, seq: int):
        return self.ctx.seq_state(self.base + seq)

    def set_seq_state(self, state: bytearray, seq: int) -> int:
        return self.ctx.set_seq_state(state, self.base + seq)
