"""JSON Schema as people write it (tool definitions, response formats) converts to a grammar llama.cpp parses,
meaning what the schema means: a pattern's strings are exactly the ones its JSON text may spell, checked
against Python's `re` through llama.cpp's own grammar engine on a byte vocabulary (one token per byte)."""

from __future__ import annotations

import json
import re

import pytest
from tiny_models import byte_vocab, random_weights, write_model

from specdec_cli.backend import native
from specdec_cli.backend.grammar import Grammar, check, from_schema
from specdec_cli.backend.schema import schema_to_gbnf
from specdec_cli.errors import UsageError


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    vocab = byte_vocab()
    path = write_model(tmp_path_factory.mktemp("vocab") / "bytes.gguf", random_weights(0, len(vocab)), vocab)
    with native.Model(path, vocab_only=True) as model:
        yield model


def accepts(model, gbnf: str, text: str) -> bool:
    """Whether the grammar takes `text` whole, byte by byte (byte b is token 3 + b in byte_vocab)."""
    state = Grammar(model, gbnf).start()
    for b in text.encode():
        if not state.allows(3 + b):
            return False
        state = state.after(3 + b)
    return state.complete()


def string_grammar(pattern: str) -> str:
    gbnf = schema_to_gbnf({"type": "string", "pattern": pattern})
    check(gbnf, schema=True)
    return gbnf


# (pattern, strings to try): the regex decides which must be accepted; each list holds both kinds.
PATTERNS = {
    "escape in a negated class": (r"^[^\.]*$", ["abc", "", "a.b", "..", 'say "hi"\\']),
    "shorthand in a class": (r"^[\w.-]+$", ["a-b.c_d", "a b", "", "a/b", "é"]),
    "digit class": (r"^[\d]+$", ["0123", "12a", ""]),
    "anything class": (r"^[\s\S]{1,5}$", ["a\nb", '"\\', "", "abcdef", "\t\x01"]),
    "escaped hyphen": (r"^[a\-z]+$", ["a-z", "-", "b", "a_z"]),
    "escaped slash": (r"^[\/a]+$", ["/a/", "b", "a\\"]),
    "escaped brackets": (r"^[\]\[]+$", ["[]", "][", "a"]),
    "escaped backslash": (r"^[\\a]+$", ["\\a", "a", "b", "\\b"]),
    "shorthands outside classes": (r"^\d\w\s\D\W\S$", ["1_ a?z", "9Z\tx-1", "1_ 1?z", "1_ a?", "a_ a?z"]),
    "date": (r"^\d{4}-\d{2}-\d{2}$", ["2024-01-31", "2024-1-31", "20240-01-31", "2024-01-31x"]),
    "semver": (r"^\d+\.\d+\.\d+$", ["1.2.3", "10.20.30", "1.2", "1x2x3", "1.2.3-beta"]),
    "identifier": (r"^[a-zA-Z_][a-zA-Z0-9_]*$", ["_x1", "abc", "1abc", "a-b", ""]),
    "url prefix": (r"^https?://", ["https://example.com/a?b=c", "http://", "ftp://x", "xhttps://", "https:/"]),
    "hex colour": (r"^#[0-9a-fA-F]{6}$", ["#a0B1c2", "#a0B1c", "a0B1c2f", "#a0B1c2f", "#g0B1c2"]),
    "path": (r"^[^/]+(/[^/]+)*$", ["a", "a/b/c", "/a", "a//b", "a/"]),
    "email": (r"^[\w.+-]+@[\w-]+\.[\w.-]+$", ["a.b+c@ex-ample.co.uk", "a@b", "a b@c.d", "@c.d"]),
    "non-capturing group": (r"^[a-z0-9]+(?:-[a-z0-9]+)*$", ["my-slug-2", "slug", "-slug", "slug-", "a--b"]),
    "named group": (r"^(?<year>\d{4})$", ["2024", "24"]),
    "alternation and group": (r"^(feature|bugfix)/[a-z]+$", ["feature/x", "bugfix/abc", "hotfix/x", "feature/"]),
    "escaped metacharacters": (r"^\$\d+(\.\d{2})?\(\+\)$", ["$5(+)", "$5.25(+)", "5(+)", "$5.2(+)", "$5()"]),
    "unanchored": (r"[A-Z]{2,}", ["AB", "xxABCyy", "aBc", ""]),
    "unanchored alternation": (r"cat|dog", ["a cat", "hotdog", "cow", ""]),
    "anchored alternatives": (r"^ab$|^cd$", ["ab", "cd", "abcd", "xab"]),
    "quote and backslash excluded": (r'^[^"\\]*$', ["plain", 'a"b', "a\\b", ""]),
    "dot": (r"^.+$", ['a"b\\c', "é€", "a\nb", ""]),
    "bounded group": (r"^(ab|c){2,3}$", ["abc", "cab", "ccc", "ababab", "c", "abababc"]),
    "at least": (r"^x{3,}$", ["xxx", "xxxxxxx", "xx"]),
    "lazy quantifiers": (r"^a*?b+?$", ["b", "aabb", "a", ""]),
    "empty": (r"^$", ["", "a"]),
    "character escapes": (r"^\x41\u00e9\t\n$", ["Aé\t\n", "Ae\t\n", "Aé \n"]),
    "negated range": (r"^[^a-z]$", ["é", "A", "a", "AB"]),
    "negated non-ASCII": (r"^[^\u00e9\u2028]+$", ["è€—", "é", "a\u2028"]),  # è, € share é's, U+2028's first byte
    "control characters": (r"^[\x00-\x1f]+$", ["\x00\x1f\n", "a"]),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_a_patterns_language_is_kept(vocab, name):
    pattern, strings = PATTERNS[name]
    gbnf = string_grammar(pattern)
    python = re.sub(r"\(\?<(?=\w)", "(?P<", pattern)  # ECMA's (?<name>...) is Python's (?P<name>...)
    want = {s: bool(re.search(python, s, re.ASCII)) for s in strings}
    assert True in want.values() and False in want.values(), want  # the case tries both kinds
    for s, matches in want.items():
        assert accepts(vocab, gbnf, json.dumps(s, ensure_ascii=False)) is matches, (s, gbnf)


def test_ecma_readings_where_python_differs(vocab):
    """JSON Schema's patterns are ECMA-262: `$` is the very end, \\s takes Unicode spaces, `.` no \\r."""
    assert not accepts(vocab, string_grammar(r"^abc$"), json.dumps("abc\n"))
    assert accepts(vocab, string_grammar(r"^\s$"), json.dumps("\u00a0", ensure_ascii=False))
    assert not accepts(vocab, string_grammar(r"^.$"), json.dumps("\r"))
    anything = string_grammar("")  # an empty pattern matches every string, and only strings
    assert all(accepts(vocab, anything, json.dumps(s)) for s in ("", 'a "quoted" \\ line\n', "é"))
    assert not accepts(vocab, anything, '"a"b"') and not accepts(vocab, anything, "1")


@pytest.mark.parametrize("pattern", [r"^a{0,2500}$", r"^a{1500,2500}$", r"^(a|b(c|d)){1500,2500}$"])
def test_counts_past_llamas_limit_stay_exact(vocab, pattern):
    """llama.cpp reads an upper count past 2,000 as none, and refuses a count times the rules it repeats past
    2,000 (a group of groups: 1,000 would do): the grammar counts in chunks of one named rule instead."""
    gbnf = string_grammar(pattern)
    assert accepts(vocab, gbnf, json.dumps("a" * 2500))
    assert not accepts(vocab, gbnf, json.dumps("a" * 2501))
    assert accepts(vocab, gbnf, json.dumps("a" * 1500))
    assert accepts(vocab, gbnf, json.dumps("a" * 1499)) is ("{1500," not in pattern)


def test_a_long_max_length_is_exact(vocab):
    gbnf = schema_to_gbnf({"type": "string", "minLength": 2, "maxLength": 2100})
    check(gbnf, schema=True)
    for n, ok in ((1, False), (2, True), (2100, True), (2101, False)):
        assert accepts(vocab, gbnf, json.dumps("é" * n, ensure_ascii=False)) is ok, n


@pytest.mark.parametrize(
    "pattern, piece",
    [
        (r"^(?!\s*$).+$", "lookaround"),
        (r"^(?=a)a$", "lookaround"),
        (r"^(a)\1$", "backreference"),
        (r"^\bword\b$", "word boundary"),
        (r"^\p{L}+$", "Unicode properties"),
        (r"^a(b$", "unbalanced ("),
        (r"^ab)$", "unbalanced )"),
        (r"^[z-a]$", "out of order"),
        (r"^a{3,1}$", "out of order"),
        (r"^a**$", "nothing to repeat"),
        (r"a^b", "an anchor"),
    ],
)
def test_a_pattern_no_grammar_can_hold_is_one_clear_error(pattern, piece):
    with pytest.raises(UsageError) as e:
        schema_to_gbnf({"type": "object", "properties": {"name": {"type": "string", "pattern": pattern}}})
    message = e.value.message
    assert message.startswith("the converter cannot express this schema: the pattern ") and piece in message
    assert "#/properties/name" in message and "\n" not in message and e.value.hint
    with pytest.raises(UsageError, match=r"^--json-schema: the converter cannot express this schema: the pattern"):
        from_schema(json.dumps({"type": "string", "pattern": pattern}))


def S(**kw):
    return {"type": "string", **kw}


def obj(props, required=None, **kw):
    return {"type": "object", "properties": props, "required": list(props) if required is None else required, **kw}


STATUS = S(enum=["pending", "in_progress", "completed"])
CLAUDE = {"$schema": "http://json-schema.org/draft-07/schema#", "additionalProperties": False}
# Tool parameters as Codex CLI, Claude Code and OpenAI's examples send them, and response formats.
SCHEMAS = {
    "codex shell": obj({"command": {"type": "array", "items": S()}, "workdir": S(), "timeout_ms": {"type": "integer"}}, ["command"]),
    "codex apply_patch": obj({"input": S(description="The entire contents of the apply_patch command")}),
    "codex read_file": obj({"path": S(), "offset": {"type": "integer", "minimum": 1}, "limit": {"type": "integer"}}, ["path"]),
    "codex update_plan": obj({"explanation": S(), "plan": {"type": "array", "items": obj({"step": S(), "status": STATUS})}}, ["plan"]),
    "Bash": obj({"command": S(), "timeout": {"type": "number"}, "description": S(), "run_in_background": {"type": "boolean"}}, ["command"], **CLAUDE),
    "Edit": obj({"file_path": S(), "old_string": S(), "new_string": S(), "replace_all": {"type": "boolean", "default": False}},
                ["file_path", "old_string", "new_string"], **CLAUDE),
    "Glob": obj({"pattern": S(), "path": S()}, ["pattern"], **CLAUDE),
    "Grep": obj({"pattern": S(), "path": S(), "glob": S(), "output_mode": S(enum=["content", "files_with_matches", "count"]),
                 "-B": {"type": "number"}, "-A": {"type": "number"}, "-C": {"type": "number"}, "-n": {"type": "boolean"},
                 "-i": {"type": "boolean"}, "type": S(), "head_limit": {"type": "number"}, "multiline": {"type": "boolean"}},
                ["pattern"], **CLAUDE),
    "TodoWrite": obj({"todos": {"type": "array", "items": obj({"content": S(minLength=1), "status": STATUS, "activeForm": S(minLength=1)},
                                                             additionalProperties=False)}}, **CLAUDE),
    "WebFetch": obj({"url": S(format="uri"), "prompt": S()}, **CLAUDE),
    "WebSearch": obj({"query": S(minLength=2), "allowed_domains": {"type": "array", "items": S()}}, ["query"], **CLAUDE),
    "Read": obj({"file_path": S(), "offset": {"type": "number"}, "limit": {"type": "number"}}, ["file_path"], **CLAUDE),
    "NotebookEdit": obj({"notebook_path": S(), "new_source": S(), "cell_type": S(enum=["code", "markdown"])}, ["notebook_path", "new_source"]),
    "openai weather": obj({"location": S(), "units": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None]}}),
    "nullable types": obj({"name": {"type": ["string", "null"]}, "age": {"type": ["integer", "null"]},
                           "day": {"type": ["string", "null"], "format": "date"}}),
    "openapi nullable": obj({"note": S(nullable=True)}),
    "no dot": obj({"name": S(pattern="^[^\\.]*$")}),
    "dates": obj({"d": S(pattern="^\\d{4}-\\d{2}-\\d{2}$")}),
    "semver": obj({"v": S(pattern="^\\d+\\.\\d+\\.\\d+$")}),
    "identifier": obj({"id": S(pattern="^[a-zA-Z_][a-zA-Z0-9_]*$")}),
    "url": obj({"u": S(pattern="^https?://")}),
    "hex colour": obj({"c": S(pattern="^#[0-9a-fA-F]{6}$")}),
    "path": obj({"p": S(pattern="^[^/]+(/[^/]+)*$")}),
    "email": obj({"e": S(pattern="^[\\w.+-]+@[\\w-]+\\.[\\w.-]+$")}),
    "slug": obj({"s": S(pattern="^[a-z0-9]+(?:-[a-z0-9]+)*$")}),
    "time": obj({"t": S(pattern="^([01]\\d|2[0-3]):[0-5]\\d$")}),
    "branch": obj({"b": S(pattern="^(feature|bugfix|hotfix)/[\\w./-]+$")}),
    "formats": obj({"d": S(format="date"), "dt": S(format="date-time"), "u": S(format="uuid"), "e": S(format="email"), "h": S(format="hostname")}),
    "$defs": {"type": "object", "properties": {"user": {"$ref": "#/$defs/User"}, "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}}},
              "required": ["user"], "$defs": {"User": obj({"name": S(), "email": S(format="email")}), "Tag": S(enum=["a", "b"])}},
    "pydantic allOf": {"type": "object", "properties": {"color": {"allOf": [{"$ref": "#/definitions/Color"}], "description": "the colour"}},
                       "required": ["color"], "definitions": {"Color": {"enum": ["red", "green"], "type": "string"}}},
    "anyOf": obj({"value": {"anyOf": [S(), {"type": "number"}, {"type": "null"}]}, "items": {"anyOf": [{"type": "array", "items": S()}, S()]}}),
    "enum with escapes": obj({"op": {"enum": ['a"b', "c\\d", "tab\there", "é", "line\nbreak", "<=", "[x]"]}}),
    "const with escapes": obj({"kind": {"const": 'C:\\path\\"q"'}, "n": {"const": None}}),
    "items bounds": obj({"xs": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 5},
                         "many": {"type": "array", "items": S(), "maxItems": 2000}}),
    "length bounds": obj({"short": S(minLength=1, maxLength=10), "long": S(maxLength=4000)}),
    "additionalProperties": {"type": "object", "properties": {"env": {"type": "object", "additionalProperties": S()},
                                                              "meta": {"type": "object", "additionalProperties": True}}, "required": ["env"]},
    "any value": obj({"value": {"description": "any JSON value"}, "data": {}}),
    "recursive": {"$ref": "#/$defs/Node", "$defs": {"Node": obj({"name": S(), "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}, ["name"])}},
    "property names with escapes": obj({'a"b': S(), "back\\slash": {"type": "integer"}, "dotted.name": {"type": "boolean"}, "ünï": S()}),
    "items true": obj({"xs": {"type": "array", "items": True}}),
    "nullable pattern": obj({"v": {"type": ["string", "null"], "pattern": "^\\d+$"}}),
}  # fmt: skip
# Instances: each schema's grammar must take them (keys in the converter's order: required, then optional).
INSTANCES = {
    "Grep": {"pattern": "TODO", "output_mode": "content", "-A": 3, "-n": True},
    "TodoWrite": {"todos": [{"content": "write tests", "status": "in_progress", "activeForm": "Writing tests"}]},
    "WebFetch": {"url": "https://example.com/a?b=1", "prompt": "summarise"},
    "openai weather": {"location": "Bogotá, Colombia", "units": None},
    "nullable types": {"name": None, "age": 3, "day": "2024-02-29"},
    "openapi nullable": {"note": None},
    "dates": {"d": "2024-01-31"},
    "email": {"e": "first.last+tag@example-mail.co.uk"},
    "url": {"u": 'https://example.com/"quoted"\\path'},
    "pydantic allOf": {"color": "green"},
    "enum with escapes": {"op": "c\\d"},
    "const with escapes": {"kind": 'C:\\path\\"q"', "n": None},
    "length bounds": {"short": "0123456789", "long": "x" * 2500},
    "any value": {"value": [1, "two", {"three": None}], "data": "x"},
    "recursive": {"name": "root", "children": [{"name": "leaf", "children": []}]},
    "property names with escapes": {'a"b': "x", "back\\slash": 1, "dotted.name": False, "ünï": "y"},
    "items true": {"xs": [1, "a", None]},
    "nullable pattern": {"v": "123"},
}
REFUSED = {  # what the grammar must not take: what each fixed piece used to let through or get wrong
    "openai weather": {"location": "x", "units": "kelvin"},
    "enum with escapes": {"op": "c\\\\d"},
    "length bounds": {"short": "", "long": ""},
    "nullable pattern": {"v": "12a"},
    "pydantic allOf": {"color": {}},
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_realistic_schemas_convert_to_grammars_that_parse(name):
    check(schema_to_gbnf(SCHEMAS[name]), schema=True)


@pytest.mark.parametrize("name", list(INSTANCES))
def test_realistic_schemas_take_their_instances(vocab, name):
    gbnf = schema_to_gbnf(SCHEMAS[name])
    assert accepts(vocab, gbnf, json.dumps(INSTANCES[name], ensure_ascii=False)), gbnf
    if name in REFUSED:
        assert not accepts(vocab, gbnf, json.dumps(REFUSED[name], ensure_ascii=False)), gbnf


def test_a_top_level_empty_schema_is_still_an_object(vocab):
    gbnf = schema_to_gbnf({})
    assert accepts(vocab, gbnf, '{"a": 1}') and not accepts(vocab, gbnf, "1")


def test_schemas_the_converter_cannot_express_are_one_clear_error():
    for schema, message in (
        ({"type": "wat"}, "the converter cannot express this schema: AssertionError"),
        ({"properties": {"a": 3}}, "the converter cannot express this schema: #/properties/a is 3, not a schema"),
        ({"$ref": "https://example.com/schema.json"}, "the converter cannot express this schema"),
        ({"type": "string", "enum": "abc"}, "enum must be a list"),
    ):
        with pytest.raises(UsageError) as e:
            schema_to_gbnf(schema)
        assert message in e.value.message and "\n" not in e.value.message, e.value.message


def test_a_schema_no_value_satisfies_still_says_so():
    for schema in ({"enum": []}, {"type": "integer", "enum": ["a"]}, {"type": "object", "properties": {"a": False}}):
        with pytest.raises(UsageError, match="no value satisfies it"):
            check(schema_to_gbnf(schema), schema=True)
