"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) as its clients see it: the official
`anthropic` client against a real `specdec serve`, raw HTTP for the bodies Claude Code sends and the ones no
client would, and the dialect's shapes checked against the SDK's own models."""

from __future__ import annotations

import json

import anthropic
import pydantic
import pytest
from test_serve import Served

from specdec_cli.engine.stats import Stats
from specdec_cli.serve.body import ApiError
from specdec_cli.serve.items import Finished
from specdec_cli.serve.messages import error, parse, response, shape
from specdec_cli.serve.stream import Stream

MODEL = "smollm2-135m-instruct-q4_1"
GREEDY = {"temperature": 0}  # the SDK no longer names sampling fields; the API still takes them
WEATHER = {
    "name": "get_weather",
    "description": "The weather forecast for a city.",
    "input_schema": {  # as Claude Code writes its tools' schemas
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
GOOD = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def server(smollm2):
    s = Served("--target", smollm2, "--drafter", "auto", "--debug", "-c", "1024", "--no-lookup-cache")
    yield s
    assert s.stop() == 0, s.stderr


def claude(s: Served, key: str = "none") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url.removesuffix("/v1"), api_key=key, max_retries=0)


def fits(schema: dict, value: dict) -> bool:
    """The input satisfies the schema's object rules: required keys, no others, each of its type."""
    types = {"string": str, "integer": int}
    props = schema["properties"]
    return (
        set(schema["required"]) <= set(value) <= set(props)
        and all(isinstance(v, types[props[k]["type"]]) and not isinstance(v, bool) for k, v in value.items())
    )  # fmt: skip


def test_answer_matches_chat_completions_streamed_or_not_and_count_tokens_agrees(server):
    system = [{"type": "text", "text": "You are brief.", "cache_control": {"type": "ephemeral"}}]
    msgs = [{"role": "user", "content": "Name three colours."}]
    m = claude(server).messages.create(model=MODEL, max_tokens=12, system=system, messages=msgs, extra_body=GREEDY)
    oai = server.client().chat.completions.create(
        model=MODEL, max_tokens=12, temperature=0, messages=[{"role": "system", "content": "You are brief."}, *msgs]
    )
    assert m.content[0].type == "text" and m.content[0].text == oai.choices[0].message.content
    assert m.id.startswith("msg_") and m.model == MODEL and m.role == "assistant"
    assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[oai.choices[0].finish_reason]
    assert m.usage.input_tokens == oai.usage.prompt_tokens and m.usage.output_tokens == oai.usage.completion_tokens
    assert m.model_extra["speculative"]["generated_tokens"] == m.usage.output_tokens

    with claude(server).messages.stream(
        model=MODEL, max_tokens=12, system=system, messages=msgs, extra_body=GREEDY
    ) as st:
        streamed = "".join(st.text_stream)
        final = st.get_final_message()
    assert streamed == m.content[0].text and final.stop_reason == m.stop_reason
    assert final.usage.input_tokens == m.usage.input_tokens and final.usage.output_tokens == m.usage.output_tokens

    counted = claude(server).messages.count_tokens(model=MODEL, system=system, messages=msgs)
    assert counted.input_tokens == m.usage.input_tokens


def test_a_forced_tool_call_round_trips_and_its_streamed_input_joins_to_the_same_object(server):
    c = claude(server)
    choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    m = c.messages.create(model=MODEL, max_tokens=64, tools=[WEATHER], tool_choice=choice, messages=ASK)
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    assert fits(WEATHER["input_schema"], use.input), use.input

    events = list(c.messages.create(model=MODEL, max_tokens=64, tools=[WEATHER], tool_choice=choice, messages=ASK,
                                    stream=True))  # fmt: skip
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == ["tool_use"] and starts[0].name == "get_weather"
    parts = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert json.loads("".join(parts)) == use.input
    assert events[-2].type == "message_delta" and events[-2].delta.stop_reason == "tool_use"
    assert events[-1].type == "message_stop"

    result = {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "Sunny, 24 C."}]}
    history = [*ASK, {"role": "assistant", "content": m.content}, {"role": "user", "content": [result]}]
    none = {"type": "none"}  # SmolLM2 would call again; the template then leaves the tools out of the prompt
    answer = c.messages.create(model=MODEL, max_tokens=8, tools=[WEATHER], tool_choice=none, messages=history)
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    assert answer.content[0].text
    counted = c.messages.count_tokens(model=MODEL, tools=[WEATHER], tool_choice=none, messages=history)
    assert counted.input_tokens == answer.usage.input_tokens


def test_any_tool_choice_calls_a_declared_tool(server):
    m = claude(server).messages.create(
        model=MODEL, max_tokens=64, tools=[WEATHER], messages=ASK,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )  # fmt: skip
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and fits(WEATHER["input_schema"], use.input)


def test_a_claude_code_shaped_request_streams_anthropic_events(server):
    """What Claude Code sends: ?beta=true, anthropic-beta and -version headers, system blocks with cache_control,
    metadata, thinking, context_management, a server tool beside its own, stream: true."""
    ephemeral = {"type": "ephemeral"}
    body = {
        **GOOD,
        "max_tokens": 8,
        "stream": True,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": ephemeral}],
        "metadata": {"user_id": "user_abc"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": ephemeral}]}],
    }  # fmt: skip
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219", "x-api-key": "k"}
    status, head, data = server.raw("POST", "/v1/messages?beta=true", json.dumps(body).encode(), headers)
    assert status == 200 and head["Content-Type"] == "text/event-stream"
    events = [block.split("\n") for block in data.decode().strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in events]
    payloads = [json.loads(lines[1].removeprefix("data: ")) for lines in events]
    assert all(p["type"] == n for n, p in zip(names, payloads))
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    for p in payloads[2:]:  # [1]: a ping, which the SDK reads past
        pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent).validate_python(p)
    pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent).validate_python(payloads[0])
    assert payloads[-2]["usage"]["input_tokens"] > 0


def test_x_api_key_is_checked(smollm2):
    s = Served("--target", smollm2, "--drafter", "none", "--api-key", "s3cret")
    try:
        m = claude(s, "s3cret").messages.create(model=MODEL, max_tokens=2, messages=GOOD["messages"])
        assert m.usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError) as e:
            claude(s, "s3cre").messages.count_tokens(model=MODEL, messages=GOOD["messages"])
        assert e.value.body["error"]["type"] == "authentication_error"
    finally:
        assert s.stop() == 0


def test_hostile_bodies_get_anthropic_errors_and_the_server_goes_on(server):
    path = "/v1/messages"
    user = lambda content: {**GOOD, "messages": [{"role": "user", "content": content}]}  # noqa: E731
    said = lambda content: {**GOOD, "messages": [*ASK, {"role": "assistant", "content": content}]}  # noqa: E731
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather"}
    cases = [
        ({k: v for k, v in GOOD.items() if k != "max_tokens"}, "max_tokens"),
        ({**GOOD, "max_tokens": 0}, "max_tokens"),
        ({**GOOD, "max_tokens": "x"}, "max_tokens"),
        ({**GOOD, "messages": "hi"}, "messages"),
        ({**GOOD, "messages": [{"role": "system", "content": "hi"}]}, "messages[0]"),
        (user([{"type": "sparkle", "text": "hi"}]), "sparkle"),
        (user([{"type": "image", "source": {"type": "base64", "data": "AA=="}}]), "only text"),
        (user([{"type": "tool_result", "content": "ok"}]), "tool_use_id"),
        (said([{**use, "input": "Paris"}]), "input must be an object"),
        ({**GOOD, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "launch"}}, "launch"),
        ({**GOOD, "tool_choice": {"type": "any"}}, "tool_choice needs tools"),
        ({**GOOD, "system": 42}, "system"),
        ({**GOOD, "temprature": 0.5}, "temprature: Extra inputs are not permitted"),
        ({**GOOD, "stop_sequences": ["x"] * 17}, "stop_sequences"),
        ({**GOOD, "stop_sequences": [""]}, "stop_sequences"),
        ({**GOOD, "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
    ]
    for body, needle in cases:
        status, _, got = server.post(path, body)
        assert status == 400 and got["type"] == "error", (body, got)
        assert got["error"]["type"] == "invalid_request_error" and needle in got["error"]["message"], (body, got)
    status, _, got = server.post(path + "/count_tokens", GOOD)  # count_tokens takes no max_tokens, as Anthropic's
    assert status == 400 and "max_tokens" in got["error"]["message"]
    status, _, got = server.raw("POST", path, b"{not json")
    assert status == 400 and json.loads(got)["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        claude(server).messages.create(model=MODEL, max_tokens=0, messages=GOOD["messages"])
    assert claude(server).messages.create(**GOOD).usage.output_tokens >= 1


def test_a_user_turn_with_results_and_text_becomes_tool_messages_then_the_text():
    req = parse("messages", {
        **GOOD,
        "system": "Be useful.",
        "messages": [
            *ASK,
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 3}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny", "is_error": False},
                {"type": "text", "text": "And tomorrow?"},
            ]},
        ],
        "stop_sequences": ["\n\n"], "temperature": 0.5, "top_k": 40, "stream": True,
    })  # fmt: skip
    roles = [m.role for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"] and req.kind == "chat" and req.stream
    assert req.messages[2].content == "Checking." and req.messages[2].tool_calls[0].name == "get_weather"
    assert json.loads(req.messages[2].tool_calls[0].arguments) == {"city": "Paris", "days": 3}
    assert req.messages[3].tool_call_id == "toolu_1" and req.messages[3].name == "get_weather"
    assert req.stop == ["\n\n"] and req.settings == {"max_tokens": 4, "temp": 0.5, "top_k": 40}


def test_tool_choice_and_server_tools(capsys):
    tools = [WEATHER, {"type": "bash_20250124", "name": "bash"}]
    for choice, want, parallel in [
        ({"type": "auto"}, "auto", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "tool", "name": "get_weather"}, "get_weather", True),
        ({"type": "none"}, "none", True),
    ]:
        req = parse("count_tokens", {"messages": ASK, "tools": tools, "tool_choice": choice})
        assert [t.name for t in req.tools.tools] == ["get_weather"]
        assert (req.tools.choice, req.tools.parallel) == (want, parallel)
    assert "bash" in capsys.readouterr().err
    assert parse("count_tokens", {"messages": ASK, "tools": [tools[1]]}).tools is None


def test_output_config_format_is_a_grammar_and_its_effort_is_ignored():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    req = parse(
        "messages", {**GOOD, "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": schema}}}
    )
    assert "ok" in req.grammar and "gbnf" not in req.settings
    assert parse("messages", {**GOOD, "output_config": {"effort": "low"}}).grammar is None
    for bad in [{"format": {"type": "json_schema"}}, {"format": "json"}, "high"]:
        with pytest.raises(ApiError) as e:
            parse("messages", {**GOOD, "output_config": bad})
        assert e.value.status == 400 and e.value.param == "output_config"


def finished(reason: str, stop_reason: str, calls=(), sequence: str | None = None) -> Finished:
    stats = Stats(prompt_tokens=7, generated_tokens=3, stop_reason=stop_reason)
    return Finished(stats, 2, reason, list(calls), stop_sequence=sequence)


def test_responses_and_stop_reasons_parse_as_the_sdk_models_them():
    from specdec_cli.chat import ToolCall

    req = parse("messages", {**GOOD, "stop_sequences": ["END"]})
    call = ToolCall("call_ab", "get_weather", '{"city": "Paris", "days": 3}')
    for end, want, sequence in [
        (finished("stop", "eos"), "end_turn", None),
        (finished("stop", None, sequence="END"), "stop_sequence", "END"),
        (finished("length", "max_tokens"), "max_tokens", None),
        (finished("tool_calls", "eos", [call]), "tool_use", None),
    ]:
        m = anthropic.types.Message.model_validate(response(req, "msg_1", MODEL, "Hi", end))
        assert (m.stop_reason, m.stop_sequence) == (want, sequence)
        assert m.usage.input_tokens == 7 and m.usage.output_tokens == 3 and m.usage.cache_read_input_tokens == 2
    assert m.content[1].id == "toolu_ab" and m.content[1].input == {"city": "Paris", "days": 3}
    two = parse("messages", {**GOOD, "stop_sequences": ["A", "B"]})
    assert response(two, "msg_1", MODEL, "", finished("stop", None))["stop_sequence"] is None  # which: unknown


def test_a_stream_cut_by_an_error_ends_with_an_error_event_and_a_client_that_left_gets_no_end():
    req = parse("messages", GOOD)

    def stream(items) -> list:  # the one stream loop, in Anthropic's shape
        return list(Stream(shape(req, "msg_1", MODEL), "messages").events(items))

    def cut(exc):
        yield "Hel"
        raise exc

    for exc, kind in [(ApiError(503, "the server is shutting down"), "overloaded_error"), (KeyError("x"), "api_error")]:
        events = stream(cut(exc))
        assert [n for n, _ in events][-2:] == ["content_block_delta", "error"]
        assert events[-1][1] == {"type": "error", "error": {"type": kind, "message": events[-1][1]["error"]["message"]}}
    left = [n for n, _ in stream(iter(["Hel"]))]
    assert "message_stop" not in left and "message_delta" not in left
    assert error(ApiError(413, "big"))["error"]["type"] == "request_too_large"
    assert error(ApiError(500, "bug")) == {"type": "error", "error": {"type": "api_error", "message": "bug"}}
