"""Tool calls: read out of each format's text (whole, streamed in any cut, broken, partial), the grammar of each
tool_choice, the lazy grammar's trigger, and speculation under it: greedy output identical to constrained
target-only decoding for every drafter."""

from __future__ import annotations

import random
import re

import pytest
from conftest import config, run_engine

from specdec_cli.backend import grammar
from specdec_cli.backend.grammar import Grammar
from specdec_cli.backend.schema import schema_to_gbnf as to_gbnf
from specdec_cli.chat import Tool, Tools, calls
from specdec_cli.session import open_session

HERMES, MISTRAL, LLAMA3 = calls.FORMATS["hermes"], calls.FORMATS["mistral"], calls.FORMATS["llama3"]
WEATHER = Tool(
    "get_weather",
    "Weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"],
    },
)
TIME = Tool("get_time", "", {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[^\\.]*$"}}})
ANSWERS = [  # (format, text, content, [(name, arguments)])
    (HERMES, 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "q": "a\\"}}"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "Checking.",
     [("get_weather", '{"city": "Paris", "q": "a\\"}}"}'), ("get_time", "{}")]),
    (HERMES, '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Oslo"\n  }\n}\n```', "",
     [("get_weather", '{\n    "city": "Oslo"\n  }')]),
    (HERMES, '{"name": "get_time", "arguments": {"zone": "UTC"}}', "", [("get_time", '{"zone": "UTC"}')]),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "a1b2c3d4e"}, '
     '{"name": "get_time", "arguments": {}}]', "", [("get_weather", '{"city": "Rome"}'), ("get_time", "{}")]),
    (LLAMA3, '{"name": "get_time", "parameters": {"zone": "CET"}}', "", [("get_time", '{"zone": "CET"}')]),
    (HERMES, "Just text, with a < and a ``` fence.", "Just text, with a < and a ``` fence.", []),
    (HERMES, "```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
]  # fmt: skip
BROKEN = [
    (HERMES, 'Sure <tool_call>\n{"name": "get_weather", "argu'),  # cut mid-call (max_tokens)
    (HERMES, "<tool_call> not a call </tool_call>"),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>'),  # arguments not an object
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x"}}\n</tool_call> and then prose'),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": '),
    (LLAMA3, 'Here: {"name": "get_time", "parameters": {}}'),  # llama3's calls open the answer
]


def streamed(fmt, text: str, cuts: list[int]):
    reader, pieces, last = calls.Reader(fmt), [], 0
    for cut in [*cuts, len(text)]:
        pieces += reader.push(text[last:cut])
        last = cut
    tail, content, made = reader.end()
    return pieces + tail, content, made


@pytest.mark.parametrize("fmt,text,content,expected", ANSWERS)
def test_each_format_reads_back_content_and_calls(fmt, text, content, expected):
    got_content, made = calls.read(fmt, text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in made] == expected
    assert len({c.id for c in made}) == len(made) and all(c.id.startswith("call_") for c in made)


@pytest.mark.parametrize("fmt,text,content,expected", ANSWERS + [(f, t, t, []) for f, t in BROKEN])
def test_streamed_pieces_join_to_the_whole_answer_in_any_cut(fmt, text, content, expected):
    rng = random.Random(len(text))
    for trial in range(25):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, trial % 9)))
        pieces, got_content, made = streamed(fmt, text, cuts)
        sent = "".join(p.text for p in pieces if p.kind == "text")
        assert got_content == content
        if made or not any(p.kind == "call" for p in pieces):
            assert sent == content, cuts
        else:  # a call was announced, then did not read: the stream does not send its text again
            assert content.startswith(sent) and len(sent) < len(content), cuts
        args = {}
        for p in pieces:
            if p.kind == "call":
                assert p.index not in args
                args[p.index] = ""
            elif p.kind == "args":
                args[p.index] += p.text
        assert [args[i] for i in range(len(made))] == [c.arguments for c in made]
        assert [(c.name, c.arguments) for c in made] == expected


@pytest.mark.parametrize("fmt,text", BROKEN)
def test_a_call_that_does_not_read_is_text_never_an_error(fmt, text):
    assert calls.read(fmt, text) == (text, [])


def test_formats_follow_the_template():
    assert calls.format_of(None) is HERMES  # no template: Hermes's instructions are written for it
    assert calls.format_of("{% if tools %}<tool_call>{% endif %}") is HERMES
    assert calls.format_of("{{ '[TOOL_CALLS]' }}{{ tools }}") is MISTRAL
    assert calls.format_of("<|python_tag|>{{ tools }} parameters") is LLAMA3
    assert calls.format_of("{{ messages }}") is HERMES  # no tool markup at all


@pytest.mark.parametrize("choice", ["auto", "required", "get_time"])
@pytest.mark.parametrize("fmt", [HERMES, MISTRAL, LLAMA3])
def test_each_tool_choice_gives_a_grammar_llama_cpp_parses(choice, fmt):
    for parallel in (True, False):
        c = calls.constraint(Tools((WEATHER, TIME), choice, parallel), fmt, to_gbnf)
        grammar.check(c.gbnf)
        assert (c.trigger is fmt) == (choice == "auto")  # lazy only with auto: required and named bind at once
        assert ('"\\"get_weather\\""' in c.gbnf) == (choice != "get_time")  # a named choice offers that tool only
    assert calls.constraint(Tools((WEATHER,), "none"), fmt, to_gbnf) is None


@pytest.fixture(scope="module")
def vocab(models):
    from specdec_cli.backend import native

    model = native.Model(models["target"], vocab_only=True)
    yield model
    model.close()


def walk(state, model, text: str):
    """The state after `text`, token by token; None where the grammar refuses a token."""
    for token in model.tokenize_text(text, add_special=False, parse_special=True):
        if not state.allows(token):
            return None
        state = state.after(token)
    return state


def test_the_lazy_grammar_is_free_until_the_marker_then_holds_the_call(vocab):
    # (the fixtures' byte vocabulary spells a space as SentencePiece's three bytes: the calls here have none)
    c = calls.constraint(Tools((WEATHER,)), HERMES, to_gbnf)
    g = Grammar(vocab, c.gbnf, c.trigger)
    free = walk(g.start(), vocab, "Any text at all { [ } here.\n")
    assert free is not None and free.complete()  # before the marker: anything, and the answer may end
    call = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}\n</tool_call>'
    done = walk(free, vocab, call)
    assert done is not None and done.complete()
    assert walk(free, vocab, '<tool_call>\n{"name":"get_weather","arguments":{"unit":"c"}}') is None  # no city
    assert walk(free, vocab, '<tool_call>\n{"name":"get_time"') is None  # no such tool
    assert walk(free, vocab, "<tool_call> and then prose") is None
    opened = walk(free, vocab, '<tool_call>\n{"name":"get_weather","arguments":{"city":"P')
    assert opened is not None and not opened.complete()  # mid-call the answer may not end
    # the call's JSON opening the answer (Qwen2.5's ```json habit) binds the grammar too, but only at the start
    fenced = '```json\n{\n"name":"get_weather",\n"arguments":{\n\t"city":"Oslo"\n}\n}\n```'
    assert walk(g.start(), vocab, fenced).complete()
    assert walk(g.start(), vocab, '```json\n{\n"name":"nope"') is None
    assert walk(g.start(), vocab, 'Text first, then {"name": "nope"}') is not None


def test_a_token_that_completes_the_marker_with_junk_is_refused_and_masked(vocab):
    class Marker:  # a one-character marker: the fixture's byte tokens complete it with what follows it
        tag = "@"

        def find(self, text):
            return text.find("@")

        def opens(self, text):
            return False

    g = Grammar(vocab, 'root ::= "@" [0-9]+', Marker())
    state = g.start()
    ids = {vocab.piece(t): t for t in range(vocab.n_vocab)}
    ok, junk = [t for piece, t in ids.items() if piece.startswith(b"@")], ids.get(b"@")
    assert junk is not None and state.allows(junk) and state.after(junk).allows(ids[b"7"])
    assert not state.after(junk).allows(ids[b"x"])
    row = __import__("numpy").zeros(vocab.n_vocab, dtype="float32")
    masked = state.mask(row)
    assert all(masked[t] == 0 for t in ok if re.fullmatch(rb"@[0-9]*", vocab.piece(t)))
    assert all(masked[t] == -float("inf") for t in ok if not re.fullmatch(rb"@[0-9]*", vocab.piece(t)))


RUNS = [
    dict(drafter="model", draft_tokens=4),
    dict(drafter="model", draft_tokens=6, branches=3, p_split=0.05),
    dict(drafter="lookup", draft_tokens=4),
    dict(drafter="auto", draft_tokens=None),
]


class At:
    """A marker the fixture target writes unconstrained (found in its plain answer), as a lazy trigger."""

    def __init__(self, tag: str):
        self.tag = tag

    def find(self, text):
        return text.find(self.tag)

    def opens(self, text):
        return False


def test_every_drafter_gives_exactly_lazily_constrained_target_only_output(models, frozen_costs):
    with open_session(config(models, "draft", drafter="auto", draft_tokens=None, max_tokens=60,
                             lookup_cache=False)) as s:  # fmt: skip
        _, _, free = run_engine(s, "hello", drafter="none")
        tag = next(ch for ch in free[4:] if ch.isascii() and ch.isalnum())
        gbnf = f'root ::= "{tag}" [a-f]+ "."'
        plain, stats, text = run_engine(s, "hello", drafter="none", gbnf=gbnf, trigger=At(tag))
        at = text.index(tag)
        assert text[:at] == free[:at]  # free until the marker
        assert re.fullmatch(f"{re.escape(tag)}[a-f]+\\.?", text[at:]), text  # bound after it
        drafted = 0
        for run in RUNS:
            tokens, stats, _ = run_engine(s, "hello", gbnf=gbnf, trigger=At(tag), **run)
            assert tokens == plain, run
            drafted += stats.drafted
        assert drafted > 0


def test_every_drafter_gives_exactly_the_required_calls_target_only_gives(models, frozen_costs):
    c = calls.constraint(Tools((WEATHER, TIME), "required"), HERMES, to_gbnf)
    with open_session(config(models, "draft", drafter="auto", draft_tokens=None, max_tokens=80,
                             lookup_cache=False)) as s:  # fmt: skip
        plain, stats, text = run_engine(s, "hello", drafter="none", gbnf=c.gbnf)
        assert stats.stop_reason == "eos" and calls.read(HERMES, text)[1], text  # a whole call, in some form
        for run in RUNS:
            assert run_engine(s, "hello", gbnf=c.gbnf, **run)[0] == plain, run


@pytest.mark.parametrize(
    "cut", ['\n<tool_call>\n{"name": "get_time", "argum', '\n<tool_call>\n{"name": "get_time", "arguments": {"zo']
)
def test_an_answer_cut_after_whole_calls_keeps_them(cut):
    # a model that repeats its call until max_tokens (SmolLM2 with parallel calls) still made the first one
    whole = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    content, made = calls.read(HERMES, whole + cut)
    assert content == "" and [(c.name, c.arguments) for c in made] == [("get_weather", '{"city": "Rome"}')]
