"""The lookup cache: earlier answers kept on disk as draft sources. Atomic, bounded, safe with several
processes, damaged files ignored and removed, `--no-lookup-cache` reads and writes nothing, clearable."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import config, run_engine

from specdec_cli.drafting import cache as lookup_cache
from specdec_cli.drafting.corpus import Corpus
from specdec_cli.session import open_session

KEY = "0123456789abcdef"


def answer(seed: int, n: int = 64) -> list[int]:
    return np.random.default_rng(seed).integers(0, 150_000, n).tolist()


def test_an_answer_round_trips_and_the_same_answer_is_kept_once(own_lookup_cache):
    path = lookup_cache.save(KEY, answer(1))
    assert path is not None and path.parent == own_lookup_cache / KEY
    lookup_cache.save(KEY, answer(1))
    lookup_cache.save(KEY, answer(2))
    loaded = lookup_cache.load(KEY)
    assert [a.tolist() for a in loaded] == [answer(1), answer(2)] or [a.tolist() for a in loaded] == [
        answer(2),
        answer(1),
    ]
    assert lookup_cache.usage()[0] == 2
    assert lookup_cache.load("another-vocabulary") == []  # keyed by vocabulary: another model's ids mean nothing
    assert lookup_cache.save(KEY, [1, 2, 3]) is None  # too short to be worth a file


def test_the_size_bound_holds_and_the_newest_answers_stay(own_lookup_cache):
    bound = 8 * (lookup_cache.HEADER.size + 4 * 64)  # room for 8 answers
    for seed in range(30):
        lookup_cache.save(KEY, answer(seed), max_bytes=bound)
        os.utime(lookup_cache.folder(KEY), None)
    answers, size = lookup_cache.usage()
    assert size <= bound and answers == 8
    kept = {tuple(a.tolist()) for a in lookup_cache.load(KEY)}
    assert tuple(answer(29)) in kept


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # a crash mid-write on a disk without atomic rename
        lambda data: data[:-4] + b"\xff\xff\xff\xff",  # a changed token: the checksum catches it
        lambda data: b"not a lookup cache file at all",
        lambda data: b"",
    ],
)
def test_a_damaged_file_is_ignored_with_a_warning_and_the_cache_rebuilds(own_lookup_cache, damage):
    good = lookup_cache.save(KEY, answer(1))
    bad = lookup_cache.save(KEY, answer(2))
    bad.write_bytes(damage(bad.read_bytes()))
    warnings: list[str] = []
    loaded = lookup_cache.load(KEY, warnings.append)
    assert [a.tolist() for a in loaded] == [answer(1)]
    assert len(warnings) == 1 and str(bad) in warnings[0] and "damaged" in warnings[0]
    assert not bad.exists() and good.exists()
    lookup_cache.save(KEY, answer(2))  # rebuilt as runs go on
    assert len(lookup_cache.load(KEY)) == 2


WRITER = """
import sys
from specdec_cli.drafting import cache as lookup_cache
import numpy as np
which, bound = int(sys.argv[1]), int(sys.argv[2])
for i in range(150):
    seed = i if i % 3 == 0 else 1000 * which + i  # every third answer both processes write
    lookup_cache.save("0123456789abcdef", np.random.default_rng(seed).integers(0, 150_000, 64).tolist(), bound)
"""


def test_two_processes_writing_at_once_leave_a_whole_bounded_cache(own_lookup_cache):
    bound = 40 * (lookup_cache.HEADER.size + 4 * 64)
    env = {**os.environ, "SPECDEC_LOOKUP_CACHE": str(own_lookup_cache)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), str(bound)], env=env) for w in (1, 2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    warnings: list[str] = []
    loaded = lookup_cache.load(KEY, warnings.append)
    assert warnings == [] and 0 < len(loaded) <= 40
    assert lookup_cache.usage()[1] <= bound
    assert not [p for p in (own_lookup_cache / KEY).iterdir() if not p.name.endswith(".tok")]  # no temporary files left


def test_a_corpus_finds_the_longest_latest_match_and_stops_at_an_answers_end():
    corpus = Corpus([np.array([1, 2, 3, 4, 5]), np.array([9, 2, 3, 4, 6, 7]), np.array([8, 3, 4, 5])])
    assert corpus.match(np.array([0, 2, 3, 4]), 5) == (3, [6, 7])  # the latest of two 3-token matches
    assert corpus.match(np.array([1, 2, 3, 4]), 5) == (4, [5])  # the longer match wins; its answer ends there
    assert corpus.match(np.array([7, 7, 7]), 5) == (0, [])
    assert Corpus([]).match(np.array([1, 2, 3]), 5) == (0, [])


# --- through a session and the CLI, on the tiny fixtures -----------------------------------------
PROMPT = "once upon a time"  # the tiny target writes 48 tokens after it (many prompts end early)


def test_a_later_run_drafts_from_an_earlier_answer_and_writes_nothing_when_off(models, own_lookup_cache, frozen_costs):
    with open_session(config(models, None, drafter="lookup", draft_tokens=None, max_tokens=48)) as s:
        first, stats1, _ = run_engine(s, PROMPT)
        s.remember(first)
    assert lookup_cache.usage()[0] == 1
    with open_session(config(models, None, drafter="lookup", draft_tokens=None, max_tokens=48)) as s:
        again, stats2, _ = run_engine(s, PROMPT)
    assert again == first  # lossless, whatever it drafts from
    assert stats2.rounds < stats1.rounds  # the earlier answer was drafted from
    with open_session(
        config(models, None, drafter="lookup", draft_tokens=None, max_tokens=48, lookup_cache=False)
    ) as s:
        off, stats3, _ = run_engine(s, PROMPT)
        s.remember(off)
    assert off == first and stats3.rounds == stats1.rounds  # not read
    assert lookup_cache.usage()[0] == 1  # not written


def specdec(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_generate_keeps_its_answer_and_cache_clear_removes_it(models, own_lookup_cache, tmp_path, monkeypatch):
    for variable in ("SPECDEC_COST_CURVES", "SPECDEC_PREFIX_CACHE"):  # `cache clear` clears these too: not the user's
        monkeypatch.setenv(variable, str(tmp_path / variable))
    target = str(models["target"])
    r = specdec("generate", "--target", target, "--drafter", "lookup", "-n", "24", "--no-chat", "--json", PROMPT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["lookup_cache"] is True
    r = specdec(
        "generate", "--target", target, "--drafter", "lookup", "-n", "24", "--no-chat", "--no-lookup-cache", "x y z"
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(specdec("cache", "info", "--json").stdout)["lookup"]
    assert info["count"] == 1 and info["path"] == str(own_lookup_cache)
    r = specdec("cache", "clear")
    assert r.returncode == 0 and r.stdout.startswith("removed 1 answers")
    assert lookup_cache.usage() == (0, 0)
    assert specdec("cache", "clear").stdout.startswith("removed 0 answers")  # clearing nothing is fine


def test_a_command_group_without_a_command_prints_its_help_and_no_empty_error():
    for group in (["cache"], ["models"], []):
        r = specdec(*group)
        assert r.returncode == 2 and "Usage" in r.stdout and "error" not in r.stderr, (group, r.stderr)


def test_a_damaged_cache_file_is_one_warning_of_generate(models, own_lookup_cache):
    args = ("generate", "--target", str(models["target"]), "--drafter", "lookup", "-n", "24", "--no-chat", PROMPT)
    assert specdec(*args).returncode == 0
    (damaged,) = own_lookup_cache.glob("*/*.tok")
    damaged.write_bytes(b"garbage")
    r = specdec(*args)
    assert r.returncode == 0 and r.stderr.count("warning: lookup cache file") == 1 and str(damaged) in r.stderr
    assert len(list(own_lookup_cache.glob("*/*.tok"))) == 1  # rebuilt by the run that found it damaged


def test_clear_removes_only_what_the_cache_wrote(own_lookup_cache, monkeypatch, tmp_path):
    """SPECDEC_LOOKUP_CACHE pointed at a folder of one's own files by mistake: `cache clear` keeps them."""
    mine = tmp_path / "projects"
    (mine / "src").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    (mine / "src" / "main.py").write_text("keep me too")
    monkeypatch.setenv("SPECDEC_LOOKUP_CACHE", str(mine))
    lookup_cache.save(KEY, answer(1))
    assert lookup_cache.clear()[0] == 1
    assert (mine / "notes.txt").read_text() == "keep me" and (mine / "src" / "main.py").exists()
    assert not (mine / KEY).exists() and lookup_cache.usage() == (0, 0)


def test_adding_answers_to_a_corpus_indexes_it_as_building_it_with_them_does():
    """A batch or a server adds each answer to the loaded index; it must be the index a fresh load builds."""
    rng = np.random.default_rng(5)
    answers = [rng.integers(0, 6, n) for n in (40, 2, 0, 75, 3, 120)]  # 6 ids: many equal trigrams, short answers
    grown = Corpus(answers[:1])
    for a in answers[1:]:
        grown.add(a)
    built = Corpus(answers)
    for name in ("tokens", "keys", "ends"):
        assert np.array_equal(getattr(grown, name), getattr(built, name)), name
    history = rng.integers(0, 6, 12)
    assert grown.match(history, 8) == built.match(history, 8)
