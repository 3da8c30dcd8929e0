"""SIGTERM and SIGHUP end a run the way Ctrl-C does, so `timeout`, a closed terminal or a service
manager get the statistics, the JSON and the finished bench rows too, and nothing is left half-written.

The first signal raises KeyboardInterrupt where the program is; later ones are ignored, so the
teardown that the first one started (rollback, statistics, files) cannot itself be cut short.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_received: list[int] = []  # the signals seen during this run, first one first


def _handler(signum: int, _frame) -> None:
    _received.append(signum)
    if len(_received) == 1:
        raise KeyboardInterrupt


def install() -> Callable[[], None]:
    """Handle the signals for one run; returns the function that puts the previous handlers back
    (for callers that go on; the console entry point instead calls `over` and exits)."""
    _received.clear()
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        return lambda: None
    previous = {s: signal.signal(s, _handler) for s in HANDLED}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


def over() -> None:
    """The process is on its way out: ignore the signals from now on. (The interpreter's finalisation
    resets Python-level handlers to the default action, which would let a late signal kill it.)"""
    if threading.current_thread() is threading.main_thread():
        for s in HANDLED:
            signal.signal(s, signal.SIG_IGN)


def exit_code() -> int:
    """The shell's convention for a run ended by a signal: 128 + its number (130 for Ctrl-C)."""
    return 128 + (_received[0] if _received else signal.SIGINT)
