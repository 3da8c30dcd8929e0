"""Fill in the middle and log probabilities: the prompt laid out as llama-server's format_prompt_infill lays it out
(per token set), `generate --suffix`, the target's log probabilities whatever the drafter, and the engine's part."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from specdec_cli.backend.native import Model
from specdec_cli.chat import fim
from specdec_cli.engine.events import Token
from specdec_cli.engine.speculative import log_probs
from specdec_cli.serve.cuts import Indent
from specdec_cli.session import RunConfig, open_session


@pytest.fixture(scope="module")
def vocab(models):
    """The FIM fixtures' vocabularies (no weights): with repository and file tokens, without, and none at all."""
    return {name: Model(models[name], vocab_only=True) for name in ("fim", "fim_plain", "chat")}


def raw(text: str) -> list[int]:
    """The FIM fixtures' tokens for text: their byte vocabulary's, <0xNN> is id 3 + NN (a space: U+2581's bytes,
    SentencePiece's)."""
    return [3 + b for b in text.replace(" ", "\u2581").encode()]


def test_the_repository_layout_puts_the_other_files_first_then_the_file_being_edited(vocab):
    m = vocab["fim"]
    extra = [fim.Extra("a.py", "A = 1\n"), fim.Extra("b.py", "B")]
    got = fim.layout(m, "def f(", "\nprint(f())\n", extra, prompt="x", n_ctx=8192)
    pre, suf, mid, rep, sep = 259, 260, 261, 262, 263
    expected = [rep, *raw("myproject\n"), sep, *raw("a.py\n"), *raw("A = 1\n"), sep, *raw("b.py\n"), *raw("B")]
    expected += [sep, *raw("filename\n"), 1, pre, *raw("def f("), *raw("x"), suf, *raw("\nprint(f())\n"), mid]
    assert got == expected


def test_without_repository_tokens_each_file_follows_a_snippet_line(vocab):
    got = fim.layout(vocab["fim_plain"], "p", "s", [fim.Extra("a.py", "A")], n_ctx=8192)
    assert got == [*raw(fim.SNIPPET), *raw("A"), 1, 259, *raw("p"), 260, *raw("s"), 261]


def test_budgets_keep_the_prefix_end_the_suffix_start_and_the_files_nearest_the_cursor(vocab):
    m = vocab["fim"]
    prefix, suffix, prompt = "a" * 1000 + "b" * 1000, "c" * 400 + "d" * 400, "e" * 10
    got = fim.layout(m, prefix, suffix, [], prompt, n_ctx=8192)
    assert got[got.index(259) + 1 : got.index(260)] == raw(prefix[-1536:] + prompt)
    assert got[got.index(260) + 1 : -1] == raw(suffix[: 512 - 2 - 10]) and got[-1] == 261
    extra = [fim.Extra("x.py", "X" * 100)]
    got = fim.layout(m, "a" * 100, "c", extra, n_ctx=2100)  # room for 2100 - 2048 + 2 = 54 of the files' tokens
    bos = got.index(1)
    assert bos == 54 and got[:bos] == [*raw("X" * 100), 263, *raw("filename\n")][-54:]


def test_a_model_without_fim_tokens_is_refused_by_name(vocab):
    assert fim.missing(vocab["chat"]) == ["pre", "suf", "mid"]
    with pytest.raises(fim.NoFim, match="no prefix, suffix, middle token"):
        fim.layout(vocab["chat"], "a", "b")


def test_the_default_pairs_layout_is_qwen_coders_repository_format(default_pair):
    m = Model(default_pair[0], vocab_only=True)
    tokens = fim.layout(m, "def add(a, b):\n", "\nprint(add(1, 2))\n", [fim.Extra("util.py", "X = 1\n")], "    ", 32768)
    text = b"".join(m.piece(t) if t < 151643 else m.token_text(t).encode() for t in tokens).decode()
    assert text == (
        "<|repo_name|>myproject\n<|file_sep|>util.py\nX = 1\n<|file_sep|>filename\n<|fim_prefix|>def add(a, b):\n"
        "    <|fim_suffix|>\nprint(add(1, 2))\n<|fim_middle|>"
    )


def specdec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", "-t", "2", *args], capture_output=True, text=True, timeout=300
    )


def test_generate_suffix_fills_in_the_middle_from_a_file_and_refuses_a_model_without_fim(models, tmp_path):
    after = tmp_path / "after.py"
    after.write_text("\nreturn x\n")
    r = specdec("--target", str(models["fim"]), "-n", "8", "--suffix", f"@{after}", "--json", "def f(x):\n")
    assert r.returncode == 0, r.stderr
    m = Model(models["fim"], vocab_only=True)
    ctx = json.loads(r.stdout)["config"]["ctx_size"]
    assert json.loads(r.stdout)["stats"]["prompt_tokens"] == len(
        fim.layout(m, "def f(x):\n", "\nreturn x\n", n_ctx=ctx)
    )
    r = specdec("--target", str(models["chat"]), "--no-chat", "--suffix", "x", "a")
    assert r.returncode == 2 and "cannot fill in the middle" in r.stderr and "Traceback" not in r.stderr
    r = specdec("--target", str(models["fim"]), "--suffix", f"@{tmp_path / 'missing.py'}", "a")
    assert r.returncode == 2 and "--suffix" in r.stderr and "does not exist" in r.stderr


def scored(session, tokens: list[int], **run) -> list[Token]:
    return [e for e in session.generate(tokens, **run) if isinstance(e, Token)]


@pytest.mark.parametrize("exact", [True, False])
def test_log_probabilities_are_the_targets_whichever_drafter(models, exact):
    """Exact mode: bit for bit as target-only decoding's; else within the batched kernels' rounding."""
    cfg = RunConfig(target=models["fim"], draft=models["fim_draft"], threads=2, ctx_size=1024, exact=exact)
    with open_session(cfg) as s:
        tokens = s.infill_tokens("def total(items):\n    s = 0\n", "\n    return s\n")
        alone = scored(s, tokens, drafter="none", max_tokens=48, logprobs=3)
        for drafter, k in (("model", 4), ("lookup", 6)):
            drafted = scored(s, tokens, drafter=drafter, draft_tokens=k, max_tokens=48, logprobs=3)
            assert [t.id for t in drafted] == [t.id for t in alone]
            a = np.array([[t.logprob, *(lp for _, lp in t.top)] for t in alone])
            b = np.array([[t.logprob, *(lp for _, lp in t.top)] for t in drafted])
            if exact:
                assert (a == b).all() and [t.top for t in drafted] == [t.top for t in alone]
            else:  # batched rows sum in another order: the tiny model's drift over 48 tokens stays under 1e-2
                assert np.abs(a - b).max() < 1e-2, np.abs(a - b).max()
    assert any(t.origin.value == "draft" for t in drafted)  # (the drafts were accepted: rows from verification)
    for t in alone:  # greedy: the chosen token is the most likely; alternatives best first; a distribution's share
        assert t.top[0] == (t.id, t.logprob) and [lp for _, lp in t.top] == sorted(
            (lp for _, lp in t.top), reverse=True
        )
        assert sum(np.exp(lp) for _, lp in t.top) <= 1 + 1e-9


def test_log_probs_is_a_log_softmax_over_what_the_grammar_allows():
    row = np.array([1.0, 3.0, 2.0, 3.0], dtype=np.float32)

    class Only:  # a grammar state that allows tokens 0 and 2
        def mask(self, r):
            out = np.full_like(r, -np.inf)
            out[[0, 2]] = r[[0, 2]]
            return out

    lp, top = log_probs(row, None, 2, 3)
    z = row.astype(np.float64)
    assert lp == pytest.approx(2.0 - np.log(np.exp(z).sum()))
    assert [t for t, _ in top] == [1, 3, 2]  # equal logits: the lower id first
    lp, top = log_probs(row, Only(), 2, 2)
    assert lp == pytest.approx(2.0 - np.log(np.exp(1.0) + np.exp(2.0))) and [t for t, _ in top] == [2, 0]


@pytest.mark.parametrize(
    "pieces, n, expected, hit",
    [
        (["x = 1\n", "    y\n", "  z\n"], 4, "x = 1\n    y\n  ", True),
        (["if a:\n        b\n", "    c"], 4, "if a:\n        b\n    c", False),
        (["a\n\n", "    b"], 4, "a\n", True),  # a blank line ends it too (llama-server's check sees its newline)
        (["first line\n  ", "  deep\n"], 4, "first line\n    deep\n", False),  # indentation across pieces
        (["a\nb"], 0, "a\nb", False),
    ],
)
def test_n_indent_ends_the_text_where_a_line_leaves_the_block(pieces, n, expected, hit):
    cut = Indent(n)
    out = "".join(cut.push(p) for p in pieces) + cut.flush()
    assert out == expected and cut.hit == hit


def test_lookup_drafts_the_code_after_the_cursor_where_the_middle_rejoins_it(vocab):
    """The suffix is in the prompt (after the prefix, before the middle marker): a completion that has written the
    suffix's first line is drafted the rest of it, as lookup drafts from the prompt."""
    from specdec_cli.drafting.matches import occurrences

    m = vocab["fim"]
    suffix = "\n    return total\n\n\nprint(total_of([1, 2]))\n"
    prompt = fim.layout(m, "def total_of(xs):\n    total = 0\n", suffix, n_ctx=4096)
    written = m.tokenize_text(
        "    for x in xs:\n        total += x\n    return total", add_special=False, parse_special=False
    )
    history = np.array(prompt + written)
    (length, start), *_ = occurrences(history)
    rest = m.tokenize_text("\n\n\nprint(total_of([1, 2]))\n", add_special=False, parse_special=False)
    assert length >= len(m.tokenize_text("    return total", add_special=False, parse_special=False))
    assert history[start : start + len(rest)].tolist() == rest


def test_other_files_give_way_where_llama_servers_budgets_would_overfill_the_context(vocab):
    """Prefix (1,536) and suffix (510) fill the batch's 2,048; the files' n_ctx - 2,048 + 2 would pass the context:
    they give way, and the rest is as laid out without them. Where it all fits, the files get llama-server's share."""
    m = vocab["fim"]
    files = [fim.Extra("x.py", "x" * 5000)]
    prefix, suffix = "p" * 2000, "s" * 2000
    got, plain = fim.layout(m, prefix, suffix, files, n_ctx=4096), fim.layout(m, prefix, suffix, n_ctx=4096)
    assert len(got) == 4096 - fim.ROOM and got[got.index(1) :] == plain[plain.index(1) :]
    small, plain = fim.layout(m, "p" * 100, "s" * 100, files, n_ctx=4096), fim.layout(m, "p" * 100, "s" * 100)
    assert small.index(1) == 4096 - 2048 + 2 and small[small.index(1) :] == plain[plain.index(1) :]


def test_a_huge_prefix_suffix_or_file_is_tokenized_only_as_far_as_the_budgets_reach(vocab, monkeypatch):
    """Some tokenizers are quadratic (the fixtures' is): a megabyte of prefix must not cost hours. The tokens are
    those of tokenizing everything (compared on a size where that is cheap)."""
    m = vocab["fim"]
    code = "".join(f"    value_{i} = compute({i}, 'x')\n" for i in range(400))  # ~12 KB of lines
    files = [fim.Extra(f"f{i}.py", code) for i in range(3)]
    whole = fim.layout(m, code, code, files, n_ctx=3000)
    seen = []
    real = m.tokenize_text
    monkeypatch.setattr(m, "tokenize_text", lambda text, **kw: seen.append(len(text)) or real(text, **kw))
    assert fim.layout(m, code, code, files, n_ctx=3000) == whole
    assert max(seen) < len(code)  # no text was tokenized whole
    seen.clear()
    big = fim.layout(m, "x = 1\n" * 200_000, "y = 2\n" * 200_000, [fim.Extra("a.py", "z\n" * 500_000)] * 50, n_ctx=4096)
    assert len(big) < 4096 and sum(seen) < 200_000


def test_a_line_break_at_the_edge_of_a_huge_one_line_text_does_not_make_it_tokenized_whole(vocab, monkeypatch):
    """The cut looks for a line's start near the window's edge: one lone line break at the prefix's end (or the
    suffix's start) must not leave an empty window that doubles until the whole text is tokenized."""
    m = vocab["fim"]
    seen = []
    real = m.tokenize_text
    monkeypatch.setattr(m, "tokenize_text", lambda text, **kw: seen.append(len(text)) or real(text, **kw))
    line = "x = [" + "1, " * 1_000_000 + "]"  # 3 MB on one line
    tokens = fim.layout(m, line + "\n", "\n" + line, n_ctx=4096)
    assert len(tokens) < 4096 and sum(seen) < 200_000, sum(seen)
    i = tokens.index(m.fim_tokens()["suf"])
    assert tokens[i - 2 : i] == raw("]\n") and tokens[i + 1 : i + 1 + len(raw("\nx = [1,"))] == raw("\nx = [1,")
