"""specdec bench on the tiny fixtures: every configuration runs, files agree, interruption keeps rows."""

from __future__ import annotations

import csv
import json
import os
import threading
import xml.etree.ElementTree as ET

import pytest

from specdec_cli.bench import report, suite
from specdec_cli.cli import main
from specdec_cli.drafting.cost import Costs, expected_tokens_per_round, predicted_speedup
from specdec_cli.errors import UsageError


def bench(capsys, models, tmp_path, *extra: str) -> tuple[int, dict | None, list[dict], str]:
    j, c = tmp_path / "b.json", tmp_path / "b.csv"
    code = main([
        "bench", "--target", str(models["target"]), "--draft", str(models["draft"]), "-n", "8", "-t", "2",
        "--json", str(j), "--csv", str(c), *extra,
    ])  # fmt: skip
    out, err = capsys.readouterr()
    doc = json.loads(j.read_text()) if j.exists() else None
    rows = list(csv.DictReader(c.open())) if c.exists() else []
    return code, doc, rows, out + err


def test_sweep_runs_every_configuration_and_category(capsys, models, tmp_path):
    code, doc, rows, out = bench(
        capsys, models, tmp_path, "--draft-tokens", "1,3", "--temps", "0,0.7", "--categories", "code,chat",
        "--plot", str(tmp_path / "b.svg"),
    )  # fmt: skip
    assert code == 0, out
    got = {(r["drafter"], r["draft_tokens"], r["temp"], r["category"]) for r in doc["rows"]}
    configs = [("none", 0), ("model", 1), ("model", 3), ("lookup", 1), ("lookup", 3), ("auto", "auto")]
    assert got == {(d, k, t, c) for d, k in configs for t in (0.0, 0.7) for c in ("all", "code", "chat")}
    assert all(r["prompts"] == 6 for r in doc["rows"] if r["category"] == "all")
    assert doc["recommendation"] and "cost curve" in out
    assert set(doc) >= {"machine", "models", "cost_curve", "rows"}
    assert set(doc["cost_curve"]["target_seconds"]) == {str(n) for n in range(1, 17)}
    ET.parse(tmp_path / "b.svg")  # a well-formed SVG


def test_baseline_speedup_is_one_and_greedy_rows_match_it(capsys, models, tmp_path):
    code, doc, _, _ = bench(capsys, models, tmp_path, "--draft-tokens", "2", "--categories", "math")
    assert code == 0
    for r in doc["rows"]:
        if r["drafter"] == "none":
            assert r["speedup"] == 1.0 and r["predicted_speedup"] == 1.0
        assert r["identical_to_baseline"] == 1.0  # F32 fixtures: speculation is exact
        assert 0 < r["draft_share"] + r["verify_share"] <= 1
    model = next(r for r in doc["rows"] if r["drafter"] == "model" and r["category"] == "all")
    assert 0 < model["accept_rate"] <= 1 and len(model["per_position_accept"]) == 2


def test_branch_rows_for_the_draft_model_and_auto(capsys, models, tmp_path):
    code, doc, rows, out = bench(
        capsys, models, tmp_path, "--drafters", "none,model,auto", "--draft-tokens", "3", "--branches", "1,2,3",
        "--categories", "code",
    )  # fmt: skip
    assert code == 0, out
    got = [(r["drafter"], r["branches"]) for r in doc["rows"] if r["category"] == "all"]
    assert got == [("none", 1), ("model", 1), ("model", 2), ("model", 3), ("auto", 1), ("auto", 2), ("auto", 3)]
    for r in doc["rows"]:
        assert r["identical_to_baseline"] == 1.0  # F32 fixtures: trees are exact too
        assert len(r["branch_wins"]) <= r["branches"] and r["mean_branches"] <= r["branches"]
    assert {r["branches"] for r in rows} == {"1", "2", "3"}
    assert "b=3" in out  # the category table names the branch count


def test_json_and_csv_agree(capsys, models, tmp_path):
    code, doc, rows, _ = bench(capsys, models, tmp_path, "--draft-tokens", "1,2", "--categories", "rag")
    assert code == 0 and len(rows) == len(doc["rows"])
    for a, b in zip(doc["rows"], rows):
        assert b["drafter"] == a["drafter"] and b["draft_tokens"] == str(a["draft_tokens"])
        assert b["category"] == a["category"] and float(b["temp"]) == a["temp"]
        for key in ("tokens_per_second", "speedup", "accept_rate", "mean_accepted", "predicted_speedup"):
            if a[key] is None:  # auto predicts per round, not per row
                assert b[key] == "" and a["drafter"] == "auto", key
            else:
                assert float(b[key]) == pytest.approx(a[key]), key
        assert [float(x) for x in b["per_position_accept"].split()] == a["per_position_accept"]


def test_interruption_keeps_finished_rows(capsys, models, tmp_path, monkeypatch):
    real = report.rows_for
    calls = []

    def interrupt_on_second_row(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(report, "rows_for", interrupt_on_second_row)
    code, doc, rows, out = bench(capsys, models, tmp_path, "--draft-tokens", "1,2", "--categories", "code")
    assert code == 130
    assert doc["interrupted"] is True
    assert {(r["drafter"], r["category"]) for r in doc["rows"]} == {("none", "all"), ("none", "code")}
    assert len(rows) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.csv", "b.json"]  # no temporary files left


def test_expected_tokens_per_round():
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens_per_round(0.9, 0) == 1.0


def test_predicted_speedup_arithmetic():
    curve = Costs({1: 0.030, 2: 0.050, 3: 0.070, 4: 0.087}, draft=0.006)
    # E = (1 - 0.8^4) / 0.2 = 2.952; cost = 3 * 6 ms + 87 ms = 105 ms; 2.952 * 30 / 105 = 0.8434
    assert predicted_speedup(curve, 0.8, 3) == pytest.approx(2.952 * 0.030 / 0.105)
    assert predicted_speedup(curve, 0.8, 0) == 1.0
    assert curve.draft_ratio == pytest.approx(0.2) and curve.relative(4) == pytest.approx(2.9)


def test_the_bench_measures_once_and_auto_starts_from_that_measurement(capsys, models, tmp_path, monkeypatch):
    from specdec_cli.drafting import auto, measure as costmodel

    calls, seen, catch_up = [], [], []
    real_measure, real_init = costmodel.measure, auto.AutoDrafter.__init__

    def measure(*args, **kw):
        calls.append(kw.get("thorough", False))
        return real_measure(*args, **kw)

    def init(self, costs, *rest, **kw):
        seen.append(costs)
        catch_up.append(costs.draft_catch_up)  # as auto starts (its rounds refine it)
        real_init(self, costs, *rest, **kw)

    monkeypatch.setattr(costmodel, "measure", measure)
    monkeypatch.setattr(auto.AutoDrafter, "__init__", init)
    code, doc, _, out = bench(capsys, models, tmp_path, "--drafters", "none,auto", "--categories", "code")
    assert code == 0, out
    assert calls == [True]  # one thorough measurement: auto does not time the machine again
    curve = doc["cost_curve"]
    assert seen and all(c.measured == seen[0].measured for c in seen)  # one session, one Costs
    assert {str(n): round(t, 6) for n, t in seen[0].measured.items()} == curve["target_seconds"]
    assert round(catch_up[0], 6) == curve["draft_catch_up_seconds"]


def test_costs_keep_the_measured_plain_cost_and_catch_up():
    c = Costs({1: 0.030, 2: 0.050, 4: 0.080}, draft=0.006, n_max=8, plain=0.028, draft_catch_up=0.010)
    assert c.verify(1) == c.plain == 0.028  # a round that drafts nothing is plain decoding
    assert c.measured[1] == 0.030  # ...while the report keeps t(1) as timed after a draft decode
    assert c.catch_up(2) == pytest.approx(0.004)  # measured: what auto and the bench's prediction both use
    assert c.catch_up(3) == pytest.approx(0.006 * (0.065 / 0.028 - 1))  # beyond: scaled by the target's curve
    copy = c.copy(16)
    assert len(copy.table) == 16 and copy.verify(8) == pytest.approx(0.16) and copy.plain == 0.028
    copy.observe_verify(2, 0.06)
    assert c.verify(2) == 0.050  # the copy refines on its own
    assert report.cost_curve(c)["target_relative"] == {"1": 1.071, "2": 1.786, "4": 2.857}


def _row(drafter, k, speedup, temp=0.0):
    return {"drafter": drafter, "draft_tokens": k, "temp": temp, "category": "all", "speedup": speedup,
            "generation_speedup": speedup * 1.1, "accept_rate": 0.9, "mean_accepted": 3.1}  # fmt: skip


def test_recommendation_names_the_best_configuration_or_says_why_not():
    cheap = Costs({n: 0.03 * (1 + 0.05 * (n - 1)) for n in range(1, 17)}, draft=0.003)
    text = report.recommendation([_row("none", 0, 1.0), _row("model", 2, 1.2), _row("model", 4, 1.4)], cheap)
    assert text.startswith("Use --drafter model -k 4: 1.40x")
    costly = Costs({1: 0.028, 2: 0.05, 3: 0.069, 4: 0.081, 5: 0.1}, draft=0.016)
    text = report.recommendation([_row("none", 0, 1.0), _row("model", 3, 0.75)], costly)
    assert text.startswith("Speculation does not pay here") and "c = 0.57" in text and "2.89x" in text
    assert "--drafter none" in text


def test_builtin_suite_covers_the_spec_bench_categories():
    cats = {p.category for p in suite.SUITE}
    assert cats == {"code", "code-edit", "chat", "summarise", "math", "translate", "rag"}
    assert all(sum(p.category == c for p in suite.SUITE) >= 3 for c in cats)


def test_prompts_from_jsonl_and_plain_text(tmp_path):
    j = tmp_path / "p.jsonl"
    j.write_text('{"category": "a", "prompt": "one"}\n\n{"category": "b", "prompt": "two\\nlines"}\n')
    assert [(p.category, p.text) for p in suite.load(str(j), None)] == [("a", "one"), ("b", "two\nlines")]
    assert [p.text for p in suite.load(str(j), ["b"])] == ["two\nlines"]
    t = tmp_path / "p.txt"
    t.write_text("first prompt\nsecond\n")
    assert [(p.category, p.text) for p in suite.load(str(t), None)] == [("file", "first prompt"), ("file", "second")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--draft-tokens", "0"], "--draft-tokens must be between 1 and 63"),
        (["--draft-tokens", "a,b"], "--draft-tokens: cannot read 'a,b'"),
        (["--temps", "-1"], "--temps must be >= 0"),
        (["--runs", "0"], "--runs must be at least 1"),
        (["--plot", "chart.png"], "--plot writes SVG"),
        (["--drafters", "magic"], "unknown drafter 'magic'"),
        (["--branches", "0,2"], "--branches must be between 1 and 8"),
        (["--branches", "2", "--drafters", "none,lookup"], "--branches 2 needs a draft model"),
        (["--categories", "poetry"], "unknown category poetry"),
        (["--prompts", "missing.jsonl"], "is neither a file nor the suite name"),
        (["--seed", "-1"], "--seed must be >= 0 (got -1)"),
        (["-c", "64"], "-c/--ctx-size must be at least 80 for bench (got 64)"),
        (["--exact", "yes"], "--exact must be on, off or both (got 'yes')"),
    ],
)
def test_bad_options_are_clean_errors(capsys, models, args, message):
    code = main(["bench", "--target", str(models["target"]), "--draft", str(models["draft"]), *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err.splitlines()[0], err


def test_model_drafter_needs_a_draft(capsys, models):
    code = main(["bench", "--target", str(models["target"]), "--drafters", "none,model"])
    assert code == 2 and "--drafters model needs a draft model" in capsys.readouterr().err


def test_predicted_speedup_counts_the_drafts_catch_up_and_plain_cost():
    curve = Costs({1: 0.030, 2: 0.050, 3: 0.070, 4: 0.087}, draft=0.006, plain=0.028, draft_catch_up=0.010)
    # After a fully accepted round (probability a^k) the draft feeds 2 tokens: +4 ms with probability 0.8^3.
    draft_round = 3 * 0.006 + 0.8**3 * 0.004
    assert curve.draft_round(0.8, 3) == pytest.approx(draft_round)
    assert predicted_speedup(curve, 0.8, 3) == pytest.approx(2.952 * 0.028 / (draft_round + 0.087))
    assert curve.draft_ratio == pytest.approx(0.006 / 0.028)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": null}', '"prompt" must be a non-empty string, not null'),
        ('{"prompt": 42, "category": "a"}', '"prompt" must be a non-empty string, not 42'),
        ('{"prompt": "  "}', '"prompt" must be a non-empty string, not "  "'),
        ('{"prompt": "hi", "category": null}', '"category" must be a non-empty string, not null'),
        ('{"prompt": "hi", "category": ["a"]}', '"category" must be a non-empty string, not ["a"]'),
        ('{"category": "a"}', 'expected a JSON object with a "prompt"'),
        ("null", 'expected a JSON object with a "prompt"'),
    ],
)
def test_a_prompt_line_that_is_not_text_is_refused_with_its_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text(f'{{"prompt": "fine"}}\n{line}\n')
    with pytest.raises(UsageError) as e:
        suite.load(str(path), None)
    assert e.value.message.startswith(f"{path}:2: {message}")


def test_prompts_from_a_fifo_are_read_once(tmp_path):
    fifo = tmp_path / "prompts"  # what bash's <(...) gives: a pipe, no suffix
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "w") as f:
            f.write('{"category": "a", "prompt": "one"}\n{"prompt": "two"}\n')

    threading.Thread(target=feed, daemon=True).start()
    assert [(p.category, p.text) for p in suite.load(str(fifo), None)] == [("a", "one"), ("file", "two")]


def test_ctx_size_is_an_option_and_a_too_long_prompt_names_it(capsys, models, tmp_path):
    code, doc, _, out = bench(capsys, models, tmp_path, "--drafters", "none", "--categories", "math", "-c", "256")
    assert code == 0, out
    assert doc["settings"]["ctx_size"] == 256
    long = tmp_path / "long.txt"
    long.write_text("word " * 400 + "\n")
    code = main(["bench", "--target", str(models["target"]), "--prompts", str(long), "-c", "256", "-t", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "\nerror: the prompt has " in err, err  # the wording is session.prompt_tokens'
    assert "\nhint: raise -c/--ctx-size or shorten the prompt" in err, err


def test_exact_both_runs_each_configuration_in_both_modes_side_by_side(capsys, models, tmp_path):
    code, doc, rows, out = bench(
        capsys, models, tmp_path, "--draft-tokens", "3", "--branches", "1,2", "--categories", "code", "--exact", "both"
    )
    assert code == 0, out
    everything = [r for r in doc["rows"] if r["category"] == "all"]
    labels = {(r["drafter"], r["branches"], r["exact"]) for r in everything}
    configs = {("none", 1), ("model", 1), ("model", 2), ("lookup", 1), ("auto", 1), ("auto", 2)}
    assert labels == {(d, b, e) for d, b in configs for e in (False, True)}
    for r in everything:
        # exact rows: identical to the exact baseline, always; measured beside the fast baseline too
        assert (r["speedup_vs_fast"] is not None) == r["exact"]
        if r["exact"]:
            assert r["identical_to_baseline"] == 1.0 and r["speedup_vs_fast"] > 0, r
    assert doc["settings"]["exact"] == [False, True] and "cost_curve_exact" in doc
    assert "vs fast" in out and "(exact)" in out
    assert {row["exact"] for row in rows} == {"True", "False"}  # the CSV has the column too


def test_the_category_table_turns_to_a_row_per_category_when_there_are_many():
    """A schema each (scripts/structured.jsonl): twelve categories read down, not across."""
    from rich.console import Console

    from specdec_cli.ui.bench import _category_table

    def rows(n: int) -> list[dict]:
        return [
            {"drafter": d, "draft_tokens": None, "branches": 1, "temp": 0.0, "category": f"schema-{i}", "speedup": 1.0 + i / 100}
            for d in ("none", "auto") for i in range(n)
        ]  # fmt: skip

    def text(n: int) -> str:
        console = Console(width=200, record=True)
        console.print(_category_table(rows(n), [f"schema-{i}" for i in range(n)]))
        return console.export_text()

    many, few = text(12), text(3)
    assert len(many.splitlines()) > 12 and "schema-11" in many and "1.11x" in many
    assert len(few.splitlines()) < 10 and all(f"schema-{i}" in few.splitlines()[2] for i in range(3))
