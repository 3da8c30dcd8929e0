"""Bounds on a GBNF grammar before llama.cpp reads it: a request's grammar is the client's, and llama.cpp's
parser and its left-recursion check recurse without a bound (measured on an 8 MiB stack; README "Security")."""

from __future__ import annotations

import re

from ..errors import UsageError

MAX_NESTING = 1_000  # ( groups inside each other: the parser recurses once a level (SIGSEGV at 20,000)
# rules each beginning with the next: the check recurses once a link (SIGSEGV at 70,000); a group nested in
# another with a ? or * after it makes two links
MAX_CHAIN = 5_000
# ways one rule can begin (its alternatives, through the rules they begin with): the check walks each way again
# (2^28 ways: 3.4 s) and each step of generation keeps a stack for each (100,000 alternatives: 18 s)
MAX_STARTS = 10_000
MAX_ELEMENTS = 1_000_000  # what the rules hold once repetitions are copied out (llama.cpp: 8 bytes, held 3 times)
REPEATS = 2_000  # llama.cpp's MAX_REPETITION_THRESHOLD: past it a repetition's most is unbounded


def bounded(gbnf: str) -> None:
    """UsageError where llama.cpp could not survive this grammar (or would take minutes over it); llama.cpp
    says what else is wrong with it. Its rules are read as llama.cpp's parser builds them (parse_sequence in
    llama-grammar.cpp), up to where that parser would stop with an error, then the ways each rule begins."""
    shape = _Rules(gbnf.split("\0", 1)[0])  # llama.cpp reads a C string: up to the first NUL
    if shape.read():
        _starts(shape.rules, {n: name for name, n in shape.names.items()})


def _too_much(what: str, limit: int) -> UsageError:
    return UsageError(
        f"the grammar {what}; the limit is {limit:,}",
        hint="llama.cpp's grammar reader recurses without a bound: write the grammar flatter",
    )


_NAME = re.compile(r"[a-zA-Z0-9-]+")
_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)  # a ( inside a literal or a class is a character
_CLASS = re.compile(r"\[(?:[^\]\\]|\\.)*\]", re.S)
_TOKEN = re.compile(r"!?<(?:\[\d+\]|[^>]*)>")
_DIGITS = re.compile(r"\d+")


class _Rules:
    """A grammar as llama.cpp's parser builds it, kept to what the bounds need: rule number -> alternatives,
    each a list of items (the rule an item refers to, or None for text; its size in llama.cpp's elements).
    Groups and repetitions become numbered rules as there. The nesting is followed on a list, not recursion."""

    def __init__(self, text: str):
        self.text, self.names, self.n = text, {}, 0  # n: llama.cpp's symbol count (names and made rules)
        self.rules: dict[int, list[list[tuple[int | None, int]]]] = {}
        self.elements = 0

    def read(self) -> bool:
        """Whether llama.cpp's parser reads it all (False: it stops with an error, having gone no deeper)."""
        text, pos = self.text, self._space(0, True)
        while pos < len(text):
            name = _NAME.match(text, pos)
            if not name:
                return False
            pos = self._space(name.end(), False)
            if not text.startswith("::=", pos):
                return False
            pos = self._alternates(self._symbol(name[0]), self._space(pos + 3, True))
            if pos is None or pos < len(text) and text[pos] not in "\r\n":
                return False
            pos = self._space(pos, True)
        return True

    def _alternates(self, rule: int, pos: int) -> int | None:
        """Where a rule's body ends: its groups are frames of [rule, alternatives, items, last symbol's
        start, rules its last symbol stands for, symbols before it, nested]."""
        text, frames = self.text, [[rule, [], [], 0, 1, 0, False]]
        while True:
            f = frames[-1]
            c, nested = text[pos : pos + 1], f[6]
            token = _LITERAL if c == '"' else _CLASS if c == "[" else _TOKEN if c in "<!" and c else None
            if token is not None or c == "." or c and _NAME.match(c):
                m = token.match(text, pos) if token else _NAME.match(text, pos) if c != "." else None
                if token and not m:
                    return None
                end = m.end() if m else pos + 1
                size = len(m[0][1:-1].removeprefix("^" if c == "[" else "")) if c in '"[' else 1  # "": none
                f[3], f[4] = len(f[2]), 1
                if size:
                    self._add(f[2], [(self._symbol(m[0]) if token is None and m else None, size)])
                pos = self._space(end, nested)
            elif c == "(":
                before = self.n
                frames.append([self._made(), [], [], 0, 1, before, True])
                if len(frames) - 1 > MAX_NESTING:  # the first frame is the rule's own
                    raise _too_much(f"nests groups ( ) more than {MAX_NESTING:,} deep", MAX_NESTING)
                pos = self._space(pos + 1, True)
            elif c and c in "*+?":
                if not self._repeat(f, *{"*": (0, None), "+": (1, None), "?": (0, 1)}[c]):
                    return None
                pos = self._space(pos + 1, nested)
            elif c == "{":
                bounds = self._braces(pos + 1, nested)
                if bounds is None or not self._repeat(f, *self._range(*bounds[:2])):
                    return None
                pos = bounds[2]
            elif c == "|":
                f[1].append(f[2])
                f[2], f[3], f[4] = [], 0, 1
                pos = self._space(pos + 1, True)
            else:
                f[1].append(f[2])
                self.rules[f[0]] = f[1]
                frames.pop()
                if not frames:
                    return pos
                if c != ")":
                    return None
                up = frames[-1]
                up[3], up[4] = len(up[2]), max(1, self.n - f[5])
                self._add(up[2], [(f[0], 1)])
                pos = self._space(pos + 1, up[6])

    def _braces(self, pos: int, nested: bool) -> tuple[int, int | None, int] | None:
        """{m}, {m,} or {m,n} from after its brace: (m, n, where it ends); None where llama.cpp refuses it."""
        text = self.text
        least = _DIGITS.match(text, self._space(pos, nested))
        if not least:
            return None
        pos = self._space(least.end(), nested)
        most: re.Match | None = least
        if text.startswith(",", pos):
            most = _DIGITS.match(text, self._space(pos + 1, nested))
            pos = self._space(most.end(), nested) if most else self._space(pos + 1, nested)
        if not text.startswith("}", pos) or len(least[0]) > 19 or most and len(most[0]) > 19:
            return None  # no brace, or a number past uint64 (std::stoull throws)
        return int(least[0]), int(most[0]) if most else None, self._space(pos + 1, nested)

    def _range(self, least: int, most: int | None) -> tuple[int, int | None]:
        if least > REPEATS:
            return least, least  # llama.cpp refuses it: _repeat says so
        if most is not None and most < least:  # llama.cpp would make 2^64 rules, until memory runs out
            raise UsageError(f"the grammar repeats something {{{least},{most}}} times: at most fewer than at least")
        return least, most if most is None or most <= REPEATS else None

    def _repeat(self, f: list, least: int, most: int | None) -> bool:
        """S{least,most} as llama.cpp rewrites it: S least times, then a chain of rules, each S or nothing."""
        items = f[2]
        if f[3] == len(items) or least > REPEATS:
            return False
        s = items[f[3] :]
        total = most if most else least or 1
        if f[4] * total > REPEATS:
            return False
        del items[f[3] :]
        self._add(items, s * least)
        last = None
        for i in range(1 if most is None else most - least):
            made = self._made()
            body = s + ([(made if most is None else last, 1)] if i > 0 or most is None else [])
            self.rules[made] = [body, []]
            self._add([], body)
            last = made
        if last is not None:
            self._add(items, [(last, 1)])
        f[4] *= total
        return True

    def _add(self, items: list, more: list) -> None:
        items += more
        self.elements += sum(size for _, size in more) + 1
        if self.elements > MAX_ELEMENTS:
            raise _too_much(f"holds over {MAX_ELEMENTS:,} elements once its repetitions are written out", MAX_ELEMENTS)

    def _symbol(self, name: str) -> int:
        if name not in self.names:
            self.names[name] = self._made()
        return self.names[name]

    def _made(self) -> int:
        self.n += 1
        return self.n - 1

    def _space(self, pos: int, newline: bool) -> int:
        text = self.text
        while pos < len(text) and (text[pos] in " \t#" or newline and text[pos] in "\r\n"):
            pos = pos + 1 if text[pos] != "#" else _line_end(text, pos)
        return pos


def _line_end(text: str, pos: int) -> int:
    ends = [i for i in (text.find("\r", pos), text.find("\n", pos)) if i >= 0]
    return min(ends) if ends else len(text)


def _starts(rules: dict[int, list[list[tuple[int | None, int]]]], names: dict[int, str]) -> None:
    """The rules each alternative begins with (and the next, past one that may be empty): llama.cpp's
    left-recursion check follows them recursively, once for every way (it keeps no record of rules done), and
    generation expands them to stacks. Bounded: the longest such chain, and the ways from any one rule."""
    empty = {r for r, alts in rules.items() if any(not alt for alt in alts)}  # llama.cpp's "may be empty"
    firsts: dict[int, list[int]] = {}
    for r, alts in rules.items():
        firsts[r] = []
        for alt in alts:
            for ref, _ in alt:
                if ref is None:
                    break
                firsts[r].append(ref)
                if ref not in empty:
                    break
    depth: dict[int, int] = {}
    ways: dict[int, int] = {}
    for top in rules:
        path = [(top, iter(firsts.get(top, ())))]
        on_path = {top}
        while path:  # depth first, on a list: a chain may be long
            r, it = path[-1]
            child = next((c for c in it if c not in depth), None)
            if child is not None and child in on_path:
                name = names.get(child) or names.get(top) or "of a group"
                raise UsageError(
                    f"the grammar's rule {name} (or a group in it) begins with itself: llama.cpp "
                    "cannot read left recursion"
                )
            if child is not None:
                path.append((child, iter(firsts.get(child, ()))))
                on_path.add(child)
                if len(path) > MAX_CHAIN:
                    raise _too_much(f"chains more than {MAX_CHAIN:,} rules, each beginning with the next", MAX_CHAIN)
                continue
            path.pop()
            on_path.discard(r)
            kids = firsts.get(r, ())
            depth[r] = 1 + max((depth[c] for c in kids), default=0)
            ways[r] = min(len(rules.get(r, ())) + sum(ways[c] for c in kids), MAX_STARTS + 1)
            if depth[r] > MAX_CHAIN:
                raise _too_much(f"chains more than {MAX_CHAIN:,} rules, each beginning with the next", MAX_CHAIN)
            if ways[r] > MAX_STARTS:
                raise _too_much(
                    f"can begin a rule in over {MAX_STARTS:,} ways (through the rules it begins with)", MAX_STARTS
                )
