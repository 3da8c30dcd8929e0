"""A generation's answer over HTTP, http.Handler's part for the routes that generate: the body read by its dialect,
the prompt tokenized, the first item taken before any header (a refusal, the queue full or a setting refused, is
still an HTTP status), then one JSON body (llama-server's n_cmpl: an array of them) or a stream of server-sent events,
as the one loop (stream.Stream) has the dialect's Shape write them."""

from __future__ import annotations

import itertools
import time
from typing import Iterable

from .. import ui
from .dialect import DIALECTS, Dialect
from .items import Finished, Streamed, whole
from .request import Request
from .service import Service
from .stream import Stream


class Answering:
    """The generating routes of http.Handler, which brings the rest: `server` (its service), `client_address`,
    `headers`, the response's writing (send_response, `_send_json`, `_event`, `wfile`) and `_gone`."""

    def _generate(self, kind: str, body: object, t0: float) -> None:
        service, dialect = self.server.service, DIALECTS[kind]
        req = dialect.parse(kind, body)  # any `model` is answered by the loaded pair (as llama-server does)
        if kind == "infill":  # an editor plugin's: its newer request supersedes this one (llama.vim, llama.vscode)
            # (a client: its address, slot and program: two editors on one machine share the first two)
            req.client = f"{self.client_address[0]} {req.slot} {self.headers.get('User-Agent', '')}"
        tokens = service.tokens(req)
        req.prompt_tokens = len(tokens)
        if kind == "count_tokens":
            self._send_json(200, {"input_tokens": len(tokens)})
            return
        items = service.run(req, tokens, self._gone)
        try:
            # The first item before any header: a refusal (queue full, bad settings) is still an HTTP status.
            first = next(items, None)
            if first is None:  # the client left while it waited
                self.close_connection = True
                return
            rid, model = dialect.new_id(kind), service.model
            if req.stream:
                self._stream(Stream(dialect.shape(req, rid, model), kind), req, itertools.chain([first], items))
                return
            text, finished = whole(itertools.chain([first], items))
            if finished is None:  # the client left
                self.close_connection = True
                return
            answer = dialect.response(req, rid, model, text, finished)
            if req.n > 1:  # llama-server's n_cmpl: an array of answers (greedy ones are one answer, repeated)
                answer = [answer, *self._more(service, dialect, req, tokens, rid, answer)]
            self._send_json(200, answer)
            self._log(req, finished, time.perf_counter() - t0)
        finally:
            items.close()  # the generation's own finally: caches rolled back, the gate let go

    def _more(self, service: Service, dialect: Dialect, req: Request, tokens: list[int], rid: str, first: dict) -> list:
        """The answers after the first of an n_cmpl request, each a generation of its own (seeds one apart)."""
        if service.greedy(req):
            return [{**first, "index": i} for i in range(1, req.n)]
        out, seed = [], req.settings.get("seed")
        req.client = None  # (its own answers do not supersede one another)
        for i in range(1, req.n):
            if seed is not None:
                req.settings["seed"] = seed + i
            items = service.run(req, tokens, self._gone)
            try:
                text, finished = whole(items)
            finally:
                items.close()
            if finished is None:
                raise ConnectionError("the client left")
            out.append({**dialect.response(req, rid, service.model, text, finished), "index": i})
        return out

    def _stream(self, stream: Stream, req: Request, items: Iterable[Streamed]) -> None:
        """Server-sent events, chunked, as the stream's loop has its dialect write them."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        t0 = time.perf_counter()
        for name, data in stream.events(items):
            self._event(name, data)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        if stream.finished is None:  # the client left, or the stream ended in an error
            self.close_connection = True
            return
        self._log(req, stream.finished, time.perf_counter() - t0)

    def _log(self, req: Request, finished: Finished, seconds: float) -> None:
        s = finished.stats
        ui.note(
            f"{req.kind}: {s.prompt_tokens} prompt tokens ({finished.cached} cached), {s.generated_tokens} tokens in "
            f"{seconds:.2f} s, {s.tokens_per_second:.1f} tok/s, {s.mean_accepted:.2f} per verification, {finished.reason}"
        )
