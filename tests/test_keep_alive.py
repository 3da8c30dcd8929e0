"""A stream whose prompt takes minutes to prefill (an agent's 18,000-token system prompt and tool list) must not
go still: Claude Code and Codex CLI give up on a stream whose events stopped 300 s ago and send the request
again. The headers and the dialect's opening events go out when the request's turn comes, then every
KEEP_ALIVE seconds until the first token an event the client counts: Anthropic's `ping` and an empty text delta
(Claude Code's SDK skips pings), the response `in_progress` again (Responses), an SSE comment (chat)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from types import SimpleNamespace

import anthropic
import openai
import pytest

from specdec_cli.batching.slots import Slot
from specdec_cli.engine.stats import Stats
from specdec_cli.run_inputs import Inputs
from specdec_cli.serve import service as service_module
from specdec_cli.serve.http import Server
from specdec_cli.serve.items import Finished
from specdec_cli.serve.service import Run, Service

PREFILL = 0.6  # seconds the fake generation takes before its first piece


class SlowService(Service):
    """The real Service (its gate, job hand-over and `run`), over a generation that prefills for PREFILL s."""

    def __init__(self):
        session = SimpleNamespace(prefixes=None, open_slots=lambda steps: [Slot(None, None, None)])
        super().__init__(session=session, model="m", model_ids={"m"}, waiting=2)

    def tokens(self, req) -> list[int]:
        return [1, 2, 3]

    def overrides(self, req) -> Run:
        return Run({}, Inputs(), None)

    def _generate(self, req, tokens, run, claim, slot=None):
        time.sleep(PREFILL)
        yield "Hi"
        yield Finished(Stats(prompt_tokens=3, generated_tokens=1, stop_reason="eos"), 0, "stop")


@pytest.fixture
def slow_server(monkeypatch):
    monkeypatch.setattr(service_module, "KEEP_ALIVE", 0.1)
    svc = SlowService()
    stop = threading.Event()
    worker = threading.Thread(target=svc.work, args=(stop,), daemon=True)  # (no llama.cpp: any thread will do)
    worker.start()
    server = Server(("127.0.0.1", 0), svc, None, False)
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    serving.start()
    yield server.server_address[1]
    server.shutdown()
    server.close()
    stop.set()
    worker.join(10)


def raw_stream(port: int, path: str, body: dict) -> list[tuple[float, bytes]]:
    """Each line of a streamed response with the seconds since the request was sent."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    t0 = time.perf_counter()
    conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    lines = []
    while line := r.readline():
        lines.append((time.perf_counter() - t0, line.rstrip(b"\r\n")))
    conn.close()
    return lines


def test_a_messages_stream_pings_while_its_prompt_prefills(slow_server):
    body = {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    lines = raw_stream(slow_server, "/v1/messages", body)
    events = [(t, line[len(b"event: ") :]) for t, line in lines if line.startswith(b"event: ")]
    first_text = next(t for t, line in lines if b'"text":"Hi"' in line)
    assert events[0][1] == b"message_start" and events[0][0] < PREFILL / 2  # at once, not after the prefill
    pings = [t for t, name in events if name == b"ping" and t < first_text]
    empty = [t for t, line in lines if b'"text_delta","text":""' in line]
    assert len(pings) >= 4 and len(empty) >= 3  # every KEEP_ALIVE (0.1 s) of the 0.6 s prefill
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{slow_server}", api_key="none", max_retries=0)
    with client.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as s:
        events = list(s)
        final = s.get_final_message()
    assert [b.text for b in final.content] == ["Hi"]  # the heartbeats' block is the answer's text block
    assert sum(e.type == "content_block_delta" for e in events) >= 4  # what Claude Code's watchdog counts


def test_openai_streams_keep_alive_as_their_clients_count_it(slow_server):
    chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    lines = raw_stream(slow_server, "/v1/chat/completions", chat)
    first_text = next(t for t, line in lines if b"Hi" in line)
    comments = [t for t, line in lines if line == b": keep-alive" and t < first_text]
    assert lines[0][0] < PREFILL / 2 and len(comments) >= 4
    lines = raw_stream(slow_server, "/v1/responses", {"model": "m", "stream": True, "input": "hi"})
    first_text = next(t for t, line in lines if b"output_text.delta" in line)
    again = [t for t, line in lines if line == b"event: response.in_progress" and t < first_text]
    assert lines[0][0] < PREFILL / 2 and len(again) >= 4  # (Codex CLI's stream counts events, not comments)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{slow_server}/v1", api_key="none", max_retries=0)
    chunks = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi"
    events = client.responses.create(model="m", input="hi", stream=True)
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == ["Hi"]


def test_a_request_that_does_not_stream_is_one_json_body(slow_server):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{slow_server}/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hi"
