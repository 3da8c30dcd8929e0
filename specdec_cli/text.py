"""Token ids to text without ever splitting a UTF-8 character across two pieces: the engine streams ids,
and whoever knows the model adds the text (`with_text`)."""

from __future__ import annotations

from dataclasses import replace

import codecs
from typing import Callable, Iterator

from .engine.events import Event, Stopped, Token


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


def with_text(events: Iterator[Event], piece: Callable[[int], bytes]) -> Iterator[Event]:
    """The engine's events with text: each token's piece, never splitting a UTF-8 character (`piece`: the
    model's bytes for a token id)."""
    detok = Detokenizer(piece)
    try:
        for event in events:
            if isinstance(event, Token):
                event = replace(event, text=detok.push(event.id))
            elif isinstance(event, Stopped):
                event = Stopped(reason=event.reason, tail=detok.flush(), complete=event.complete)
            yield event
    finally:
        events.close()  # a consumer that walks away: the engine's rollback runs now
