"""One generation at a time on the loaded pair, and a bounded queue for the requests that wait for it."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from .body import ApiError
from .jobs import shutting_down


class Gate:
    """One generation at a time on the loaded pair; at most `queue` requests wait for it, the rest get 503."""

    def __init__(self, queue: int):
        self.queue = queue
        self.closing = False
        self._cond = threading.Condition()
        self._busy = False
        self._waiting = 0
        self._seconds = 1.0  # a running mean of how long a generation holds the gate: for Retry-After

    @contextmanager
    def turn(self, admitted: Callable[[], None] = lambda: None) -> Iterator[None]:
        """The generation's turn; `admitted` runs once the request has a place (not refused with 503)."""
        with self._cond:
            if self._busy and self._waiting >= self.queue:
                raise ApiError(
                    503,
                    f"busy: a generation is running and {self._waiting} request(s) wait (the queue holds {self.queue})",
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
            self._busy = True
        t0 = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                self._seconds = 0.8 * self._seconds + 0.2 * (time.monotonic() - t0)
                self._busy = False
                self._cond.notify()

    def _retry_after(self) -> int:
        return max(1, round(self._seconds * (self._waiting + 1)))

    def close(self) -> None:
        """No new generations; waiting requests get 503, the one running ends after its current round."""
        with self._cond:
            self.closing = True
            self._cond.notify_all()
