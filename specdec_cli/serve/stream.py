"""The one loop every streamed answer goes through, whichever API asked: the dialect's Shape says how each event reads,
the loop says when. It owns what every stream has: the opening events once the request's turn comes, a heartbeat
while the prompt prefills (a client gives up on a still stream), the answer's pieces (a text piece with the
probabilities of the tokens it completes), the end, and an error after the headers (the server stopping, a bug),
written the API's way, after which the stream ends. A client that left gets no end."""

from __future__ import annotations

import abc
from typing import Iterable, Iterator

from .. import ui
from .body import ApiError
from .items import WAITING, Args, Call, Finished, Probs, Scored, Streamed, Text

COMMENT = ":"  # an event name that stands for an SSE comment line (every SSE reader skips it)
Event = tuple[str | None, dict | str]  # an SSE event: its name (None: none; COMMENT: a comment line), its data


class Shape(abc.ABC):
    """How one API writes its stream's events, one method per moment (each yields that moment's events); what an
    API has nothing for (an opening, tool calls) is nothing by default."""

    def start(self) -> Iterator[Event]:
        """The events that open the stream, once the request's turn has come (before the prompt's prefill)."""
        return iter(())

    @abc.abstractmethod
    def heartbeat(self) -> Iterator[Event]:
        """Nothing new for service.KEEP_ALIVE seconds (a long prefill): what keeps this API's clients waiting."""

    @abc.abstractmethod
    def text(self, piece: Text, probs: list[Scored]) -> Iterator[Event]:
        """A piece of the answer's text, and the tokens it completes where the request asked for their
        probabilities (else none)."""

    def call(self, piece: Call) -> Iterator[Event]:
        """A tool call's start: its id and name."""
        return iter(())

    def args(self, piece: Args) -> Iterator[Event]:
        """A fragment of the open call's arguments."""
        return iter(())

    @abc.abstractmethod
    def end(self, finished: Finished) -> Iterator[Event]:
        """The events that close a whole answer."""

    @abc.abstractmethod
    def error(self, e: ApiError) -> Iterator[Event]:
        """The events that close a stream cut by an error after its headers."""


class Stream:
    """One streamed answer's events, `shape`'s, in the order every API's stream takes. `kind`: the route's, for the
    log. `finished`: the answer's end once the stream has ended whole (None: its client left, or an error cut it)."""

    def __init__(self, shape: Shape, kind: str):
        self.shape, self.kind = shape, kind
        self.finished: Finished | None = None

    def events(self, items: Iterable[Streamed]) -> Iterator[Event]:
        shape, finished, probs = self.shape, None, []
        yield from shape.start()
        try:
            for item in items:
                if item is WAITING:
                    yield from shape.heartbeat()
                elif isinstance(item, Probs):  # the next piece's tokens
                    probs = list(item)
                elif isinstance(item, str):
                    yield from shape.text(item, probs)
                    probs = []
                elif isinstance(item, Call):
                    yield from shape.call(item)
                elif isinstance(item, Args):
                    yield from shape.args(item)
                elif isinstance(item, Finished):
                    finished = item
                # (STARTED: the headers went; nothing more to say)
        except Exception as e:
            if not isinstance(e, ApiError):  # a bug, after the headers
                ui.error(f"{self.kind} stream: unexpected {type(e).__name__}: {e}")
                e = ApiError(500, f"internal error: {type(e).__name__}")
            yield from shape.error(e)
            return
        if finished is None:  # the client left
            return
        self.finished = finished
        yield from shape.end(finished)
