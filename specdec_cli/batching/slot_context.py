"""One generation's share of a context that several generations use at once (a server's slots): the engine's Context
protocol over sequences of its own, whose decodes go through the steps (rendezvous.py).

A slot owns the context's sequences base .. base + n_seq - 1 and sees them as 0 .. n_seq - 1, so the engine, its
forks and rollbacks, the prefix cache's scratch sequence, are those of a context of its own; `n_ctx` is its share
of the cells (the pool holds every slot's whole share: one request never runs another out of cells). Each part it
hands over says what the policy reads: its slot's state and claim."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable, Protocol

import numpy as np

from ..backend.context import Context, Decoder, Rows, in_one_sequence
from ..engine.context import ALONE, StepFigures
from .claim import Claim, Left, State
from .rendezvous import Part, Steps


class Holder(Protocol):
    """Whose share it is (slots.py's Slot): what its parts say of it, and its state as its decodes move it."""

    claim: Claim
    state: State
    prompt_end: int


class SlotContext:
    def __init__(
        self,
        ctx: Context,
        steps: Steps,
        base: int,
        n_seq: int,
        n_ctx: int,
        slot: Holder,
        draft: bool = False,
        shared: bool = True,
    ):
        """slot: whose share this is (its claim, its state); draft: the share of its draft's context; shared: other
        slots' shares decode in the same context (engine/kv.py's Kept parks what an idle one keeps)."""
        self.ctx, self.steps, self.base, self.n_seq, self.n_ctx = ctx, steps, base, n_seq, n_ctx
        self.slot, self.draft, self.shared = slot, draft, shared
        self.model, self.n_vocab, self.memory = ctx.model, ctx.n_vocab, ctx.memory
        self.max_rollback, self.can_shift, self.other_backends = ctx.max_rollback, ctx.can_shift, ctx.other_backends
        self.n_batch = min(ctx.n_batch, steps.chunk)  # a prompt goes in chunks of this, between the others' steps
        self.last_step: StepFigures = ALONE
        self.after: Callable[[], None] | None = None  # runs after each of its decodes, on its thread (a draft's feed)

    @property
    def decode_seconds(self) -> float:
        return self.ctx.decode_seconds

    def decode(self, tokens: list[int], pos0: int, seq_id: int, outputs: str | int) -> np.ndarray:
        return self.decode_tree(tokens, *in_one_sequence(len(tokens), pos0, seq_id, outputs))

    def decode_tree(
        self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], first_out: int = 0
    ) -> np.ndarray:
        if len(tokens) > self.n_batch:
            raise ValueError(f"batch of {len(tokens)} tokens exceeds n_batch {self.n_batch}")
        part = self._part(Rows(tokens, pos, [tuple(self.base + s for s in ss) for ss in seqs], first_out), self.draft)
        self.steps.decode(self.ctx, part)
        self.last_step = part.figures
        if self.after is not None:
            self.after()
        return part.rows

    def hand(self, decoder: Decoder, rows: Rows):
        """A companion's decode (the target's MTP heads, a draft of its hidden states: `rows` in the slot's own
        sequences of its context), through the steps as the slot's draft; what it gave."""
        part = self._part(rows, True)
        self.steps.decode(decoder, part)
        return part.rows

    def _part(self, rows: Rows, draft: bool) -> Part:
        """The rows as the policy sees them: rows before the prompt's last token read the prompt (the target's or a
        draft's); the target's first rows past them start its generating."""
        slot, claim = self.slot, self.slot.claim
        if claim.left:
            slot.state = State.LEAVING
            raise Left("the client left")
        prompt = min(rows.pos) < slot.prompt_end - 1  # (a draft's window feed reads the prompt too: it takes turns)
        if not prompt and not draft and slot.state is State.PROMPT:
            slot.state = State.GENERATING
        return Part(
            rows.tokens,
            rows.pos,
            rows.seqs,
            rows.first_out,
            rows.embd,
            prompt=prompt,
            ends=prompt and max(rows.pos) >= slot.prompt_end - 2,  # (the last token goes with the first round)
            draft=draft,
            priority=claim.priority,
            order=claim.order,
        )

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
