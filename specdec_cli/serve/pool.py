"""--parallel N: up to N generations at once, each on a thread of its own in a slot of the session (slots.py), their
decodes batched by the steps (backend/steps.py) on the thread that runs `work` (the main thread: llama.cpp's)."""

from __future__ import annotations

import queue
import threading
from typing import Callable

from .. import ui
from ..backend.steps import NORMAL, URGENT, Steps
from ..session import Session
from ..slots import Slot
from .jobs import Job, shutting_down
from .request import Request

JOIN_SECONDS = 30.0  # a stopping server waits this long for its generations to roll back (each takes a step at most)


def priority(req: Request) -> int:
    """An editor's request (llama-server's /infill and /completion, a fill-in-the-middle completion) is waited for
    at the keyboard: its prompt goes before a chat turn's, which an agent sends in the background."""
    return URGENT if req.kind in ("infill", "llama") or req.suffix is not None else NORMAL


class Pool:
    def __init__(self, session: Session):
        self.steps = Steps()
        self._free: list[Slot] = session.open_slots(self.steps)
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()

    def start(self, job: Job, urgency: int) -> None:
        """The job on a free slot, on a thread of its own (the gate admits no more jobs than slots)."""
        with self._lock:
            slot = self._free.pop()
        slot.target.priority, slot.target.gone = (lambda: urgency), job.cancel.is_set
        slot.target.order = self.steps.order()
        job.slot = slot
        thread = threading.Thread(target=self._run, args=(job, slot), name="specdec-slot", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _run(self, job: Job, slot: Slot) -> None:
        try:
            with self.steps.joined():
                job.execute(release=lambda: self._release(slot))
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
            self.steps.poke()

    def _release(self, slot: Slot) -> None:
        with self._lock:
            self._free.append(slot)

    def work(self, stop: threading.Event, jobs: queue.Queue, idle: Callable[[], None]) -> None:
        """Start the jobs handed over and decode the steps until `stop`; `idle` runs (with the contexts to itself)
        each time the last generation has ended. A signal here ends every generation cleanly: each one's next decode
        raises 503, and it rolls back."""
        ran = False
        try:
            while not stop.is_set():
                while True:
                    try:
                        job = jobs.get_nowait()
                    except queue.Empty:
                        break
                    self.start(job, job.urgency)
                    ran = True
                self.steps.step(timeout=0.1)
                if ran and self.steps.running == 0 and jobs.empty():
                    ran = False
                    with self.steps.turn():
                        idle()
        finally:
            self.steps.close(shutting_down(": generation stopped"))
            with self._lock:
                threads = list(self._threads)
            for t in threads:
                t.join(JOIN_SECONDS)
            s = self.steps
            if s.steps:
                ui.note(
                    f"{s.steps:,} decode steps, {s.shared:,} of them shared by several requests, "
                    f"{s.rows / s.steps:.2f} tokens a step, {s.seconds:.1f} s in the decodes"
                )
