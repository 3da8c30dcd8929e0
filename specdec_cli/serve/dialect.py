"""What each API the server speaks is: a module (api.py: OpenAI's chat and completions; responses.py: OpenAI's
Responses; messages.py: Anthropic's Messages; llama.py: llama-server's /infill and /completion) that reads a body into
the one Request, names its answers, writes a whole answer, shapes a stream's events (stream.Shape, which the one loop,
stream.Stream, drives) and writes an error. http.py routes each endpoint to a kind, DIALECTS here each kind to its
module. A fifth API is a module with these five functions, a line here and its routes in http.ROUTES;
tests/test_dialects.py checks that every module here has them, each with the Protocol's parameters."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from . import api, llama, messages, responses
from .body import ApiError
from .items import Finished
from .request import Request
from .stream import Shape


@runtime_checkable
class Dialect(Protocol):
    def parse(self, kind: str, body: Any) -> Request:
        """The body checked into a Request (ApiError where it is refused); `kind`: the route's (http.ROUTES)."""
        ...

    def new_id(self, kind: str) -> str:
        """A new answer's id, in the API's form."""
        ...

    def response(self, req: Request, rid: str, model: str, text: str, finished: Finished) -> dict:
        """The whole answer of a request that did not stream: its text (the tool calls: `finished`'s)."""
        ...

    def shape(self, req: Request, rid: str, model: str) -> Shape:
        """How the events of this request's stream read."""
        ...

    def error(self, e: ApiError) -> dict:
        """A refusal's body, in the API's shape (before the headers; after them, Shape.error writes it)."""
        ...


# A route's kind (http.ROUTES) -> the API that reads its body and writes its answers.
DIALECTS: dict[str, Dialect] = {
    "chat": api,
    "completion": api,
    "responses": responses,
    "messages": messages,
    "count_tokens": messages,
    "infill": llama,
    "llama": llama,
}
