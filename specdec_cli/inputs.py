"""Text the CLI reads from a stream or a file that may be anything: endless (`< /dev/zero`, `yes |`),
binary, or in another encoding. Read in chunks up to a cap, so a signal is seen between chunks and
memory stays bounded; decoded strictly, so bad bytes are an error that says where."""

from __future__ import annotations

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
