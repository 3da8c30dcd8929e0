"""Text the CLI reads from a stream or a file that may be anything: endless (`< /dev/zero`, `yes |`),
binary, or in another encoding. Read in chunks up to a cap, so a signal is seen between chunks and
memory stays bounded; decoded strictly, so bad bytes are an error that says where."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import UsageError

MAX_BYTES = 64 << 20  # far beyond any prompt a context can hold (32k tokens of a few bytes each)
CHUNK = 1 << 20


def read_text(stream: BinaryIO, what: str, limit: int = MAX_BYTES) -> str:
    """All of `stream` as UTF-8 text; UsageError naming `what` when it is longer than `limit`, not
    UTF-8, or binary (a NUL byte)."""
    chunks, size = [], 0
    while chunk := stream.read(CHUNK):
        size += len(chunk)
        if size > limit:
            raise UsageError(f"{what} is longer than {limit >> 20} MiB: far more than any context holds")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{what} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})",
            hint="convert it first, e.g. iconv -f latin1 -t utf-8 FILE",
        ) from None
    if "\0" in text:
        raise UsageError(f"{what} is binary, not text (a NUL byte at offset {text.index(chr(0))})")
    return text


def read_file(path: str, what: str, limit: int = MAX_BYTES) -> str:
    """A text file an option names (`what`: the option), as read_text reads it; a FIFO too (`<(make-it)`), read
    once. UsageError, one line, for a path that is missing, a directory or a device, or unreadable."""
    p = Path(os.path.expanduser(path))
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise UsageError(f"{what}: {path} does not exist", hint=f"{what} takes the path of a text file") from None
    except OSError as e:
        raise UsageError(f"{what}: cannot read {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"{what}: {path} is a directory, not a file", hint=f"{what} takes the path of a text file")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # a device may never end, a socket cannot be opened
        raise UsageError(f"{what}: {path} is not a regular file")
    try:
        with p.open("rb") as f:
            return read_text(f, f"{what} {path}", limit)
    except OSError as e:
        raise UsageError(f"{what}: cannot read {path}: {e.strerror or e}") from None
