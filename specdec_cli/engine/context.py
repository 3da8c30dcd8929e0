"""What the loop needs of a model's context: token ids in, logits rows out, and sequences to fork and
cut. backend/context.py's llama.cpp context satisfies it, and so does the tests' fake (a list of ids
per sequence), so the engine is token ids and arithmetic only (tests/test_round_loop.py checks both)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class StepFigures:
    """The decode that carried a context's last rows: more than its own where other requests' rows shared it (a
    server's slots: batching/). What auto weighs a draft's rows against (drafting/cost.py's Loaded)."""

    own: int = 0  # its own tokens
    rows: int = 0  # the decode's tokens, every request's
    seconds: float = 0.0
    stake: int = 1  # the tokens that wait on it: its own next one, each other generating row, a prompt's chunk as one
    teaches: bool = True  # the one part of the decode whose run may learn the decode's cost (once a decode)
    # The others' rows in the step its generation joins next, as this one foretells them (None: this step's): a
    # prompt's last chunk is followed by the one row a step its generation then makes.
    ahead: int | None = None

    @property
    def beside(self) -> int:
        """The rows a draft's rows would be added beside in the next step: the others'."""
        return max(self.rows - self.own, 0) if self.ahead is None else self.ahead


ALONE = StepFigures()


@runtime_checkable
class Model(Protocol):
    name: str  # for messages

    def is_eog(self, token: int) -> bool:
        """An end-of-generation token: nothing after it is output."""
        ...


@runtime_checkable
class Context(Protocol):
    model: Model
    n_ctx: int  # positions
    n_batch: int  # tokens one decode may take
    n_seq: int  # sequences (a tree's branches)
    n_vocab: int
    max_rollback: int | None  # None: any tail of a sequence can go (KV cells); else a recurrent state's snapshots
    can_shift: bool  # cells can be moved to other positions (seq_add): a draft's window can slide
    last_step: StepFigures  # its last decode's

    def decode(self, tokens: list[int], pos0: int, seq_id: int, outputs: str | int) -> np.ndarray:
        """Decode tokens at pos0.. in one sequence; logits rows: "last", "all", or from index i on."""
        ...

    def decode_tree(
        self, tokens: list[int], pos: list[int], seqs: list[tuple[int, ...]], first_out: int = 0
    ) -> np.ndarray:
        """ONE decode of tokens[i] at pos[i] in every sequence of seqs[i]; rows from tokens[first_out] on."""
        ...

    def prompt_kernels(self) -> AbstractContextManager[None]:
        """Exact mode: decode the prompt through the fast kernels meanwhile (elsewhere nothing changes)."""
        ...

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...

    def seq_keep(self, seq: int) -> None: ...

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move the cells of positions [p0, p1) (-1: open end) by `delta` positions (llama.cpp's K-shift)."""
        ...

    def seq_pos_range(self, seq: int) -> tuple[int, int]: ...

    def seq_state(self, seq: int) -> Any:
        """A sequence's cells read out (llama.cpp's state of it); OSError where llama.cpp could not."""
        ...

    def set_seq_state(self, state: Any, seq: int) -> int:
        """A sequence's cells read back from `seq_state`'s; how many bytes llama.cpp read."""
        ...
