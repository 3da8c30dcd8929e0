"""Token ids to text without ever splitting a UTF-8 character across two pieces."""

from __future__ import annotations

import codecs
from typing import Callable


class Detokenizer:
    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        # An incremental decoder holds back the first bytes of a character until the rest arrive;
        # bytes that can never form a character become U+FFFD instead of raising.
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token: int) -> str:
        return self._utf8.decode(self._piece(token))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
