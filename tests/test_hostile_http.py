"""`specdec serve` against hostile clients and web pages, as the hostile pass found them (issue 47, findings 3, 4,
10): slow clients that trickle a request's head or body, more connections than the cap, a process out of file
descriptors, a page in the user's browser (a foreign Host, an Origin, a form's Content-Type), malformed lengths,
a key-less HEAD. Real servers on the tiny fixtures, raw sockets in bounded loops, each server stopped by its pid."""

from __future__ import annotations

import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import anthropic
import openai
import pytest
from test_serve import Served

from specdec_cli.serve import guard
from specdec_cli.serve.http import Server

HEAD_S, BODY_S, CAP = 2.0, 3.0, 40  # the guarded server's deadlines and cap, short for the tests
KEY = "sekrit"
PAGE = "http://localhost:3000"  # the one page --allow-origin lets in
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
JSON_POSTS = {  # every JSON endpoint, with a body it answers, and the status it answers with
    "/v1/chat/completions": (CHAT, 200),
    "/v1/completions": ({"prompt": "hi", "max_tokens": 3}, 200),
    "/v1/responses": ({"input": "hi", "max_output_tokens": 3}, 200),
    "/v1/messages": (CHAT, 200),
    "/v1/messages/count_tokens": ({"messages": CHAT["messages"]}, 200),
    "/infill": ({"input_prefix": "def f(", "input_suffix": "):", "n_predict": 3}, 501),  # (the model has no FIM
    # tokens: a 501 from the model, past every HTTP check)
    "/completion": ({"prompt": "hi", "n_predict": 3}, 200),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import write_fixture_set

    return write_fixture_set(tmp_path_factory.mktemp("hostile-http-models"))


def pair(models, *args) -> Served:
    return Served("--target", models["chat"], "--draft", models["draft"], "--drafter", "model", "-k", "3", *args)


@pytest.fixture(scope="module")
def guarded(models):
    """A keyed server with short deadlines, a cap of CAP connections, and one allowed page."""
    s = pair(models, "--api-key", KEY, "--header-timeout", HEAD_S, "--body-timeout", BODY_S,
             "--max-connections", CAP, "--allow-origin", PAGE)  # fmt: skip
    yield s
    assert s.stop() == 0, s.stderr


def ask(s: Served, method: str, path: str, body=None, headers: dict | None = None, timeout: float = 30):
    """(status, headers, the body: parsed if JSON) over a fresh connection; `body` a dict is sent as JSON."""
    if isinstance(body, dict):
        body = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
    conn = http.client.HTTPConnection(s.host, int(s.port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        is_json = r.getheader("Content-Type") == "application/json"
        return r.status, dict(r.getheaders()), json.loads(data) if is_json and data else data
    finally:
        conn.close()


def connect(s: Served) -> socket.socket:
    return socket.create_connection((s.host, int(s.port)), timeout=5)


def held(sock: socket.socket) -> bool:
    """Whether the server still holds the connection open (not answered and closed, not reset)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def answer_of(sock: socket.socket, seconds: float) -> bytes:
    """What the server sends until it closes the connection (at most `seconds` of waiting)."""
    sock.settimeout(seconds)
    out = b""
    try:
        while data := sock.recv(65536):
            out += data
    except OSError:
        pass
    return out


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


# --- finding 3: slow clients ---------------------------------------------------------------------------------


def test_a_trickled_head_is_cut_at_its_deadline_not_per_read(guarded):
    socks = [connect(guarded) for _ in range(5)]
    t0 = time.monotonic()
    for sock in socks:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    while time.monotonic() - t0 < HEAD_S + 1.5:  # a header line every 0.25 s: each read is quick
        for sock in socks:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                pass
        time.sleep(0.25)
    answers = [answer_of(sock, 2) for sock in socks]
    assert all(a.startswith(b"HTTP/1.1 408 ") and b"line and headers" in a for a in answers), answers[0]


def test_a_trickled_body_is_cut_at_its_deadline(guarded):
    sock = connect(guarded)
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
    sock.sendall(head.encode() + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    t0 = time.monotonic()
    sock.settimeout(0.25)
    got = b""
    while not got and time.monotonic() - t0 < BODY_S + 3:
        try:
            sock.sendall(b" ")
            got = sock.recv(65536)
        except TimeoutError:
            pass
    seconds = time.monotonic() - t0
    got += answer_of(sock, 2)
    assert got.startswith(b"HTTP/1.1 408 ") and b"its body" in got, got
    assert BODY_S - 0.5 < seconds < BODY_S + 1.5


def test_hundreds_of_slow_clients_hold_no_more_than_the_cap_and_health_answers(guarded):
    pid = guarded.proc.pid
    before = threads_of(pid)
    socks, statuses, threads = [], [], []
    for _ in range(200):
        sock = connect(guarded)
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(sock)
    t0 = time.monotonic()
    while time.monotonic() - t0 < HEAD_S + 2:  # each still open sends a header line every 0.5 s
        for sock in socks:
            try:
                sock.send(b"X-Slow: 1\r\n")
            except OSError:
                pass
        statuses.append(ask(guarded, "GET", "/health", timeout=5)[0])
        threads.append(threads_of(pid))
        time.sleep(0.5)
    still = sum(held(sock) for sock in socks)
    for sock in socks:
        sock.close()
    assert statuses == [200] * len(statuses)
    assert max(threads) <= before + CAP + 5, (before, max(threads))
    assert still == 0  # evicted at the cap (503) or cut at the head's deadline (408)


class Blocked:
    """A service whose token counts wait until released: their connections stay busy being answered."""

    model = "m"

    def __init__(self):
        self.release = threading.Event()
        self.gate = SimpleNamespace(close=lambda: None)  # (the server closes it when it stops)

    def tokens(self, req) -> list[int]:
        self.release.wait(20)
        return [1, 2, 3]


def test_at_the_cap_with_every_connection_busy_a_newcomer_gets_503_with_retry_after():
    service = Blocked()
    server = Server(("127.0.0.1", 0), service, None, False, guard.Limits(max_connections=2))
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    serving.start()
    port = server.server_address[1]
    body = json.dumps({"messages": CHAT["messages"]}).encode()
    request = b"POST /v1/messages/count_tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    try:
        busy = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        for sock in busy:
            sock.sendall(request)
        time.sleep(0.5)  # both read and counting
        newcomer = socket.create_connection(("127.0.0.1", port), timeout=5)
        newcomer.sendall(request)
        refused = answer_of(newcomer, 3)
        service.release.set()
        answered = [answer_of(sock, 0.5) for sock in busy]  # (kept alive: the wait ends the read)
    finally:
        service.release.set()
        server.shutdown()
        server.close()
    assert refused.startswith(b"HTTP/1.1 503 ") and b"\r\nRetry-After: 1\r\n" in refused, refused
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answered), answered


def test_out_of_file_descriptors_the_accept_loop_backs_off_and_health_answers(models):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))  # the server inherits a low soft limit
    try:
        s = pair(models, "--max-connections", 1000)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    socks = []
    try:
        pid = s.proc.pid
        limits = open(f"/proc/{pid}/limits").read()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files")).split()
        assert line[3] == line[4] or int(line[3]) == guard.FILE_LIMIT  # raised to the hard limit at start
        n = len(os.listdir(f"/proc/{pid}/fd")) + 8
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (n, n))  # eight to spare, then none
        socks = [connect(s) for _ in range(30)]  # silent clients: twenty-two wait in the listen backlog
        time.sleep(0.5)
        cpu0 = cpu_seconds(pid)
        time.sleep(2)
        spent = cpu_seconds(pid) - cpu0
        status = ask(s, "GET", "/health", timeout=10)[0]
    finally:
        for sock in socks:
            sock.close()
        code = s.stop()
    assert spent < 0.5, f"the accept loop spun: {spent:.2f} s of CPU in 2 s"
    assert status == 200
    assert code == 0 and "cannot accept connections" in s.stderr


# --- finding 4: web pages ------------------------------------------------------------------------------------


def test_a_foreign_host_is_refused_and_loopback_names_are_answered(guarded):
    port = guarded.port
    for host in ["localhost", f"localhost:{port}", "LocalHost", "127.0.0.1", f"127.0.0.1:{port}", "[::1]",
                 f"[::1]:{port}", "127.0.0.2"]:  # fmt: skip
        assert ask(guarded, "GET", "/health", headers={"Host": host})[0] == 200, host
        assert ask(guarded, "GET", "/v1/models", headers={**AUTH, "Host": host})[0] == 200, host
    for host in ["evil.example.com", f"evil.example.com:{port}", "127.0.0.1.nip.io", "localhost.evil.com",
                 "[::1]x", "localhost:x"]:  # fmt: skip
        status, _, body = ask(guarded, "POST", "/v1/chat/completions", CHAT, {**AUTH, "Host": host})
        assert status == 403 and body["error"]["code"] == "forbidden_host", host
        assert ask(guarded, "GET", "/health", headers={"Host": host})[0] == 403, host


def test_a_foreign_origin_is_refused_and_an_allowed_one_gets_cors(guarded):
    for origin in ["http://evil.example.com", "null", "http://localhost:3001", f"http://127.0.0.1:{guarded.port}"]:
        status, head, body = ask(guarded, "POST", "/v1/chat/completions", CHAT, {**AUTH, "Origin": origin})
        assert status == 403 and body["error"]["code"] == "forbidden_origin", origin
        assert "Access-Control-Allow-Origin" not in head
        preflight = {"Origin": origin, "Access-Control-Request-Method": "POST"}
        assert ask(guarded, "OPTIONS", "/v1/chat/completions", headers=preflight)[0] == 403
    status, _, body = ask(guarded, "POST", "/v1/messages", CHAT, {**AUTH, "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and body["type"] == "error"  # (Anthropic's shape on its endpoint)

    asked = {"Origin": PAGE, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}  # fmt: skip
    status, head, _ = ask(guarded, "OPTIONS", "/v1/chat/completions", headers=asked)  # (no key: browsers send none)
    assert status == 204 and head["Access-Control-Allow-Origin"] == PAGE
    assert "POST" in head["Access-Control-Allow-Methods"]
    assert head["Access-Control-Allow-Headers"] == "authorization, content-type, x-stainless-os"
    status, head, _ = ask(guarded, "POST", "/v1/chat/completions", CHAT, {**AUTH, "Origin": PAGE})
    assert status == 200 and head["Access-Control-Allow-Origin"] == PAGE and head["Vary"] == "Origin"
    status, head, _ = ask(guarded, "POST", "/v1/chat/completions", {**CHAT, "stream": True}, {**AUTH, "Origin": PAGE})
    assert status == 200 and head["Access-Control-Allow-Origin"] == PAGE  # (a stream's headers too)
    assert ask(guarded, "POST", "/v1/chat/completions", CHAT, {"Origin": PAGE})[0] == 401  # the key still counts


def test_json_endpoints_refuse_other_content_types(guarded):
    for path, (body, ok) in JSON_POSTS.items():
        data = json.dumps(body).encode()
        for kind in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]:
            status, _, answer = ask(guarded, "POST", path, data, {**AUTH, "Content-Type": kind})
            assert status == 415 and "--json" in json.dumps(answer), (path, kind)
        for kind in ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8", None]:
            headers = {**AUTH, **({"Content-Type": kind} if kind else {})}
            assert ask(guarded, "POST", path, data, headers)[0] == ok, (path, kind)


def test_the_official_clients_and_editors_keep_working(guarded):
    oa = openai.OpenAI(base_url=guarded.url, api_key=KEY, max_retries=0)
    assert oa.chat.completions.create(model="m", messages=CHAT["messages"], max_tokens=3).choices[0].message
    assert [c for c in oa.chat.completions.create(model="m", messages=CHAT["messages"], max_tokens=3, stream=True)]
    assert oa.models.retrieve("chat").id == "chat"
    claude = anthropic.Anthropic(base_url=guarded.url.removesuffix("/v1"), api_key=KEY, max_retries=0)
    assert claude.messages.create(model="m", messages=CHAT["messages"], max_tokens=3).content is not None
    assert claude.messages.count_tokens(model="m", messages=CHAT["messages"]).input_tokens > 0
    with claude.messages.stream(model="m", messages=CHAT["messages"], max_tokens=3) as stream:
        assert stream.get_final_message().stop_reason
    assert ask(guarded, "HEAD", "/")[0] == 200  # Claude Code's check, without a key
    # llama.vim: curl with -H 'Content-Type: application/json' (and its key) to /infill
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Content-Type: application/json",
                          "-H", f"Authorization: Bearer {KEY}", "--data", json.dumps(JSON_POSTS["/infill"][0]),
                          f"http://{guarded.host}:{guarded.port}/infill"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.stdout == str(JSON_POSTS["/infill"][1])


# --- finding 10: lengths, keys, bounds -----------------------------------------------------------------------


def test_content_length_is_ascii_digits_and_the_whole_body(guarded):
    # (headers are Latin-1: "²" is one byte, and a digit to str.isdigit)
    for length in ["²", "1³", "¹", "+5", "-1", "0x10", "1e3", "5 5"]:
        sock = connect(guarded)
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        sock.sendall((head + f"Content-Length: {length}\r\n\r\n").encode("latin-1"))
        assert answer_of(sock, 10).startswith(b"HTTP/1.1 400 "), length
    sock = connect(guarded)  # a body that ends before its length, then the client's end: a JSON that parses
    head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
    body = b'{"prompt": "hi", "max_tokens": 3}'
    sock.sendall(head.encode() + b"Content-Length: %d\r\n\r\n%s" % (len(body) + 20, body))
    sock.shutdown(socket.SHUT_WR)
    got = answer_of(sock, 10)
    assert got.startswith(b"HTTP/1.1 400 ") and b"ended after" in got, got
    long = "0" * 5000 + str(len(body))  # past int()'s 4,300 digits, and a small length all the same
    assert ask(guarded, "POST", "/v1/completions", body, {**AUTH, "Content-Length": long})[0] == 200


def test_every_protected_route_and_method_checks_the_key(guarded):
    for method, path in [("GET", "/v1/models"), ("HEAD", "/v1/models"), ("GET", "/v1/models/chat"),
                         ("HEAD", "/v1/models/chat"), ("HEAD", "/v1/models/other"), ("DELETE", "/v1/models"),
                         ("PUT", "/v1/models/chat"), ("GET", "/nowhere"), ("OPTIONS", "/v1/chat/completions"),
                         *(("POST", p) for p in JSON_POSTS)]:  # fmt: skip
        status, head, _ = ask(guarded, method, path)
        assert status == 401 and head.get("WWW-Authenticate") == "Bearer", (method, path)
    assert ask(guarded, "HEAD", "/v1/models/chat", headers=AUTH)[0] == 200
    assert ask(guarded, "GET", "/health")[0] == ask(guarded, "HEAD", "/")[0] == 200


def test_an_absurd_max_tokens_is_a_4xx_in_each_apis_shape(guarded):
    big = 10_000_000_000
    status, _, body = ask(guarded, "POST", "/v1/messages", {**CHAT, "max_tokens": big}, AUTH)
    assert status == 400 and body["type"] == "error" and "max_tokens" in body["error"]["message"]
    status, _, body = ask(guarded, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": big}, AUTH)
    assert status == 400 and body["error"]["param"] == "max_tokens"
    status, _, body = ask(guarded, "POST", "/v1/responses", {"input": "hi", "max_output_tokens": big}, AUTH)
    assert status == 400 and "max_output_tokens" in body["error"]["message"]
    status, _, body = ask(guarded, "POST", "/completion", {"prompt": "hi", "n_predict": big}, AUTH)
    assert status == 400 and body["error"]["code"] == 400


def test_a_public_host_without_a_key_refuses_to_start(models):
    cmd = [sys.executable, "-m", "specdec_cli", "serve", "--target", str(models["chat"]), "--host", "0.0.0.0",
           "--port", "0"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_API_KEY"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: --host 0.0.0.0 is reachable from other machines: give --api-key")
    assert "--insecure-no-key" in out.stderr
    s = Served("--target", models["chat"], "--drafter", "none", "--host", "0.0.0.0", "--insecure-no-key")
    assert s.stop() == 0
    assert "no authentication" in s.stderr


# --- the second hostile pass: clients that send requests and read none of the answers ---------------------------

HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def stuffed(port: int, request: bytes = HEALTH) -> socket.socket:
    """A connection that pipelines `request` until the server stops reading (its answers fill the buffers both
    ways: this client reads none), left open."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connecting: a small window)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    burst, quiet = request * 512, 0
    while quiet < 5:  # five rounds of 0.1 s in which nothing more went: the server reads no more
        try:
            sock.send(burst)
            quiet = 0
        except BlockingIOError:
            quiet += 1
            time.sleep(0.1)
    return sock


def test_a_write_to_a_client_that_does_not_read_ends_within_the_connections_allowance():
    conns = guard.Connections(guard.Limits(write_seconds=1.0))
    ours, theirs = socket.socketpair()
    try:
        ours.settimeout(30)
        conns.admit(ours)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            conns.send(ours, b"x" * 2**24)  # far past both buffers
        first = time.monotonic() - t0
        with pytest.raises(TimeoutError):
            conns.send(ours, b"y" * 2**16)  # the allowance is the connection's, not each write's: it is spent
        second = time.monotonic() - t0 - first
        assert ours.gettimeout() == 30  # reads keep their own timeout
    finally:
        ours.close()
        theirs.close()
    assert 0.9 < first < 2.0 and second < 0.2, (first, second)


def test_pipelining_clients_that_read_nothing_neither_hold_the_cap_nor_health():
    cap = 4
    server = Server(("127.0.0.1", 0), None, None, False, guard.Limits(max_connections=cap, write_seconds=3.0))
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    serving.start()
    port = server.server_address[1]
    stuck = []
    try:
        stuck = [stuffed(port) for _ in range(cap)]
        time.sleep(guard.WRITE_GRACE + 0.2)  # every one blocked writing past the grace: evictable
        t0 = time.monotonic()
        health = socket.create_connection(("127.0.0.1", port), timeout=5)
        health.sendall(HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        answer, waited = answer_of(health, 5), time.monotonic() - t0
        time.sleep(3.0 + 0.5)  # past every connection's allowance: each closed
        open_after = len(server.conns)
    finally:
        for sock in stuck:
            sock.close()
        server.shutdown()
        server.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and waited < 2, (answer[:100], waited)
    assert open_after == 0


def test_a_refused_key_ends_the_connection_so_pipelined_requests_get_one_answer(guarded):
    sock = connect(guarded)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 3)
    got = answer_of(sock, 5)
    assert got.count(b"HTTP/1.1 401 ") == 1 and b"\r\nConnection: close\r\n" in got, got


def test_sigterm_ends_the_server_promptly_while_a_client_reads_none_of_its_answers(models):
    s = pair(models)
    stuck = None
    try:
        stuck = stuffed(int(s.port))
        time.sleep(0.5)
        t0 = time.monotonic()
        code = s.stop()
        seconds = time.monotonic() - t0
    finally:
        if stuck is not None:
            stuck.close()
        if s.proc.poll() is None:
            s.stop()
    assert code == 0 and seconds < 3, (code, seconds, s.stderr)
