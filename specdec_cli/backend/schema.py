"""JSON Schema as GBNF. llama-cpp-python's converter (json_schema_to_gbnf) writes the structure: objects, arrays,
references, unions, formats. Before it runs, the schema is rewritten: what it would turn into a grammar llama.cpp
refuses, or one that means something else, is written here and stands in the schema as a mark (a `const` of a
string no schema holds) that its output carries through, to be filled in with our GBNF after it.

What is ours: patterns (pattern.py), enum and const values and property names with characters JSON escapes,
length-bounded strings, nullable types (`["string", "null"]`, `nullable`), schemas that allow any value (`{}`,
`true`, one with only a description), a one-element `allOf` (pydantic's way to describe a reference)."""

from __future__ import annotations

import json
import re
from typing import Any

from llama_cpp.llama_grammar import json_schema_to_gbnf

from ..errors import UsageError
from . import pattern

ANY_TYPES = ("object", "array", "string", "number", "boolean", "null")
TYPE_OF = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
DEFS = ("$defs", "definitions")  # where references point: kept on the object that holds them
# Keywords the converter acts on; a schema with none of them (and no type) allows any value.
STRUCTURE = {"$ref", "anyOf", "oneOf", "allOf", "const", "enum", "properties", "additionalProperties", "items",
             "prefixItems", "pattern", "format", "minLength", "maxLength"}  # fmt: skip
CONVERTER_FORMATS = re.compile(r"uuid[1-5]?|date|time|date-time")  # strings it writes a rule for
# max - min items or characters the converter can write: it nests a group per optional one, and llama.cpp
# refuses a grammar nested much deeper
NESTED_BOUND = 1000
# objects and arrays inside each other, a local $ref counting as one more: the converter and _prepare recurse a
# few frames a level, and Python's recursion limit stopped them at about 500 (anyOf in anyOf) or 490 $refs
MAX_DEPTH = 100
CANNOT = "the converter cannot express this schema"


def schema_to_gbnf(schema: dict) -> str:
    """GBNF for `schema` (tool parameters, a response_format, --json-schema); UsageError saying what it cannot
    express. Whether the grammar parses is grammar.check's to say (no value satisfies an empty enum)."""
    _check_depth(schema)
    marks = _Marks(schema)
    try:
        return marks.fill(json_schema_to_gbnf(json.dumps(_prepare(schema, "", marks, root=True))))
    except UsageError:
        raise
    except RecursionError:  # a chain of $refs deeper than _check_depth follows, or one it cannot resolve
        raise UsageError(f"{CANNOT}: it is nested too deeply (through its $refs)", hint=DEEP_HINT) from None
    except Exception as e:  # the converter's own errors: an unsupported feature, a bad reference
        raise UsageError(f"{CANNOT}: {type(e).__name__}: {e}") from None


DEEP_HINT = "a schema this deep is no one's tool: flatten it, or name its parts in $defs that refer to each other"


def _check_depth(schema: dict) -> None:
    """UsageError where objects, arrays and local $refs nest deeper than MAX_DEPTH, before anything recurses
    through them. A $ref is followed the first time only: the converter writes one rule for each."""
    todo, seen = [(schema, 1)], set()
    while todo:
        node, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise UsageError(f"{CANNOT}: it nests more than {MAX_DEPTH} deep (objects, arrays, $refs)", hint=DEEP_HINT)
        children = list(node.values()) if isinstance(node, dict) else node if isinstance(node, list) else []
        ref = node.get("$ref") if isinstance(node, dict) else None
        if isinstance(ref, str) and ref.startswith("#") and ref not in seen:
            seen.add(ref)
            children.append(_pointed(schema, ref[1:]))
        todo += [(child, depth + 1) for child in children if isinstance(child, (dict, list))]


def _pointed(schema: dict, pointer: str):
    """What a local JSON pointer (`/$defs/a`) names in `schema`; None where it names nothing."""
    node = schema
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdecimal() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


class _Marks:
    """Stand-ins for our GBNF: the converter writes a const string s as the literal "\\"s\\"", which is found
    and replaced after it; and the rules that GBNF names, added to the grammar. Their stem is one the schema
    does not contain, nor any rule name the converter makes of it."""

    def __init__(self, schema: dict):
        text, self.stem = json.dumps(schema), "specdec-mark"
        while self.stem in text or self.stem in re.sub(r"[^a-zA-Z0-9-]+", "-", text):
            self.stem += "-x"
        self.gbnf: dict[str, str] = {}
        self.rules: dict[str, str] = {}  # body: name

    def add(self, gbnf: str) -> str:
        name = f"{self.stem}-{len(self.gbnf)}"
        self.gbnf[name] = gbnf if " " not in gbnf else f"( {gbnf} )"
        return name

    def rule(self, body: str) -> str:
        return self.rules.setdefault(body, f"{self.stem}-rule-{len(self.rules)}")

    def const(self, gbnf: str, holder: dict) -> dict:
        """A schema the converter writes as the mark for `gbnf`, keeping the definitions `holder` carries."""
        return {"const": self.add(gbnf), **_defs(holder)}

    def fill(self, gbnf: str) -> str:
        found = re.compile(re.escape('"\\"') + "(" + re.escape(self.stem) + r"-\d+)" + re.escape('\\""'))
        rules = "".join(f"\n{name} ::= {body}" for body, name in self.rules.items())
        return found.sub(lambda m: self.gbnf[m[1]], gbnf) + rules


def _prepare(s: Any, at: str, marks: _Marks, root: bool = False) -> dict:
    """`s` (at JSON pointer `at`) as the converter reads right. Order follows the converter's own precedence:
    $ref, anyOf/oneOf, a type list, const, enum, then by kind."""
    if s is True or isinstance(s, dict) and not s.keys() & STRUCTURE and "type" not in s:
        # {} at the top keeps the converter's reading, an object: tool arguments and response_format rely on it
        return {"type": "object", **_defs(s)} if root else {"anyOf": [{"type": t} for t in ANY_TYPES], **_defs(s)}
    if s is False:
        return {"enum": []}  # no value: the converter's empty rule, which check() refuses as such
    if not isinstance(s, dict):
        raise UsageError(f"{CANNOT}: #{at} is {json.dumps(s)[:40]}, not a schema")
    s = dict(s)
    if s.pop("nullable", None) is True:  # OpenAPI's spelling of ["...", "null"]
        return _prepare({"anyOf": [_without_defs(s), {"type": "null"}], **_defs(s)}, at, marks)
    if "$ref" in s:  # the converter resolves no reference beside a $ref: definitions there go one level out
        return {"anyOf": [{"$ref": s["$ref"]}], **_children(_defs(s), at, marks)} if _defs(s) else s
    if "anyOf" in s or "oneOf" in s:
        return _children(s, at, marks)
    if "const" in s or "enum" in s:
        return _values(s, marks)
    if isinstance(s.get("type"), list):
        if len(s["type"]) == 1:
            return _prepare({**s, "type": s["type"][0]}, at, marks)
        branches = [{**_without_defs(s), "type": t} for t in s["type"]]
        return _prepare({"anyOf": branches, **_defs(s)}, at, marks)
    if len(s.get("allOf", ())) == 1 and "properties" not in s:  # {"allOf": [{"$ref": ...}], "description": ...}
        (only,) = s.pop("allOf")
        return _prepare({**s, **only} if isinstance(only, dict) else only, at, marks)
    if _is_string(s) and "pattern" in s:
        return marks.const(_pattern(s["pattern"], at, marks) + " space", s)
    if s.get("type") == "string" and _past_nesting(s, "Length") and not _converter_format(s):
        length = pattern.json_chars(int(s.get("minLength", 0)), s["maxLength"], marks.rule)
        return marks.const(r'"\"" ' + length + r' "\"" space', s)
    if _past_nesting(s, "Items"):
        del s["maxItems"]  # past what it can nest: unbounded, no model writes a thousand items to a tool call
    return _children(s, at, marks)


def _children(s: dict, at: str, marks: _Marks) -> dict:
    """`s` with its subschemas prepared, and property names with characters JSON escapes marked."""
    s = dict(s)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems") + (("items",) if isinstance(s.get("items"), list) else ()):
        if isinstance(s.get(key), list):
            s[key] = [_prepare(x, f"{at}/{key}/{i}", marks) for i, x in enumerate(s[key])]
    for key in ("items", "additionalProperties"):
        # false: no more items or properties; additionalProperties true beside no properties: the converter's
        # object, any object, already (beside properties it would allow only objects as the values)
        value = s.get(key, False)
        kept = value is False or value is True and key == "additionalProperties" and "properties" not in s
        if not isinstance(value, list) and not kept:
            s[key] = _prepare(value, f"{at}/{key}", marks)
    for key in DEFS:
        if isinstance(s.get(key), dict):
            s[key] = {k: _prepare(v, f"{at}/{key}/{_pointer(k)}", marks) for k, v in s[key].items()}
    if isinstance(s.get("properties"), dict):
        names = {
            k: marks.add(pattern.literal(json.dumps(k, ensure_ascii=False))) if _escaped(k) else k
            for k in s["properties"]
        }
        s["properties"] = {
            names[k]: _prepare(v, f"{at}/properties/{_pointer(k)}", marks) for k, v in s["properties"].items()
        }
        if isinstance(s.get("required"), list):
            s["required"] = [names.get(k, k) if isinstance(k, str) else k for k in s["required"]]
    return s


def _values(s: dict, marks: _Marks) -> dict:
    """const and enum as literals of their JSON text (the converter leaves \\ and control escapes unescaped),
    only the values of the schema's type(s) where it names one."""
    values = [s["const"]] if "const" in s else s["enum"]
    if not isinstance(values, list):
        raise UsageError(f"{CANNOT}: enum must be a list (got {json.dumps(values)[:40]})")
    types = s.get("type", list(ANY_TYPES))
    types = types if isinstance(types, list) else [types]
    values = [v for v in values if any(_is_type(v, t) for t in types)]
    texts = [json.dumps(v) for v in values]
    if not any("\\" in text for text in texts):  # the converter writes these right (an empty enum: its empty rule)
        return {"enum": values, **_defs(s)}
    return marks.const(" | ".join(pattern.literal(json.dumps(v, ensure_ascii=False)) for v in values), s)


def _pattern(regex: Any, at: str, marks: _Marks) -> str:
    if not isinstance(regex, str):
        raise UsageError(f"{CANNOT}: the pattern at #{at} is not a string")
    try:
        return pattern.to_gbnf(regex, marks.rule)
    except pattern.Unsupported as e:
        raise UsageError(
            f"{CANNOT}: the pattern {json.dumps(regex)} at #{at} holds {e}",
            hint="a grammar holds a regular language: rewrite the pattern without it, or leave the pattern out",
        ) from None


def _is_type(value: Any, name: Any) -> bool:
    if name in ("integer", "number"):
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return is_number and (name == "number" or float(value).is_integer())
    return isinstance(value, TYPE_OF.get(name, ())) if name != "boolean" else isinstance(value, bool)


def _is_string(s: dict) -> bool:
    """The converter reads `s` as a string (its checks for objects and arrays come first when there is no type)."""
    if s.get("type") == "string":
        return True
    structured = (
        s.keys() & {"properties", "allOf", "items", "prefixItems"} or s.get("additionalProperties", True) is not True
    )
    return "type" not in s and not structured


def _converter_format(s: dict) -> bool:
    return isinstance(s.get("format"), str) and bool(CONVERTER_FORMATS.fullmatch(s["format"]))


def _past_nesting(s: dict, what: str) -> bool:
    """maxLength - minLength (what="Length") or maxItems - minItems is more than the converter can write."""
    most = s.get(f"max{what}")
    return isinstance(most, int) and most - int(s.get(f"min{what}", 0)) > NESTED_BOUND


def _escaped(name: str) -> bool:
    """A property name whose JSON text holds an escape, which the converter would write unescaped."""
    return any(c in '"\\' or ord(c) < 0x20 for c in name)


def _defs(s: Any) -> dict:
    return {k: s[k] for k in DEFS if isinstance(s, dict) and k in s}


def _without_defs(s: dict) -> dict:
    return {k: v for k, v in s.items() if k not in DEFS}


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
