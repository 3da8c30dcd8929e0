"""The HTTP side of `specdec serve`, on the standard library's http.server (its parser, its threads).

Why not an ASGI stack (uvicorn + starlette/FastAPI + pydantic): one generation runs at a time anyway, so
an event loop buys nothing here, and they would add five packages and ~0.3 s of imports to every start.
http.server parses requests and headers; ThreadingHTTPServer gives each connection a thread, which
waits its turn at the Gate. What it leaves to us is small and written once below: a body size limit,
chunked streaming of server-sent events, and noticing a client that went away.
"""

from __future__ import annotations

import hmac
import itertools
import json
import select
import socket
import sys
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .. import __version__, ui
from . import api, llama, messages, responses
from .service import Finished, Service, whole

MAX_BODY = 8 * 2**20  # bytes; a prompt that fits any context we allow is far smaller
JSON = (",", ":")  # compact, one line: llama.vim checks a response's text for `"content":"`, with no space
IDLE_SECONDS = 30.0  # a connection that sends nothing for this long is closed (and a slow sender's read fails)
ROUTES = {
    **{("POST", path): kind for path, kind in api.ENDPOINTS.items()},
    ("POST", "/v1/responses"): "responses",
    ("POST", "/v1/messages"): "messages",
    ("POST", "/v1/messages/count_tokens"): "count_tokens",
    ("POST", "/infill"): "infill",  # llama-server's own (the editor plugins')
    ("POST", "/completion"): "llama",
    ("GET", "/v1/models"): "models",
    ("GET", "/health"): "health",
    ("GET", "/"): "health",  # clients check that the server answers (Claude Code sends HEAD /)
}


# Each API's request, response, stream and error shapes (the same functions in each module).
DIALECTS = {"chat": api, "completion": api, "responses": responses, "messages": messages, "count_tokens": messages}
DIALECTS |= {"infill": llama, "llama": llama}


class Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() waits for every connection's thread: nothing is cut mid-write
    block_on_close = True

    def __init__(self, address: tuple[str, int], service: Service | None, api_key: str | None, debug: bool):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.service = service
        self.api_key = api_key.encode() if api_key else None
        self.debug = debug
        self._connections: set[socket.socket] = set()
        super().__init__(address, Handler)

    def handle_error(self, request, client_address) -> None:
        """A connection's thread ended in an exception outside a request's own handling (http.server reading
        the next request line): a client that reset its connection is no news; anything else is one line."""
        error = sys.exc_info()[1]
        if not isinstance(error, (ConnectionError, TimeoutError)):
            ui.error(f"connection from {client_address[0]}: unexpected {type(error).__name__}: {error}")

    def process_request(self, request, client_address):
        self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        self._connections.discard(request)
        super().shutdown_request(request)

    def close(self) -> None:
        """Stop: no new generations (the running one stops after its current round), idle connections are woken
        from their wait for a next request, and every connection's thread is waited for."""
        if self.service is not None:
            self.service.gate.close()
        for conn in list(self._connections):
            try:
                conn.shutdown(socket.SHUT_RD)  # a thread waiting for a request reads the end; writes still go
            except OSError:
                pass
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: an editor sends its requests over one connection
    default_request_version = "HTTP/1.0"  # an unreadable request line still gets a status line (not HTTP/0.9's none)
    server_version = f"specdec/{__version__}"
    timeout = IDLE_SECONDS
    server: Server

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too long, an unknown method) in
        OpenAI's error shape too, not its HTML page."""
        self.close_connection = True
        try:
            self._send_json(code, api.ApiError(code, message or HTTPStatus(code).phrase).body())
        except OSError:
            pass

    def log_message(self, format: str, *args) -> None:  # http.server's own lines: only with --debug
        if self.server.debug:
            ui.note(f"{self.address_string()} {format % args}")

    def _dispatch(self) -> None:
        """Every method: the route decides (a known path with another method is 405, not http.server's 501)."""
        method, t0 = self.command, time.perf_counter()
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        self._body_read = False
        self._dialect = api
        try:
            route = ROUTES.get(("GET" if method == "HEAD" else method, path))  # HEAD: GET without its body
            self._dialect = DIALECTS.get(route, api)
            if route is None:
                if any(p == path for _, p in ROUTES):
                    raise api.ApiError(405, f"{method} is not allowed on {path}")
                if path.startswith("/v1/models/") and method == "GET":
                    route = "model"
                else:
                    raise api.ApiError(404, f"no such endpoint: {method} {path}", code="unknown_url")
            if route != "health":
                self._authorize()
            if route == "health":
                self._send_json(200, {"status": "ok"})
            elif route == "models":
                self._send_json(200, {"object": "list", "data": [self._model_card()]})
            elif route == "model":
                self.server.service.check_model(path[len("/v1/models/") :])
                self._send_json(200, self._model_card())
            else:
                self._generate(route, self._body(), t0)
        except api.ApiError as e:
            self._fail(e)
        except (ConnectionError, TimeoutError):  # the client went away or stalled
            self.close_connection = True
        except Exception as e:  # a bug: the client gets a 500 and the server keeps serving
            ui.error(f"{method} {path}: unexpected {type(e).__name__}: {e}")
            self._fail(api.ApiError(500, f"internal error: {type(e).__name__}"))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch

    def _authorize(self) -> None:
        key = self.server.api_key
        if key is None:
            return
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if not given and self.headers.get("x-api-key") is not None:  # Anthropic's clients send their key so
            scheme, token = "bearer", self.headers.get("x-api-key", "")
        # compare_digest: the time taken does not tell how much of a guessed key was right
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
            raise api.ApiError(401, "a valid API key is required: Authorization: Bearer KEY", code="invalid_api_key")

    def _body(self) -> object:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise api.ApiError(411, "send the body with a Content-Length (chunked request bodies are not accepted)")
        lengths = set(self.headers.get_all("Content-Length") or [])
        length = lengths.pop().strip() if len(lengths) == 1 else None
        if length is None or not length.isdigit():
            self.close_connection = True
            missing = not lengths and length is None
            raise api.ApiError(411 if missing else 400, "a request body needs one valid Content-Length")
        n = int(length)
        if n > MAX_BODY:
            self.close_connection = True  # its body is never read: the connection cannot carry another request
            raise api.ApiError(413, f"the request body has {n:,} bytes; the limit is {MAX_BODY:,}")
        raw = self.rfile.read(n)
        self._body_read = True
        return api.decode(raw)

    def _model_card(self) -> dict:
        return {"id": self.server.service.model, "object": "model", "created": 0, "owned_by": "specdec"}

    def _generate(self, kind: str, body: object, t0: float) -> None:
        service, dialect = self.server.service, DIALECTS[kind]
        req = dialect.parse(kind, body)  # any `model` is answered by the loaded pair (as llama-server does)
        if kind == "infill":  # an editor plugin's: its newer request supersedes this one (llama.vim, llama.vscode)
            req.client = f"{self.client_address[0]} {req.slot}"
        tokens = service.tokens(req)
        req.prompt_tokens = len(tokens)
        if kind == "count_tokens":
            self._send_json(200, {"input_tokens": len(tokens)})
            return
        pieces = service.run(req, tokens, self._gone)
        try:
            # The first piece before any header: a refusal (queue full, bad settings) is still an HTTP status.
            first = next(pieces, None)
            if first is None:  # the client left while it waited
                self.close_connection = True
                return
            rid, model = dialect.new_id(kind), service.model
            if req.stream:
                self._stream(dialect, req, rid, model, itertools.chain([first], pieces))
                return
            text, finished = whole(itertools.chain([first], pieces))
            if finished is None:  # the client left
                self.close_connection = True
                return
            answer = dialect.response(req, rid, model, text, finished)
            if req.n > 1:  # llama-server's n_cmpl: an array of answers (greedy ones are one answer, repeated)
                answer = [answer, *self._more(service, dialect, req, tokens, rid, answer)]
            self._send_json(200, answer)
            self._log(req, finished, time.perf_counter() - t0)
        finally:
            pieces.close()  # the generation's own finally: caches rolled back, the gate let go

    def _more(self, service: Service, dialect, req: api.Request, tokens: list[int], rid: str, first: dict) -> list:
        """The answers after the first of an n_cmpl request, each a generation of its own (seeds one apart)."""
        if service.greedy(req):
            return [{**first, "index": i} for i in range(1, req.n)]
        out, seed = [], req.settings.get("seed")
        req.client = None  # (its own answers do not supersede one another)
        for i in range(1, req.n):
            if seed is not None:
                req.settings["seed"] = seed + i
            pieces = service.run(req, tokens, self._gone)
            try:
                text, finished = whole(pieces)
            finally:
                pieces.close()
            if finished is None:
                raise ConnectionError("the client left")
            out.append({**dialect.response(req, rid, service.model, text, finished), "index": i})
        return out

    def _stream(self, dialect, req: api.Request, rid: str, model: str, items) -> None:
        """Server-sent events, as the dialect writes them (each ends a stream cut by an error its own way)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        t0, seen = time.perf_counter(), []

        def watched():
            for item in items:
                if isinstance(item, Finished):
                    seen.append(item)
                yield item

        for name, data in dialect.stream(req, rid, model, watched()):
            self._event(name, data)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        if not seen:  # the client left, or the stream ended in an error
            self.close_connection = True
            return
        self._log(req, seen[0], time.perf_counter() - t0)

    def _event(self, name: str | None, data: dict | str) -> None:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=JSON)
        if name == api.COMMENT:  # a line every SSE reader skips
            self._chunk(b": " + text.encode() + b"\n\n")
            return
        head = b"event: " + name.encode() + b"\n" if name else b""
        self._chunk(head + b"data: " + text.encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _gone(self) -> bool:
        """The client closed its side (asked once a verification: a select and a peek, microseconds). Data
        waiting to be read is a next request on a kept-alive connection, not a goodbye."""
        conn = self.connection
        try:
            readable, _, _ = select.select([conn], [], [], 0)
            return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def _send_json(self, status: int, obj: dict, headers: dict | None = None) -> None:
        if not getattr(self, "_body_read", True) and self._has_body():
            self.close_connection = True  # a body left unread (a GET's, a refused POST's) would be read as a request
        data = json.dumps(obj, ensure_ascii=False, separators=JSON).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def _has_body(self) -> bool:
        headers = getattr(self, "headers", None)
        if headers is None:
            return False
        return any(v.strip() != "0" for v in headers.get_all("Content-Length") or []) or "Transfer-Encoding" in headers

    def _fail(self, e: api.ApiError) -> None:
        headers = {"Retry-After": str(e.retry_after)} if e.retry_after else {}
        if e.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        try:
            self._send_json(e.status, self._dialect.error(e), headers)
        except OSError:
            self.close_connection = True
        if self.server.debug or e.status >= 500:
            ui.note(f"{self.command} {self.path} {e.status} {HTTPStatus(e.status).phrase}: {e.message}")

    def _log(self, req: api.Request, finished: Finished, seconds: float) -> None:
        s = finished.stats
        ui.note(
            f"{req.kind}: {s.prompt_tokens} prompt tokens ({finished.cached} cached), {s.generated_tokens} tokens in "
            f"{seconds:.2f} s, {s.tokens_per_second:.1f} tok/s, {s.mean_accepted:.2f} per verification, {finished.reason}"
        )
