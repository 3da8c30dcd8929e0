"""Constrained decoding (--grammar, --json-schema), speculated losslessly: every drafter's output is exactly
constrained target-only decoding (greedy: token for token; sampling: the same distribution); a draft is cut
at the first token the grammar rejects; bad schemas and grammars are one line before any model loads."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import config, run_engine, same_distribution, sample_counts

from specdec_cli.backend.grammar import Grammar
from specdec_cli.drafting.model import ModelDrafter
from specdec_cli.engine.constraint import along, greedy_rows
from specdec_cli.engine.kv import Sequence
from specdec_cli.engine.drafter import Draft
from specdec_cli.engine.sampling import Sampler
from specdec_cli.session import open_session
from test_cli import one_line_error

# On the tiny byte-vocabulary models: a grammar that forbids most bytes the models like, one that forces a
# long literal (every token of it certain: a draft of it is right), and an enum.
GRAMMARS = {
    "forbids": ('root ::= [a-f ]+ "."', r"[a-f ]+\.?"),
    "literal": ('root ::= "once upon a time, in a land far away, " [a-z ]*', r"once upon a time, in a land far away, [a-z ]*"),
    "enum": ('root ::= ("alpha" | "beta" | "gamma") ": " [a-z]+ ("," [a-z]+)*', r"(alpha|beta|gamma): [a-z]+(,[a-z]+)*"),
}  # fmt: skip
RUNS = [
    dict(drafter="model", draft_tokens=4),
    dict(drafter="model", draft_tokens=6, branches=3, p_split=0.05),
    dict(drafter="lookup", draft_tokens=4),
    dict(drafter="lookup", draft_tokens=None),
    dict(drafter="auto", draft_tokens=None),
]


@pytest.mark.parametrize("name", list(GRAMMARS))
def test_every_drafter_gives_exactly_constrained_target_only_output(models, frozen_costs, name):
    gbnf, pattern = GRAMMARS[name]
    with open_session(config(models, "draft", drafter="auto", draft_tokens=None, max_tokens=60, gbnf=gbnf,
                             lookup_cache=False)) as s:  # fmt: skip
        plain, stats, text = run_engine(s, "hello", drafter="none", draft_tokens=4)
        assert re.fullmatch(pattern, text), text  # the constraint holds
        assert stats.complete is (stats.stop_reason == "eos")
        drafted = 0
        for run in RUNS:
            tokens, stats, _ = run_engine(s, "hello", **run)
            assert tokens == plain, run
            drafted += stats.drafted
        assert drafted > 0  # the drafters drafted: identity is not plain decoding five times


def test_sampling_keeps_the_constrained_distribution(models):
    """temp 1: the draft model samples from its masked rows (q the masked distribution) and the rule accepts
    or draws from the residual of the masked rows; the outcome's distribution must be constrained
    target-only sampling's. Negative control: without the constraint it is another one."""
    cfg = config(models, "draft", max_tokens=4, temp=1.0, gbnf="root ::= [a-d] [a-d] [a-d]", lookup_cache=False)
    with open_session(cfg) as s:
        want, _ = sample_counts(s, "hello", 1200, drafter="none")
        got, stats = sample_counts(s, "hello", 1200, drafter="model", draft_tokens=3)
    assert stats.drafted > 0 and stats.accepted < stats.drafted  # some draft tokens were rejected
    ok, stat, cells = same_distribution(want, got)
    assert ok, (stat, cells)
    with open_session(config(models, "draft", max_tokens=4, temp=1.0, lookup_cache=False)) as s:
        free, _ = sample_counts(s, "hello", 1200, drafter="model", draft_tokens=3)
    assert not same_distribution(want, free)[0]


@pytest.mark.parametrize("temp", [0.0, 1.0])
@pytest.mark.parametrize("branches", [1, 3])
def test_the_draft_model_proposes_only_what_the_grammar_allows(models, temp, branches):
    """Its rows are masked as the target's are: every node of a chain or tree is a token the grammar allows
    along its path, and a sampled draft's q gives nothing to a rejected token. Control: unmasked, the same
    draft proposes tokens the grammar rejects (the grammar forbids most of what the models like)."""
    gbnf = GRAMMARS["forbids"][0]
    sampler, rng = Sampler(temp=temp), np.random.default_rng(3)
    with open_session(config(models, "draft", gbnf=gbnf, lookup_cache=False)) as s:
        grammar = Grammar(s.target, gbnf)
        prompt = s.prompt_tokens("hello")
        a = s.target.tokenize("a", special=False)[0]  # the text goes on with a token the grammar allows
        rejected = 0
        for masked in (True, False):
            drafter = ModelDrafter(Sequence.empty(s.draft_ctx), 0.0, branches, 0.01,
                                   grammar=grammar.start() if masked else None)  # fmt: skip
            drafter.prefill(prompt[:-1])
            committed, state = list(prompt), grammar.start()
            for _ in range(6):
                draft = drafter.propose(committed, 6, sampler, rng)
                cut, states = along(draft, state, sampler)
                if masked:
                    assert cut.tokens == draft.tokens and None not in states, draft.tokens
                    parents = getattr(draft.shape, "parents", range(-1, 5))  # a tree's, or a chain's
                    for i, parent in zip(range(len(draft.tokens)), parents):
                        if draft.q is not None:  # sampled: q's support is what the node's state allows
                            assert states[parent + 1].allowed(np.flatnonzero(draft.q[i] > 0)).all()
                else:
                    rejected += cut.tokens != draft.tokens or None in states
                drafter.rollback(len(committed) - 1, draft)
                committed.append(a)
                state = state.after(a)
        assert rejected > 0


def test_greedy_rows_pick_what_argmax_over_the_masked_row_picks():
    """The cheap path (the best token, then the row's best 64 in one pass) against the whole row's mask, on
    rows with many equal logits (quantised logits tie) and grammars allowing a few tokens or most."""

    class Allows:
        def __init__(self, ok):
            self.ok = ok

        def allows(self, token):
            return bool(self.ok[token])

        def allowed(self, ids):
            return self.ok[ids]

        def mask(self, row):
            return np.where(self.ok, row, -np.inf)

    rng = np.random.default_rng(7)
    for trial in range(400):
        rows = rng.integers(0, 40 if trial % 2 else 4000, size=(3, 500)).astype(np.float32)  # ties, or few
        states = [Allows(rng.random(500) < rng.choice([0.005, 0.05, 0.5, 0.95])) for _ in rows]
        for st in states:
            st.ok[rng.integers(500)] = True  # never an empty set
        want = [int(st.mask(r).argmax()) for r, st in zip(rows, states)]
        assert greedy_rows(rows, rows.argmax(axis=1), states) == want
    for _ in range(50):  # the first allowed token ties with tokens outside the row's best 64
        row = np.zeros(500, dtype=np.float32)
        high = rng.choice(500, 60, replace=False)
        row[high] = 5.0  # rejected; the best 64 then end in 4 of the 440 zeros, whichever the partition takes
        ok = rng.random(500) < 0.3
        ok[high] = False
        st = Allows(ok)
        assert greedy_rows(row[None], row[None].argmax(axis=1), [st]) == [int(np.flatnonzero(ok)[0])]


def test_a_point_mass_draft_is_cut_at_the_first_rejected_token_and_a_sampled_one_after_it():
    class Only:  # allows tokens below 10; each state is its depth
        def __init__(self, depth=0):
            self.depth = depth

        def allows(self, token):
            return token < 10

        def after(self, token):
            return Only(self.depth + 1)

    draft = Draft([1, 2, 50, 3], None, source="lookup", k=4)
    cut, states = along(draft, Only(), Sampler())
    assert cut.tokens == [1, 2] and [s.depth for s in states] == [0, 1, 2]
    q = np.full((4, 64), 1 / 64)
    cut, states = along(Draft([1, 2, 50, 3], q, source="model", k=4), Only(), Sampler(temp=1.0))
    assert cut.tokens == [1, 2, 50] and cut.q.shape == (3, 64) and states[-1] is None  # kept, its row unused


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_bad_schemas_and_grammars_are_one_line_before_any_model_loads(tmp_path):
    bad_gbnf = tmp_path / "bad.gbnf"
    bad_gbnf.write_text('root ::= "a" | undefined-rule\n')
    cases = [
        (("--json-schema", "{not json"), "--json-schema is not valid JSON"),
        (("--json-schema", '{"type": "wat"}'), "--json-schema: the converter cannot express this schema"),
        (("--json-schema", '{"a":' * 5000 + "1" + "}" * 5000), "--json-schema is nested too deeply to read"),
        (("--json-schema", '{"enum": []}'), "--json-schema: no value satisfies it, or the converter cannot express it"),
        (("--json-schema", tmp_path / "missing.json"), "is not a file nor a JSON object"),
        (("--grammar", bad_gbnf), "the grammar does not parse: Undefined rule identifier 'undefined-rule'"),
        (("--grammar", tmp_path / "missing.gbnf"), "--grammar: "),
        (("--grammar", bad_gbnf, "--json-schema", "{}"), "give one of them"),
    ]
    for args, message in cases:  # the target does not exist: the constraint is refused before it is looked at
        r = cli("generate", "hi", "--target", tmp_path / "no-model.gguf", *args)
        assert r.returncode == 2 and message in one_line_error(r.stderr), (args, r.stderr)


def test_json_says_whether_the_constrained_answer_is_whole(models, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}))
    args = ["generate", "hello", "--target", models["target"], "--no-chat", "--json", "-t", "2"]
    short = cli(*args, "-n", "3", "--json-schema", schema)
    assert short.returncode == 0, short.stderr
    out = json.loads(short.stdout)
    assert out["stop_reason"] == "max_tokens" and out["valid"] is False
    assert "before its grammar was complete" in short.stderr
    free = json.loads(cli(*args, "-n", "3").stdout)
    assert free["valid"] is None  # unconstrained


def test_bench_prompt_files_carry_a_schema_or_grammar_per_prompt(capsys, models, tmp_path):
    from test_bench import bench

    from specdec_cli.bench import suite

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"category": "enum", "prompt": "hello", "grammar": GRAMMARS["enum"][0]}) + "\n"
        + json.dumps({"category": "free", "prompt": "once upon a time"}) + "\n"
    )  # fmt: skip
    code, doc, rows, err = bench(capsys, models, tmp_path, "--prompts", str(prompts), "--drafters", "none,model",
                                 "--draft-tokens", "3")  # fmt: skip
    assert code == 0, err
    assert all(r["identical_to_baseline"] == 1.0 for r in doc["rows"])  # constrained rows stay exact
    loaded = suite.load(str(prompts), None)
    assert loaded[0].gbnf == GRAMMARS["enum"][0] and loaded[1].gbnf is None
    prompts.write_text(json.dumps({"prompt": "x", "schema": {"type": "wat"}}) + "\n")
    with pytest.raises(Exception, match=r"p.jsonl:1: --json-schema: the converter cannot express"):
        suite.load(str(prompts), None)


def test_what_the_grammar_forces_is_drafted_and_accepted(models, frozen_costs):
    """A long literal the grammar forces: auto drafts it (drafting/forced.py) with no copy to follow."""
    gbnf, _ = GRAMMARS["literal"]
    with open_session(config(models, None, drafter="lookup", draft_tokens=None, max_tokens=40, gbnf=gbnf,
                             lookup_cache=False)) as s:  # fmt: skip
        plain, alone, _ = run_engine(s, "hello", drafter="none")
        tokens, stats, _ = run_engine(s, "hello")
    assert tokens == plain
    assert stats.by_drafter["lookup"].accepted >= 20 and stats.rounds < alone.rounds / 2


def forced_for(s, gbnf: str):
    from specdec_cli.drafting.forced import Forced

    tokenize = functools.partial(s.target.tokenize, special=False)
    return Forced(Grammar(s.target, gbnf).start(), tokenize, s.target.piece), tokenize


def test_optional_whitespace_follows_the_answers_habit_and_says_how_steady_it_is(models):
    """Where whitespace is optional, what the answer wrote after the same character before (after a number:
    after the numbers before), how steadily: once, a habit; every time of several, steady; '{' never met
    before: JSON's common style (no whitespace), a guess. (Newlines: this tokenizer writes spaces as U+2581.)"""
    from specdec_cli.drafting.forced import GUESS, HABIT, STEADY, SURE

    gbnf = (
        r'root ::= "{" ws "\"a\"" ws ":" ws [0-9] ws "," ws "\"b\"" ws ":" ws [0-9] ws "," ws "\"c\"" ws ":" ws [0-9] ws "}"'
        + "\nws ::= [\\n]?"
    )
    with open_session(config(models, None, drafter="none", lookup_cache=False)) as s:
        forced, tokenize = forced_for(s, gbnf)
        prompt = s.prompt_tokens("hello")
        forced.prefill(prompt[:-1])
        c = forced.candidate(prompt + tokenize("{"), 30)  # '{': no habit yet, the style's none
        assert bytes(s.target.piece(c.tokens[0])) == b'"' and c.at[0] == GUESS
        c = forced.candidate(prompt + tokenize('{"a":1,\n"b":2'), 30)
        text = b"".join(s.target.piece(t) for t in c.tokens)
        assert text == b',\n"c":' and c.at[:3] == (HABIT, HABIT, SURE)  # after a number, after a comma
        c = forced.candidate(prompt + tokenize('{"a":1,\n"b":2,\n"c":3'), 30)
        assert b"".join(s.target.piece(t) for t in c.tokens[:-1]) == b"}" and c.at[0] == STEADY  # twice so
