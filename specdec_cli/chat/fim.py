"""Fill-in-the-middle prompts: the code before the cursor, the code after it and other files, in the model's FIM
tokens, laid out token for token as llama-server's `format_prompt_infill` lays them out (tools/server), because
the editor plugins (llama.vim, llama.vscode) were tuned against that layout:

    [rep]"myproject\\n" ([sep]FILENAME"\\n" TEXT)... [sep]"filename\\n"  [BOS] [pre]PREFIX PROMPT [suf]SUFFIX [mid]

The repository header where the model has the repo token; each extra file after the file-separator token and its
name (without one, after a "--- snippet ---" line); then the file being edited. Budgets as llama-server's, with
its default batch of 2,048: the prefix's last 1,536 tokens, the suffix's first 510 less the prompt's, and of the
extra files the tokens nearest the file being edited that leave the batch (and two) free in the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from . import limits

N_BATCH = 2048  # llama-server's default batch (-b): its budgets are shares of it
N_PREDICT = -1  # llama-server's default -n: part of the extra files' budget
SNIPPET = "\n\n--- snippet ---\n\n"  # an extra file's header where the model has no file separator
TOKENS = ("pre", "suf", "mid")
BYTES_PER_TOKEN = 8  # what a prompt's end is first cut to before tokenizing (code averages 3 to 4 bytes a token)
MARGIN = 16  # tokens past the cut that may differ from the whole text's tokens, and are not used
ROOM = 64  # tokens left for the answer where the other files had to give way (below)  # what a model needs to fill in the middle at all


class FimModel(Protocol):
    name: str

    def fim_tokens(self) -> dict[str, int | None]: ...
    def add_bos(self) -> bool: ...
    def bos(self) -> int: ...
    def tokenize_text(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...
    def piece(self, token: int) -> bytes: ...


@dataclass(frozen=True)
class Extra:
    """A file the completion may draw on (llama-server's input_extra chunk)."""

    filename: str
    text: str


class NoFim(Exception):
    """The model has no fill-in-the-middle tokens: the message says which it lacks."""


def missing(model: FimModel) -> list[str]:
    """The FIM tokens the model lacks, of those it needs (prefix, suffix, middle)."""
    ids = model.fim_tokens()
    return [name for name in TOKENS if ids[name] is None]


def refusal(model: FimModel) -> str | None:
    """Why the model cannot fill in the middle (None: it can)."""
    lacks = missing(model)
    names = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
    return (
        f"{model.name} cannot fill in the middle: it has no {', '.join(names[n] for n in lacks)} token"
        if lacks
        else None
    )


def layout(
    model: FimModel, prefix: str, suffix: str, extra: list[Extra] = (), prompt: str = "", n_ctx: int = 0
) -> list[int]:
    """The prompt's tokens; `prompt`: text that continues the prefix (llama.vim sends the cursor line's start
    there); `n_ctx`: the context, which bounds the extra files. NoFim where the model cannot."""
    why = refusal(model)
    if why:
        raise NoFim(why)
    ids = model.fim_tokens()

    def tok(text: str) -> list[int]:  # text as text: control-token names in the code are not parsed
        return limits.tokenize(model, text, add_special=False, parse_special=False)

    budget = max(0, n_ctx - N_BATCH - 2 * N_PREDICT)  # the other files' tokens, nearest the cursor's first
    parts: list = []  # the head's parts, first to last: token lists, or texts (only their last tokens count)
    if ids["rep"] is not None:
        parts += [[ids["rep"], *tok("myproject\n")]]
    for chunk in extra:
        parts += [[ids["sep"], *tok(chunk.filename + "\n")] if ids["sep"] is not None else tok(SNIPPET), chunk.text]
    if ids["sep"] is not None:
        parts += [[ids["sep"], *tok("filename\n")]]
    head: list[int] = []
    for part in reversed(parts):  # from the last, only until the budget is spent: a huge input_extra costs nothing
        if len(head) > budget:
            break
        head = [*(part if isinstance(part, list) else last_tokens(tok, part, budget + 1 - len(head))), *head]
    continued = tok(prompt)
    pre = last_tokens(tok, prefix, 3 * (N_BATCH // 4))
    suf = first_tokens(tok, suffix, max(0, N_BATCH // 4 - (2 + len(continued))))
    n_head = min(budget, len(head))
    body = [ids["pre"], *pre, *continued]
    if model.add_bos():
        body = [model.bos(), *body]
    end = [ids["suf"], *suf, ids["mid"]]
    if n_ctx and n_head + len(body) + len(end) >= n_ctx:  # llama-server's budgets can overfill the context by a few
        # tokens (the files' share counts on the batch's, the prefix's and suffix's, summing to 2,048 at most): where
        # it would refuse the request, the files give way, leaving ROOM for the answer
        n_head = max(0, min(n_head, n_ctx - ROOM - len(body) - len(end)))
    return [*head[len(head) - n_head :], *body, *end]


def last_tokens(tok, text: str, n: int) -> list[int]:
    """The last n of text's tokens, as tokenizing all of it gives them, tokenizing only as much of its end as
    needed (a megabyte of prefix is one request away, and some tokenizers are quadratic): from a line's start far
    enough back that MARGIN more tokens come before the n (the tokens after a line break do not depend on what
    came before it; the margin covers a run of line breaks cut in two)."""
    if n <= 0:
        return []
    size = n * BYTES_PER_TOKEN
    while len(text) > size:
        cut = len(text) - size  # a line's start in the window's first half, else anywhere (the margin covers it):
        start = text.find("\n", cut, cut + size // 2) + 1 or cut  # (a lone line break at the end: not an empty window)
        tokens = tok(text[start:])
        if len(tokens) >= n + MARGIN:
            return tokens[len(tokens) - n :]
        size *= 4
    tokens = tok(text)
    return tokens[max(len(tokens) - n, 0) :]


def first_tokens(tok, text: str, n: int) -> list[int]:
    """The first n of text's tokens, tokenizing only as much of its start as needed (last_tokens' rule)."""
    if n <= 0:
        return []
    size = n * BYTES_PER_TOKEN
    while len(text) > size:
        end = text.rfind("\n", size // 2, size)  # a line's end in the window's second half, else anywhere
        tokens = tok(text[: end if end > 0 else size])
        if len(tokens) >= n + MARGIN:
            return tokens[:n]
        size *= 4
    return tok(text)[:n]
