"""The chat template's renderer (sandbox.py) in a child process, one per process, so that its bounds hold whatever
the template runs: RENDER_SECONDS of wall clock per rendering, measured here, and the child's address space
(sandbox.MEMORY_BYTES). At the deadline the child is killed (SIGKILL) and the next rendering starts a new one; a
child that died (killed by the kernel, crashed) is a TemplateError for that rendering and is started again for the
next. It is killed at exit, and ends itself where its parent is gone (stdin's end; an alarm mid-rendering).

One rendering at a time uses the child (a lock). While one waits, for the lock or for the child, a stopping server
is noticed every SLICE_SECONDS (limits.check_stop): the child is killed and Cancelled raised.

Not a privilege boundary: the child runs as the same user. It bounds what a template costs; the sandbox bounds
what it may reach.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from . import limits, sandbox
from .sandbox import FRAME, TemplateError

RENDER_SECONDS = 1.0  # a template's whole rendering, wall clock: real ones take milliseconds, tools and all
START_SECONDS = 10.0  # a child's start, apart from its rendering's time (50 ms measured), on a loaded machine too
SLICE_SECONDS = 0.05  # how often a wait looks at the server's stop (it must stop within 2 s)
_CHUNK = 1 << 20  # the most one read of the child's reply takes
# sandbox.py runs as a file, not as specdec_cli.chat.sandbox: the package would import template.py and rich (250 ms
# against 50 ms). -c's '' leaves sys.path: the working directory, where a file could shadow a module.
_BOOT = (
    "import sys; sys.path[:] = [p for p in sys.path if p]; "
    "import runpy; runpy.run_path(sys.argv[1], run_name='__main__')"
)

_lock = threading.Lock()  # the child, to one rendering at a time
_child: _Child | None = None


def render(source: str, context: dict, max_bytes: int) -> str:
    """The template's text, rendered in the child within RENDER_SECONDS: a failure is a TemplateError, a stopping
    server's Cancelled."""
    limits.check_stop()
    request = {"source": source, "context": context, "max_bytes": max_bytes, "seconds": RENDER_SECONDS}
    body = json.dumps(request).encode("ascii")  # (ensure_ascii: a lone surrogate crosses as its escape)
    with _turn():
        try:
            reply = _running().ask(body, 12 * max_bytes + 1024)  # a character is 12 bytes of JSON at most
        except BaseException:  # late, stopped, died, interrupted: the child may be mid-rendering
            _discard()
            raise
    if "error" in reply:
        raise TemplateError(reply["error"])
    return reply["text"]


def prestart() -> None:
    """Start the child now, so that the first rendering does not wait for its start: for a server, before it takes
    requests. Returns at once; where the child cannot start, the first rendering says why."""
    with _lock:
        try:
            _running()
        except OSError:
            pass


def child_pid() -> int | None:
    """The running child's process id (None: none runs yet)."""
    return _child.proc.pid if _child is not None else None


class _Child:
    """One renderer process and its pipes, non-blocking: the parent waits on them in slices."""

    def __init__(self) -> None:
        cmd = [sys.executable, "-c", _BOOT, sandbox.__file__]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.ready = False
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        os.set_blocking(self.proc.stdin.fileno(), False)
        os.set_blocking(self.proc.stdout.fileno(), False)

    def ask(self, body: bytes, most: int) -> Any:
        """The child's reply to one request; its rendering's deadline starts once the child is ready."""
        if not self.ready:
            late = f"its renderer, a child Python, did not start within {START_SECONDS:g} s"
            self._exchange(b"", time.monotonic() + START_SECONDS, 64, late)
            self.ready = True
        late = f"it renders for more than {RENDER_SECONDS:g} s"
        return json.loads(self._exchange(FRAME.pack(len(body)) + body, time.monotonic() + RENDER_SECONDS, most, late))

    def _exchange(self, out: bytes, deadline: float, most: int, late: str) -> bytes:
        """Writes `out` and reads one frame back by `deadline` (else a TemplateError that says `late`), looking at
        the server's stop between slices."""
        pending, got, stdin = memoryview(out), bytearray(), self.proc.stdin
        if pending:
            self.selector.register(stdin, selectors.EVENT_WRITE)
        while (body := _framed(got, most)) is None:
            limits.check_stop()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TemplateError(late)
            for key, _ in self.selector.select(min(left, SLICE_SECONDS)):
                if key.fileobj is stdin:
                    pending = pending[_written(key.fd, pending) :]
                    if not pending:
                        self.selector.unregister(stdin)
                else:
                    got += _read(key.fd)
        return body

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.selector.close()
        self.proc.stdin.close()
        self.proc.stdout.close()


_ENDED = "its renderer, a child Python, ended before it answered (it could not start, was killed, or ran out of memory)"


def _written(fd: int, data: memoryview) -> int:
    try:
        return os.write(fd, data)
    except BrokenPipeError:
        raise TemplateError(_ENDED) from None


def _read(fd: int) -> bytes:
    chunk = os.read(fd, _CHUNK)
    if not chunk:
        raise TemplateError(_ENDED)
    return chunk


def _framed(got: bytearray, most: int) -> bytes | None:
    """A whole frame's JSON, once it has come; a length past `most` is no reply (no text is that long)."""
    if len(got) < FRAME.size:
        return None
    (size,) = FRAME.unpack_from(got)
    if size > most:
        raise TemplateError(f"its renderer's reply would be {size:,} bytes, more than its text could be")
    return bytes(got[FRAME.size : FRAME.size + size]) if len(got) >= FRAME.size + size else None


@contextmanager
def _turn() -> Iterator[None]:
    while not _lock.acquire(timeout=SLICE_SECONDS):
        limits.check_stop()
    try:
        yield
    finally:
        _lock.release()


def _running() -> _Child:
    """The child, started where none runs: one that died while idle is replaced before it fails a rendering."""
    global _child
    if _child is not None and _child.proc.poll() is not None:
        _discard()
    if _child is None:
        _child = _Child()
    return _child


def _discard() -> None:
    """Kill the child (the next rendering starts a new one)."""
    global _child
    child, _child = _child, None
    if child is not None:
        child.kill()


atexit.register(_discard)  # the child never outlives this process's interpreter
