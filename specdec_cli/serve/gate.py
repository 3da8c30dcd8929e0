"""The loaded pair's slots, and a bounded line of requests that wait for one: first come, first served."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

from ..batching.claim import Claim
from ..batching.slots import Slot
from .body import ApiError
from .jobs import shutting_down


class Gate:
    """The free slots (the one count of them: the session's), and at most `queue` requests waiting in line for one;
    more get 503 with a Retry-After. A freed slot goes to the request at the head of the line, never to one that
    came after it."""

    def __init__(self, slots: list[Slot], queue: int):
        self.queue, self.slots = queue, len(slots)
        self.closing = False
        self._free = list(slots)
        self._line: deque[object] = deque()
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._seconds = 1.0  # a running mean of how long a generation holds a slot: for Retry-After

    @contextmanager
    def admit(
        self, claim: Claim, admitted: Callable[[], None] = lambda: None, reuse: Callable[[Slot], int] = lambda s: 0
    ) -> Iterator[Slot]:
        """A slot for the request, bound to its claim (its ticket: `order`); `admitted` runs once it has a place in
        line (not refused with 503). Of the free slots, the one whose cells serve most of its prompt (`reuse`: a
        chat's next turn finds its last turn's, as llama-server picks a slot by its prompt's similarity), else
        the one free longest. The slot is free again when the block ends."""
        with self._cond:
            if (not self._free or self._line) and len(self._line) >= self.queue:
                raise ApiError(
                    503,
                    f"busy: {self.slots - len(self._free)} generation(s) running and {len(self._line)} request(s) "
                    f"wait (the queue holds {self.queue})",
                    code="queue_full",
                    retry_after=self._retry_after(),
                )
            admitted()
            ticket = object()
            self._line.append(ticket)
            try:
                while not self.closing and not (self._free and self._line[0] is ticket):
                    self._cond.wait()
            finally:
                self._line.remove(ticket)
                self._cond.notify_all()
            if self.closing:
                raise shutting_down()
            slot = max(self._free, key=reuse)  # (ties: the one freed first, whose cells are the oldest)
            self._free.remove(slot)
            claim.order = next(self._tickets)
            slot.bind(claim)
        t0 = time.monotonic()
        try:
            yield slot
        finally:
            with self._cond:
                self._seconds = 0.8 * self._seconds + 0.2 * (time.monotonic() - t0)
                slot.release()
                self._free.append(slot)
                self._cond.notify_all()

    def _retry_after(self) -> int:
        """When a place is likely free: the waiting requests' turns, `slots` at a time, at the mean generation's time."""
        return max(1, round(self._seconds * (len(self._line) + 1) / self.slots))

    def close(self) -> None:
        """No new generations; waiting requests get 503, the ones running end after their current step."""
        with self._cond:
            self.closing = True
            self._cond.notify_all()
