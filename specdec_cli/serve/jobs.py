"""A generation handed from a connection's thread to its slot's (Job), and whether a newer request from the same
client has superseded it (Newest)."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

from .. import ui
from ..batching.claim import Claim
from ..signals import INTERRUPTS
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
    """One generation handed from a connection's thread to its slot's: items flow back through `out`; its claim says
    whether it has left (the one way it is told)."""

    def __init__(self, items: Callable[[], Iterator], claim: Claim):
        self.items, self.claim = items, claim
        self.out: queue.Queue = queue.Queue()
        self.done = threading.Event()

    def execute(self) -> None:
        """Run it (on its slot's thread); anyone waiting hears it is over only once its caches are let go of."""
        try:
            if self.claim.left:  # its client left while it waited: nothing to generate for
                return
            for item in self.items():
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
            self.out.put(END)
            self.done.set()

    def refuse(self, error: ApiError) -> None:
        self.out.put(error)
        self.out.put(END)
        self.done.set()
