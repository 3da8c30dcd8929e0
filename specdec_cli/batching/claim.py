"""A request's claim on a slot, and a slot's state: what the steps read of a generation instead of guessing.

A `Claim` is made by the server for a request and bound to its slot in one call (slots.Slot.bind): how soon its
prompt goes (its priority, decided by the dialect that parsed it), its place in line (its ticket at the gate), and
whether it has left. Leaving is told one way, `leave`, by whoever sees it first (its connection gone, a newer
request from the same client, the server stopping); the slot's next decode then raises `Left`, and the run stops
between rounds.

A slot's `State` is llama-server's slot_state: free, reading its prompt, generating, leaving.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field


class Priority(enum.IntEnum):
    URGENT = 0  # waited for at the keyboard: an editor's fill-in-the-middle
    NORMAL = 1  # a chat turn, a completion: an agent's or a script's, in the background


class State(enum.Enum):
    FREE = "free"
    PROMPT = "prompt"  # its target or draft reads the prompt (rows before the prompt's last token)
    GENERATING = "generating"
    LEAVING = "leaving"  # its client left (or the server stops): its next decode raises Left


class Left(Exception):
    """A generation's client left: its next decode is not made (a long prompt stops at its next chunk)."""


@dataclass(eq=False)
class Claim:
    priority: Priority = Priority.NORMAL
    order: int = 0  # its ticket: among equals the earlier goes first
    reason: str | None = None  # why it left: "gone", "superseded", "stopping"
    _left: threading.Event = field(default_factory=threading.Event, repr=False)

    def leave(self, reason: str) -> None:
        """It leaves (the first reason told is kept)."""
        if not self._left.is_set():
            self.reason = reason
            self._left.set()

    @property
    def left(self) -> bool:
        return self._left.is_set()
