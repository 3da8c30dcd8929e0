"""A batch's results file: one line per finished request, as OpenAI's Batch API writes them, appended and
flushed as each request finishes, so that a stop of any kind (Ctrl-C, SIGTERM, SIGKILL, a power cut) loses
at most the request in progress, and running the same command again goes on where it stopped.

    {"id": "batch_req_...", "custom_id": "t-1", "response": {"status_code": 200, "request_id": "...",
     "body": {...what serve answers...}}, "error": null}

A request serve would refuse has its status and serve's error object as its body (OpenAI's shape for a
request that failed). The file is locked while a batch writes it: a second batch on it is refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from pathlib import Path

from ..errors import SpecdecError, UsageError


PREFIX = b'{"id": "batch_req_'  # how every line we write starts (json.dumps keeps the key order)


def result(custom_id: str, status: int, body: dict) -> dict:
    rid = secrets.token_hex(12)
    return {
        "id": f"batch_req_{rid}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": rid, "body": body},
        "error": None,
    }


class Results:
    """The results file, open for appending (locked); `done`: custom_id -> status code of what it holds."""

    def __init__(self, path: Path, shown: str):
        self.shown = shown
        self.dropped = False  # a cut last line was removed (its request runs again)
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
        except OSError as e:
            raise SpecdecError(f"cannot open {shown}: {e.strerror or e}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise UsageError(
                f"-o: {shown} is being written by another specdec batch", hint="wait for it, or choose another -o"
            ) from None
        try:
            self.done = self._read()
        except BaseException:
            self.close()
            raise

    def _read(self) -> dict[str, int]:
        """What an earlier run finished. A last line without its newline was cut by a crash: it is dropped
        (its request runs again). Any other line that is not a result means the file is not a batch's
        results: refused (at its first such line, before the rest is read) rather than appended to."""
        done: dict[str, int] = {}
        offset, pending, number = 0, b"", 0
        while chunk := os.pread(self._fd, 1 << 20, offset):
            offset += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                number += 1
                done.update([self._result(raw, number)])
        if pending:  # no newline after it
            custom_id, status = _parse(pending)
            if custom_id is not None:  # whole: only its newline was lost
                os.write(self._fd, b"\n")
                done[custom_id] = status
            elif pending.startswith(PREFIX):  # the start of one of our lines, cut by a crash
                os.ftruncate(self._fd, offset - len(pending))
                self.dropped = True
            else:
                self._result(pending, number + 1)
        return done

    def _result(self, raw: bytes, number: int) -> tuple[str, int]:
        custom_id, status = _parse(raw)
        if custom_id is None:
            raise UsageError(
                f"-o: {self.shown} line {number} is not a batch result: it is not a results file of specdec batch",
                hint="a batch appends to its results file (and resumes from it): choose a new path",
            )
        return custom_id, status

    def append(self, line: dict) -> None:
        """One result, whole: a single write of the line, then fsync (a crash after this keeps it)."""
        data = (json.dumps(line, ensure_ascii=False) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._fd, data) :]
            os.fsync(self._fd)
        except OSError as e:
            raise SpecdecError(f"cannot write {self.shown}: {e.strerror or e}") from None
        self.done[line["custom_id"]] = line["response"]["status_code"]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # the lock goes with it
            self._fd = -1

    def __enter__(self) -> Results:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse(raw: bytes) -> tuple[str | None, int]:
    """(custom_id, status code) of a result line; (None, 0) if it is not one."""
    try:
        obj = json.loads(raw)
        custom_id, status = obj["custom_id"], obj["response"]["status_code"]
    except (ValueError, RecursionError, TypeError, KeyError):
        return None, 0
    if not isinstance(custom_id, str) or not isinstance(status, int):
        return None, 0
    return custom_id, status
