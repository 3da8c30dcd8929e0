"""`specdec serve` as a client sees it: a real server process on 127.0.0.1 (a free port the OS picks),
the official openai client, raw HTTP for what a client library would never send, and signals."""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from specdec_cli.batching.claim import Claim
from specdec_cli.chat import Message
from specdec_cli.run_inputs import Inputs
from specdec_cli.engine.stats import collect
from specdec_cli.serve.api import ApiError, parse
from specdec_cli.serve.cuts import StopText
from specdec_cli.serve.gate import Gate
from specdec_cli.session import RunConfig, open_session

START_SECONDS = 120.0


class Served:
    """`specdec serve ARGS --port 0` until stopped; `url` is the address it printed."""

    def __init__(self, *args, env: dict | None = None):
        cmd = [sys.executable, "-m", "specdec_cli", "serve", "--port", "0", "-t", "2", *map(str, args)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], START_SECONDS)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("http://"):
            self.stop()
            raise AssertionError(f"the server did not start: {self.stderr}")
        self.url = line.strip()
        self.host, self.port = self.url.split("//")[1].split("/")[0].split(":")
        self.stderr = ""

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def raw(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection(self.host, int(self.port), timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def post(self, path: str, obj, headers: dict | None = None):
        status, head, data = self.raw("POST", path, json.dumps(obj).encode(), headers)
        return status, head, json.loads(data)

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.stderr = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


@pytest.fixture(scope="module")
def smol_server(smollm2):
    """SmolLM2 with lookup (auto's cost model chooses), checking the KV caches every round (--debug). One slot: these
    tests compare answers across requests, and in fast mode an answer decoded in a step beside another request's
    rows may part from its answer alone at a near-tie (docs/serve.md; the slots' tests are tests/test_parallel.py)."""
    s = Served("--target", smollm2, "--drafter", "auto", "--debug", "-c", "1024", "--no-lookup-cache", "-np", "1")
    yield s
    assert s.stop() == 0, s.stderr


@pytest.fixture(scope="module")
def pair_server(tmp_path_factory):
    """The tiny fixtures: a chat-template target and a draft model, with --debug."""
    from tiny_models import write_fixture_set

    m = write_fixture_set(tmp_path_factory.mktemp("serve-models"))
    s = Served("--target", m["chat"], "--draft", m["draft"], "--drafter", "model", "-k", "3", "--debug")
    s.models = m
    yield s
    assert s.stop() == 0, s.stderr


def generate_json(*args) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", "--json", "-t", "2", *map(str, args)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


PROMPT = "Write a Python function that returns the sum of a list."


def test_chat_and_completions_match_generate(smol_server, smollm2):
    client = smol_server.client()
    cli = generate_json(PROMPT, "--target", smollm2, "--drafter", "auto", "-n", "40", "--no-lookup-cache")
    r = client.chat.completions.create(
        model="smollm2-135m-instruct-q4_1", messages=[{"role": "user", "content": PROMPT}], max_tokens=40
    )
    assert r.choices[0].message.content == cli["text"]
    assert r.choices[0].finish_reason == ("length" if cli["stop_reason"] == "max_tokens" else "stop")
    assert r.usage.completion_tokens == len(cli["tokens"]) and r.usage.prompt_tokens == cli["stats"]["prompt_tokens"]
    spec = r.model_extra["speculative"]
    assert set(spec) == set(cli["stats"]) - {"load_seconds", "cost_curve"}  # the process's, not the request's
    assert spec["generated_tokens"] == len(cli["tokens"])

    chunks = list(
        client.chat.completions.create(
            model="smollm2-135m-instruct-q4_1", messages=[{"role": "user", "content": PROMPT}], max_tokens=40,
            stream=True,
        )
    )  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == cli["text"]
    assert chunks[-1].choices[0].finish_reason and set(chunks[-1].model_extra["speculative"]) == set(spec)

    raw = "The three primary colours are"
    cli = generate_json(raw, "--target", smollm2, "--no-chat", "--drafter", "auto", "-n", "24", "--no-lookup-cache")
    r = client.completions.create(model="smollm2-135m-instruct-q4_1", prompt=raw, max_tokens=24)
    assert r.choices[0].text == cli["text"] and r.usage.completion_tokens == 24
    streamed = client.completions.create(model="smollm2-135m-instruct-q4_1", prompt=raw, max_tokens=24, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cli["text"]
    assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct-q4_1"]
    # Any model name is answered by the loaded pair, and the response names the model that answered.
    other = client.completions.create(model="gpt-4o-mini", prompt=raw, max_tokens=24)
    assert other.model == "smollm2-135m-instruct-q4_1" and other.choices[0].text == cli["text"]


PERSON = {
    "type": "object",
    "required": ["name", "age", "city"],
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
    },
}


def test_response_format_constrains_the_answer_as_generate_does(smol_server, smollm2):
    client, ask = smol_server.client(), "Bob is 42 and lives in Paris. Give his name, age and city as JSON."
    cli = generate_json(ask, "--target", smollm2, "--drafter", "auto", "-n", "60", "--no-lookup-cache",
                        "--json-schema", json.dumps(PERSON))  # fmt: skip
    assert cli["valid"] is True
    r = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": ask}], max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )  # fmt: skip
    answer = json.loads(r.choices[0].message.content)
    assert r.choices[0].message.content == cli["text"] and r.choices[0].finish_reason == "stop"
    assert (
        set(answer) == {"name", "age", "city"}
        and isinstance(answer["age"], int)
        and answer["city"] in ("Paris", "Rome")
    )
    any_object = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": ask}], max_tokens=60, response_format={"type": "json_object"}
    )
    assert any_object.choices[0].finish_reason != "stop" or isinstance(
        json.loads(any_object.choices[0].message.content), dict
    )


def test_draft_model_and_overrides_match_generate(pair_server):
    m, client = pair_server.models, pair_server.client()
    cli = generate_json("hello there", "--target", m["chat"], "--draft", m["draft"], "--drafter", "model", "-k", "3",
                        "-n", "30")  # fmt: skip
    r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hello there"}],
                                       max_tokens=30)  # fmt: skip
    assert r.choices[0].message.content == cli["text"]
    assert r.model_extra["speculative"]["by_drafter"]["model"]["drafted"] > 0
    # Per-request drafter and draft length: the text is the target's either way.
    plain = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello there"}], max_tokens=30,
        extra_body={"drafter": "none"},
    )  # fmt: skip
    assert plain.choices[0].message.content == cli["text"]
    assert plain.model_extra["speculative"]["drafted"] == 0
    k5 = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello there"}], max_tokens=30,
        extra_body={"draft_tokens": 5},
    )  # fmt: skip
    assert k5.choices[0].message.content == cli["text"]
    assert max(len(k5.model_extra["speculative"]["per_position_accept"]), 0) <= 5


def test_stop_sequences_cut_the_text_and_never_stream_a_part_of_one(smol_server):
    client = smol_server.client()
    full = client.completions.create(model="smollm2-135m-instruct-q4_1", prompt="1, 2, 3, 4,", max_tokens=20)
    text = full.choices[0].text
    stop = text[6:9]
    assert len(stop) == 3 and stop in text
    cut = client.completions.create(model="smollm2-135m-instruct-q4_1", prompt="1, 2, 3, 4,", max_tokens=20,
                                    stop=[stop, "zzz"])  # fmt: skip
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model="smollm2-135m-instruct-q4_1", prompt="1, 2, 3, 4,", max_tokens=20, stop=stop, stream=True
        )
    ]
    assert "".join(pieces) == text[: text.index(stop)]


def test_eight_concurrent_clients_each_get_their_own_answer(smol_server):
    client = smol_server.client(timeout=300)
    topics = ["the sea", "a cat", "mountains", "Python code", "the moon", "bread", "winter", "a train"]

    def ask(i: int, stream: bool) -> str:
        args = dict(model="smollm2-135m-instruct-q4_1", max_tokens=16,
                    messages=[{"role": "user", "content": f"Write one sentence about {topics[i]}."}])  # fmt: skip
        if stream:
            chunks = client.chat.completions.create(**args, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks)
        return client.chat.completions.create(**args).choices[0].message.content

    expected = [ask(i, False) for i in range(8)]
    assert len(set(expected)) == 8  # different answers: a mix-up would show
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: ask(i, i % 2 == 0), range(8)))
    assert got == expected


def test_eight_clients_of_the_default_slots_in_exact_mode_each_get_their_answer_alone(smollm2):
    """The default server (several slots, decoded together): in exact mode each answer is the one it gets alone, token
    for token, whatever the others ask meanwhile; the server says how many slots it runs."""
    s = Served("--target", smollm2, "--drafter", "auto", "--exact", "-c", "512", "--no-lookup-cache", "--debug")
    try:
        client = s.client(timeout=300)
        prompts = [f"Write one sentence about {t}." for t in ("the sea", "a cat", "mountains", "bread")] * 2

        def ask(i: int) -> str:
            messages = [{"role": "user", "content": prompts[i]}]
            r = client.chat.completions.create(model="m", max_tokens=24 + i, messages=messages)
            return r.choices[0].message.content

        expected = [ask(i) for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(ask, range(8)))
    finally:
        assert s.stop() == 0, s.stderr
    assert got == expected
    assert "4 slots" in s.stderr and "shared by several requests" in s.stderr


def test_a_client_that_leaves_mid_stream_stops_its_generation(smol_server):
    body = json.dumps({"prompt": "Tell a very long story about a dragon.", "max_tokens": 400, "stream": True})
    conn = http.client.HTTPConnection(smol_server.host, int(smol_server.port), timeout=60)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    r.read1(200)  # a first event or two
    conn.sock.shutdown(2)
    conn.close()
    t0 = time.monotonic()
    # The next request is served at once (the abandoned one stopped) and right: the caches were rolled
    # back (--debug checks them every round) and what they kept is only a prefix of the text.
    client = smol_server.client(timeout=60)
    after = client.completions.create(model="smollm2-135m-instruct-q4_1", prompt=PROMPT, max_tokens=20)
    assert time.monotonic() - t0 < 30  # 400 tokens would take far longer than 20 (a bound, not a benchmark)
    cold = client.completions.create(model="smollm2-135m-instruct-q4_1", prompt="x " + PROMPT, max_tokens=1)
    again = client.completions.create(model="smollm2-135m-instruct-q4_1", prompt=PROMPT, max_tokens=20)
    assert cold.usage.completion_tokens == 1 and after.choices[0].text == again.choices[0].text


def chat_turns(client, max_tokens: int = 32):
    first = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    a = client.chat.completions.create(model="smollm2-135m-instruct-q4_1", messages=first, max_tokens=max_tokens)
    turn = first + [
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "user", "content": "Now make it reverse the words instead."},
    ]
    b = client.chat.completions.create(model="smollm2-135m-instruct-q4_1", messages=turn, max_tokens=max_tokens)
    return a, turn, b


def test_the_second_chat_turn_reuses_the_first(smol_server):
    a, turn, b = chat_turns(smol_server.client())
    cached = b.usage.model_extra["prompt_tokens_cached"]
    # The first turn's prompt and all of its answer but the last token (never fed to the target).
    assert cached >= a.usage.prompt_tokens + a.usage.completion_tokens - 2
    assert b.usage.prompt_tokens_details.cached_tokens == cached < b.usage.prompt_tokens
    cold = smol_server.client().chat.completions.create(
        model="smollm2-135m-instruct-q4_1", messages=turn, max_tokens=4, extra_body={"cache_prompt": False}
    )
    assert cold.usage.model_extra["prompt_tokens_cached"] == 0


def test_with_exact_the_reused_turn_says_what_a_cold_run_says(smollm2):
    """Exact mode: every cell a reused prefix holds is the cell a cold run computes, so the text is the
    same bit for bit (outside exact mode batch shapes differ at near-ties: README, Serve)."""
    s = Served("--target", smollm2, "--drafter", "auto", "--exact", "--debug", "-c", "1024", "--no-lookup-cache")
    try:
        a, turn, b = chat_turns(s.client())
        assert b.usage.model_extra["prompt_tokens_cached"] > a.usage.prompt_tokens
    finally:
        assert s.stop() == 0, s.stderr
    cfg = RunConfig(target=smollm2, drafter="auto", max_tokens=32, threads=2, ctx_size=1024, lookup_cache=False,
                    exact=True)  # fmt: skip
    with open_session(cfg) as cold:  # a session of its own: nothing to reuse
        tokens = cold.prompt_tokens(messages=[Message(m["role"], m["content"]) for m in turn])
        events = list(cold.generate(tokens, Inputs(reuse=True)))
    assert events[0].cached == 0 and len(tokens) == b.usage.prompt_tokens
    assert collect(iter(events)).text == b.choices[0].message.content


def test_bad_requests_get_an_error_object_and_the_server_goes_on(smol_server):
    s = smol_server
    chat = "/v1/chat/completions"
    good = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases = [
        (s.raw("POST", chat, b"{not json", {"Content-Type": "application/json"}), 400, None),
        (s.raw("POST", chat, b"[1, 2]"), 400, None),
        (s.post(chat, {**good, "temperature": "hot"}), 400, "temperature"),
        (s.post(chat, {**good, "temperature": -1}), 400, "temperature"),
        (s.post(chat, {**good, "max_tokens": 0}), 400, "max_tokens"),
        (s.post(chat, {**good, "max_tokens": True}), 400, "max_tokens"),
        (s.post(chat, {**good, "draft_tokens": "many"}), 400, "draft_tokens"),
        (s.post(chat, {**good, "drafter": "oracle"}), 400, "drafter"),
        (s.post(chat, {**good, "drafter": "model"}), 400, "drafter"),  # no draft model loaded
        (s.post(chat, {**good, "exact": True}), 400, "exact"),
        (s.post(chat, {**good, "n": 2}), 400, "n"),
        (s.post(chat, {**good, "stop": ["a", "b", "c", "d", "e"]}), 400, "stop"),
        (s.post(chat, {"messages": "hi"}), 400, "messages"),
        (s.post(chat, {"messages": [{"role": "wizard", "content": "hi"}]}), 400, "messages[0]"),
        (
            s.post(chat, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            400,
            "messages[0].content",
        ),
        (s.post("/v1/completions", {"prompt": "word " * 3000}), 400, "prompt"),
        (s.post("/v1/completions", {"prompt": 42}), 400, "prompt"),
        (s.post("/v1/nothing", good), 404, None),
        (s.raw("GET", chat), 405, None),
        (s.raw("POST", chat, b"x" * 16, {"Content-Length": str(9 * 2**20)}), 413, None),
        (s.raw("POST", chat, b"[" * 100_000 + b"]" * 100_000), 400, None),  # nested too deeply for the parser
        (
            s.raw("POST", chat, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'),
            400,
            "temperature",
        ),  # fmt: skip
        (s.raw("POST", chat, rb'{"messages": [{"role": "user", "content": "a\udc80"}]}'), 400, "messages[0].content"),
        (
            s.raw("POST", chat, b'{"messages": [{"role": "user", "content": "\xed\xb2\x80"}]}'),
            400,
            "messages[0].content",
        ),
        (s.raw("POST", chat, b'{"messages": [{"role": "user", "content": "\xff"}]}'), 400, None),
        (s.raw("HEAD", chat), 405, None),
        (s.post(chat, {"messages": [{"role": ["user"], "content": "hi"}]}), 400, "messages[0]"),
        (
            s.raw(
                "POST", chat, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 5000 + b"}"
            ),
            400,
            None,
        ),  # fmt: skip
        (s.post(chat, {**good, "tools": [{"type": "function", "function": {"name": "no spaces"}}]}), 400, "tools[0]"),
        (
            s.post(chat, {**good, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "g"}),
            400,
            "tool_choice",
        ),
        (s.post(chat, {**good, "tools": [{"type": "code_interpreter"}]}), 400, "tools"),
        (s.post(chat, {**good, "prediction": {"type": "content", "content": 3}}), 400, "prediction.content"),
        (
            s.post(chat, {**good, "response_format": {"type": "json_schema", "json_schema": {"schema": "x"}}}),
            400,
            "response_format",
        ),
        (s.post(chat, {**good, "response_format": {"type": "yaml"}}), 400, "response_format"),
        (s.post(chat, {**good, "temprature": 0.5}), 400, "temprature"),  # a typo is not silently the default
    ]
    for (status, _, body), want, param in cases:
        body = (
            body
            if isinstance(body, dict)
            else json.loads(body or b'{"error": {"message": "(HEAD)", "type": "x", "param": null}}')
        )
        assert status == want, body
        assert body["error"]["message"] and body["error"]["type"] and body["error"]["param"] == param, body
    # A refusal before the body was read (unknown path, wrong key) must not leave the body on a kept-alive
    # connection, to be read as the next request.
    conn = http.client.HTTPConnection(s.host, int(s.port), timeout=30)
    for path in ("/v1/nothing", "/v1/models/x"):
        conn.request("POST", path, body=json.dumps(good))
        assert conn.getresponse().read() and True
        conn.request("GET", "/health")
        assert json.loads(conn.getresponse().read()) == {"status": "ok"}
    conn.request("GET", "/health", body=b'{"x": 1}')  # a GET's body, never read
    assert conn.getresponse().read()
    conn.request("GET", "/health")
    assert json.loads(conn.getresponse().read()) == {"status": "ok"}
    conn.close()
    with socket.create_connection((s.host, int(s.port)), timeout=30) as raw:  # two lengths: which one is meant?
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 14\r\n\r\n"
                    b'{"prompt": "x"}')  # fmt: skip
        reply = b"".join(iter(lambda: raw.recv(65536), b"")).decode()
    assert " 400 " in reply.split("\r\n")[0] and reply.count("HTTP/1.") == 1
    # A request line http.server itself refuses still gets the error object.
    with socket.create_connection((s.host, int(s.port)), timeout=30) as raw:
        raw.sendall(b"GARBAGE\r\n\r\n")
        reply = b"".join(iter(lambda: raw.recv(65536), b"")).decode()  # until the server closes it
    assert reply.startswith("HTTP/1.") and " 400 " in reply.split("\r\n")[0] and '"error"' in reply
    long = s.post("/v1/completions", {"prompt": "word " * 3000})[2]
    assert long["error"]["code"] == "context_length_exceeded"
    status, _, body = s.post(chat, good)
    assert status == 200 and body["choices"][0]["message"]["content"]
    assert s.raw("GET", "/health")[0] == 200


def test_a_full_queue_gets_503_with_retry_after(smollm2):
    s = Served("--target", smollm2, "--drafter", "none", "--queue", "0", "-np", "1")
    try:
        conn = http.client.HTTPConnection(s.host, int(s.port), timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 300,
                                                             "stream": True}))  # fmt: skip
        busy = conn.getresponse()
        assert busy.status == 200
        busy.read1(100)  # it is generating now
        status, headers, body = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 503 and int(headers["Retry-After"]) >= 1
        assert json.loads(json.dumps(body))["error"]["code"] == "queue_full"
        conn.close()
    finally:
        assert s.stop() == 0, s.stderr


def test_api_key_is_required_and_health_is_open(smollm2):
    s = Served("--target", smollm2, "--drafter", "none", env={"SPECDEC_API_KEY": "s3cret"})
    try:
        assert s.raw("GET", "/health")[0] == 200
        assert s.raw("GET", "/v1/models")[0] == 401
        status, headers, body = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2},
                                       {"Authorization": "Bearer wrong"})  # fmt: skip
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        r = s.client(api_key="s3cret").completions.create(model="smollm2-135m-instruct-q4_1", prompt="hi", max_tokens=2)
        assert r.usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="s3cre").models.list()
    finally:
        assert s.stop() == 0


def test_every_interface_without_a_key_refuses_to_start_unless_told(smollm2):
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_API_KEY"}
    cmd = [sys.executable, "-m", "specdec_cli", "serve", "--target", str(smollm2), "--host", "0.0.0.0", "--port", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and out.stderr.startswith("error: --host 0.0.0.0 is reachable")
    assert "--api-key" in out.stderr and "--insecure-no-key" in out.stderr
    s = Served("--target", smollm2, "--drafter", "none", "--host", "0.0.0.0", "--insecure-no-key")
    assert s.stop() == 0  # (stop always ends it, killing it if it must)
    assert "no authentication" in s.stderr


def test_sigterm_mid_stream_ends_the_stream_cleanly_and_exits_0(smollm2):
    s = Served("--target", smollm2, "--drafter", "none", "-np", "1")
    try:
        conn = http.client.HTTPConnection(s.host, int(s.port), timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 2000,
                                                             "stream": True}))  # fmt: skip
        r = conn.getresponse()
        r.read1(100)
        # Requests waiting for their turn: each must get its answer (503) however the turn passes at the stop.
        with ThreadPoolExecutor(5) as pool:
            waiting = [pool.submit(s.post, "/v1/completions", {"prompt": f"{i}", "max_tokens": 2}) for i in range(5)]
            time.sleep(0.5)
            s.proc.send_signal(signal.SIGTERM)
            rest = r.read().decode()  # the chunked stream ends properly (http.client would raise on a cut one)
            statuses = [f.result(timeout=60)[0] for f in waiting]
    finally:
        code = s.stop()  # (killed if it does not end within a minute)
    assert rest.rstrip().endswith("data: [DONE]") and "shutting down" in rest
    assert statuses == [503] * 5
    assert code == 0 and "stopped" in s.stderr


# --- the parts, without a server ---------------------------------------------------------------------


def test_stop_text_holds_back_what_may_become_a_stop_sequence():
    cut = StopText(["END", "\n\n"])
    assert cut.push("abc E") == "abc"  # " E" may start "END"
    assert cut.push("N") == " "
    assert cut.push("D tail") == "" and cut.hit
    free = StopText([])
    assert free.push("abc") == "abc" and free.flush() == ""


def test_parse_refuses_wrong_types_with_the_field_named():
    with pytest.raises(ApiError) as e:
        parse("chat", {"messages": [{"role": "user", "content": "x"}], "top_p": "1"})
    assert e.value.param == "top_p" and e.value.status == 400
    req = parse("chat", {"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}]}],
                         "max_completion_tokens": 5, "draft_tokens": "auto", "seed": 3.0})  # fmt: skip
    assert req.messages == [Message("system", "a")] and req.settings == {
        "max_tokens": 5,
        "draft_tokens": None,
        "seed": 3,
    }


class _Slot:
    def bind(self, claim):
        pass

    def release(self):
        pass


def test_gate_queues_up_to_its_bound_then_refuses():
    gate, entered, release = Gate([_Slot()], 1), [], threading.Event()

    def hold():
        with gate.admit(Claim()):
            entered.append(1)
            release.wait(10)

    first = threading.Thread(target=hold)
    first.start()
    while not entered:
        time.sleep(0.01)
    second = threading.Thread(target=hold)  # waits its turn: the queue holds one
    second.start()
    while len(gate._line) < 1:
        time.sleep(0.01)
    with pytest.raises(ApiError) as e:
        with gate.admit(Claim()):
            pass
    assert e.value.status == 503 and e.value.retry_after >= 1
    release.set()
    first.join()
    second.join()
    assert len(entered) == 2
