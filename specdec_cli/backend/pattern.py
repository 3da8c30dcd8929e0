"""A JSON Schema `pattern` (an ECMA-262 regular expression) as GBNF over the JSON text of a string.

llama-cpp-python's converter copies a pattern's pieces into the grammar nearly verbatim, and llama.cpp's
grammar parser refuses most of what real patterns hold (`[^\\.]`, `\\d`, `(?:`, a pattern without both
anchors), while `.` or `[^/]` let through a raw `"`, which ends the JSON string early. Here the pattern is
parsed into a small tree of character sets, and each set is written as the JSON text that spells its
characters: the string's value matches the pattern exactly when the grammar accepts its JSON text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

MAX_CP = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]  # a character set: sorted, disjoint, inclusive code point ranges


def _norm(ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _not(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in ranges:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    return tuple(out + ([(at, MAX_CP)] if at <= MAX_CP else []))


def _and(a: Ranges, b: Ranges) -> Ranges:
    return _not(_norm(_not(a) + _not(b)))


def _one(c: int) -> tuple:
    return ("set", ((c, c),))


# ECMA-262's classes: \d and \w are ASCII; \s is WhiteSpace and LineTerminator; `.` is all but line terminators.
DIGIT = ((0x30, 0x39),)
WORD = _norm([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
SPACE = _norm([(9, 13), (32, 32), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
               (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)])  # fmt: skip
DOT = _not(_norm([(10, 10), (13, 13), (0x2028, 0x2029)]))
SHORTHANDS = {"d": DIGIT, "D": _not(DIGIT), "w": WORD, "W": _not(WORD), "s": SPACE, "S": _not(SPACE)}
CONTROL_ESCAPES = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13}
QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")

# What JSON text must escape inside a string (controls, '"', '\'), and what UTF-8 text cannot hold (surrogates).
JSON_SPECIAL = _norm([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
SURROGATES = ((0xD800, 0xDFFF),)
SHORT_ESCAPES = {0x22: '"', 0x5C: "\\", 8: "b", 9: "t", 10: "n", 12: "f", 13: "r"}  # \" \\ \b \t \n \f \r
# One character of a JSON string in any spelling: the padding of a pattern without anchors, a length-bounded string.
JSON_CHAR = r'([^\x22\x5C\x00-\x1F] | "\\" ([\x22\x5C/bfnrt] | "u" [0-9a-fA-F]{4}))'
NOTHING = r"[^\x00-\U0010FFFF]"  # an empty set, such as [] (it matches no character)
CLASS_SAFE = set(" !#$%&'()*+,./:;<=>?@_`{|}~")  # written as themselves inside a GBNF [...]
# llama.cpp refuses x{m,n} where m, or n times the rules x makes, is past 2,000 (and reads an n past 2,000 as
# no bound at all): counts are written in chunks of REPEAT_CHUNK, of rules named once
REPEAT_CHUNK = 1000
MAX_COUNT = 1_000_000  # a longer string is past any context: a bound beyond it is as good as none
ATOM = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[a-zA-Z0-9-]+')  # a literal, a class, a rule name
Rule = Callable[[str], str]  # names a GBNF body: a rule of the grammar, defined once


class Unsupported(ValueError):
    """A pattern (or a piece of one) that has no grammar form; the message names the piece."""


def to_gbnf(pattern: str, rule: Rule) -> str:
    """The GBNF for the JSON text (quotes included) of strings `pattern` matches somewhere, as JSON Schema
    reads it: unanchored unless it starts with ^ or ends with $. `rule` names a GBNF body (see Rule)."""
    tree = _Parser(pattern).parse()
    alternatives = []
    for head, body, tail in _anchored(tree):
        anything = [] if head and tail else [rule(JSON_CHAR) + "*"]  # what an unanchored end may add
        parts = ([] if head else anything) + [_gbnf(body, rule)] + ([] if tail else anything)
        alternatives.append(" ".join(p for p in parts if p != '""') or '""')
    return r'"\"" ' + _group(" | ".join(alternatives)) + r' "\""'


def json_chars(lo: int, hi: int | None, rule: Rule) -> str:
    """Between lo and hi characters of a JSON string (hi None: no upper bound), as GBNF."""
    return repeat(JSON_CHAR, lo, hi, rule)


def literal(text: str) -> str:
    """A GBNF string literal for JSON text `text` (already JSON: its own escapes stay as written)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def repeat(x: str, lo: int, hi: int | None, rule: Rule) -> str:
    """x{lo,hi} within llama.cpp's limits (see REPEAT_CHUNK): exact to MAX_COUNT. x is repeated by name when it
    is more than a literal or a class, so that each repetition multiplies one rule."""
    if lo > MAX_COUNT:
        raise Unsupported(f"a count of {lo:,} (at most {MAX_COUNT:,})")
    hi = None if hi is not None and hi > MAX_COUNT else hi
    x = x if ATOM.fullmatch(x) else rule(x)
    if (hi is None or hi <= REPEAT_CHUNK) and lo <= REPEAT_CHUNK:
        return _count(x, lo, hi)
    if lo:  # the fixed count first, in whole chunks and what is left
        q, r = divmod(lo, REPEAT_CHUNK)
        whole = _count(rule(_count(x, REPEAT_CHUNK, REPEAT_CHUNK)), q, q) if q else '""'
        parts = [whole, _count(x, r, r), repeat(x, 0, None if hi is None else hi - lo, rule)]
        return " ".join(p for p in parts if p != '""') or '""'
    # 0 to hi, hi = q chunks and r: fewer than q whole chunks and less than one more, or q chunks and at most r
    q, r = divmod(hi, REPEAT_CHUNK)
    chunk = rule(_count(x, REPEAT_CHUNK, REPEAT_CHUNK))
    fewer = " ".join(p for p in (_count(chunk, 0, q - 1), _count(x, 0, REPEAT_CHUNK - 1)) if p != '""')
    whole = " ".join(p for p in (_count(chunk, q, q), _count(x, 0, r)) if p != '""')
    return f"({fewer} | {whole})"


def _count(x: str, lo: int, hi: int | None) -> str:
    """x{lo,hi} in GBNF's shortest spelling."""
    short = {(0, 0): '""', (0, 1): f"{x}?", (1, 1): x, (0, None): f"{x}*", (1, None): f"{x}+"}
    if (lo, hi) in short:
        return short[lo, hi]
    return f"{x}{{{lo},}}" if hi is None else f"{x}{{{lo}}}" if lo == hi else f"{x}{{{lo},{hi}}}"


class _Parser:
    """ECMA-262 syntax, as JSON Schema specifies, to a tree: ("set", ranges), ("seq", [...]), ("alt", [...]),
    ("rep", item, lo, hi), ("^",), ("$",). What has no grammar form raises Unsupported."""

    def __init__(self, text: str):
        self.text, self.i = text, 0

    def peek(self, n: int = 1) -> str:
        return self.text[self.i : self.i + n]

    def take(self) -> str:
        if self.i >= len(self.text):
            raise Unsupported("an unfinished escape, class or group at its end")
        self.i += 1
        return self.text[self.i - 1]

    def parse(self) -> tuple:
        tree = self.alternation()
        if self.i < len(self.text):
            raise Unsupported("an unbalanced )")
        return tree

    def alternation(self) -> tuple:
        items = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            items.append(self.sequence())
        return items[0] if len(items) == 1 else ("alt", items)

    def sequence(self) -> tuple:
        items = []
        while self.i < len(self.text) and self.peek() not in "|)":
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else ("seq", items)

    def quantified(self, atom: tuple) -> tuple:
        c, m = self.peek(), QUANTIFIER.match(self.text, self.i)
        if c and c in "*+?":
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            self.i += 1
        elif m:
            lo, hi = int(m[1]), int(m[1]) if m[2] is None else int(m[3]) if m[3] else None
            self.i = m.end()
        else:
            return atom
        if atom[0] in "^$":
            raise Unsupported("a repeated anchor")
        if hi is not None and hi < lo:
            raise Unsupported(f"a count out of order {{{lo},{hi}}}")
        if self.peek() == "?":  # lazy: the same strings match, only the choice of match differs
            self.i += 1
        if self.peek() and (self.peek() in "*+?" or QUANTIFIER.match(self.text, self.i)):
            raise Unsupported("a quantifier with nothing to repeat")
        return ("rep", atom, lo, hi)

    def atom(self) -> tuple:
        c = self.take()
        if c == "(":
            return self.group()
        if c == "[":
            return ("set", self.char_class())
        if c == ".":
            return ("set", DOT)
        if c in "^$":
            return (c,)
        if c == "\\":
            return self.escape(in_class=False)
        if c in "*+?" or (c == "{" and QUANTIFIER.match(self.text, self.i - 1)):
            raise Unsupported("a quantifier with nothing to repeat")
        return _one(ord(c))

    def group(self) -> tuple:
        if self.peek() == "?":
            named = re.compile(r"\?P?<[A-Za-z_$][\w$]*>").match(self.text, self.i)
            if self.peek(2) != "?:" and not named:
                raise Unsupported("lookaround or inline flags ((?=, (?!, (?<=, (?<!, (?i))")
            self.i = named.end() if named else self.i + 2
        tree = self.alternation()
        if self.peek() != ")":
            raise Unsupported("an unbalanced (")
        self.i += 1
        return tree

    def escape(self, in_class: bool) -> tuple:
        c = self.take()
        if c in SHORTHANDS:
            return ("set", SHORTHANDS[c])
        if c in CONTROL_ESCAPES:
            return _one(CONTROL_ESCAPES[c])
        if c == "b" and in_class:
            return _one(8)
        if c in "bB":
            raise Unsupported("a word boundary (\\b, \\B)")
        if c in "0123456789" and (c != "0" or self.peek() in tuple("0123456789")):
            raise Unsupported("a backreference or octal escape (\\1)")
        if c in "pPk":
            raise Unsupported(f"\\{c} (Unicode properties, named backreferences)")
        if c == "0":
            return _one(0)
        if c == "c" and self.peek().isascii() and self.peek().isalpha():
            return _one(ord(self.take()) % 32)
        if c in "xu":
            return _one(self.hex_code(c))
        return _one(ord(c))  # an identity escape: \. \( \/ \- \$ ...

    def hex_code(self, c: str) -> int:
        braced = c == "u" and self.peek() == "{"  # \u{H...} (up to six digits); else \xHH or \uHHHH
        digits = r"\{([0-9a-fA-F]{1,6})\}" if braced else "[0-9a-fA-F]{%d}" % (2 if c == "x" else 4)
        m = re.compile(digits).match(self.text, self.i)
        if not m or int(m[1] if m.groups() else m[0], 16) > MAX_CP:
            raise Unsupported(f"a malformed \\{c} escape")
        self.i = m.end()
        return int(m[1] if m.groups() else m[0], 16)

    def char_class(self) -> Ranges:
        negate = self.peek() == "^"
        self.i += negate
        ranges: list[tuple[int, int]] = []
        while (c := self.take()) != "]":
            first = self.escape(in_class=True)[1] if c == "\\" else ((ord(c), ord(c)),)
            if self.peek() != "-" or self.peek(2) in ("-]", "-"):
                ranges += first
                continue
            self.i += 1
            c = self.take()
            last = self.escape(in_class=True)[1] if c == "\\" else ((ord(c), ord(c)),)
            single = len(first) == len(last) == 1 and first[0][0] == first[0][1] and last[0][0] == last[0][1]
            if single and last[0][0] < first[0][0]:
                raise Unsupported("a class range out of order")
            # [\d-z]: without the u flag ECMA-262 reads the hyphen between a class and a character literally
            ranges += [(first[0][0], last[0][0])] if single else [*first, *last, (0x2D, 0x2D)]
        return _not(_norm(ranges)) if negate else _norm(ranges)


def _anchored(tree: tuple) -> list[tuple[bool, tuple, bool]]:
    """(starts with ^, the rest, ends with $) per top-level alternative; an anchor anywhere else raises."""
    if tree[0] == "alt":
        return [a for item in tree[1] for a in _anchored(item)]
    items = list(tree[1]) if tree[0] == "seq" else [tree]
    if len(items) == 1 and items[0][0] == "alt":  # (^a$|^b$): one group around the whole pattern
        return _anchored(items[0])
    head = bool(items) and items[0] == ("^",)
    items = items[head:]
    tail = bool(items) and items[-1] == ("$",)
    items = items[: len(items) - tail]
    return [(head, ("seq", items), tail)]


def _gbnf(tree: tuple, rule: Rule) -> str:
    kind = tree[0]
    if kind == "set":
        return _set(tree[1])
    if kind == "alt":
        return "(" + " | ".join(_gbnf(item, rule) for item in tree[1]) + ")"
    if kind == "rep":
        return repeat(_gbnf(tree[1], rule), tree[2], tree[3], rule)
    if kind == "seq":
        return _sequence(tree[1], rule)
    raise Unsupported("an anchor (^, $) inside the pattern")


def _sequence(items: list[tuple], rule: Rule) -> str:
    """Runs of single characters become one literal: "2024-" rather than "2" "0" "2" "4" "-"."""
    parts, run = [], ""
    for item in items:
        if item[0] == "set" and len(item[1]) == 1 and item[1][0][0] == item[1][0][1] and not _and(item[1], SURROGATES):
            run += chr(item[1][0][0])
            continue
        parts += [literal(json.dumps(run, ensure_ascii=False)[1:-1])] if run else []
        parts.append(_gbnf(item, rule))
        run = ""
    parts += [literal(json.dumps(run, ensure_ascii=False)[1:-1])] if run else []
    return " ".join(parts) or '""'


def _set(ranges: Ranges) -> str:
    """The characters of a set as JSON text: the ones JSON writes as themselves in one GBNF class, and the ones
    it escapes (", \\, controls) by their escapes as json.dumps writes them (\\n, \\u001f, in either case)."""
    ranges = _and(ranges, _not(SURROGATES))
    raw = _and(ranges, _not(JSON_SPECIAL))
    special = [c for lo, hi in _and(ranges, JSON_SPECIAL) for c in range(lo, hi + 1)]
    parts = [_class(raw)] if raw else []
    if short := [ord(SHORT_ESCAPES[c]) for c in special if c in SHORT_ESCAPES]:
        parts.append(r'"\\" ' + _class(_norm((c, c) for c in short)))
    for high in (0, 1):  # \u0000-\u000f, \u0010-\u001f: the last hex digit as a class
        digits = {f"{c & 15:x}" for c in special if c not in SHORT_ESCAPES and c >> 4 == high}
        if digits:
            parts.append(
                rf'"\\u00{high}" ' + _class(_norm((ord(d), ord(d)) for d in digits | {*"".join(digits).upper()}))
            )
    if not parts:
        return NOTHING
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


def _class(ranges: Ranges) -> str:
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return literal(chr(ranges[0][0]))  # not JSON-special: its JSON text is itself
    # [^/] is shorter written as what it leaves out; but only ASCII may be left out: llama.cpp refuses the first
    # byte of a character split over byte tokens (é€ as <0xE2>...) if any character it may begin is left out
    negated = _and(_not(ranges), _not(SURROGATES))
    items, caret = (negated, "^") if len(negated) < len(ranges) and negated[-1][1] < 0x80 else (ranges, "")
    body = "".join(_class_char(lo) + ("" if lo == hi else "-" + _class_char(hi)) for lo, hi in items)
    return f"[{caret}{body}]"


def _class_char(c: int) -> str:
    if c < 128 and (chr(c).isalnum() or chr(c) in CLASS_SAFE):
        return chr(c)
    return f"\\x{c:02X}" if c < 0x100 else f"\\u{c:04X}" if c < 0x10000 else f"\\U{c:08X}"


def _group(gbnf: str) -> str:
    """`gbnf` as one item: a literal, a class or a rule name as it is, anything else in parentheses."""
    return gbnf if ATOM.fullmatch(gbnf) else f"({gbnf})"
