"""`specdec serve` as the editor plugins call it: llama-server's /infill and /completion (bodies as llama.vim and
llama.vscode send them), OpenAI's `suffix` and log probabilities, prefix reuse counted by timings.prompt_n, a newer
request superseding the one before it, and the time and indentation limits."""

from __future__ import annotations

import http.client
import json
import threading

import pytest

from specdec_cli.backend.native import Model
from specdec_cli.chat import fim
from test_serve import Served

CTX = 4096
PREFIX = "import os\n\n\ndef list_files(root):\n    out = []\n    for name in os.listdir(root):\n"
SUFFIX = "\n    return out\n\n\nprint(list_files('.'))\n"
VIM_FIELDS = [  # llama.vim's response_fields (autoload/llama.vim)
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/prompt_per_token_ms",
    "timings/prompt_per_second",
    "timings/predicted_n",
    "timings/predicted_ms",
    "timings/predicted_per_token_ms",
    "timings/predicted_per_second",
    "truncated",
    "tokens_cached",
]


def vim_body(prefix: str = PREFIX, suffix: str = SUFFIX, **kw) -> dict:
    """A FIM request as llama.vim sends it."""
    body = {
        "id_slot": 0,
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": [{"text": "ROOT = '.'\n", "time": 1700000000, "filename": "config.py"}],
        "prompt": "        ",
        "n_predict": 16,
        "stop": [],
        "n_indent": 0,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
        "response_fields": VIM_FIELDS,
        "model": "",
    }
    return body | kw


@pytest.fixture(scope="module")
def server(models):
    s = Served("--target", models["fim"], "--draft", models["fim_draft"], "--debug", "-c", str(CTX))
    yield s
    assert s.stop() == 0, s.stderr


@pytest.fixture(scope="module")
def layout(models):
    m = Model(models["fim"], vocab_only=True)
    return lambda body: fim.layout(
        m,
        body["input_prefix"],
        body["input_suffix"],
        [fim.Extra(c.get("filename", "tmp"), c["text"]) for c in body.get("input_extra", [])],
        body.get("prompt", ""),
        CTX,
    )


def sse(data: bytes) -> list:
    """A stream's `data:` payloads (comments skipped), decoded."""
    out = []
    for event in data.decode().split("\n\n"):
        for line in event.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def streaming(server, path: str, body: dict, headers: dict | None = None) -> tuple[threading.Thread, dict]:
    """A stream read on a thread of its own, returned once its first piece has come; `got` gets its status and
    its events when it ends."""
    started, got = threading.Event(), {}

    def read():
        conn = http.client.HTTPConnection(server.host, int(server.port), timeout=60)
        conn.request("POST", path, json.dumps(body).encode(), headers or {})
        r, lines = conn.getresponse(), []
        got["status"] = r.status
        while line := r.readline():
            lines.append(line)
            started.set()
        got["events"] = sse(b"".join(lines))
        conn.close()

    t = threading.Thread(target=read)
    t.start()
    assert started.wait(60)
    return t, got


def test_llama_vims_request_gets_its_fields_in_compact_json(server, layout):
    status, _, data = server.raw("POST", "/infill", json.dumps(vim_body()).encode(), {"Authorization": "Bearer "})
    assert status == 200 and b'"content":"' in data and b"\n" not in data  # llama.vim's check of the raw text
    r = json.loads(data)
    assert sorted(r) == sorted(VIM_FIELDS) and isinstance(r["content"], str)
    assert r["timings/predicted_n"] >= 1 and r["tokens_cached"] == len(layout(vim_body())) + r["timings/predicted_n"]


def test_infill_and_completion_answer_in_llama_servers_shape(server, layout):
    body = vim_body(response_fields=None, n_predict=12, t_max_predict_ms=None)
    status, _, r = server.post("/infill", body)
    assert status == 200
    assert r["stop"] is True and r["stop_type"] in ("eos", "limit") and r["tokens_evaluated"] == len(layout(body))
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n"} <= set(r["timings"])
    assert r["tokens_predicted"] == r["timings"]["predicted_n"] <= 12
    status, _, c = server.post("/completion", {"prompt": PREFIX, "n_predict": 8, "n_probs": 3, "cache_prompt": False})
    assert status == 200 and 1 <= c["tokens_predicted"] == len(c["completion_probabilities"]) <= 8
    first = c["completion_probabilities"][0]
    assert len(first["top_logprobs"]) == 3 and first["top_logprobs"][0]["logprob"] >= first["logprob"]
    assert (
        bytes(b for p in c["completion_probabilities"] for b in p["bytes"]).decode("utf-8", "replace") == c["content"]
    )


def test_a_streamed_infill_says_what_the_whole_answer_says(server):
    body = vim_body(response_fields=None, t_max_predict_ms=None, n_predict=12)
    _, _, whole = server.post("/infill", body)
    status, head, data = server.raw("POST", "/infill", json.dumps(body | {"stream": True}).encode())
    events = sse(data)
    assert status == 200 and head["Content-Type"] == "text/event-stream" and "[DONE]" not in events
    *pieces, last = events
    assert all(p["stop"] is False for p in pieces) and last["stop"] is True and last["content"] == ""
    assert "".join(p["content"] for p in pieces) == whole["content"] and last["timings"]["predicted_n"] >= 1
    # /completion's stream: each piece with its tokens' probabilities
    body = {"prompt": PREFIX, "n_predict": 6, "n_probs": 2, "stream": True, "cache_prompt": False}
    *pieces, last = sse(server.raw("POST", "/completion", json.dumps(body).encode())[2])
    probs = [p for piece in pieces for p in piece.get("completion_probabilities", [])]
    assert 1 <= len(probs) == last["tokens_predicted"] <= 6 and all(len(p["top_logprobs"]) == 2 for p in probs)


def test_an_edit_at_the_prefixs_end_evaluates_only_the_tokens_from_the_edit_on(server, layout):
    """cache_prompt: the second request shares the first's tokens up to the edit; the rest is evaluated."""
    first = vim_body(response_fields=None, n_predict=4, prefix=PREFIX + "        if name.endswith('.py'):\n")
    second = vim_body(response_fields=None, n_predict=4, prefix=first["input_prefix"] + "            out.app")
    _, _, a = server.post("/infill", first)
    _, _, b = server.post("/infill", second)
    one, two = layout(first), layout(second)
    shared = next(i for i, (x, y) in enumerate(zip(one, two)) if x != y)
    assert a["tokens_evaluated"] == len(one)
    assert b["timings"]["prompt_n"] == len(two) - shared and b["timings"]["cache_n"] == shared


def test_suffix_in_v1_completions_is_the_same_fill_as_infill(server):
    client = server.client()
    r = client.completions.create(model="x", prompt=PREFIX, suffix=SUFFIX, max_tokens=10, logprobs=2)
    body = vim_body(input_extra=[], prompt="", response_fields=None, n_predict=10, t_max_predict_ms=None)
    _, _, infill = server.post("/infill", body)  # the same tokens: no other files, nothing after the prefix
    assert r.choices[0].text == infill["content"]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_a_newer_request_from_the_same_client_supersedes_the_one_in_progress(server):
    """The older stream (a grammar with no end: it would fill the context) ends cleanly, stop_type "none"."""
    endless = "root ::= [a-z] root"
    first = vim_body(response_fields=None, n_predict=-1, t_max_predict_ms=None, stream=True, grammar=endless)
    t, got = streaming(server, "/infill", first)
    status, _, newer = server.post("/infill", vim_body(response_fields=None, n_predict=4))
    t.join(60)
    assert status == 200 and newer["tokens_predicted"] >= 1
    last = got["events"][-1]
    assert got["status"] == 200 and last["stop"] is True and last["stop_type"] == "none"
    assert last["tokens_predicted"] < CTX - last["tokens_evaluated"] - 1  # it did not run to the context's end
    status, _, again = server.post("/infill", vim_body(response_fields=None, n_predict=4, id_slot=1))
    assert status == 200 and again["stop_type"] in ("eos", "limit")  # the server goes on (--debug checked the KV)


def test_another_program_on_the_same_address_and_slot_supersedes_nothing(server):
    """Two editors (or an editor and any local program) share 127.0.0.1 and the default slot: a client is also its
    User-Agent, so one cannot cut the other's completions short."""
    endless = "root ::= [a-z] root"
    first = vim_body(response_fields=None, n_predict=200, t_max_predict_ms=None, stream=True, grammar=endless)
    t, got = streaming(server, "/infill", first, {"User-Agent": "editor-a"})
    status, _, _ = server.post("/infill", vim_body(response_fields=None, n_predict=2), {"User-Agent": "editor-b"})
    t.join(60)
    last = got["events"][-1]
    assert status == 200 and last["stop_type"] == "limit" and last["tokens_predicted"] == 200


def test_the_time_limit_ends_the_text_at_a_line_end_and_n_indent_where_a_line_leaves_the_block(server):
    # Lines of 40 letters: the first newline comes 40 tokens (many milliseconds) after generation starts.
    lines = "root ::= line line line\nline ::= " + "[a-z] " * 40 + '"\\n"'
    base = {"prompt": PREFIX, "n_predict": 200, "grammar": lines, "cache_prompt": False}
    _, _, free = server.post("/completion", base)
    _, _, limited = server.post("/completion", base | {"t_max_predict_ms": 1})
    assert free["content"].count("\n") == 3 and free["content"].startswith(limited["content"])
    assert limited["content"].count("\n") == 1 and limited["content"].endswith("\n") and limited["stop_type"] == "limit"
    block = 'root ::= "x = 1\\n    y\\n  z\\n"'
    _, _, r = server.post("/completion", {"prompt": PREFIX, "n_predict": 32, "grammar": block, "n_indent": 4})
    assert r["content"] == "x = 1\n    y\n  " and r["stop_type"] == "limit"


def test_n_cmpl_answers_an_array_as_llama_vscode_asks(server):
    status, _, r = server.post("/infill", vim_body(response_fields=None, n_cmpl=3, n_predict=6, top_p=0.99))
    assert status == 200 and [x["index"] for x in r] == [0, 1, 2] and len({x["content"] for x in r}) == 1  # greedy


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"input_suffix": "x"}, 400, '"input_prefix" is required'),
        ({"input_prefix": "x", "input_suffix": "y", "input_extra": "z"}, 400, "input_extra must be an array"),
        ({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"filename": "a"}]}, 400, '"text" field'),
        ({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"text": "a", "filename": 3}]}, 400, "filename"),
        ({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"text": ""}] * 1025}, 400, "at most 1024"),
        ({"input_prefix": 5, "input_suffix": "y"}, 400, "input_prefix must be a string"),
        ({"input_prefix": "x", "input_suffix": "y", "n_predict": "many"}, 400, "n_predict must be a number"),
        ({"input_prefix": "x", "input_suffix": "y", "repeat_penalty": 1.3}, 400, "repeat_penalty"),
        ({"input_prefix": "x", "input_suffix": "y", "n_cmpl": 2, "stream": True}, 400, "n_cmpl"),
        ({"input_prefix": "x", "input_suffix": "y", "n_probs": 21}, 400, "n_probs must be 0..20"),
        ({"input_prefix": "x", "input_suffix": "y", "repeat_penalty": True}, 400, "repeat_penalty"),
        ({"input_prefix": "x", "input_suffix": "y", "grammar": "root ::= [", "stream": True}, 400, "grammar"),
        ({"input_prefix": "x" * 9000, "input_suffix": "y", "input_extra": [{"text": "e" * 50000}]}, 200, ""),
    ],
)
def test_hostile_infill_bodies_get_llama_servers_error_shape(server, body, status, words):
    got, _, r = server.post("/infill", body | {"n_predict": body.get("n_predict", 2)})
    assert got == status, r
    if status != 200:
        assert r["error"]["code"] == status and words in r["error"]["message"] and r["error"]["type"]


def test_a_model_without_fim_tokens_is_a_501_and_a_prefix_over_the_context_a_400(models):
    s = Served("--target", models["chat"], "--drafter", "none")
    try:
        status, _, r = s.post("/infill", {"input_prefix": "a", "input_suffix": "b"})
        assert status == 501 and r["error"]["type"] == "not_supported_error" and "middle" in r["error"]["message"]
        # (and a chat's log probabilities, in OpenAI's shape)
        messages = [{"role": "user", "content": "hi"}]
        c = s.client().chat.completions.create(
            model="x", messages=messages, max_tokens=6, logprobs=True, top_logprobs=2
        )
        content = c.choices[0].logprobs.content
        assert len(content) == c.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)
        assert bytes(b for t in content for b in t.bytes).decode("utf-8", "replace") == c.choices[0].message.content
        status, _, r = s.post("/v1/chat/completions", {"messages": messages, "top_logprobs": 2})
        assert status == 400 and "top_logprobs needs logprobs" in r["error"]["message"]
    finally:
        assert s.stop() == 0, s.stderr
    s = Served("--target", models["fim"], "--drafter", "none", "-c", "1024")
    try:  # the prefix's last 1,536 tokens do not fit 1,024
        status, _, r = s.post("/infill", {"input_prefix": "x" * 3000, "input_suffix": "b"})
        assert status == 400 and "context" in r["error"]["message"]
    finally:
        assert s.stop() == 0, s.stderr


@pytest.mark.parametrize(
    "extra, content",
    [
        ({"grammar": 'root ::= "ab" "STOP" "cd"', "stop": ["STOP"]}, "ab"),
        ({"grammar": 'root ::= "x = 1\\n    y\\n  z\\n"', "n_indent": 4}, "x = 1\n    y\n  "),
        ({"grammar": 'root ::= "abc"'}, "abc"),
    ],
)
def test_probabilities_are_those_of_the_text_that_went_out(server, extra, content):
    """A stop string's tokens and a line cut by n_indent are not scored; the last tokens are (streamed or not)."""
    for stream in (False, True):
        body = {"prompt": PREFIX, "n_predict": 32, "n_probs": 1, "cache_prompt": False, "stream": stream, **extra}
        status, _, data = server.raw("POST", "/completion", json.dumps(body).encode())
        if stream:
            *pieces, last = sse(data)
            text = "".join(p["content"] for p in pieces)
            probs = [p for piece in pieces for p in piece.get("completion_probabilities", [])]
            assert last["tokens_predicted"] >= sum(1 for _ in probs) and last["has_new_line"] == ("\n" in content)
        else:
            r = json.loads(data)
            text, probs = r["content"], r["completion_probabilities"]
        assert status == 200 and text == content
        assert bytes(b for p in probs for b in p["bytes"]).decode("utf-8", "replace") == content


def test_only_an_infill_from_the_same_client_and_slot_supersedes(server):
    """/completion and OpenAI's completions never cancel one another; a request refused (503) or from a client the
    server has forgotten supersedes nothing."""
    endless = "root ::= [a-z] root"
    first = {"prompt": PREFIX, "n_predict": 600, "grammar": endless, "stream": True, "id_slot": 0}
    t, got = streaming(server, "/completion", first)
    status, _, newer = server.post("/completion", {"prompt": PREFIX, "n_predict": 2, "id_slot": 0})
    t.join(60)
    last = got["events"][-1]
    assert status == 200 and last["stop_type"] == "limit" and last["tokens_predicted"] == 600  # it ran to its end
