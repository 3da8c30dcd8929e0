"""A scripted two-turn agent exchange on all three endpoints, through the official SDKs, streamed and not:
the model calls a tool (tool_choice auto: it decides), the tool's result goes back, the model answers. Checks
that every call parses and its arguments validate against the tool's schema, and that one plain conversation
gets the same greedy text from /v1/chat/completions, /v1/responses and /v1/messages.

    python scripts/agent_exchange.py -- -t 2          # starts `specdec serve --port 0 -t 2` (the default pair)
    python scripts/agent_exchange.py --url http://127.0.0.1:8080

Needs the test extras (`openai`, `anthropic`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import anthropic
from openai import OpenAI

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
DESCRIPTION = "Get the current weather in a city"
ASK = "What's the weather like in Paris today? Use the tool."
RESULT = json.dumps({"temperature": 18, "unit": "celsius", "sky": "cloudy"})
PLAIN = "In one sentence: what is a hash map?"


def valid(args: dict) -> bool:
    """The schema by hand (no jsonschema dependency): required city, a string; unit one of the enum."""
    return (
        isinstance(args, dict)
        and isinstance(args.get("city"), str)
        and set(args) <= {"city", "unit"}
        and args.get("unit", "celsius") in ("celsius", "fahrenheit")
    )


def chat(url: str, stream: bool) -> dict:
    c = OpenAI(base_url=url + "/v1", api_key="none")
    tools = [
        {"type": "function", "function": {"name": "get_weather", "description": DESCRIPTION, "parameters": SCHEMA}}
    ]
    msgs = [{"role": "user", "content": ASK}]
    if stream:
        calls, text = {}, ""
        for ch in c.chat.completions.create(model="m", messages=msgs, tools=tools, temperature=0, stream=True):
            d = ch.choices[0].delta if ch.choices else None
            for tc in (d.tool_calls or []) if d else []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
                entry["arguments"] += tc.function.arguments or ""
            text += (d.content or "") if d else ""
        call = calls.get(0)
    else:
        r = c.chat.completions.create(model="m", messages=msgs, tools=tools, temperature=0)
        tc = (r.choices[0].message.tool_calls or [None])[0]
        call = tc and {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
    if not call:
        return {"called": False}
    back = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call["id"], "type": "function",
                                                                 "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": RESULT},
    ]  # fmt: skip
    answer = c.chat.completions.create(model="m", messages=back, tools=tools, temperature=0, max_tokens=64)
    return {"called": True, "valid": valid(json.loads(call["arguments"])), "answer": answer.choices[0].message.content}


def responses(url: str, stream: bool) -> dict:
    c = OpenAI(base_url=url + "/v1", api_key="none")
    tools = [{"type": "function", "name": "get_weather", "description": DESCRIPTION, "parameters": SCHEMA}]
    if stream:
        call, args = None, ""
        for ev in c.responses.create(model="m", input=ASK, tools=tools, temperature=0, stream=True):
            if ev.type == "response.output_item.added" and ev.item.type == "function_call":
                call = ev.item
            elif ev.type == "response.function_call_arguments.delta":
                args += ev.delta
        call = call and {"call_id": call.call_id, "name": call.name, "arguments": args}
    else:
        r = c.responses.create(model="m", input=ASK, tools=tools, temperature=0)
        fc = next((o for o in r.output if o.type == "function_call"), None)
        call = fc and {"call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments}
    if not call:
        return {"called": False}
    items = [
        {"role": "user", "content": ASK},
        {"type": "function_call", **call},
        {"type": "function_call_output", "call_id": call["call_id"], "output": RESULT},
    ]
    answer = c.responses.create(model="m", input=items, tools=tools, temperature=0, max_output_tokens=64)
    return {"called": True, "valid": valid(json.loads(call["arguments"])), "answer": answer.output_text}


def messages(url: str, stream: bool) -> dict:
    c = anthropic.Anthropic(base_url=url, api_key="none")
    tools = [{"name": "get_weather", "description": DESCRIPTION, "input_schema": SCHEMA}]
    msgs = [{"role": "user", "content": ASK}]
    extra = {"temperature": 0}
    if stream:
        with c.messages.stream(model="m", max_tokens=256, messages=msgs, tools=tools, extra_body=extra) as s:
            final = s.get_final_message()
    else:
        final = c.messages.create(model="m", max_tokens=256, messages=msgs, tools=tools, extra_body=extra)
    use = next((b for b in final.content if b.type == "tool_use"), None)
    if use is None:
        return {"called": False}
    back = msgs + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]},
    ]
    answer = c.messages.create(model="m", max_tokens=64, messages=back, tools=tools, extra_body=extra)
    return {
        "called": True,
        "valid": valid(use.input),
        "answer": "".join(b.text for b in answer.content if b.type == "text"),
    }


def plain(url: str) -> dict:
    o, a = OpenAI(base_url=url + "/v1", api_key="none"), anthropic.Anthropic(base_url=url, api_key="none")
    msgs = [{"role": "user", "content": PLAIN}]
    return {
        "chat": o.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=48)
        .choices[0]
        .message.content,
        "responses": o.responses.create(model="m", input=PLAIN, temperature=0, max_output_tokens=48).output_text,
        "messages": a.messages.create(model="m", max_tokens=48, messages=msgs, extra_body={"temperature": 0})
        .content[0]
        .text,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running server (else one is started with the arguments after --)")
    ap.add_argument("serve_args", nargs="*")
    args = ap.parse_args()
    server = None
    url = args.url
    if url is None:
        cmd = [sys.executable, "-m", "specdec_cli", "serve", "--port", "0", *args.serve_args]
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        url = server.stdout.readline().strip().removesuffix("/v1")
    try:
        for name, run in (("chat", chat), ("responses", responses), ("messages", messages)):
            for stream in (False, True):
                t0 = time.perf_counter()
                r = run(url, stream)
                print(f"{name:9} stream={stream!s:5} {time.perf_counter() - t0:6.1f} s  {json.dumps(r)[:300]}")
        texts = plain(url)
        print("plain:", json.dumps(texts)[:400])
        print("same greedy text on all three endpoints:", len(set(texts.values())) == 1)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
