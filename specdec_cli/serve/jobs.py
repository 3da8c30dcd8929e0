"""A generation handed from a connection's thread to the engine's (Job), and whether a newer request from the same
client has superseded it (Newest)."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

from .. import ui
from ..signals import INTERRUPTS
from ..backend.steps import NORMAL
from ..slots import Slot
from .body import ApiError


def shutting_down(detail: str = "") -> ApiError:
    return ApiError(503, "the server is shutting down" + detail, code="shutting_down")


END = object()
MAX_CLIENTS = 256  # the clients whose newest request is remembered (the least recent forgotten)


class Newest:
    """Whether a newer request from the same client has come since this one (an editor asks again at every
    keystroke, and only the newest answer is shown): then this one, waiting or running, is superseded. Called, it
    says so; `arrive`, when the request has its place in the queue (under the gate's lock), makes it the newest."""

    def __init__(self, latest: dict[str, object], client: str | None):
        self.latest, self.client = latest, client

    def arrive(self) -> None:
        if self.client is not None:
            self.latest.pop(self.client, None)  # (re-inserted last: the least recent client is the first key)
            self.latest[self.client] = self
            if len(self.latest) > MAX_CLIENTS:
                del self.latest[next(iter(self.latest))]

    def __call__(self) -> bool:  # a forgotten client's request is not superseded
        return self.client is not None and self.latest.get(self.client, self) is not self


class Job:
    """One generation handed from a connection's thread to the engine's: items flow back through `out`."""

    def __init__(self, items: Callable[[Callable[[], bool]], Iterator]):
        self.items = items
        self.out: queue.Queue = queue.Queue()
        self.cancel = threading.Event()  # the connection gave up: stop after the current round
        self.done = threading.Event()
        self.urgency = NORMAL  # --parallel: how soon its prompt goes (pool.priority)
        self.slot: Slot | None = None  # --parallel: where it runs (given when it starts)

    def execute(self, release: Callable[[], None] = lambda: None) -> None:
        """Run it; `release` runs once it is over, before anyone waiting for it hears so (its slot is free again
        before the gate lets the next request in)."""
        try:
            if self.cancel.is_set():  # its client left while it waited: nothing to generate for
                return
            for item in self.items(self.cancel.is_set):
                self.out.put(item)
        except ApiError as e:
            self.out.put(e)
        except INTERRUPTS:
            self.out.put(shutting_down(": generation stopped"))
            ui.note("a generation in progress was cut, its caches rolled back")
            raise
        except Exception as e:  # a bug: the connection answers 500, the server goes on
            self.out.put(e)
        finally:
            release()
            self.out.put(END)
            self.done.set()

    def refuse(self, error: ApiError) -> None:
        self.out.put(error)
        self.out.put(END)
        self.done.set()
