"""The built-in prompt suite, in the categories the field benchmarks (as Spec-Bench does), and
loading a user's prompts. Written for specdec; short enough to run on a laptop."""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path

from ..backend import grammar
from ..errors import SpecdecError, UsageError
from ..inputs import read_text


@dataclass(frozen=True)
class Prompt:
    category: str
    text: str
    gbnf: str | None = None  # the answer's constraint: a prompt file line's "schema" (or "grammar"), as GBNF


_CODE = """def total_price(items, tax):
    s = 0
    for it in items:
        s += it["price"] * it["qty"]
    return s * (1 + tax)
"""

_CODE2 = """class Stack:
    def __init__(self):
        self.data = []

    def push(self, x):
        self.data.append(x)

    def pop(self):
        return self.data.pop()
"""

_CODE3 = """def read_config(path):
    f = open(path)
    lines = f.readlines()
    cfg = {}
    for line in lines:
        k, v = line.split("=")
        cfg[k.strip()] = v.strip()
    return cfg
"""

_PASSAGE1 = (
    "The Great Barrier Reef, off the coast of Queensland, Australia, is the world's largest coral reef "
    "system. It is made of over 2,900 individual reefs and 900 islands stretching over 2,300 kilometres. "
    "The reef was selected as a World Heritage Site in 1981. Rising sea temperatures have caused mass coral "
    "bleaching events in 1998, 2002, 2016, 2017 and 2020, and scientists warn that the reef's long-term "
    "survival depends on limiting global warming."
)
_PASSAGE2 = (
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light energy into "
    "chemical energy. Using sunlight, they combine carbon dioxide from the air with water to make glucose, "
    "releasing oxygen as a by-product. The process takes place mainly in the chloroplasts of leaf cells, "
    "which contain the green pigment chlorophyll. Almost all life on Earth depends on it, directly or "
    "indirectly, for food and for the oxygen in the atmosphere."
)
_PASSAGE3 = (
    "The printing press, developed by Johannes Gutenberg around 1440 in Mainz, used movable metal type, "
    "oil-based ink and a wooden press adapted from wine presses. Books became far cheaper to produce, "
    "literacy spread across Europe, and ideas travelled faster than ever before. By 1500, printing presses "
    "in Western Europe had produced more than twenty million volumes."
)

SUITE: list[Prompt] = [
    # code generation
    Prompt("code", "Write a Python function that returns the n-th Fibonacci number iteratively."),
    Prompt("code", "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces."),
    Prompt("code", "Write a Python function that merges two sorted lists into one sorted list."),
    # code editing: the answer mostly repeats the given code
    Prompt(
        "code-edit", f"Rename the variable `s` to `subtotal` in the code below and return the whole code.\n\n{_CODE}"
    ),
    Prompt("code-edit", f"Add type hints to every method of this class and return the whole class.\n\n{_CODE2}"),
    Prompt(
        "code-edit",
        f"Change this function to open the file with a `with` statement. Return the whole function.\n\n{_CODE3}",
    ),
    # chat / QA
    Prompt("chat", "What is the difference between a process and a thread?"),
    Prompt("chat", "Give me three tips for writing readable code."),
    Prompt("chat", "Why is the sky blue? Answer in a short paragraph."),
    # summarisation of a given passage
    Prompt("summarise", f"Summarise the following passage in two sentences.\n\n{_PASSAGE1}"),
    Prompt("summarise", f"Summarise the following passage in one sentence.\n\n{_PASSAGE2}"),
    Prompt("summarise", f"Summarise the following passage in two sentences.\n\n{_PASSAGE3}"),
    # math reasoning
    Prompt("math", "A train travels 120 km in 1.5 hours. What is its average speed in km/h? Explain step by step."),
    Prompt("math", "If 3x + 7 = 22, what is x? Show your steps."),
    Prompt("math", "A shop sells pens at 3 for $2. How much do 12 pens cost? Reason step by step."),
    # translation
    Prompt("translate", "Translate to French: The library opens at nine and closes at six on weekdays."),
    Prompt("translate", "Translate to German: I would like a table for two people by the window, please."),
    Prompt("translate", "Translate to Spanish: The meeting was moved to Thursday because the manager is travelling."),
    # answering from a given passage (retrieval-augmented)
    Prompt("rag", f"{_PASSAGE1}\n\nUsing only the passage above: in which years did mass bleaching happen?"),
    Prompt(
        "rag", f"{_PASSAGE2}\n\nUsing only the passage above: where in the plant does photosynthesis mainly happen?"
    ),
    Prompt("rag", f"{_PASSAGE3}\n\nUsing only the passage above: what did Gutenberg adapt his press from?"),
]
CATEGORIES = sorted({p.category for p in SUITE})
SUITE_NAME = "spec-bench"  # --prompts spec-bench (the default) selects the built-in suite


def load(source: str | None, categories: list[str] | None) -> list[Prompt]:
    """Prompts from the built-in suite or a file (JSONL {"category", "prompt"}, or plain text: one per line)."""
    if source in (None, SUITE_NAME):
        prompts = list(SUITE)
    else:
        prompts = _from_file(Path(source))
    if categories:
        known = sorted({p.category for p in prompts})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise UsageError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}",
                hint=f"categories here: {', '.join(known)}",
            )
        prompts = [p for p in prompts if p.category in categories]
    return prompts


def _from_file(path: Path) -> list[Prompt]:
    # A FIFO is a prompts file too: bash's process substitution, --prompts <(make-prompts). Read once.
    try:
        mode = path.stat().st_mode
    except OSError:
        mode = 0
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise UsageError(f"--prompts: {path} is neither a file nor the suite name '{SUITE_NAME}'")
    try:
        with path.open("rb") as f:
            lines = read_text(f, f"--prompts {path}").splitlines()
    except OSError as e:
        raise SpecdecError(f"cannot read prompts from {path}: {e.strerror or e}") from None
    jsonl = path.suffix == ".jsonl" or (lines and lines[0].lstrip().startswith("{"))
    prompts = [
        _from_json(line, f"{path}:{n}") if jsonl else Prompt("file", line.replace("\\n", "\n"))
        for n, line in enumerate(lines, 1)
        if line.strip()
    ]
    if not prompts:
        raise UsageError(f"{path} has no prompts")
    return prompts


def _from_json(line: str, where: str) -> Prompt:
    """One JSONL line: {"prompt": text, "category": name}; both strings, the prompt not blank."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict) or "prompt" not in obj:
        raise UsageError(f'{where}: expected a JSON object with a "prompt" (and a "category")')
    text, category = obj["prompt"], obj.get("category", "file")
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f'{where}: "prompt" must be a non-empty string, not {json.dumps(text)}')
    if not isinstance(category, str) or not category.strip():
        raise UsageError(f'{where}: "category" must be a non-empty string, not {json.dumps(category)}')
    return Prompt(category, text, _constraint(obj, where))


def _constraint(obj: dict, where: str) -> str | None:
    """A line's "schema" (a JSON Schema object) or "grammar" (GBNF text), as GBNF checked now."""
    schema, gbnf = obj.get("schema"), obj.get("grammar")
    try:
        if schema is not None:
            if not isinstance(schema, dict) or gbnf is not None:
                raise UsageError('"schema" must be a JSON Schema object (and no "grammar" beside it)')
            gbnf = grammar.from_schema(json.dumps(schema))
        elif gbnf is not None and not isinstance(gbnf, str):
            raise UsageError(f'"grammar" must be GBNF text, not {json.dumps(gbnf)}')
        if gbnf is not None:
            grammar.check(gbnf, schema=schema is not None)
    except UsageError as e:
        raise UsageError(f"{where}: {e.message}") from None
    return gbnf
