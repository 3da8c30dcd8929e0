"""A draft of another vocabulary (drafting/foreign.py, drafting/bridge.py): it drafts text, the target verifies its
own tokens for it. The output is the target's alone, greedy and --exact token for token, sampled in distribution;
--debug checks both caches every round (the draft's: tokens that spell a prefix of the committed text).

Fixtures (tiny_models.py): other_vocab_same computes the target's function over shuffled byte ids (a foreign draft
that is always right), other_vocab_draft the noisy draft's; merged has multi-byte tokens that straddle the target's;
no_text's tokens spell nothing."""

from __future__ import annotations

import json

import pytest

from conftest import accept_every_draft, config, run_engine, same_distribution, sample_counts
from test_cli import one_line_error, specdec
from test_constraint import GRAMMARS
from specdec_cli.drafting import measure as measurement
from specdec_cli.drafting.cost import Costs
from specdec_cli.drafting.bridge import Bridge, _restart, complete, readable, spelled
from specdec_cli.drafting.foreign import ForeignDrafter
from specdec_cli.drafting.model import ModelDrafter
from specdec_cli.engine.sampling import Sampler
from specdec_cli.run_inputs import Inputs
from specdec_cli.session import RunConfig, open_session

PROMPTS = ["hello world", "The quick brown fox", "def f(x):\n    return", "é€ and 😀", "z", "abcabcabc"]
PAIRS = [  # (target, draft)
    ("target", "other_vocab_same"),
    ("target", "other_vocab_draft"),
    ("target", "merged"),  # draft tokens straddle the target's
    ("merged", "target"),  # target tokens straddle the draft's
    ("target", "merged_space"),  # a draft that adds a space before a text
    ("merged_space", "target"),
    ("chat", "other_vocab_draft"),  # a chat prompt, its template's markers as text
]


def outputs(models, target: str, draft: str | None, k: int = 3, **kw) -> tuple[dict, list]:
    with open_session(config(models, draft, target=models[target], max_tokens=40, **kw)) as s:
        runs = {p: run_engine(s, p, draft_tokens=k) for p in PROMPTS}
    return {p: ids for p, (ids, _, _) in runs.items()}, [stats for _, stats, _ in runs.values()]


@pytest.mark.parametrize("target,draft", PAIRS)
@pytest.mark.parametrize("k", [1, 4, 9])
def test_a_foreign_draft_gives_the_target_alone_output(models, target, draft, k):
    alone, _ = outputs(models, target, None)
    spec, stats = outputs(models, target, draft, k)
    assert spec == alone
    assert sum(s.drafted for s in stats) > 0  # it drafted (and --debug checked both caches every round)


@pytest.mark.parametrize("target,draft", [("target", "other_vocab_draft"), ("merged", "target")])
def test_a_foreign_draft_in_exact_mode_gives_the_target_alone_output(models, target, draft):
    alone, _ = outputs(models, target, None, exact=True)
    assert outputs(models, target, draft, 5, exact=True)[0] == alone


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_foreign_draft_that_computes_the_targets_function_is_fully_accepted(open_pair, k):
    """Its ids are others, its text the same: every token it drafts is the target's. The target verifies only the
    text the draft fixed (the last token before the draft's text ends is left to the target's bonus)."""
    s = open_pair("other_vocab_same", max_tokens=60)
    ids, stats, _ = run_engine(s, "The quick brown fox", draft_tokens=k)
    assert all(s.target.piece(t) for t in ids)  # (a token with no text would hide from the draft's view)
    assert stats.drafted == stats.accepted > 0
    part = stats.by_drafter["model"]
    assert part.foreign_rounds > 0 and part.draft_fed >= part.accepted  # each accepted byte was one of its tokens


@pytest.mark.parametrize("exact", [False, True])
def test_sampling_with_a_foreign_draft_matches_the_target_alone(open_pair, exact):
    kw = dict(max_tokens=2, temp=1.5, top_k=3, exact=exact)
    spec, plain = open_pair("other_vocab_draft", **kw), open_pair(None, **kw)
    spec_counts, stats = sample_counts(spec, "hello world", 1500, draft_tokens=2)
    plain_counts, _ = sample_counts(plain, "hello world", 1500, draft_tokens=2)
    ok, stat, cells = same_distribution(spec_counts, plain_counts)
    assert ok, (stat, cells)
    assert cells > 3 and stats.drafted > 0


def test_the_sampling_test_tells_a_foreign_drafts_distribution_apart(open_pair, monkeypatch):
    """The negative control: every draft token accepted makes the output the draft's greedy text."""
    accept_every_draft(monkeypatch)
    kw = dict(max_tokens=2, temp=1.5, top_k=3)
    spec, plain = open_pair("other_vocab_draft", **kw), open_pair(None, **kw)
    spec_counts, _ = sample_counts(spec, "hello world", 600, draft_tokens=2)
    plain_counts, _ = sample_counts(plain, "hello world", 600, draft_tokens=2)
    assert not same_distribution(spec_counts, plain_counts)[0]


def test_auto_drafts_with_a_foreign_draft_and_learns_its_cost(open_pair, frozen_costs):
    s = open_pair("other_vocab_same", drafter="auto", max_tokens=48)
    alone = open_pair(None, max_tokens=48)
    ids, stats, _ = run_engine(s, "The quick brown fox")
    assert ids == run_engine(alone, "The quick brown fox")[0]
    assert stats.by_drafter["model"].drafted > 0 and stats.by_drafter["model"].foreign_rounds > 0


def test_auto_learns_what_a_drafted_target_token_costs_through_text(open_pair, monkeypatch):
    """Its cost per drafted target token (its decodes, the tokenizing both ways) is learned from its own rounds: a
    curve that prices its decodes at nothing moves to what they took."""
    curve = Costs({1: 0.03, 16: 0.033, 32: 0.04}, 1e-5, 32)
    monkeypatch.setattr(measurement, "measure", lambda *args, **kw: curve)
    s = open_pair("other_vocab_same", drafter="auto", max_tokens=96)
    stats = run_engine(s, "The quick brown fox")[1]
    assert stats.by_drafter["model"].foreign_rounds > 3
    assert curve.draft > 1.1e-5  # (a drafted target token takes some 0.3 ms here: each round moves it a step up)


@pytest.mark.parametrize("k", [2, 6])
def test_a_foreign_draft_drafts_from_a_sliding_window(models, k):
    """Its window (the text's head and tail, K-shifted as it slides) holds its own tokens: --debug checks it."""
    text = "The quick brown fox jumps over the lazy dog and keeps running. " * 5
    kw = dict(max_tokens=120, draft_window=64, ctx_size=1024)
    with open_session(config(models, None, **kw)) as alone, open_session(config(models, "other_vocab_same", **kw)) as s:
        ids, stats, _ = run_engine(s, text, draft_tokens=k)
        assert ids == run_engine(alone, text)[0]
        assert stats.drafted > 0
        assert s.draft_ctx.seq_pos_range(0)[1] < 64 + 32 + 66  # the window, not the whole text


@pytest.mark.parametrize("name", ["forbids", "literal", "enum"])
def test_a_grammar_cuts_a_foreign_proposal_and_the_output_is_the_constrained_targets(models, monkeypatch, name):
    """The draft's rows are not masked (its ids are not the grammar's): the engine cuts its proposal where the grammar
    rejects a token, as it cuts every drafter's (here at once: the draft writes what the unconstrained target would)."""
    proposed, propose = [], ForeignDrafter.propose
    monkeypatch.setattr(ForeignDrafter, "propose", lambda *a, **kw: proposed.append(d := propose(*a, **kw)) or d)
    kw = dict(max_tokens=60, gbnf=GRAMMARS[name][0], lookup_cache=False)
    with open_session(config(models, None, **kw)) as alone, open_session(config(models, "other_vocab_same", **kw)) as s:
        expected = run_engine(alone, "hello")[0]
        for k in (2, 5):
            assert run_engine(s, "hello", draft_tokens=k)[0] == expected
    assert sum(len(d.tokens) for d in proposed) > 0  # (it proposed: the grammar had something to cut)


def test_a_walk_away_mid_stream_leaves_the_next_run_right(open_pair):
    """A consumer that stops reading between rounds: the next run (reusing the draft's cells) is still exact."""
    s = open_pair("other_vocab_draft", max_tokens=40)
    alone = open_pair(None, max_tokens=40)
    for stop in (1, 3, 7):
        stream = s.generate(s.prompt_tokens("hello world"), Inputs(reuse=True), draft_tokens=3)
        for i, _ in enumerate(stream):
            if i == stop:
                break
        stream.close()
        assert run_engine(s, "hello world", draft_tokens=3, reuse=True)[0] == run_engine(alone, "hello world")[0]


def test_the_cli_reports_a_foreign_draft(models, capsys):
    args = ["generate", "The quick brown fox", "--target", str(models["target"]), "--draft"]
    args += [str(models["other_vocab_same"]), "--drafter", "model", "-k", "3", "-n", "24"]
    code, out, err = specdec(capsys, *args, "--json")
    assert code == 0, err
    model = json.loads(out)["stats"]["by_drafter"]["model"]
    assert model["another_tokenizer"] is True
    assert model["draft_tokens_fed_per_accepted"] == round(model["draft_tokens_fed"] / model["accepted"], 4)
    code, out, err = specdec(capsys, *args)  # the statistics panel
    assert code == 0 and "another tokenizer's: 1.3 of its tokens fed per accepted" in out + err


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--draft", "{no_text}"], "its tokens spell no text"),
        (["--draft", "{other_vocab}", "--drafter", "model", "--branches", "2"], "drafts a chain of text"),
    ],
)
def test_a_draft_that_cannot_draft_through_text_is_one_line_exit_2(models, capsys, extra, needle):
    args = ["generate", "hi", "--target", str(models["target"])] + [a.format(**models) for a in extra]
    code, out, err = specdec(capsys, *args)
    assert code == 2 and out == ""
    assert needle in one_line_error(err)


# The bridge alone: fake vocabularies, no llama.cpp.


class Fake:
    """A vocabulary of whole words and single bytes (longest match first); `space_prefix`: SentencePiece's dummy."""

    def __init__(self, words: list[bytes], space_prefix: bool = False, bos: bool = True):
        self.pieces = [b"<s>", b"</s>"] + [bytes([b]) for b in range(256)] + words
        self.space_prefix, self.adds_bos = space_prefix, bos

    def piece(self, token: int) -> bytes:
        return b"" if token < 2 else self.pieces[token]

    def tokenize_bytes(self, raw: bytes, *, add_special: bool, parse_special: bool) -> list[int]:
        raw = (b" " if self.space_prefix else b"") + raw
        out, i = ([0] if add_special and self.adds_bos else []), 0
        while i < len(raw):
            best = max(
                (j for j, p in enumerate(self.pieces) if j >= 2 and raw.startswith(p, i)),
                key=lambda j: len(self.pieces[j]),
            )
            out.append(best)
            i += len(self.pieces[best])
        return out

    def render(self, tokens: list[int]) -> bytes:
        return b"".join(self.pieces[t] for t in tokens)

    def is_eog(self, token: int) -> bool:
        return token == 1

    def is_control(self, token: int) -> bool:
        return token < 2

    def end_of_turn(self) -> int:
        return 1

    def bos(self) -> int:
        return 0


def test_an_empty_text_for_the_draft_drafts_nothing_and_touches_no_cache():
    """A prompt that is only the target's BOS, for a draft that adds none: nothing for the draft to read."""
    target, draft = Fake([]), Fake([], bos=False)
    drafter = ForeignDrafter(ModelDrafter(lambda: pytest.fail("the draft's cache was opened")), Bridge(target, draft))
    drafter.prefill([])
    assert drafter.propose([0], 4, Sampler(), None).tokens == []


def test_tokenizing_again_starts_at_a_characters_first_byte():
    """Where no space or new line is near (CJK text), the restart falls where a character starts: a draft token that
    ended inside one (byte-level BPE does) is no place to tokenize from."""
    text = "日本語のテキスト".encode() * 20
    ends = list(range(2, len(text) + 1, 2))  # every token two bytes: most end inside a character
    j = _restart(text, ends, 8)
    assert 0 < j <= len(ends) - 8 and text[ends[j - 1]] & 0xC0 != 0x80


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_a_recurrent_draft_of_another_vocabulary_gives_the_target_alone_output(models, arch):
    """Its state rolls back only into its last decode's snapshots: its cells are never tokenized again (--debug checks
    them every round)."""
    alone, _ = outputs(models, arch, None)
    spec, stats = outputs(models, arch, f"{arch}_other")
    assert spec == alone and sum(s.accepted for s in stats) > 0


def test_complete_holds_back_only_an_unfinished_character():
    assert complete(b"caf\xc3\xa9 \xe2\x82") == 6
    assert complete(b"ab\xff") == 3  # no character continues an invalid byte
    assert readable(b"a\xffb") == "a\ufffdb".encode()


def test_spelled_leaves_out_a_dummy_space_and_stops_where_pieces_differ():
    v = Fake([b" world", b"hello", b" hello"], space_prefix=True)
    tokens, ends = spelled(v, b"hello world")  # (alone it would be " hello" " world": the space is not the text's)
    assert [v.piece(t) for t in tokens] == [b"hello", b" world"] and ends == [5, 11]
    v = Fake([b" \n\n"], space_prefix=True)  # the anchor merges into the text: the text alone, its space not counted
    tokens, ends = spelled(v, b"\nab")
    assert [v.piece(t) for t in tokens] == [b" ", b"\n", b"a", b"b"] and ends == [0, 1, 2, 3]
    v = Fake([b"\xef\xbf\xbd"])
    v.tokenize_bytes = lambda raw, **kw: [2 + raw[0], 258]  # a tokenizer that reads "\xff" as U+FFFD
    assert spelled(v, b"a\xff") == ([2 + ord("a")], [1])


def test_the_proposal_leaves_the_straddling_token_to_the_target():
    target, draft = Fake([b" world", b" wor"]), Fake([b"ld", b" wo"])
    bridge = Bridge(target, draft)
    bridge.begin([0])
    drafted = draft.tokenize_bytes(b" world", add_special=False, parse_special=False)  # " wo", "r", "ld"
    tokens, conf = bridge.proposal(drafted, [0.9, 0.8, 0.7], k=8)
    assert tokens == []  # " world" is the target's one token, and the draft's text may go on ("worlds")
    tokens, conf = bridge.proposal(drafted + [1], [0.9, 0.8, 0.7, 0.6], k=8)
    assert [target.piece(t) for t in tokens] == [b" world", b""] and tokens[-1] == 1  # its end: the target's end too
    assert conf == [0.7, 0.6]  # the least of the draft tokens it overlaps


def test_the_draft_keeps_the_tokens_whose_text_the_target_kept():
    target, draft = Fake([]), Fake([b"ab", b"cd"])
    bridge = Bridge(target, draft)
    prompt = [0, 2 + ord("x")]
    bridge.begin(prompt)
    committed = prompt + [2 + c for c in b"ab"]
    assert bridge.sync(committed)[len(bridge.head) :] == [258]  # "ab"
    held = [258, 259, 2 + ord("e")]  # "ab" "cd" "e": the target kept "abc"
    committed += [2 + ord("c"), 2 + ord("x")]  # (the correction is not yet kept text)
    bridge.follow(committed)
    assert bridge.kept(held, len(committed) - 1) == 1  # "cd" reaches past "abc": it goes


# Real models of two families (the package index's): SmolLM2 (byte-level BPE, 49,152 ids) and Gemma 3 (SentencePiece
# with byte fallback, 262,144 ids), each drafting for the other; the default target drafted by SmolLM2.

REAL_PROMPTS = ["Write a Python function that reverses a string.", "Café, naïve, 😀: say what these are.", "1, 2, 3,"]


def real(target, draft, k: int = 4, **kw) -> tuple[list, list]:
    base = dict(target=target, threads=2, max_tokens=32, ctx_size=2048, lookup_cache=False, debug=True)
    with open_session(RunConfig(**base, draft=draft, drafter="model" if draft else "none", **kw)) as s:
        runs = [run_engine(s, p, draft_tokens=k) for p in REAL_PROMPTS]
    return [ids for ids, _, _ in runs], [stats for _, stats, _ in runs]


@pytest.mark.parametrize("which", ["smollm2<-gemma3", "gemma3<-smollm2"])
def test_real_models_of_two_families_draft_for_each_other_exactly(smollm2, gemma3, which):
    target, draft = (smollm2, gemma3) if which.startswith("smollm2") else (gemma3, smollm2)
    alone, _ = real(target, None, exact=True)
    spec, stats = real(target, draft, exact=True)
    assert spec == alone
    assert sum(s.accepted for s in stats) > 0  # (they agree on some of it: the test has something to verify)


def test_the_default_target_drafted_by_smollm2_is_its_output_alone(default_pair, smollm2):
    target, _ = default_pair
    alone, _ = real(target, None, exact=True)
    spec, stats = real(target, smollm2, exact=True)
    assert spec == alone and sum(s.accepted for s in stats) > 0
