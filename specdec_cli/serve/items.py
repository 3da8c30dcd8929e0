"""What a generation hands the dialects, declared once: the answer's text (Text), the log probabilities of the tokens
the next piece completes (Probs of Scored), a tool call's start and its arguments' fragments (Call, Args), then its
end (Finished); and, in a stream, the two markers of the wait before the first piece (Marker). Service._generate
yields Items; Service.run adds the Markers; the stream loop (stream.py) and `whole` read them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable

from ..chat import ToolCall
from ..engine.stats import Stats


class Text(str):
    """A piece of the answer's text, and how many generated tokens it completes (a stream's tokens_predicted)."""

    tokens = 1

    @classmethod
    def of(cls, text: str, tokens: int) -> Text:
        out = cls(text)
        out.tokens = tokens
        return out


@dataclass(frozen=True, slots=True)
class Scored:
    """One generated token's log probability under the target, and its best alternatives (id, text, bytes,
    logprob)."""

    id: int
    text: str
    bytes: bytes
    logprob: float
    top: tuple[tuple[int, str, bytes, float], ...]


class Probs(tuple):
    """The Scored tokens whose text the next Text carries (they go out with it, never alone)."""


@dataclass(frozen=True)
class Call:
    """A tool call's start, once its header is read: its place among the answer's calls, its id and name (the
    call's arguments empty: they follow as Args)."""

    index: int
    call: ToolCall


@dataclass(frozen=True)
class Args:
    """A fragment of the open call's arguments: the fragments, joined, are its arguments."""

    index: int
    text: str


@dataclass
class Finished:
    """A generation's end, after its text: its statistics, reused prompt tokens and OpenAI's finish_reason."""

    stats: Stats
    cached: int
    reason: str  # "stop" | "length" | "tool_calls"
    calls: list[ToolCall] = field(default_factory=list)  # the tool calls the answer made (its text: none of them)
    stop_sequence: str | None = None  # the stop sequence that ended the text
    probs: list[Scored] = field(default_factory=list)  # each token's log probabilities, where the request asked
    limit: bool = False  # a request's time or indentation limit ended it (llama-server's stop_type "limit")
    superseded: bool = False  # a newer request from the same client ended it


class Marker(enum.Enum):
    """A stream's items besides the answer's: its turn has come (the headers go, before a long prompt's prefill),
    and nothing new for service.KEEP_ALIVE seconds (each dialect keeps the client waiting its own way)."""

    STARTED = "started"
    WAITING = "waiting"


STARTED, WAITING = Marker.STARTED, Marker.WAITING

Item = Text | Probs | Call | Args | Finished  # what a generation yields, Finished last (none: its client left)
Streamed = Item | Marker  # what a stream reads (Service.run)


def whole(items: Iterable[Item]) -> tuple[str, Finished | None]:
    """A generation's text pieces joined, and its end (None: it stopped first, its client gone); its tool
    calls are the end's."""
    text, finished = [], None
    for item in items:
        if isinstance(item, Finished):
            finished = item
        elif isinstance(item, str):
            text.append(item)
    return "".join(text), finished
