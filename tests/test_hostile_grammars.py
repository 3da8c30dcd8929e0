"""Grammars and schemas from a hostile client: what llama.cpp's grammar reader cannot survive (it recurses without
a bound: 20,000 nested groups or 70,000 chained rules end the process with SIGSEGV) is refused before it reads
them, with a 400 from the server and one line from the CLI; a tool schema the converter cannot express loosens
that tool's arguments, with a warning, rather than failing the request. llama.cpp's own parse runs in a child
process here, so that a crash is a failed test, not a dead pytest."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import pytest
from test_constraint import cli, one_line_error
from test_serve import Served

from specdec_cli import ui
from specdec_cli.backend import gbnf_bounds, schema
from specdec_cli.backend.gbnf_bounds import bounded
from specdec_cli.backend.grammar import check
from specdec_cli.backend.schema import schema_to_gbnf
from specdec_cli.chat import calls
from specdec_cli.chat.messages import Tool, Tools
from specdec_cli.errors import UsageError
from specdec_cli.serve import toolcalls

DEEP = 60_000  # the issue's request: SIGSEGV in llama.cpp's parser (30,000 too; 10,000 parsed)


def nested(n: int) -> str:
    return "root ::= " + "(" * n + '"a"' + ")" * n


def chain(n: int, link: str = "r{i} ::= r{j}") -> str:
    """root, then n rules, each beginning with the next (`link`)."""
    rules = "".join(link.format(i=i, j=i + 1) + "\n" for i in range(n))
    return f'root ::= r0\n{rules}r{n} ::= "a"\n'


# A child that parses each grammar (one a line, as JSON) with llama.cpp, as the server would, memory bounded.
PARSER = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import llama_cpp as L
L.llama_backend_init()
for line in sys.stdin:
    p = L.llama_sampler_init_grammar(None, json.loads(line).encode(), b"root")
    if p:
        L.llama_sampler_free(p)
"""


def llama_cpp_survives(grammars: list[str], seconds: float = 60) -> None:
    feed = "".join(json.dumps(g) + "\n" for g in grammars)
    r = subprocess.run([sys.executable, "-c", PARSER], input=feed, capture_output=True, text=True, timeout=seconds)
    assert r.returncode == 0, f"llama.cpp's parser died ({r.returncode}): {r.stderr[-300:]}"


def refused(gbnf: str) -> str:
    with pytest.raises(UsageError) as e:
        bounded(gbnf)
    return e.value.message


# --- the bounds, in-process ---------------------------------------------------------------------------------------


def test_groups_nested_past_the_bound_are_refused_before_llama_cpp_reads_them():
    assert "nests groups ( ) more than 1,000 deep; the limit is 1,000" in refused(nested(DEEP))
    assert "more than 1,000 deep" in refused(nested(gbnf_bounds.MAX_NESTING + 1))
    assert "more than 1,000 deep" in refused("root ::= " + "(" * DEEP)  # unclosed: llama.cpp recursed first
    check(nested(gbnf_bounds.MAX_NESTING))  # at the bound: llama.cpp parses it


def test_brackets_in_literals_classes_and_comments_are_not_nesting():
    for text in ['root ::= "' + "(" * DEEP + '"', "root ::= [" + "(" * DEEP + "]", 'root ::= "a" # ' + "(" * DEEP,
                 'root ::= "\\"' + "(" * DEEP + '"', 'root ::= [\\]' + "(" * DEEP + "]"]:  # fmt: skip
        check(text)
    assert "more than 1,000 deep" in refused('root ::= "\\\\" ' + "(" * DEEP)  # the escape ends there
    assert "more than 1,000 deep" in refused('root ::= "a" # x\n r ::= ' + "(" * DEEP)
    bounded('root ::= "a"\0' + "(" * DEEP)  # llama.cpp reads up to the NUL


def test_rules_chained_past_the_bound_are_refused():
    assert "chains more than 5,000 rules, each beginning with the next" in refused(chain(100_000))
    # through what can be empty, as llama.cpp's left-recursion check follows: "", [^], an empty alternative
    for link in ['r{i} ::= "" r{j}', "r{i} ::= [^] r{j}", "r{i} ::= e r{j}\ne ::= | [x]"]:
        assert "chains more than" in refused(chain(10_000, link)), link
    check("root ::= " + "(" * 900 + '"a"' + ")?" * 900)  # two links a level, under the bound
    bounded(chain(20_000, 'r{i} ::= "x" r{j}'))  # text first: no chain, llama.cpp parses it without recursing
    check(chain(gbnf_bounds.MAX_CHAIN - 10))


def test_a_rule_that_begins_in_too_many_ways_is_refused():
    diamond = chain(40, "r{i} ::= r{j} | r{j}")  # 2^40 ways: llama.cpp's check walks each (2^28 took 3.4 s)
    assert "can begin a rule in over 10,000 ways" in refused(diamond)
    assert "over 10,000 ways" in refused("root ::= " + " | ".join(f'"a{i}"' for i in range(100_000)))  # 18 s
    check("root ::= " + " | ".join(f'"a{i}"' for i in range(5_000)))


def test_repetitions_that_would_exhaust_memory_are_refused():
    assert "{5,2} times: at most fewer than at least" in refused('root ::= "a"{5,2}')  # 2^64 rules in llama.cpp
    assert "{5,2}" in refused('root ::= ("a"{ 5 ,\n 2 })')
    assert "over 1,000,000 elements" in refused("".join(f'r{i} ::= "{"a" * 1000}"{{2000}}\n' for i in range(3)))


def test_left_recursion_is_named_rather_than_walked():
    assert "rule root (or a group in it) begins with itself" in refused('root ::= root "a" | "b"')
    bounded('root ::= "[" root "]" | "x"')  # not left: text first


def test_schemas_nested_past_the_bound_are_refused_before_the_converter_recurses():
    deep: dict = {"type": "string"}
    for _ in range(300):  # 600 levels: Python's recursion limit stopped the converter at about 500
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(UsageError, match="nests more than 100 deep"):
        schema_to_gbnf(deep)
    defs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(1000)} | {"a1000": {"type": "string"}}
    with pytest.raises(UsageError, match="nests more than 100 deep"):
        schema_to_gbnf({"$ref": "#/$defs/a0", "$defs": defs})
    shallow: dict = {"type": "string"}
    for _ in range(20):
        shallow = {"type": "object", "properties": {"a": shallow}}
    check(schema_to_gbnf(shallow), schema=True)


def test_a_schema_whose_grammar_is_past_a_bound_is_refused_as_a_schema():
    huge_enum = {"enum": [f"v{i}" for i in range(20_000)]}
    with pytest.raises(UsageError, match="--json-schema converts to a grammar llama.cpp cannot take: .*10,000 ways"):
        check(schema_to_gbnf(huge_enum), schema=True)


def test_the_cli_says_one_line_and_exits_2(tmp_path):
    deep = tmp_path / "deep.gbnf"
    deep.write_text(nested(DEEP))
    deep_schema: dict = {"type": "string"}
    for _ in range(200):
        deep_schema = {"type": "array", "items": deep_schema}
    for args, message in [(("--grammar", deep), "the grammar nests groups ( ) more than 1,000 deep"),
                          (("--json-schema", json.dumps(deep_schema)), "nests more than 100 deep")]:  # fmt: skip
        r = cli("generate", "hi", "--target", tmp_path / "no-model.gguf", *args)
        assert r.returncode == 2 and message in one_line_error(r.stderr), (args, r.stderr)


# --- a tool schema the converter cannot express ------------------------------------------------------------------

UNCONVERTIBLE = {  # real schemas' features the converter refuses (each tried against it)
    "remote $ref": {"type": "object", "properties": {"a": {"$ref": "https://example.com/address.json"}}},
    "$anchor": {"type": "object", "properties": {"a": {"$ref": "#s"}}, "$defs": {"s": {"$anchor": "s"}}},
    "type date": {"type": "object", "properties": {"when": {"type": "date"}}},
    "lookahead": {"type": "object", "properties": {"p": {"type": "string", "pattern": "^(?=.*\\d).+$"}}},
    "float maxLength": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 5.0}}},
    "type []": {"type": "object", "properties": {"x": {"type": []}}},
    "enum past a bound": {"type": "object", "properties": {"e": {"enum": [f"v{i}" for i in range(20_000)]}}},
    "deep": {"type": "object", "properties": {"d": json.loads('{"items": ' * 120 + "{}" + "}" * 120)}},
}
WEATHER = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def tool_grammar(tools: Tools) -> calls.Constraint:
    """The calls' grammar for a Hermes template, without a loaded model."""
    return toolcalls.constraint(tools, calls.FORMATS["hermes"])


@pytest.mark.parametrize("feature", sorted(UNCONVERTIBLE))
def test_a_tool_schema_the_converter_cannot_express_loosens_that_tool_alone(feature, monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(ui, "warning", warned.append)
    bad = Tool("odd_tool", "", UNCONVERTIBLE[feature])
    out = tool_grammar(Tools((WEATHER, bad), choice="required"))
    check(out.gbnf)
    assert '\\"city\\"' in out.gbnf  # the other tool keeps its schema
    assert len(warned) == 1 and "odd_tool" in warned[0] and "get_weather" not in warned[0], warned


def test_a_tools_own_definitions_are_kept_as_pydantic_writes_them(monkeypatch):
    """`$defs` (and `definitions`) as the OpenAI SDK's pydantic_function_tool writes them: every tool's keep their
    meaning inside the call's schema (each tool's under its own name), so the tool stays constrained."""
    warned: list[str] = []
    monkeypatch.setattr(ui, "warning", warned.append)
    where = {
        "$defs": {
            "Unit": {"enum": ["celsius", "fahrenheit"], "type": "string"},
            "Place": {"type": "object", "properties": {"unit": {"$ref": "#/$defs/Unit"}}, "required": ["unit"]},
        },
        "type": "object",
        "properties": {"where": {"$ref": "#/$defs/Place"}, "days": {"type": "integer"}},
        "required": ["where", "days"],
    }
    other = {
        "definitions": {"Unit": {"enum": ["kelvin"]}},
        "type": "object",
        "properties": {"u": {"$ref": "#/definitions/Unit"}},
    }
    gbnf = tool_grammar(Tools((Tool("forecast", "", where), Tool("convert", "", other)), choice="required")).gbnf
    check(gbnf)
    assert warned == []
    assert "celsius" in gbnf and "kelvin" in gbnf  # both tools' Unit, apart
    [args] = [line for line in gbnf.splitlines() if "-where-kv" in line and "-days-kv" in line and '::= "{"' in line]
    assert args.index("-where-kv") < args.index("-days-kv")  # the properties' order kept


# --- through a real server ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    from tiny_models import write_fixture_set

    return write_fixture_set(tmp_path_factory.mktemp("hostile-grammar-models"))


@pytest.fixture(scope="module")
def server(tiny):
    s = Served("--target", tiny["chat"], "--draft", tiny["draft"], "--drafter", "model", "-k", "3")
    yield s
    s.stop()


def test_a_grammar_that_crashed_the_server_gets_400_and_it_still_answers(server):
    for path, body in [
        ("/completion", {"prompt": "hi", "n_predict": 4, "grammar": nested(DEEP)}),
        ("/completion", {"prompt": "hi", "n_predict": 4, "grammar": chain(100_000)}),
        ("/completion", {"prompt": "hi", "n_predict": 4, "grammar": 'root ::= "a"{5,2}'}),
    ]:
        status, _, answer = server.post(path, body)
        message = answer["error"]["message"]  # llama-server's shape: {"error": {"code", "message", "type"}}
        assert status == 400 and answer["error"]["code"] == 400 and message.startswith("grammar: the grammar "), answer
        assert "the limit is" in message or "{5,2}" in message
        assert server.raw("GET", "/health")[0] == 200
    deep: dict = {"type": "string"}
    for _ in range(150):  # past the schema's bound (100), within the body's (200 levels)
        deep = {"type": "array", "items": deep}
    status, _, answer = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}})  # fmt: skip
    assert status == 400 and "nests more than 100 deep" in answer["error"]["message"], answer
    assert server.proc.poll() is None and server.raw("GET", "/health")[0] == 200


def test_a_tool_the_converter_cannot_express_is_answered_with_a_warning(tiny):
    s = Served("--target", tiny["chat"])  # its own: its warnings are read when it stops
    try:
        tools = [{"type": "function", "function": {"name": "odd_tool", "parameters": UNCONVERTIBLE["remote $ref"]}},
                 {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER.parameters}}]  # fmt: skip
        status, _, answer = s.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 48, "tools": tools,
            "tool_choice": "required", "temperature": 0})  # fmt: skip
        assert status == 200, answer
    finally:
        s.stop()
    assert "any JSON object stands for the arguments of odd_tool" in s.stderr, s.stderr[-2000:]


# --- fuzz ---------------------------------------------------------------------------------------------------------


def random_grammar(rng: random.Random) -> str:
    """Deep, wide, repeated or garbled: the shapes that reach llama.cpp's recursion, built at random."""
    n = rng.choice([1, 10, 300, 999, 1001, 5000, 30_000])
    atoms = ['"a"', '"("', "[(]", '"\\""', "[\\]]", "[^]", '""', ".", "r", "e", "# (\n"]
    kind = rng.randrange(7)
    if kind == 0:
        body = "(" * n + rng.choice(atoms) + rng.choice([")", ")?", ")*", ")+", "){0,3}"]) * n
    elif kind == 1:
        body = " | ".join(rng.choice(atoms) for _ in range(n))
    elif kind == 2:
        return chain(n, rng.choice(["r{i} ::= r{j}", 'r{i} ::= "x" r{j}', "r{i} ::= r{j} | r{j}", 'r{i} ::= "" r{j}']))
    elif kind == 3:
        body = rng.choice(atoms) + "{%d,%d}" % (rng.randrange(3000), rng.randrange(3000))
    elif kind == 4:
        body = "".join(rng.choice(["(", ")", '"', "[", "]", "|", "*", "a", " ", "\n", "\\", "#", "{", "}", ","])
                       for _ in range(n))  # fmt: skip
    elif kind == 5:
        body = "(" * rng.randrange(2000) + '"' + "(" * n
    else:
        body = "(" * (n // 2) + "r" + ")" * (n // 2)
    return f'root ::= {body}\nr ::= "x" | e\ne ::= "y" |\n'


def test_fuzz_random_grammars_are_refused_or_survived():
    rng, passed, deadline = random.Random(47), [], time.monotonic() + 3
    while time.monotonic() < deadline:
        text = random_grammar(rng)
        try:
            bounded(text)
        except UsageError:
            continue
        passed.append(text)
    assert len(passed) > 20
    llama_cpp_survives(passed)


def random_schema(rng: random.Random, depth: int = 0) -> object:
    if depth > rng.choice([3, 40, 120]) or rng.random() < 0.05:
        return rng.choice([{"type": "string"}, {"$ref": "#/$defs/a"}, {"enum": list(range(rng.randrange(30_000)))},
                           {"type": "string", "pattern": "(" * 50 + "a" + ")" * 50}, True, {}])  # fmt: skip
    child = random_schema(rng, depth + 1)
    return rng.choice([{"type": "object", "properties": {"p": child}}, {"type": "array", "items": child},
                       {"anyOf": [child, {"type": "null"}]}, {"allOf": [child]}, {"$defs": {"a": child}, "$ref": "#/$defs/a"}])  # fmt: skip


def test_fuzz_random_schemas_are_refused_or_their_grammar_survived():
    rng, passed, deadline = random.Random(10), [], time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            gbnf = schema_to_gbnf(random_schema(rng))
            bounded(gbnf)
        except UsageError:
            continue
        passed.append(gbnf)
    assert passed
    llama_cpp_survives(passed)


def test_the_bounds_are_well_under_what_crashed():
    assert gbnf_bounds.MAX_NESTING * 10 <= 20_000 and gbnf_bounds.MAX_CHAIN * 10 <= 70_000
    assert schema.MAX_DEPTH * 4 <= 500
