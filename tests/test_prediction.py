"""Predicted outputs (OpenAI's `prediction`): the text the answer is expected to repeat is lookup's first source,
followed through the answer's edits by a cursor. It changes how fast the answer comes, never the answer; the
statistics count its draft tokens accepted and rejected."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import cheap_verification, run_engine
from test_cli import JSON_STATS, one_line_error, specdec
from test_round_loop import EOS, FakeContext

from specdec_cli import drafting
from specdec_cli.drafting.lookup import LookupDrafter
from specdec_cli.drafting.prediction import Prediction
from specdec_cli.engine.kv import Sequence
from specdec_cli.engine.sampling import Sampler
from specdec_cli.engine.speculative import Settings, generate
from specdec_cli.engine.stats import Stats, collect

GREEDY = Sampler()
RNG = np.random.default_rng(0)
NL = 10  # a token that ends a line
T, EQ, Z, C, S, A = range(50, 56)  # `total`, ` =`, ` 0`, `count`, `skipped`, `amount`
NEW = [70, 71]  # `subtotal`: two tokens where the old name took one
CODE = [5, 6, 7, NL, T, EQ, Z, NL, C, EQ, Z, NL, S, EQ, Z, NL, T, EQ, A, NL, 8, 9, NL]
PROMPT = [1, 2, 3]  # the prompt does not hold the code: only the prediction does


def newline(t: int) -> bool:
    return t == NL


def predicting(code: list[int] = CODE) -> LookupDrafter:
    return LookupDrafter(prediction=Prediction(code, newline), newline=newline)


# --- the cursor, on token lists -----------------------------------------------------------------
def test_the_prediction_is_drafted_from_the_answers_first_token():
    draft = predicting().propose(PROMPT, 4, GREEDY, RNG)
    assert draft.tokens == CODE[:4] and draft.from_prediction == (0, 1, 2, 3)
    assert LookupDrafter().propose(PROMPT, 4, GREEDY, RNG).tokens == []  # nothing in the text to copy


def test_the_cursor_follows_the_answer_and_rejoins_just_past_an_edit():
    d = predicting()
    answer = CODE[:4]
    assert d.propose(PROMPT, 4, GREEDY, RNG).tokens == CODE[:4]
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == [T, EQ, Z, NL]  # advanced over what it wrote
    answer += [*NEW, EQ]  # the answer renames `total`: ` =` follows it in four places of the prediction
    draft = d.propose(PROMPT + answer, 4, GREEDY, RNG)
    assert draft.tokens == [Z, NL, C, EQ]  # where the edit left it, not the latest ` =`
    assert draft.match >= 2


def test_a_rename_is_drafted_from_the_prediction_once_made_or_named_by_the_instruction():
    d = predicting()
    d.propose(PROMPT, 4, GREEDY, RNG)
    answer = [*CODE[:4], *NEW, EQ]  # `total` renamed at its first occurrence
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == [Z, NL, C, EQ]
    answer += CODE[6:16]  # up to the next `total`
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == [*NEW, EQ, A]
    told = LookupDrafter(prediction=Prediction(CODE, newline), newline=newline, renames=(((T,), tuple(NEW)),))
    told.propose(PROMPT, 4, GREEDY, RNG)
    assert told.propose(PROMPT + CODE[:4], 4, GREEDY, RNG).tokens == [*NEW, EQ, Z]
    answer = [*CODE[:4], T]  # the answer did not make it here after all: no longer assumed
    assert told.propose(PROMPT + answer, 4, GREEDY, RNG).tokens[:3] == [EQ, Z, NL]
    assert told.propose(PROMPT + answer + CODE[5:16], 3, GREEDY, RNG).tokens == [T, EQ, A]


def test_a_rewritten_line_goes_on_at_the_next_line_and_inserted_lines_at_the_one_they_precede():
    d = predicting()
    d.propose(PROMPT, 4, GREEDY, RNG)
    answer = CODE[:4] + [T, 99, 98, NL]  # the line `total = 0` rewritten, ending where nothing matches
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == [C, EQ, Z, NL]
    d = predicting()
    d.propose(PROMPT, 4, GREEDY, RNG)
    answer = [97, 96, NL]  # a line before the code (a code fence): the code's first line comes next
    assert d.propose(PROMPT + answer, 4, GREEDY, RNG).tokens == CODE[:4]


def test_auto_offers_the_prediction_first_and_trusts_it_from_the_start():
    auto = drafting.build(
        "auto", drafting.Sources(k=None, costs=cheap_verification, draft=None, prediction=tuple(CODE))
    )
    draft = auto.propose(PROMPT, 8, GREEDY, RNG)
    assert draft.offers[0].source == "prediction" and draft.tokens == CODE[:8]
    assert draft.from_prediction == tuple(range(8))
    plain = drafting.build("auto", drafting.Sources(k=None, costs=cheap_verification, draft=None))
    assert plain.propose(PROMPT, 8, GREEDY, RNG).tokens == []


# --- the counts, through the round loop (the fake target counts: after t comes t + 1) ---------------
def counted(drafter, **settings) -> tuple[list[int], Stats]:
    r = collect(generate(Sequence(FakeContext()), drafter, [1, 2, 3], Settings(debug=True, **settings)))
    return r.tokens, r.stats


@pytest.mark.parametrize("name", ["lookup", "auto"])
def test_a_perfect_prediction_is_accepted_whole_and_a_wrong_one_rejected_with_the_same_answer(name):
    def drafter(prediction: list[int]):
        sources = drafting.Sources(k=4 if name == "lookup" else None, costs=cheap_verification, draft=None)
        return drafting.build(name, drafting.Sources(**{**sources.__dict__, "prediction": tuple(prediction)}))

    alone, _ = counted(
        drafting.build("none", drafting.Sources(k=4, costs=cheap_verification, draft=None)), max_tokens=30
    )
    assert alone == list(range(4, 34))
    k = {"draft_tokens": 4} if name == "lookup" else {}
    tokens, stats = counted(drafter(list(range(4, EOS))), max_tokens=30, **k)
    assert tokens == alone and stats.prediction_accepted == stats.accepted == stats.drafted > 0
    assert stats.prediction_rejected == 0 and stats.rounds < 30
    wrong = [*range(4, 12), 40, 41, *range(14, EOS)]  # two tokens the answer does not write
    tokens, stats = counted(drafter(wrong), max_tokens=30, **k)
    assert tokens == alone and stats.prediction_rejected > 0 and stats.prediction_accepted > 0


# --- through a session, on the tiny fixtures ----------------------------------------------------
PROMPT_TEXT = "once upon a time"


@pytest.mark.parametrize(
    "drafter, k, draft",
    [("lookup", 4, None), ("lookup", None, None), ("auto", None, None), ("auto", None, "draft"), ("model", 4, "draft"),
     ("none", 4, None)],
)  # fmt: skip
def test_greedy_output_is_the_same_with_and_without_a_prediction(open_pair, frozen_costs, drafter, k, draft):
    s = open_pair(draft, drafter=drafter, draft_tokens=k, max_tokens=48)
    alone, _, text = run_engine(s, PROMPT_TEXT, drafter="none", draft_tokens=4)
    plain, stats, _ = run_engine(s, PROMPT_TEXT)
    assert plain == alone and stats.prediction_tokens is None and "prediction_accepted" not in stats.as_dict()
    counts = []
    for prediction in (text, "a wrong guess " * 8):  # the answer's own text (its bytes that decode), and not
        tokens, stats, _ = run_engine(s, PROMPT_TEXT, prediction=prediction)
        assert tokens == alone, prediction
        assert stats.prediction_tokens == len(s.target.tokenize(prediction, special=False))
        assert {"prediction_accepted", "prediction_rejected"} <= set(stats.as_dict())
        counts.append((stats.prediction_accepted, stats.prediction_rejected))
    if not drafting.kind(drafter).lookup:  # the draft model and plain decoding do not read it
        assert counts == [(0, 0), (0, 0)]
    elif draft is None:  # (with a draft model on this cheap curve, auto may choose the model every round)
        assert counts[0][0] > 0 and counts[1][0] == 0


# --- the command line ---------------------------------------------------------------------------
def test_prediction_file_errors_are_one_line_and_exit_2(capsys, models, tmp_path):
    target = ["--target", str(models["target"]), "-n", "4", "-t", "2"]
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"abc\0def")
    for path, message in [
        (tmp_path / "missing.py", "does not exist"),
        (tmp_path, "is a directory"),
        (binary, "is binary"),
    ]:
        code, _, err = specdec(capsys, "generate", "hi", *target, "--prediction", str(path))
        assert code == 2 and message in one_line_error(err) and "--prediction" in err, err
    code, _, err = specdec(capsys, "batch", str(tmp_path / "r.jsonl"), "-o", str(tmp_path / "o.jsonl"), *target,
                           "--prediction", str(tmp_path / "missing.py"))  # fmt: skip
    assert code == 2 and "does not exist" in one_line_error(err)
    code, _, err = specdec(capsys, "serve", "--prediction", str(binary))  # a request's own, not the server's
    assert code == 2 and "No such option" in err


def test_generate_shows_the_prediction_counts_only_when_given_one(capsys, models, tmp_path):
    args = ["generate", PROMPT_TEXT, "--target", str(models["target"]), "--drafter", "lookup", "-n", "24", "-t", "2",
            "--no-lookup-cache"]  # fmt: skip
    code, out, _ = specdec(capsys, *args, "--json")
    assert code == 0
    stats = json.loads(out)["stats"]
    assert JSON_STATS <= set(stats) and not any(key.startswith("prediction") for key in stats)
    predicted = tmp_path / "expected.txt"
    predicted.write_text(json.loads(out)["text"])
    code, out2, _ = specdec(capsys, *args, "--json", "--prediction", str(predicted))
    assert code == 0 and json.loads(out2)["tokens"] == json.loads(out)["tokens"]
    stats = json.loads(out2)["stats"]
    assert stats["prediction_accepted"] > 0 and stats["prediction_tokens"] > 0 and "prediction_rejected" in stats
    code, _, err = specdec(capsys, *args, "--prediction", str(predicted))
    assert code == 0 and "prediction" in err and "draft tokens accepted" in err


def test_batch_applies_the_prediction_to_every_request(capsys, models, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps({"custom_id": f"r{i}", "prompt": PROMPT_TEXT, "max_tokens": 24}) + "\n"
                                for i in range(2)))  # fmt: skip
    predicted = tmp_path / "expected.txt"
    predicted.write_text("a guess at the answer\n")
    out = tmp_path / "results.jsonl"
    code, _, err = specdec(capsys, "batch", str(requests), "-o", str(out), "--target", str(models["target"]),
                           "--drafter", "lookup", "-t", "2", "--prediction", str(predicted))  # fmt: skip
    assert code == 0, err
    results = [json.loads(line)["response"]["body"]["speculative"] for line in out.read_text().splitlines()]
    assert len(results) == 2 and all(r["prediction_tokens"] > 0 and "prediction_rejected" in r for r in results)
    assert "draft tokens accepted" in err  # the summary's row
