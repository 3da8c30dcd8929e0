"""The third hostile pass (issue 47): bodies whose parsing costs the server its memory or its CPU before any
check (millions of empty objects), conversations of many empty messages that the byte budget did not count,
absurd seeds and top-k, and the parse's turns (a stop does not wait for every queued body)."""

from __future__ import annotations

import json
import subprocess
import sys
import random
import threading
import time
import tracemalloc

import pytest
from test_serve import Served

from specdec_cli.chat import Message
from specdec_cli.chat.messages import MAX_CONTAINERS, MAX_DEPTH, json_shape
from specdec_cli.serve import guard
from specdec_cli.serve.body import ApiError, decode
from specdec_cli.session import PromptTooLong, RunConfig, open_session


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import write_fixture_set

    return write_fixture_set(tmp_path_factory.mktemp("hostile-bodies-models"))


def walked(value, depth: int = 1) -> tuple[int, int, int, int]:
    """(depth, nodes, containers, empty containers) of a parsed value, by recursion (the reference)."""
    if isinstance(value, (dict, list)):
        items = list(value.values() if isinstance(value, dict) else value)
        below = [walked(v, depth + 1) for v in items]
        return (
            max([depth, *(b[0] for b in below)]),
            1 + sum(b[1] for b in below),
            1 + sum(b[2] for b in below),
            (not items) + sum(b[3] for b in below),
        )
    return depth - 1, 1, 0, 0


def random_json(rng: random.Random, depth: int = 0):
    """A value with strings that hold brackets, commas, quotes and backslashes, escaped or not."""
    kind = rng.random()
    if depth > 6 or kind < 0.35:
        return rng.choice([1, -2.5, True, None, "", '[{"]}', 'a\\"],[', "\u00e9\u4e2d[", "\\", '"', "}]" * 3])
    if kind < 0.7:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        rng.choice(["a", "[", "}", '"', "\\", "k,"]) + str(i): random_json(rng, depth + 1)
        for i in range(rng.randrange(4))
    }


def test_a_bodys_shape_is_what_a_walk_of_its_parsed_value_finds():
    rng = random.Random(7)
    for _ in range(400):
        value = random_json(rng)
        for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
            depth, nodes, containers, empty = walked(value)
            shape = json_shape(text)
            assert (shape.depth, shape.containers) == (depth, containers), text
            assert shape.values == nodes + empty, text  # (each empty container counts one value more)
            assert json_shape(text.encode("utf-16")) == json_shape(text.encode()) == shape


def test_a_body_of_millions_of_empty_objects_is_refused_before_it_is_parsed():
    """Found by the third pass: 8 MiB of `{},` took 3.3 s and 450 MB (the parse, then a walk of it), twelve at once
    4.9 GB, before any field was read."""
    body = b'{"messages":[' + b"{}," * (8 * 2**20 // 3 - 10) + b"{}]}"
    tracemalloc.start()
    try:
        with pytest.raises(ApiError, match="too large"):
            decode(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, f"{peak / 2**20:.0f} MB"


def test_depth_and_size_bounds_hold_in_every_encoding_json_takes():
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    for raw in (deep, deep.encode(), deep.encode("utf-16"), deep.encode("utf-32-le")):
        with pytest.raises(ApiError, match="nested too deeply"):
            decode(raw)
    wide = "[" + "[]," * MAX_CONTAINERS + "[]]"
    with pytest.raises(ApiError, match="too large"):
        decode(wide.encode("utf-16"))
    ok = {"messages": [{"role": "user", "content": "[{\u4e2d"}], "n": [[[1]]] * 10}
    assert decode(json.dumps(ok, ensure_ascii=False).encode("utf-16")) == ok


def test_a_stop_ends_the_wait_for_a_turn_to_parse():
    conns = guard.Connections(guard.Limits())
    held = [conns.parsing() for _ in range(guard.PARSERS)]
    for turn in held:
        turn.__enter__()
    got = []

    def waiter():
        t0 = time.monotonic()
        try:
            with conns.parsing():
                got.append("parsed")
        except ApiError as e:
            got.append((e.status, time.monotonic() - t0))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    assert not got  # waiting its turn
    conns.stop_all()
    t.join(5)
    for turn in held:
        turn.__exit__(None, None, None)
    assert got and got[0][0] == 503, got


def test_each_message_and_tool_counts_as_a_token_before_anything_is_rendered(models, monkeypatch):
    """Found by the third pass: 289,000 empty messages counted 0 bytes, passed the budget, and went to the template
    (13 s of a single renderer) and the tokenizer."""
    from specdec_cli.chat import template

    rendered = []
    monkeypatch.setattr(template.isolation, "render", lambda *a, **k: rendered.append("jinja") or "")
    with open_session(RunConfig(target=models["chat"], threads=2, ctx_size=256)) as s:
        builtin = s.target.builtin_chat
        s.target.builtin_chat = lambda pairs: rendered.append("builtin") or builtin(pairs)
        with pytest.raises(PromptTooLong, match="more than a context of 256 tokens"):
            s.prompt_tokens(messages=[Message("user", "")] * 300)
        assert not rendered
        assert s.prompt_tokens(messages=[Message("user", "")] * 3)  # a few still fit


def test_a_huge_body_an_absurd_seed_or_top_k_is_a_400_and_the_server_goes_on(models):
    server = Served("--target", models["chat"], "--drafter", "none")
    try:
        status, _, answer = server.raw(
            "POST", "/v1/chat/completions", b'{"messages":[' + b"{}," * 2_000_000 + b"{}]}",
            {"Content-Type": "application/json"},
        )  # fmt: skip
        assert status == 400 and b"too large" in answer, answer[:200]
        nines = int("9" * 4300)
        for body in (
            {"prompt": "hi", "n_predict": 2, "n_cmpl": 2, "temperature": 1, "seed": nines},
            {"prompt": "hi", "n_predict": 2, "seed": 2**64},
            {"prompt": "hi", "n_predict": 2, "top_k": 2**31},
        ):
            status, _, answer = server.post("/completion", body)
            assert status == 400, answer
        status, _, answer = server.post("/completion", {"prompt": "hi", "n_predict": 2, "seed": 2**64 - 1})
        assert status == 200, answer
        assert server.raw("GET", "/health")[0] == 200
    finally:
        assert server.stop() == 0, server.stderr


# --- the fourth hostile pass --------------------------------------------------------------------------------------


def finishes(code: str, seconds: float = 30) -> bool:
    """Whether `code` ends within `seconds` in a fresh interpreter (a hang detector: the quadratic versions ran
    for minutes to hours, holding the GIL, so no thread of this process could time them out)."""
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=seconds, capture_output=True)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_counting_a_body_is_linear_whatever_its_strings_hold():
    """Found by the fourth pass: an unterminated string of escaped quotes made the count quadratic: 64 KB froze the
    server for 11 s, 8 MiB for hours, and a SIGTERM waited for it."""
    assert finishes(
        "from specdec_cli.chat.messages import json_shape\n"
        "for body in ['\"' + '\\\\\"' * 4_000_000, '\"\\\\' * 4_000_000, '[\"' + '\\\\' * 8_000_000]:\n"
        "    json_shape(body.encode())\n"
    )


def test_a_calls_arguments_nested_past_the_bound_are_content_not_a_500():
    """Found by the fourth pass: a model that wrote arguments 1,000 deep (a copied text) got RecursionError: a 500,
    or an error event ending the stream."""
    from specdec_cli.chat.calls import FORMATS, read

    deep = "[" * 1000 + "1" + "]" * 1000
    text = '<tool_call>\n{"name": "f", "arguments": {"a": ' + deep + "}}\n</tool_call>"
    content, calls = read(FORMATS["hermes"], text)
    assert calls == [] and content == text
    ok = '<tool_call>\n{"name": "f", "arguments": {"a": [[1]]}}\n</tool_call>'
    assert [c.name for c in read(FORMATS["hermes"], ok)[1]] == ["f"]


def test_reading_calls_out_of_an_answer_is_linear_in_its_length():
    """Found by the fourth pass: one character at a time, 32,000 characters after a call (or of leading spaces)
    took 15 s: each step looked at everything since the last call."""
    assert finishes(
        "from specdec_cli.chat.calls import FORMATS, Reader\n"
        'call = \'<tool_call>\\n{"name": "f", "arguments": {}}\\n</tool_call>\'\n'
        "for text in [call + '{\"name\": \"' + 'x' * 200_000, ' ' * 200_000 + 'hi', 'hi' + ' ' * 200_000 + 'yo']:\n"
        "    r = Reader(FORMATS['hermes'])\n"
        "    pieces = [p for ch in text for p in r.push(ch)]\n"
        "    last, whole, calls = r.end()\n"
        "    assert whole == text and not calls\n"
        "    assert text.startswith(call) or ''.join(p.text for p in pieces + last) == text\n"
    )
