"""The server's one execution model: every generation on a thread of its own, in the slot the gate gave it, its
decodes batched with the others' by the steps (batching/rendezvous.py) on the thread that runs `work` (the main
thread: llama.cpp's OpenMP team is that thread's)."""

from __future__ import annotations

import queue
import threading
from typing import Callable

from .. import signals, ui
from ..batching.rendezvous import Steps
from .jobs import Job, shutting_down

JOIN_SECONDS = 30.0  # a stopping server waits this long for its generations to roll back (each takes a step at most)


class Pool:
    def __init__(self, steps: Steps):
        self.steps = steps
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()

    def start(self, job: Job) -> None:
        """The job on a thread of its own (in the slot its claim holds)."""
        thread = threading.Thread(target=self._run, args=(job,), name="specdec-slot", daemon=True)
        # A signal that landed between the two would leave a counted thread that never starts (or one that runs
        # uncounted), and the stop's join would raise: held, it lands after.
        with signals.held(), self._lock:
            self._threads.add(thread)
            thread.start()

    def _run(self, job: Job) -> None:
        try:
            with self.steps.joined():
                job.execute()
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
            self.steps.poke()

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
                    self.start(job)
                    ran = True
                self.steps.step(timeout=0.1)
                if ran and self.steps.running == 0 and jobs.empty() and not self._threads:
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
