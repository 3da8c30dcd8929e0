"""What `specdec serve` allows a connection: how many at once, how long a request's head and body may take, and
which Host, Origin and Content-Type headers it answers (a browser's requests). http.py applies them.

A connection is in one phase at a time, each with its own deadline counted from the phase's start (not per read,
so a client trickling a byte a second is cut all the same): waiting for a request (`head`: its line and headers;
`idle`: a kept-alive connection before the next request's first byte), reading its `body`, `busy` being answered
(no deadline: a generation takes what it takes), or `write`: blocked sending an answer to a client that does not
read it. A connection may spend WRITE_SECONDS in all blocked in writes (over its whole life, so a client that
pipelines requests and reads none of the answers gets no fresh allowance per request), then it is cut; a stream
to a client that stopped reading stops its generation. The accept loop sweeps the deadlines; at the cap a new
connection evicts the one that has waited longest for its request (or been blocked writing past WRITE_GRACE), so
/health answers however many slow clients hold connections, and only when every connection is being answered is
the newcomer refused with 503.
"""

from __future__ import annotations

import io
import ipaddress
import re
import resource
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message

from .body import ApiError

MAX_CONNECTIONS = 64  # a queue of 16 and the one generating, with room for /health, token counts and idle keep-alives
HEAD_SECONDS = 10.0  # a request's line and headers (a few hundred bytes: a client takes milliseconds)
BODY_SECONDS = 60.0  # its body, after the headers: the 8 MiB limit at 140 KB/s
IDLE_SECONDS = 30.0  # a kept-alive connection waiting for its next request; also each read's timeout
WRITE_SECONDS = 30.0  # a connection's time blocked in writes, all told (a client reading its answers blocks none)
WRITE_GRACE = 1.0  # seconds a write may block before an eviction may pick its connection (a busy network's stall)
STOP_WRITE_SECONDS = 1.0  # what a write may still block once the server stops (SIGTERM exits within 2 s)
PARSERS = 2  # bodies parsed at once: the GIL runs one at a time anyway, and each may make tens of MB of objects
RETRY_AFTER = 1  # seconds a newcomer refused at the cap is told to wait
BACKOFF = (0.05, 1.0)  # seconds the accept loop pauses when out of file descriptors, doubling up to the second
DRAIN_READS = 4  # reads of what a newcomer refused at the cap sent, before its answer (the accept loop's time)
FILE_LIMIT = 65536  # the soft RLIMIT_NOFILE raised toward the hard limit, at most this (where the hard one is none)
WAITING = ("idle", "head", "body")  # the phases a deadline and an eviction may cut (and `write`, blocked past grace)
LOOPBACK_NAMES = {"localhost"}  # and every loopback address, written as an IP (127.0.0.1, [::1])
CORS_METHODS = "GET, HEAD, POST, OPTIONS"
CORS_MAX_AGE = 600  # seconds a browser may keep a preflight's answer
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header's name (those a preflight asks for are echoed)
LENGTH_DIGITS = 12  # a Content-Length longer than this (leading zeros aside) is past any limit: not worth an int()


@dataclass(frozen=True)
class Limits:
    """The serve command's connection options."""

    max_connections: int = MAX_CONNECTIONS
    head_seconds: float = HEAD_SECONDS
    body_seconds: float = BODY_SECONDS
    idle_seconds: float = IDLE_SECONDS
    write_seconds: float = WRITE_SECONDS

    def deadline(self, phase: str) -> float | None:
        return {"idle": self.idle_seconds, "head": self.head_seconds, "body": self.body_seconds}.get(phase)


@dataclass
class Conn:
    phase: str  # "idle" | "head" | "body" | "busy" | "write"
    since: float  # time.monotonic() when the phase began
    cut: tuple[int, str] | None = None  # why it was cut: the status its handler answers (0: none, just close)
    stalled: float = 0.0  # seconds spent blocked in writes, all told


class Connections:
    """The open connections and their phases; the accept loop's thread cuts, the handlers' threads move phases."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._open: dict[socket.socket, Conn] = {}
        self._lock = threading.Lock()
        self._parsers = threading.BoundedSemaphore(PARSERS)
        self.stopping = False

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, sock: socket.socket) -> bool:
        """A new connection, in its head phase from now; at the cap it evicts the connection that has waited
        longest (False: every one is being answered, and the newcomer is refused)."""
        with self._lock:
            live = sum(1 for c in self._open.values() if c.cut is None)
            if live >= self.limits.max_connections and not self._evict():
                return False
            self._open[sock] = Conn("head", time.monotonic())
            return True

    def evict(self) -> bool:
        """Cut the connection that has waited longest for its request (its line, headers, or body)."""
        with self._lock:
            return self._evict()

    def _evict(self) -> bool:
        stuck = time.monotonic() - WRITE_GRACE
        waiting = [
            (c.phase == "body", c.since, s)
            for s, c in self._open.items()
            if not c.cut and (c.phase in WAITING or (c.phase == "write" and c.since < stuck))
        ]
        if not waiting:
            return False
        sock = min(waiting, key=lambda w: w[:2])[2]  # a request's head, an idle wait, a stalled write before a body's
        why = "too many connections: this one waited longest for its request"
        phase = self._open[sock].phase
        self._cut(sock, (503, why) if phase in ("head", "body") else (0, ""), both=phase == "write")
        return True

    def enter(self, sock: socket.socket, phase: str) -> Conn | None:
        with self._lock:
            conn = self._open.get(sock)
            if conn is not None and conn.cut is None:
                conn.phase, conn.since = phase, time.monotonic()
            return conn

    def cut_of(self, sock: socket.socket) -> tuple[int, str] | None:
        conn = self._open.get(sock)
        return conn.cut if conn is not None else None

    def remove(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.pop(sock, None)

    def sweep(self) -> None:
        """Cut every connection past its phase's deadline (run by the accept loop, every poll)."""
        now = time.monotonic()
        with self._lock:
            for sock, conn in list(self._open.items()):
                limit = self.limits.deadline(conn.phase)
                if conn.cut is None and limit is not None and now - conn.since > limit:
                    what = {"head": "its line and headers", "body": "its body"}.get(conn.phase)
                    self._cut(
                        sock, (408, f"the request took longer than {limit:g} s to send {what}") if what else (0, "")
                    )

    def stop_all(self) -> None:
        """The server stops: a connection being answered reads the end (its answer still goes, each write
        STOP_WRITE_SECONDS at most); every other one is closed both ways, a blocked write included."""
        with self._lock:
            self.stopping = True
            conns = list(self._open.items())
        for sock, conn in conns:
            _shut(sock, both=conn.phase != "busy")

    @contextmanager
    def parsing(self):
        """A turn to parse a body, PARSERS at once: their objects' memory does not multiply by the connections,
        and a stop ends the wait (503) rather than waiting for every body's turn."""
        while not self._parsers.acquire(timeout=0.1):
            if self.stopping:
                raise ApiError(503, "the server is stopping")
        try:
            yield
        finally:
            self._parsers.release()

    def send(self, sock: socket.socket, data) -> None:
        """Write all of `data`, in the `write` phase while it blocks, within what is left of the connection's
        WRITE_SECONDS (TimeoutError past it; an OSError once cut both ways)."""
        conn, t0 = self.enter(sock, "write"), time.monotonic()
        if conn is None:  # (not a connection the accept loop admitted: a test's own socket)
            sock.sendall(data)
            return
        left = self.limits.write_seconds - conn.stalled
        if self.stopping:
            left = min(left, STOP_WRITE_SECONDS)
        before = sock.gettimeout()
        if before is None or left < before:  # (sendall's timeout bounds the whole call, not each send)
            sock.settimeout(max(left, 0.001))
        try:
            sock.sendall(data)
        finally:
            conn.stalled += time.monotonic() - t0
            if sock.gettimeout() != before:
                sock.settimeout(before)
            self.enter(sock, "busy")

    def _cut(self, sock: socket.socket, why: tuple[int, str], both: bool = False) -> None:
        # The handler's thread, blocked reading, reads the end and answers `why` itself: one writer per socket;
        # one blocked writing (`both`) gets an error, and nothing more is sent.
        self._open[sock].cut = why
        _shut(sock, both)


def _shut(sock: socket.socket, both: bool = False) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR if both else socket.SHUT_RD)
    except OSError:
        pass


class Writer(io.BufferedIOBase):
    """A handler's wfile: every write through Connections.send (its phase, its allowance)."""

    def __init__(self, conns: Connections, sock: socket.socket):
        self._conns, self._sock = conns, sock

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._conns.send(self._sock, data)
        return len(data)


def refuse_at_cap(sock: socket.socket, status_line: bytes, body: bytes) -> None:
    """Answer a newcomer at the cap from the accept loop without blocking it: what the client sent is drained
    first, so that closing sends a FIN (the answer arrives) rather than a reset (it may not)."""
    head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nRetry-After: %d\r\n" % (
        status_line,
        len(body),
        RETRY_AFTER,
    )
    try:
        sock.setblocking(False)
        try:
            for _ in range(DRAIN_READS):
                if not sock.recv(65536):
                    break
        except (BlockingIOError, InterruptedError):
            pass
        sock.send(head + b"Connection: close\r\n\r\n" + body)
    except OSError:
        pass


def raise_file_limit() -> int:
    """The soft limit on open files raised to the hard one (the kernel's default soft 1,024 is a few hundred slow
    clients); returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FILE_LIMIT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):  # (macOS refuses more than OPEN_MAX whatever the hard limit says)
            pass
    return soft


# --- a browser's requests ------------------------------------------------------------------------------------


def check_page(headers: Message, hosts: frozenset[str] | None, origins: frozenset[str]) -> str | None:
    """Refuse (403) what a web page in the user's browser could send: a Host its DNS points at us (rebinding), or
    an Origin of its own (any site's script); returns the Origin to answer with CORS headers (one --allow-origin
    lists), or None. Agents, SDKs and editors send neither a foreign Host nor an Origin."""
    given = headers.get_all("Host") or []
    if len(given) > 1 or (given and not host_allowed(given[0], hosts)):
        raise ApiError(
            403,
            f"Host {', '.join(given)[:200]!r} is not this server's name: on a loopback address it answers "
            "localhost, 127.0.0.1 and [::1], or the --host it was given",
            code="forbidden_host",
        )
    sent = headers.get_all("Origin") or []
    if sent:
        if len(sent) > 1 or origin(sent[0]) not in origins:
            raise ApiError(
                403,
                f"requests from web pages are refused (Origin {', '.join(sent)[:200]!r}): "
                "--allow-origin ORIGIN allows a page",
                code="forbidden_origin",
            )
        return sent[0].strip()
    if headers.get("Sec-Fetch-Site", "").strip().lower() in ("cross-site", "same-site"):
        # (a browser's request without an Origin, such as a GET from another site's page)
        raise ApiError(403, "requests from web pages are refused", code="forbidden_origin")
    return None


def preflight(headers: Message) -> dict[str, str]:
    """The answer's headers to an allowed page's preflight: its methods and the headers it asks to send."""
    asked = [h.strip() for h in headers.get("Access-Control-Request-Headers", "").split(",")]
    out = {"Access-Control-Allow-Methods": CORS_METHODS, "Access-Control-Max-Age": str(CORS_MAX_AGE)}
    if any(TOKEN.fullmatch(h) for h in asked):
        out["Access-Control-Allow-Headers"] = ", ".join(h for h in asked if TOKEN.fullmatch(h))
    return out


def body_length(headers: Message, most: int) -> int:
    """A JSON body's length: its Content-Type JSON's (415), one Content-Length in ASCII digits (400; 411 none),
    at most `most` bytes (413)."""
    types = headers.get_all("Content-Type") or []
    if len(types) > 1 or not json_type(types[0] if types else None):
        raise ApiError(
            415,
            f"the body must be JSON, sent with Content-Type: application/json (got {', '.join(types)[:100]!r}); "
            "with curl: -H 'Content-Type: application/json', or --json",
        )
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        raise ApiError(411, "send the body with a Content-Length (chunked request bodies are not accepted)")
    lengths = set(headers.get_all("Content-Length") or [])
    length = lengths.pop().strip() if len(lengths) == 1 else None
    if length is None or not (length.isascii() and length.isdigit()):  # (isdigit alone takes "²" and "٣")
        missing = not lengths and length is None
        raise ApiError(411 if missing else 400, "a request body needs one valid Content-Length")
    digits = length.lstrip("0") or "0"
    n = int(digits) if len(digits) <= LENGTH_DIGITS else most + 1
    if n > most:
        raise ApiError(413, f"the request body has {length[:20]} bytes; the limit is {most:,}")
    return n


def allowed_hosts(bound: str, host: str) -> frozenset[str] | None:
    """The Host names a server bound to `bound` answers (None: any, for a server on another address, which
    only a key protects): on loopback, loopback names and the --host given, so that a page whose name a DNS
    rebinding points at 127.0.0.1 is refused."""
    if not ipaddress.ip_address(bound).is_loopback:
        return None
    return frozenset({*LOOPBACK_NAMES, host.lower(), bound})


def host_allowed(value: str, allowed: frozenset[str] | None) -> bool:
    """Whether a Host header (a name or an IP, a port or none, IPv6 in brackets) names this server."""
    value = value.strip().lower()
    if allowed is None or not value:  # (an empty Host: no browser sends one)
        return True
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not _port(rest)):
            return False
    else:
        name, colon, port = value.partition(":")
        if colon and not _port(colon + port):
            return False
    if name in allowed:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _port(text: str) -> bool:
    return text.startswith(":") and text[1:].isascii() and text[1:].isdigit()


def origin(value: str) -> str | None:
    """An --allow-origin value as compared (scheme://host[:port], lowercased), or None if it is not one."""
    value = value.strip().lower()
    scheme, sep, rest = value.partition("://")
    if not (sep and scheme and rest) or not scheme.replace("-", "").replace("+", "").replace(".", "").isalnum():
        return None
    if any(ch in rest for ch in "/?#@ \t") or not rest.isascii():
        return None
    return value


def json_type(value: str | None) -> bool:
    """Whether a Content-Type is JSON's (its parameters, such as charset=utf-8, aside). None is taken as JSON too:
    scripts (http.client, urllib) often send none, and a browser's POST without one carries an Origin."""
    if value is None:
        return True
    return value.split(";", 1)[0].strip().lower() == "application/json"
