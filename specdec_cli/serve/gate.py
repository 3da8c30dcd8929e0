"""The generations the loaded pair runs at once (one, or --parallel N), and a bounded queue for the requests that wait."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from .body import ApiError
from .jobs import shutting_down


class Gate:
    """`slots` generations at a time on the loaded pair; at most `queue` requests wait for one, the rest get 503."""

    def __init__(self, queue: int, slots: int = 1):
        self.queue, self.slots = queue, slots
        self.closing = False
        self._cond = threading.Condition()
        self._running = 0
        self._waiting = 0
        self._seconds = 1.0  # a running mean of how long a generation holds the gate: for Retry-After

    @contextmanager
    def turn(self, admitted: Callable[[], None] = lambda: None) -> Iterator[None]:
        """The generation's turn; `admitted` runs once the request has a place (not refused with 503)."""
        with self._cond:
            if self._busy and self._waiting >= self.queue:
                raise ApiError(
                    503,
                    f"busy: {self._running} generation(s) running and {self._waiting} request(s) wait (the queue holds "
                    f"{self.queue})",
                    code="queue_full",
                    retry_after=self._retry_after(),
                )
            admitted()
            self._waiting += 1
            try:
                while self._busy and not self.closing:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            if self.closing:
                raise shutting_down()
            self._running += 1
        t0 = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                self._seconds = 0.8 * self._seconds + 0.2 * (time.monotonic() - t0)
                self._running -= 1
                self._cond.notify()

    @property
    def _busy(self) -> bool:
        return self._running >= self.slots

    def _retry_after(self) -> int:
        """When a place is likely free: the waiting requests' turns, `slots` at a time, at the mean generation's time."""
        return max(1, round(self._seconds * (self._waiting + 1) / self.slots))

    def close(self) -> None:
        """No new generations; waiting requests get 503, the one running ends after its current round."""
        with self._cond:
            self.closing = True
            self._cond.notify_all()
