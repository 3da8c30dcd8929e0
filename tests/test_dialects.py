"""Every API the server speaks is a dialect (serve/dialect.py): a module with the Protocol's functions, each taking
the Protocol's parameters, whose stream shape writes every moment of the one stream loop (serve/stream.py). A
dialect that lacked one, or took other parameters, fails here before it fails a client; and every dialect's stream,
llama-server's included, ends an answer, an error and a client that left the same way."""

from __future__ import annotations

import inspect
import json

import pytest

from specdec_cli import ui
from specdec_cli.engine.stats import Stats
from specdec_cli.serve import dialect
from specdec_cli.serve.body import ApiError
from specdec_cli.serve.items import STARTED, WAITING, Finished, Probs, Scored, Text
from specdec_cli.serve.stream import Shape, Stream

MODULES = sorted(set(dialect.DIALECTS.values()), key=lambda m: m.__name__)
BODIES = {  # a streamed request of each generating route's kind
    "chat": {"messages": [{"role": "user", "content": "hi"}], "stream": True, "logprobs": True},
    "completion": {"prompt": "hi", "stream": True, "logprobs": 1},
    "responses": {"input": "hi", "stream": True},
    "messages": {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stream": True},
    "infill": {"input_prefix": "def f(", "input_suffix": ")", "stream": True, "n_probs": 1},
    "llama": {"prompt": "hi", "stream": True},
}


def members(protocol: type) -> list[str]:
    return sorted(n for n in dir(protocol) if not n.startswith("_"))


def test_every_route_that_answers_has_a_dialect():
    assert set(dialect.DIALECTS) == {*BODIES, "count_tokens"}
    assert members(dialect.Dialect) == ["error", "new_id", "parse", "response", "shape"]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_dialect_module_satisfies_the_protocol(module):
    """As the engine's Context is checked (tests/test_round_loop.py): every member, with the same parameters."""
    assert isinstance(module, dialect.Dialect), module.__name__
    for name in members(dialect.Dialect):
        want = list(inspect.signature(getattr(dialect.Dialect, name)).parameters)[1:]  # (less self)
        have = list(inspect.signature(getattr(module, name)).parameters)
        assert have == want, (module.__name__, name, have)


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_every_dialects_stream_shape_writes_every_moment(kind):
    module = dialect.DIALECTS[kind]
    shape = module.shape(module.parse(kind, BODIES[kind]), "id_1", "m")  # (an abstract moment left: TypeError)
    assert isinstance(shape, Shape)
    for name in members(Shape):
        want = list(inspect.signature(getattr(Shape, name)).parameters)[1:]
        assert list(inspect.signature(getattr(shape, name)).parameters) == want, (kind, name)


def streamed(kind: str, items) -> tuple[Stream, list]:
    module = dialect.DIALECTS[kind]
    req = module.parse(kind, BODIES[kind])
    stream = Stream(module.shape(req, module.new_id(kind), "m"), kind)
    return stream, list(stream.events(items))


def ended(events: list) -> bool:
    """Whether the events hold an answer's end: a chunk with its finish_reason (OpenAI's chat and completions),
    response.completed (Responses), message_stop (Messages), the line with stop: true (llama-server's)."""
    for name, data in events:
        if name in ("response.completed", "message_stop"):
            return True
        if isinstance(data, dict) and (
            data.get("stop") is True or any(c["finish_reason"] for c in data.get("choices", []))
        ):
            return True
    return False


SCORED = Scored(1, "Hi", b"Hi", -0.5, ((1, "Hi", b"Hi", -0.5),))
END = Finished(Stats(prompt_tokens=3, generated_tokens=1, stop_reason="eos"), 0, "stop")


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_whole_answer_ends_with_the_dialects_end(kind):
    stream, events = streamed(kind, [STARTED, WAITING, Probs([SCORED]), Text.of("Hi", 1), END])
    assert stream.finished is END and ended(events)
    assert '"Hi"' in "".join(json.dumps(data) for _, data in events)


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_an_error_after_the_headers_is_the_streams_last_word_in_every_dialect(kind, monkeypatch):
    """llama-server's /completion and /infill too, as its server-context.cpp ends a stream: `data: {"error": ...}`."""
    logged: list[str] = []
    monkeypatch.setattr(ui, "error", logged.append)

    def cut(exc):
        yield STARTED
        yield Text.of("Hi", 1)
        raise exc

    for exc, message in [(ApiError(503, "the server is shutting down"), "shutting down"), (KeyError("x"), "KeyError")]:
        stream, events = streamed(kind, cut(exc))
        assert stream.finished is None and not ended(events)
        assert any(message in json.dumps(data) for _, data in events[-2:]), events[-2:]
    assert logged == [f"{kind} stream: unexpected KeyError: 'x'"]
    if kind in ("infill", "llama"):
        assert events[-1] == (
            None,
            {"error": {"code": 500, "message": "internal error: KeyError", "type": "server_error"}},
        )


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_client_that_left_gets_no_end(kind):
    stream, events = streamed(kind, [STARTED, Text.of("Hi", 1)])
    assert stream.finished is None and not ended(events) and events[-1] != (None, "[DONE]")
