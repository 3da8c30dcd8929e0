"""The HTTP side of `specdec serve`, on the standard library's http.server (its parser, its threads).

Why not an ASGI stack (uvicorn + starlette/FastAPI + pydantic): one generation runs at a time anyway, so
an event loop buys nothing here, and they would add five packages and ~0.3 s of imports to every start.
uvicorn alone (over h11) adds three packages (2.3 MB) and ~0.13 s, and still has no deadline for a request's
head or body (uvicorn issue 157): the slow-client defences below would be written for it all the same.
http.server parses requests and headers; ThreadingHTTPServer gives each connection a thread, which
waits its turn at the Gate. What it leaves to us is small and written once below: a body size limit,
chunked streaming of server-sent events, and noticing a client that went away; and, in guard.py, what a hostile
client could otherwise do with it: a cap on connections, a deadline for each request's head and body, and the
Host, Origin and Content-Type checks that keep web pages out.
"""

from __future__ import annotations

import errno
import hmac
import json
import select
import socket
import sys
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .. import __version__, ui
from . import api, guard
from .answering import Answering
from .body import quoted
from .dialect import DIALECTS
from .service import Service
from .stream import COMMENT

MAX_BODY = 8 * 2**20  # bytes; a prompt that fits any context we allow is far smaller
JSON = (",", ":")  # compact, one line: llama.vim checks a response's text for `"content":"`, with no space
STARVED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)  # accept() failing for want of descriptors
STARVED_NOTE_SECONDS = 60.0  # at most one line this often while they last
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


class Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() waits for every connection's thread: nothing is cut mid-write
    block_on_close = True
    request_queue_size = 128  # the listen backlog: socketserver's 5 drops the SYNs of a burst (and /health's)

    def __init__(
        self,
        address: tuple[str, int],
        service: Service | None,
        api_key: str | None,
        debug: bool,
        limits: guard.Limits = guard.Limits(),
        host: str | None = None,
        origins: frozenset[str] = frozenset(),
    ):
        """`host`: the --host given (a name a Host header may use besides loopback's); `origins`: the web pages
        (--allow-origin, as guard.origin writes them) whose requests are answered, with CORS headers."""
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.service = service
        self.api_key = api_key.encode() if api_key else None
        self.debug = debug
        self.conns = guard.Connections(limits)
        self.hosts = guard.allowed_hosts(address[0], host or address[0])
        self.origins = origins
        self._pause, self._starved_at = guard.BACKOFF[0], -STARVED_NOTE_SECONDS
        super().__init__(address, Handler)

    def handle_error(self, request, client_address) -> None:
        """A connection's thread ended in an exception outside a request's own handling (http.server reading
        the next request line): a client that reset its connection is no news; anything else is one line."""
        error = sys.exc_info()[1]
        if not isinstance(error, (ConnectionError, TimeoutError)):
            ui.error(f"connection from {client_address[0]}: unexpected {type(error).__name__}: {error}")

    def get_request(self):
        """accept(), which fails at once, again and again, while the process is out of file descriptors: then the
        connection that waited longest is closed (a descriptor for the next) and the loop pauses, not spins."""
        try:
            got = super().get_request()
        except OSError as e:
            if e.errno in STARVED:
                self._starved(e)
            raise  # (socketserver drops the attempt)
        self._pause = guard.BACKOFF[0]
        return got

    def _starved(self, e: OSError) -> None:
        now = time.monotonic()
        if now - self._starved_at > STARVED_NOTE_SECONDS:
            self._starved_at = now
            ui.warning(
                f"cannot accept connections ({e.strerror}): closing the one that waited longest and pausing; "
                f"{len(self.conns)} are open (--max-connections {self.conns.limits.max_connections})"
            )
        self.conns.evict()
        time.sleep(self._pause)
        self._pause = min(2 * self._pause, guard.BACKOFF[1])

    def verify_request(self, request, client_address) -> bool:
        """Admit a connection under the cap (evicting the one that waited longest), or refuse it with 503."""
        if self.conns.admit(request):
            return True
        e = api.ApiError(503, "too many connections, each being answered: try again shortly")
        guard.refuse_at_cap(request, b"503 Service Unavailable", json.dumps(e.body(), separators=JSON).encode())
        return False

    def service_actions(self) -> None:  # the accept loop, every poll: the deadlines
        self.conns.sweep()

    def shutdown_request(self, request):
        self.conns.remove(request)
        super().shutdown_request(request)

    def close(self) -> None:
        """Stop: no new generations (the running one stops after its current round), no next request on any
        connection; every connection not being answered is closed, a write blocked on a client that does not
        read included, and every connection's thread is waited for (each write STOP_WRITE_SECONDS at most)."""
        if self.service is not None:
            self.service.gate.close()
        self.conns.stop_all()
        self.server_close()


class Handler(Answering, BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: an editor sends its requests over one connection
    default_request_version = "HTTP/1.0"  # an unreadable request line still gets a status line (not HTTP/0.9's none)
    server_version = f"specdec/{__version__}"
    timeout = guard.IDLE_SECONDS  # each read's (the deadlines are the accept loop's, the writes' allowance: guard.py)
    server: Server

    def setup(self) -> None:
        super().setup()
        self.wfile = guard.Writer(self.server.conns, self.connection)
        self._served, self._cut_answered, self._cors = False, False, None

    def handle_one_request(self) -> None:
        """One request; on a kept-alive connection, after waiting (idle) for its first byte, from which its
        head's deadline runs (a new connection's runs from its accept)."""
        if self._served:
            if self.server.conns.stopping:  # (a pipelined request already read is not served either)
                self.close_connection = True
                return
            self.server.conns.enter(self.connection, "idle")
            try:
                first = self.rfile.peek(1)
            except OSError:  # (a timeout, a reset)
                first = b""
            if not first or self._cut():
                self.close_connection = True
                return
            self.server.conns.enter(self.connection, "head")
        self._served = True
        super().handle_one_request()

    def parse_request(self) -> bool:
        """http.server's, then whether the accept loop cut the connection meanwhile (its head too slow, or evicted
        at the cap): then the request, whatever arrived of it, is answered with why, never served."""
        self._cors = None
        ok = super().parse_request()
        if self._cut():
            self.send_error(*self._cut())
            return False
        if ok:
            self.server.conns.enter(self.connection, "busy")
        return ok

    def _cut(self) -> tuple[int, str] | None:
        return self.server.conns.cut_of(self.connection)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too long, an unknown method) in
        OpenAI's error shape too, not its HTML page. A cut connection answers why it was cut, once (or nothing,
        an idle one)."""
        self.close_connection = True
        cut = self._cut()
        if cut is not None:
            if self._cut_answered or not cut[0]:
                return
            self._cut_answered, (code, message) = True, cut
        e = api.ApiError(code, message or HTTPStatus(code).phrase)
        try:
            self._send_json(code, e.body(), {"Retry-After": str(guard.RETRY_AFTER)} if code == 503 else None)
        except OSError:
            pass

    def end_headers(self) -> None:
        if self._cors:  # a page --allow-origin lists: it may read the answer
            self.send_header("Access-Control-Allow-Origin", self._cors)
            self.send_header("Vary", "Origin")
        super().end_headers()

    def log_message(self, format: str, *args) -> None:  # http.server's own lines: only with --debug
        if self.server.debug:
            ui.note(f"{self.address_string()} {format % args}")

    def _dispatch(self) -> None:
        """Every method: the route decides (a known path with another method is 405, not http.server's 501).
        The checks, in order: a web page's (Host, Origin), the key (every route but /health, every method), the
        route, then a body's Content-Type and length."""
        method, t0 = self.command, time.perf_counter()
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        self._body_read = False
        get = "GET" if method == "HEAD" else method  # HEAD: GET without its body
        route = ROUTES.get((get, path)) or ("model" if get == "GET" and path.startswith("/v1/models/") else None)
        self._dialect = DIALECTS.get(route, api)
        try:
            self._cors = guard.check_page(self.headers, self.server.hosts, self.server.origins)
            if method == "OPTIONS" and self._cors and "Access-Control-Request-Method" in self.headers:
                self._preflight()  # (a browser sends no key with it)
                return
            if route != "health":
                self._authorize()
            if route is None:
                if any(p == path for _, p in ROUTES) or path.startswith("/v1/models/"):
                    raise api.ApiError(405, f"{method} is not allowed on {path}")
                raise api.ApiError(404, f"no such endpoint: {method} {path}", code="unknown_url")
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
            ui.error(f"{method} {quoted(path)}: unexpected {type(e).__name__}: {e}")
            self._fail(api.ApiError(500, f"internal error: {type(e).__name__}"))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch

    def _preflight(self) -> None:
        """A browser asks whether a page --allow-origin lists may send its request: yes, with the headers it asks."""
        if self._has_body():
            self.close_connection = True
        self.send_response(204)
        for k, v in guard.preflight(self.headers).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

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
        """The request's JSON: its Content-Type JSON's, its length one Content-Length in ASCII digits, the body
        read whole within its deadline."""
        n = guard.body_length(self.headers, MAX_BODY)
        self.server.conns.enter(self.connection, "body")
        raw = self.rfile.read(n)
        self._body_read = True
        cut = self._cut()
        if cut is not None:  # too slow, or evicted at the cap: whatever came is not served
            self.close_connection = True
            raise api.ApiError(*cut, retry_after=guard.RETRY_AFTER if cut[0] == 503 else None)
        self.server.conns.enter(self.connection, "busy")
        if len(raw) < n:  # the client closed its side: a cut body could still parse (a number, an object's prefix)
            self.close_connection = True
            raise api.ApiError(400, f"the request body ended after {len(raw):,} of its {n:,} bytes")
        with self.server.conns.parsing():
            return api.decode(raw)

    def _model_card(self) -> dict:
        return {"id": self.server.service.model, "object": "model", "created": 0, "owned_by": "specdec"}

    def _event(self, name: str | None, data: dict | str) -> None:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=JSON)
        if name == COMMENT:  # a line every SSE reader skips
            self._chunk(b": " + utf8(text) + b"\n\n")
            return
        head = b"event: " + name.encode() + b"\n" if name else b""
        self._chunk(head + b"data: " + utf8(text) + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _gone(self) -> bool:
        """The client closed its side (asked once a verification: a select and a peek, microseconds). Data
        waiting to be read is a next request on a kept-alive connection, not a goodbye."""
        conn = self.connection
        try:
            poll = select.poll()  # (not select.select: a descriptor past 1,023 is out of its range)
            poll.register(conn, select.POLLIN)
            return bool(poll.poll(0)) and conn.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def _send_json(self, status: int, obj: dict, headers: dict | None = None) -> None:
        if not getattr(self, "_body_read", True) and self._has_body():
            self.close_connection = True  # a body left unread (a GET's, a refused POST's) would be read as a request
        data = utf8(json.dumps(obj, ensure_ascii=False, separators=JSON))
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
        if e.status in (401, 403):  # refused before its key or page was accepted: no next request on it
            self.close_connection = True
        try:
            self._send_json(e.status, self._dialect.error(e), headers)
        except OSError:
            self.close_connection = True
        if self.server.debug or e.status >= 500:
            ui.note(
                f"{self.command} {quoted(self.path)} {e.status} {HTTPStatus(e.status).phrase}: {quoted(e.message, 300)}"
            )


def utf8(text: str) -> bytes:
    """JSON text as UTF-8; a lone surrogate (from "\\udc80" in a request, echoed in an error) as JSON's escape
    for it, which `.encode()` would refuse with an exception and the client would get no answer."""
    return text.encode("utf-8", "backslashreplace")
