"""SIGTERM and SIGHUP end a run the way Ctrl-C does, so `timeout`, a closed terminal or a service
manager get the statistics, the JSON and the finished bench rows too, and nothing is left half-written.

The first signal raises `Interrupted` where the program is; later ones are ignored, so the
teardown that the first one started (rollback, statistics, files) cannot itself be cut short.

Python runs a signal handler only once the main thread is back in Python code. A llama.cpp call that
never returns (waiting for an RPC server that froze: its kernel still acknowledges, so no timeout fires)
would make Ctrl-C do nothing at all; a watchdog thread, woken by the signal itself (set_wakeup_fd), ends
the process with one line if the handler has not run within GRACE_SECONDS.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_received: list[int] = []  # the signals seen during this run, first one first
_again = [False]  # a later signal raises too (second_stops)
_holding = [0]  # how deep in held() blocks the main thread is
_deferred: list[int] = []  # signals that came during one: raised (one) as the outermost ends


class Interrupted(BaseException):
    """What a signal raises. Not a KeyboardInterrupt: Typer turns one of those into a silent exit 130
    wherever a command did not catch it, whatever the signal was."""


INTERRUPTS = (Interrupted, KeyboardInterrupt)  # what to catch: a KeyboardInterrupt still comes from code
# that runs without our handlers (another thread; a test that raises one)


RESEND_SECONDS = 0.005  # a log callback returns within microseconds
GRACE_SECONDS = 5.0  # a decode step returns within this; a llama.cpp call that does not is stuck
_wakeup: list[int] = []  # the watchdog's pipe, once per process: (read end, write end)
_ran = [0]  # how many times _handler ran: the watchdog compares it with the signals that came
_STUCK = (
    b"error: interrupted, and llama.cpp did not return within 5 s (an RPC server that stopped answering, "
    b"or a long prompt being read): stopped at once\n"
)
_CALLBACKS: set = set()  # code of the Python functions that C calls back (llama.cpp's log hook)


def native_callback(fn):
    """Mark a function that C code calls back: an exception raised in it is printed and dropped by
    ctypes, so a signal that lands there is sent again, to be raised once our own code runs."""
    _CALLBACKS.add(fn.__code__)
    return fn


def _handler(signum: int, frame) -> None:
    _ran[0] += 1
    if not _received and _in_callback(frame):
        # Sent again shortly, from a thread: sent from here, it would be handled inside this handler.
        timer = threading.Timer(RESEND_SECONDS, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    _received.append(signum)
    if len(_received) == 1 or _again[0]:
        if _holding[0]:
            _deferred.append(signum)
            return
        raise Interrupted(signum)


def _watchdog_fd() -> int:
    """The write end of the pipe the interpreter writes each signal's number to, from its C handler;
    the watchdog thread reads it. Started once per process."""
    if not _wakeup:
        r, w = os.pipe()
        os.set_blocking(w, False)  # set_wakeup_fd's requirement
        _wakeup.extend((r, w))
        threading.Thread(target=_watchdog, args=(r,), daemon=True, name="specdec-signal-watchdog").start()
    return _wakeup[1]


def _watchdog(read_fd: int) -> None:
    came = 0  # signals our handlers were installed for (bytes come only while they are: see install)
    while True:
        raw = os.read(read_fd, 64)
        if not raw:
            return
        data = [s for s in raw if s in HANDLED]
        came += len(data)
        deadline = time.monotonic() + GRACE_SECONDS
        while data and _ran[0] < came and time.monotonic() < deadline:
            time.sleep(0.05)
        if data and _ran[0] < came:  # the main thread is inside llama.cpp and does not come back
            os.write(2, _STUCK)
            os._exit(128 + data[-1])


def _in_callback(frame) -> bool:
    """Inside code that would lose an exception raised there: a function C calls back (ctypes prints and drops
    it), or an import (a compiled module's initialisation may swallow it: a lazy `numpy.random` did, and the
    server went on serving after SIGTERM)."""
    while frame is not None:
        if frame.f_code in _CALLBACKS or frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def install() -> Callable[[], None]:
    """Handle the signals for one run; returns the function that puts the previous handlers back
    (for callers that go on; the console entry point instead calls `over` and exits)."""
    _received.clear()
    _deferred.clear()
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        return lambda: None
    previous = {s: signal.signal(s, _handler) for s in HANDLED}
    previous_fd = signal.set_wakeup_fd(_watchdog_fd(), warn_on_full_buffer=False)

    def restore() -> None:  # the wakeup first: a signal it reports is always one _handler sees
        signal.set_wakeup_fd(previous_fd)
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


@contextmanager
def held() -> Iterator[None]:
    """A signal waits until the block is done: the final output (the JSON, the statistics, the bench
    files) is written whole, a server's slot thread is started and counted, and the interruption applies
    right after. Held here, in the handler, not by masking the signal: the kernel hands a signal the main
    thread masks to another thread (the watchdog, a server's), and the interpreter still runs the handler on
    the main thread, inside the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _holding[0] += 1
    try:
        yield
    finally:
        _holding[0] -= 1
        if not _holding[0] and _deferred:  # (over an exception leaving the block too: a caller that goes on
            signum = _deferred[0]  # after an error, a server's, must not lose the stop)
            _deferred.clear()
            raise Interrupted(signum)


@contextmanager
def second_stops() -> Iterator[None]:
    """Within the block a later signal raises Interrupted too: a teardown that may take seconds (a server
    writing its prefix cache) is one the user can still cut short."""
    _again[0] = True
    try:
        yield
    finally:
        _again[0] = False


def over() -> None:
    """The process is on its way out: ignore the signals from now on. (The interpreter's finalisation
    resets Python-level handlers to the default action, which would let a late signal kill it.)"""
    if threading.current_thread() is threading.main_thread():
        for s in HANDLED:
            signal.signal(s, signal.SIG_IGN)


def exit_code() -> int:
    """The shell's convention for a run ended by a signal: 128 + its number (130 for Ctrl-C)."""
    return 128 + (_received[0] if _received else signal.SIGINT)
