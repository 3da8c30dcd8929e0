"""POST /v1/responses as its clients see it: the official openai SDK (responses.create, responses.stream) and
raw HTTP against a real `specdec serve`, SmolLM2 for the answers, the tiny fixture model for the refusals.
The Responses API is served stateless: every request carries the whole conversation."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response
from openai.types.responses.response_stream_event import ResponseStreamEvent
from pydantic import TypeAdapter
from test_serve import Served

MODEL = "smollm2-135m-instruct-q4_1"
PROMPT = "Write a Python function that returns the sum of a list."
EVENTS = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def smol(smollm2):
    """SmolLM2, drafting by lookup (speculative, with no draft model to load), the KV caches checked (--debug)."""
    s = Served("--target", smollm2, "--drafter", "lookup", "--debug", "-c", "2048", "--no-lookup-cache")
    yield s
    assert s.stop() == 0, s.stderr


@pytest.fixture(scope="module")
def tiny(models):
    """The tiny chat-template fixture: starts in a moment, answers nonsense; for what is refused or left out."""
    s = Served("--target", models["chat"], "--drafter", "none")
    yield s
    assert s.stop() == 0, s.stderr


def sse(data: bytes) -> list[tuple[str, dict]]:
    """A raw event stream as (event name, data); every block must have both lines."""
    out = []
    for block in data.decode().strip().split("\n\n"):
        head, body = block.split("\n")
        assert head.startswith("event: ") and body.startswith("data: "), block
        out.append((head.removeprefix("event: "), json.loads(body.removeprefix("data: "))))
    return out


def valid_arguments(arguments: str, schema: dict) -> dict:
    """The call's arguments as JSON, checked against the tool's schema by hand: required keys, types, enums."""
    args = json.loads(arguments)
    assert isinstance(args, dict) and set(schema["required"]) <= set(args) <= set(schema["properties"]), args
    for key, value in args.items():
        spec = schema["properties"][key]
        assert isinstance(value, {"string": str, "integer": int, "number": (int, float)}[spec["type"]]), args
        assert value in spec.get("enum", [value]), args
    return args


def test_plain_answer_is_the_chat_completions_answer(smol):
    client = smol.client()
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0
    )
    r = client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=24, temperature=0)
    assert r.output_text == chat.choices[0].message.content and r.id.startswith("resp_")
    assert [o.type for o in r.output] == ["message"] and r.output[0].content[0].annotations == []
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if chat.choices[0].finish_reason == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed" and r.incomplete_details is None
    assert r.model_extra["speculative"]["generated_tokens"] == r.usage.output_tokens
    status, _, raw = smol.post("/v1/responses", {"input": PROMPT, "max_output_tokens": 24})
    assert status == 200 and Response.model_validate(raw).output_text == r.output_text  # every required field
    # The short form of a message item, and instructions as the system message.
    system = "Answer in one word."
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}],
        max_tokens=12, temperature=0,
    )  # fmt: skip
    r = client.responses.create(
        model=MODEL, instructions=system, input=[{"role": "user", "content": "Name a colour."}], max_output_tokens=12
    )
    assert r.output_text == chat.choices[0].message.content


def test_streamed_text_is_the_whole_answer(smol):
    client = smol.client()
    whole = client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=24)
    events = list(client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=24, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == f"response.{whole.status}" and events[-1].response.output_text == whole.output_text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    names = [e.type for e in events if "delta" not in e.type]
    assert names[2:-1] == [
        "response.output_item.added", "response.content_part.added", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
    ]  # fmt: skip
    # The SDK's stream helper wants response.completed (not incomplete): an answer that ends by itself.
    ask = {"model": MODEL, "instructions": "Answer in one word.", "input": "Name a colour.", "max_output_tokens": 16}
    short = client.responses.create(**ask)
    assert short.status == "completed"
    with client.responses.stream(**ask) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == short.output_text
    # On the wire: each event named as its type, every one parsed by the SDK's models, and no "[DONE]".
    status, head, data = smol.raw("POST", "/v1/responses", json.dumps({"input": PROMPT, "max_output_tokens": 24,
                                                                        "stream": True}).encode())  # fmt: skip
    assert status == 200 and head["Content-Type"] == "text/event-stream" and b"[DONE]" not in data
    for name, body in sse(data):
        assert body["type"] == name and EVENTS.validate_python(body).type == name


def test_a_tool_call_round_trip(smol):
    """SmolLM2 calls no tool by itself: a named function (then required) makes it; the call goes back with
    its output, and the model answers in text. One call at a time: given parallel calls, SmolLM2 repeats its
    call until max_output_tokens cuts it."""
    client = smol.client()
    question = {"role": "user", "content": "What is the weather in Paris?"}
    r = client.responses.create(
        model=MODEL, input=[question], tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False, max_output_tokens=60,
    )  # fmt: skip
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].status == "completed"
    assert calls[0].call_id and calls[0].id.startswith("fc_")
    valid_arguments(calls[0].arguments, WEATHER["parameters"])
    assert r.tools[0].name == "get_weather" and r.tool_choice.name == "get_weather"
    history = [question, *(o.model_dump(exclude_none=True) for o in r.output)]
    history.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp": 21}'})
    answer = client.responses.create(model=MODEL, input=history, tools=[WEATHER], max_output_tokens=20)
    assert answer.output_text and [o.type for o in answer.output] == ["message"]

    events = list(client.responses.create(model=MODEL, input=[question], tools=[WEATHER], tool_choice="required",
                                          parallel_tool_calls=False, max_output_tokens=60, stream=True))  # fmt: skip
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert added and added[0].arguments == "" and added[0].name == "get_weather"
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    final = events[-1].response.output[-1]
    assert len(fragments) > 1 and "".join(fragments) == done.arguments == final.arguments
    assert done.item_id == final.id == added[0].id
    valid_arguments(final.arguments, WEATHER["parameters"])


def test_text_format_json_schema_constrains_the_answer(smol):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = smol.client().responses.create(
        model=MODEL, input="Invent a person.", max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
    )  # fmt: skip
    valid_arguments(r.output_text, schema)


def test_refusals_in_openai_shape(tiny):
    """Each hostile body is a 400 naming what is wrong (messages only this dialect writes), and the server
    lives on."""
    s, good = tiny, {"input": "hi", "max_output_tokens": 2}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    cases = [
        ({**good, "previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
        ({**good, "temprature": 0.5}, "temprature", "Unrecognized request argument"),
        ({"input": {"role": "user"}}, "input", "input must be a string or a non-empty list"),
        ({"input": []}, "input", "input must be a string or a non-empty list"),
        ({"input": [{"content": "hi"}]}, "input[0]", "input[0].type must be"),
        ({"input": [{"type": "message", "role": "robot", "content": "hi"}]}, "input[0]", "input[0].role"),
        ({"input": ["hi"]}, "input[0]", "input[0] must be an object"),
        ({"input": [call, {"type": "function_call_output", "output": "x"}]}, "input[1]", "call_id must be"),
        ({"input": [call, {"type": "function_call_output", "call_id": "c9", "output": "x"}]}, "input[1]", "c9"),
        ({"input": [{**call, "arguments": {"a": 1}}]}, "input[0]", "input[0].arguments must be a string"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "stateless"),
        ({**good, "tools": [{"type": "function", "parameters": {}}]}, "tools[0]", "tools[0]: a function's name"),
        ({**good, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0]", "name"),
        ({**good, "tools": [{"type": "gadget"}]}, "tools", 'tools[0] must be {"type": "function"'),
        ({**good, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "'nope'"),
        ({**good, "tool_choice": "required"}, "tool_choice", "tool_choice needs function tools"),
        ({**good, "max_output_tokens": -1}, "max_output_tokens", "max_output_tokens must be at least 1"),
        ({**good, "max_output_tokens": "x"}, "max_output_tokens", "max_output_tokens must be a number"),
        ({**good, "temperature": -1}, "temperature", "temperature must be >= 0"),
        ({**good, "text": {"format": {"type": "yaml"}}}, "text.format", "text.format.type"),
        ({**good, "text": {"format": {"type": "json_schema", "schema": "x"}}}, "text.format", "text.format.schema"),
        ({**good, "background": True}, "background", "background responses"),
    ]
    for body, param, words in cases:
        status, _, answer = s.post("/v1/responses", body)
        assert status == 400, (body, answer)
        error = answer["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, (body, error)
        assert words in error["message"], (body, error)
    status, _, answer = s.raw("POST", "/v1/responses", b"[1, 2]")
    assert status == 400 and json.loads(answer)["error"]["message"] == "the request body must be a JSON object"
    status, _, answer = s.post("/v1/responses", good)
    assert status == 200 and Response.model_validate(answer).status in ("completed", "incomplete")
    assert s.raw("GET", "/health")[0] == 200


def test_hosted_tools_are_left_out_with_one_warning(models):
    """Codex CLI's request (its fields, a developer message, a reasoning item, its shell function, the freeform
    apply_patch and web_search) is answered; the tools it cannot run are named in one warning line."""
    s = Served("--target", models["chat"], "--drafter", "none")
    shell = {
        "type": "function", "name": "shell", "description": "Runs a shell command.", "strict": False,
        "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                       "required": ["command"], "additionalProperties": False},
    }  # fmt: skip
    patch = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}  # fmt: skip
    codex = {
        "model": "gpt-5-codex", "instructions": "You are Codex.", "store": False, "stream": True, "include": [],
        "tools": [shell, patch, {"type": "web_search"}], "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "prompt_cache_key": "0199", "text": {"verbosity": "low"},
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: none"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
            {"type": "reasoning", "summary": [], "content": None, "encrypted_content": "gAAA"},
            {"type": "function_call", "name": "shell", "arguments": '{"command": ["ls"]}', "call_id": "call_1"},
            {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
            {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done"},
        ],
        "max_output_tokens": 4,
    }  # fmt: skip
    try:
        status, _, data = s.raw("POST", "/v1/responses", json.dumps(codex).encode())
        events = sse(data)
        assert status == 200 and events[-1][0] in ("response.completed", "response.incomplete")
        assert [t["name"] for t in events[-1][1]["response"]["tools"]] == ["shell"]
        status, _, answer = s.post("/v1/responses", {"input": "hi", "tools": [{"type": "web_search_preview"}],
                                                     "max_output_tokens": 2})  # fmt: skip
        assert status == 200 and answer["tools"] == [] and answer["tool_choice"] == "auto"
    finally:
        assert s.stop() == 0, s.stderr
    warnings = [line for line in s.stderr.splitlines() if "left out" in line]
    assert warnings == [
        "warning: /v1/responses: left out the tools this server cannot run: custom apply_patch, web_search",
        "warning: /v1/responses: left out the tools this server cannot run: web_search_preview",
    ]
