"""Auto's cost curve kept between processes (drafting/curves.py): a second process reuses it, a damaged file
is one warning and is replaced, a changed model file or --remeasure measures again, a stale or drifted
curve is not used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from specdec_cli.drafting import curves, measure


def generate(*args: str) -> tuple[dict, str]:
    r = subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", "hi", "-n", "4", "-t", "1", "--no-lookup-cache", "--json",
         *args], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def pair(models) -> tuple[str, ...]:
    return ("--target", str(models["target"]), "--draft", str(models["draft"]))


def test_a_second_process_reuses_the_curve_and_remeasure_measures_again(models, own_cost_curves):
    first, _ = generate(*pair(models))
    assert first["stats"]["cost_curve"] == "measured" and len(list(own_cost_curves.glob("*.json"))) == 1
    second, _ = generate(*pair(models))
    assert second["stats"]["cost_curve"] == "cached"
    assert second["tokens"] == first["tokens"]  # where the costs came from never changes the text
    again, _ = generate(*pair(models), "--remeasure")
    assert again["stats"]["cost_curve"] == "measured"
    plain, _ = generate("--target", str(models["target"]), "--drafter", "none")
    assert plain["stats"]["cost_curve"] is None  # target-only: no curve is measured, read or written


def test_a_damaged_curve_is_one_warning_and_is_replaced(models, own_cost_curves):
    generate(*pair(models))
    (kept,) = own_cost_curves.glob("*.json")
    good = json.loads(kept.read_text())
    absurd = {**good, "verify": {"1": 1e308, "99999999999": 1e-300}}  # would overflow the cost model's arithmetic
    for damage in (
        b"garbage",
        b'{"version": 1}',
        json.dumps({**good, "draft": -1}).encode(),
        json.dumps(absurd).encode(),
    ):
        kept.write_bytes(damage)
        out, err = generate(*pair(models))
        assert out["stats"]["cost_curve"] == "measured" and err.count("warning: ignored a damaged cost curve") == 1
        assert json.loads(kept.read_text())["key"] == kept.stem  # the measurement replaced it


def test_a_fifo_or_a_huge_file_in_place_of_a_curve_is_a_warning_not_a_hang(models, own_cost_curves):
    generate(*pair(models))
    (kept,) = own_cost_curves.glob("*.json")
    kept.unlink()
    os.mkfifo(kept)  # a plain read would wait for a writer forever
    out, err = generate(*pair(models))
    assert out["stats"]["cost_curve"] == "measured" and "not a regular file" in err and kept.is_file()
    kept.write_bytes(b" " * (curves.MAX_FILE + 1))
    out, err = generate(*pair(models))
    assert out["stats"]["cost_curve"] == "measured" and "larger than a curve" in err
    kept.unlink()
    kept.mkdir()  # a folder in its place: read as "not a regular file", and the run goes on (nothing kept)
    out, err = generate(*pair(models))
    assert out["stats"]["cost_curve"] == "measured" and "not a regular file" in err and kept.is_dir()


def test_a_changed_model_file_is_measured_again(models, tmp_path, own_cost_curves):
    target = tmp_path / "target.gguf"
    shutil.copy(models["target"], target)
    args = ("--target", str(target), "--draft", str(models["draft"]))
    assert generate(*args)[0]["stats"]["cost_curve"] == "measured"
    first = {p.name for p in own_cost_curves.glob("*.json")}
    assert generate(*args)[0]["stats"]["cost_curve"] == "cached"
    shutil.copy(models["same"], target)  # another model under the same name
    assert generate(*args)[0]["stats"]["cost_curve"] == "measured"
    # Kept under another key. (The first curve may be gone: a cached run on a busy machine whose plain decoding
    # drifted from the kept figure drops it, measure.Curve.check_drift.)
    assert {p.name for p in own_cost_curves.glob("*.json")} - first


def test_a_curve_older_than_a_day_is_not_used(own_cost_curves):
    curves.save("k", dict(verify={1: 0.01, 2: 0.012}, draft=0.002, plain=None, draft_catch_up=None))
    assert curves.load("k", print)["verify"] == {1: 0.01, 2: 0.012}
    data = json.loads((own_cost_curves / "k.json").read_text())
    data["saved_at"] = time.time() - curves.MAX_AGE - 60
    (own_cost_curves / "k.json").write_text(json.dumps(data))
    assert curves.load("k", print) is None


def test_a_kept_curve_that_auto_sees_drift_is_dropped(own_cost_curves):
    measured = dict(verify={1: 0.01, 4: 0.012, 8: 0.02}, draft=0.002, plain=0.01, draft_catch_up=None)
    curves.save("k", measured)
    curve = measure.Curve(None, None, 8, key="k", kept=curves.load("k", print))
    costs = curve.get([1, 2])
    assert curve.source == "cached" and curve.measurements == 0
    costs.observe_verify(1, 0.012)
    curve.check_drift()  # a little slower: kept
    assert (own_cost_curves / "k.json").exists()
    for _ in range(20):  # the machine got three times slower (another job, a lower clock)
        costs.observe_verify(1, 0.03)
    curve.check_drift()
    assert not (own_cost_curves / "k.json").exists()


def test_an_unwritable_cache_leaves_the_run_as_it_is(models, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("SPECDEC_COST_CURVES", str(blocked / "curves"))
    out, err = generate(*pair(models))
    assert out["stats"]["cost_curve"] == "measured" and "Traceback" not in err
    assert os.path.isfile(blocked)


def test_generate_loads_the_draft_only_where_auto_drafts_with_it(models, own_cost_curves):
    """The draft model is loaded at its first draft: a run on a kept curve where it cannot pay never loads it."""
    first, _ = generate(*pair(models))  # measures, which times the draft: loaded
    assert first["config"]["draft_loaded"] is True
    (kept,) = own_cost_curves.glob("*.json")
    good = json.loads(kept.read_text())
    # A compute-bound machine: verifying n tokens costs n decodes, a draft token 0.9 of one. Even a draft
    # accepted every time cannot pay there.
    steep = {**good, "verify": {str(n): 0.01 * n for n in (1, 2, 4, 8, 16)}, "draft": 0.009, "plain": 0.01}
    kept.write_text(json.dumps(steep))
    skipped, _ = generate(*pair(models))
    assert skipped["config"]["draft_loaded"] is False and skipped["stats"]["cost_curve"] == "cached"
    assert skipped["tokens"] == first["tokens"] and "model" not in skipped["stats"]["by_drafter"]
    flat = {**steep, "verify": {str(n): 0.01 for n in (1, 2, 4, 8, 16)}, "draft": 0.0005, "draft_prefill": 0.0001}
    kept.write_text(json.dumps(flat))  # a GPU's: the draft pays, and is loaded where it first drafts
    drafted, _ = generate(*pair(models), "-n", "12")
    assert drafted["config"]["draft_loaded"] is True and drafted["stats"]["by_drafter"]["model"]["drafted"] > 0
    kept.write_text(json.dumps(steep))
    model, _ = generate(*pair(models), "--drafter", "model", "-k", "3")  # asked for by name: it drafts
    assert model["config"]["draft_loaded"] is True and model["stats"]["by_drafter"]["model"]["drafted"] > 0


def test_the_same_file_by_another_path_shares_its_curve_and_other_threads_do_not(models, tmp_path, own_cost_curves):
    """The curve is the file's, by content and time, not by name: a copy elsewhere that keeps its time, or a link, is
    the same model (as a store's name and a path to it are); -t changes llama.cpp's costs, and is another curve."""
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy2(models["target"], copy)
    link = tmp_path / "link.gguf"
    link.symlink_to(models["target"])
    assert generate(*pair(models))[0]["stats"]["cost_curve"] == "measured"
    for target in (copy, link):
        out, _ = generate("--target", str(target), "--draft", str(models["draft"]))
        assert out["stats"]["cost_curve"] == "cached"
    assert generate(*pair(models), "-t", "2")[0]["stats"]["cost_curve"] == "measured"
    assert len(list(own_cost_curves.glob("*.json"))) == 2


def test_the_machines_measurement_is_told_apart_from_the_prefill(models, own_cost_curves):
    """auto's first run here measures the machine: one line says so while it does (a spinner on a terminal), and its
    seconds are measure_seconds, in the wall time but not the prefill's; a run on the kept curve measures nothing."""
    first, err = generate(*pair(models))
    stats = first["stats"]
    assert stats["cost_curve"] == "measured" and stats["measure_seconds"] > 0
    assert err.count("measuring this machine's costs for auto") == 1
    parts = stats["measure_seconds"] + stats["prefill_seconds"] + stats["generation_seconds"]
    assert abs(stats["wall_seconds"] - parts) < 1e-3  # (rounded to 4 places each)
    second, err = generate(*pair(models))
    assert second["stats"]["measure_seconds"] == 0 and "measuring" not in err


def test_the_panel_shows_the_measurement_on_a_row_of_its_own():
    from specdec_cli.engine.stats import Stats
    from specdec_cli.ui import stat_rows

    rows = dict(stat_rows(Stats(prompt_tokens=18, prefill_seconds=0.05, measure_seconds=3.2)))
    assert rows["prefill"] == "18 prompt tokens in 0.05 s"
    assert rows["cost curve"] == "this machine measured in 3.20 s, before the prefill"
    assert "cost curve" not in dict(stat_rows(Stats(prompt_tokens=18, prefill_seconds=0.05)))


def test_a_model_file_changed_in_place_is_another_computation_even_where_the_samples_miss_the_change(tmp_path):
    """The prefix store must never restore another model's cells: a fine-tune of a few tensors, quantised alike, has
    the same size and may change no sampled block; the file's time tells it apart."""
    from specdec_cli import identity

    f = tmp_path / "model.gguf"
    f.write_bytes(bytes(64 << 20))
    before = identity.file_identity(f)
    with f.open("r+b") as w:  # a byte between the first two sampled blocks
        w.seek(identity.HEAD + identity.SAMPLE + 1000)
        w.write(b"\1")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # (a coarse clock may not have moved)
    assert identity.file_identity(f) != before
    assert identity.file_identity(f)["content"] == before["content"]  # (what the samples alone would have said)
