"""The names an instruction mentions: where an edit's answer will leave its source.

"Rename `total` to `subtotal`", "add a `timeout` parameter to fetch_page", "set "retries" to 5": the
identifiers and literals named are where the answer differs from the code it copies. Lookup marks
them as likely edit points (drafting/lookup.py); only the instruction is read, not the code after it.
"""

from __future__ import annotations

import re

INSTRUCTION_CHARS = 600  # an instruction is its first paragraph; the code after it is not one
QUOTED = re.compile(r"`([^`\n]{1,40})`|\"([^\"\n]{1,40})\"|'([^'\n]{1,40})'")
RENAME = re.compile(
    r"\b(?:renam\w*|replac\w*|chang\w*)\b(?:\s+(?:the|a|an|variable|function|method|class|field|key|parameter|argument))*"
    r"\s+`?([A-Za-z_][\w.]*)`?\s+(?:to|with|into|->|=>|→)\s+`?([A-Za-z_]\w*)",
    re.IGNORECASE,
)
CODE_WORD = re.compile(r"\b[A-Za-z_]*(?:_[A-Za-z0-9]|[a-z][A-Z]|[A-Za-z][0-9])[\w]*\b")  # snake_case, camelCase, x2
WORDS = {"to", "with", "into", "the", "a", "an", "it", "this", "that", "them", "all", "each", "every", "and", "or"}


def instruction(prompt: str) -> str:
    """The prompt's first paragraph (up to a blank line or a code fence), at most INSTRUCTION_CHARS."""
    text = prompt.lstrip()[:INSTRUCTION_CHARS]
    return re.split(r"\n\s*\n|```", text, maxsplit=1)[0]


def hints_in(prompt: str) -> list[str]:
    """Names the prompt's instruction mentions: quoted or backticked, written as code, or either side of
    "X to Y" in a rename; each once, in order."""
    text = instruction(prompt)
    names = [next(g for g in m.groups() if g) for m in QUOTED.finditer(text)]
    for m in RENAME.finditer(text):
        names += [g for g in m.groups() if g.lower() not in WORDS]
    names += CODE_WORD.findall(text)
    out: list[str] = []
    for name in (n.strip() for n in names):
        if name and name not in out:
            out.append(name)
    return out


def renames_in(prompt: str) -> list[tuple[str, str]]:
    """(old, new) for each "rename/replace/change X to Y" in the instruction."""
    return [(m[1], m[2]) for m in RENAME.finditer(instruction(prompt)) if m[1].lower() not in WORDS]
