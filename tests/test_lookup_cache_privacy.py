"""The lookup cache keeps what clients were told: private to this user (files 0600, folders 0700 whatever the umask)
and namespaced like the prefix cache (a server's API key and a request's cache_salt), so a client neither drafts
from another's answers nor learns from its speed that a guessed text was one of them."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import config, run_engine

from specdec_cli.drafting import cache as lookup_cache
from specdec_cli import prefixes
from specdec_cli.session import open_session

KEY = "0123456789abcdef"
KEY_ONE, KEY_TWO = prefixes.key_hash("key-one"), prefixes.key_hash("key-two")


def answer(seed: int, n: int = 64) -> list[int]:
    return np.random.default_rng(seed).integers(0, 150_000, n).tolist()


def loaded(*space: str) -> set[tuple[int, ...]]:
    """The answers `load` gives for KEY in a namespace (none given: the plain one, as `generate` reads it)."""
    return {tuple(a.tolist()) for a in lookup_cache.load(KEY, lambda m: None, *space)}


def every_path(folder: Path) -> list[Path]:
    return [Path(d) / n for d, dirs, files in os.walk(folder) for n in dirs + files]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# --- files 0600 in folders 0700 -----------------------------------------------------------------------------


def test_answer_files_are_0600_in_0700_folders_whatever_the_umask(own_lookup_cache, umask_022):
    """Without the fix: 0644 files in 0755 folders, which any local user reads."""

    def modes() -> dict[str, int]:
        return {str(p): stat.S_IMODE(p.stat().st_mode) for p in every_path(own_lookup_cache) + [own_lookup_cache]}

    lookup_cache.save(KEY, answer(1))
    assert modes() == {p: 0o700 if Path(p).is_dir() else 0o600 for p in modes()}
    lookup_cache.save(KEY, answer(2), space=lookup_cache.space(KEY_ONE, "alice"))
    assert modes() == {p: 0o700 if Path(p).is_dir() else 0o600 for p in modes()}
    assert len(list(own_lookup_cache.glob("*/*.tok"))) == 2


def test_folders_left_0755_by_an_older_version_are_made_0700_when_read(own_lookup_cache, umask_022):
    old = own_lookup_cache / KEY
    old.mkdir(parents=True)
    (own_lookup_cache / KEY).chmod(0o755)
    own_lookup_cache.chmod(0o755)
    data = lookup_cache.encode(answer(1))
    (old / (hashlib.sha1(data).hexdigest()[:20] + ".tok")).write_bytes(data)  # a file as versions before wrote it
    assert loaded() == {tuple(answer(1))}  # (a session's start reads the cache: no answer need be written)
    assert stat.S_IMODE(old.stat().st_mode) == stat.S_IMODE(own_lookup_cache.stat().st_mode) == 0o700


def test_the_files_are_created_anew_never_through_a_planted_link(own_lookup_cache, tmp_path):
    """create_private: O_EXCL and O_NOFOLLOW; a file already at the name is not opened, nor a link's target."""
    from specdec_cli.outputs import create_private

    target = tmp_path / "elsewhere"
    target.write_text("keep me")
    link = tmp_path / "link"
    link.symlink_to(target)
    for planted in (link, target):
        with pytest.raises(FileExistsError):
            create_private(planted)
    assert target.read_text() == "keep me"


# --- namespaces -----------------------------------------------------------------------------------------------


def test_a_namespace_is_a_hash_of_the_key_and_the_salt_and_plain_without_either():
    spaces = {lookup_cache.space(key, salt) for key in (KEY_ONE, KEY_TWO, b"") for salt in ("alice", "bob", None)} - {
        ""
    }
    assert len(spaces) == 8  # every key and salt apart; neither a key nor a salt: the plain namespace
    assert lookup_cache.space(b"", None) == lookup_cache.space(prefixes.key_hash(None), "") == ""
    assert lookup_cache.space(prefixes.key_hash(None), "alice") == lookup_cache.space(b"", "alice")
    for space in spaces:
        assert len(space) == lookup_cache.SPACE_CHARS and int(space, 16) >= 0 and "alice" not in space
    assert lookup_cache.space(KEY_ONE, "alice") == lookup_cache.space(prefixes.key_hash("key-one"), "alice")


def test_two_namespaces_do_not_see_each_others_answers(own_lookup_cache):
    """Without the fix every answer was every client's: `load` has no namespace."""
    alice, bob = lookup_cache.space(KEY_ONE, "alice"), lookup_cache.space(KEY_ONE, "bob")
    other_key = lookup_cache.space(KEY_TWO, "alice")
    for seed, space in enumerate(["", alice, bob, other_key]):
        lookup_cache.save(KEY, answer(seed), space=space)
    lookup_cache.save(KEY, answer(0), space=alice)  # the same answer in two namespaces: one file each
    assert loaded() == {tuple(answer(0))}
    assert loaded(alice) == {tuple(answer(0)), tuple(answer(1))}
    assert loaded(bob) == {tuple(answer(2))}
    assert loaded(other_key) == {tuple(answer(3))}
    names = [p.name for p in own_lookup_cache.glob("*/*.tok")]
    assert len(names) == 5 and not any("alice" in n or "bob" in n for n in names)


def test_the_plain_namespace_reads_the_files_versions_before_wrote(own_lookup_cache):
    """`generate` and `batch` keep sharing their answers under the same names: an existing cache still serves."""
    data = lookup_cache.encode(answer(1))
    old = own_lookup_cache / KEY / (hashlib.sha1(data).hexdigest()[:20] + ".tok")
    old.parent.mkdir(parents=True)
    old.write_bytes(data)
    assert lookup_cache.save(KEY, answer(1)) == old  # the same answer again: the same file
    lookup_cache.save(KEY, answer(2), space=lookup_cache.space(b"", "alice"))
    assert loaded() == {tuple(answer(1))}
    assert loaded(lookup_cache.space(b"", "alice")) == {tuple(answer(2))}


def test_a_damaged_file_of_another_namespace_is_left_to_its_own(own_lookup_cache):
    alice = lookup_cache.space(KEY_ONE, "alice")
    bad = lookup_cache.save(KEY, answer(1), space=alice)
    bad.write_bytes(b"garbage")
    warnings: list[str] = []
    assert lookup_cache.load(KEY, warnings.append) == [] and warnings == [] and bad.exists()
    assert lookup_cache.load(KEY, warnings.append, alice) == [] and len(warnings) == 1 and not bad.exists()


def specdec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, timeout=300)


def test_cache_info_and_clear_count_every_namespace(own_lookup_cache):
    # (`cache clear lookup`: the cost curves and prefix blocks under the user's SPECDEC_HOME are not this test's)
    for seed, space in enumerate(["", lookup_cache.space(KEY_ONE, None), lookup_cache.space(KEY_ONE, "bob")]):
        lookup_cache.save(KEY, answer(seed), space=space)
    assert lookup_cache.usage() == (3, 3 * (lookup_cache.HEADER.size + 4 * 64))
    info = json.loads(specdec("cache", "info", "--json").stdout)["lookup"]
    assert info["count"] == 3
    r = specdec("cache", "clear", "lookup")
    assert r.returncode == 0 and r.stdout.startswith("removed 3 answers"), r.stderr
    assert lookup_cache.usage() == (0, 0) and not own_lookup_cache.exists()


# --- through a session, on the tiny fixtures ------------------------------------------------------------------
PROMPT = "once upon a time"  # the tiny target writes 48 tokens after it


def lookup_session(models, key: bytes = b""):
    # remeasure: every session on frozen_costs' curve, not on the one the session before kept (then refined)
    cm = open_session(config(models, None, drafter="lookup", draft_tokens=None, max_tokens=48, remeasure=True))
    s = cm.__enter__()
    s.answers.key_hash = key
    return cm, s


def test_a_session_drafts_only_from_its_own_namespaces_answers(models, own_lookup_cache, frozen_costs):
    """Without the fix a client with another salt, another server key, or `generate` drafted from alice's answer
    (fewer rounds): the speed told them what she had been told."""
    cm, s = lookup_session(models, KEY_ONE)
    try:
        first, cold, _ = run_engine(s, PROMPT, salt="alice")
        s.remember(first, "alice")
        again, warm, _ = run_engine(s, PROMPT, salt="alice")  # (the loaded corpus learnt it)
        assert again == first and warm.rounds < cold.rounds
        assert run_engine(s, PROMPT, salt="bob")[1].rounds == cold.rounds
        assert run_engine(s, PROMPT)[1].rounds == cold.rounds  # this key without a salt
    finally:
        cm.__exit__(None, None, None)
    for key, salt in ((KEY_TWO, "alice"), (b"", None), (KEY_ONE, "bob")):  # restarted: read from disk
        cm, s = lookup_session(models, key)
        try:
            assert run_engine(s, PROMPT, salt=salt)[1].rounds == cold.rounds, (key, salt)
        finally:
            cm.__exit__(None, None, None)
    cm, s = lookup_session(models, KEY_ONE)
    try:
        assert run_engine(s, PROMPT, salt="alice")[1].rounds < cold.rounds
    finally:
        cm.__exit__(None, None, None)


def test_only_the_most_recently_used_namespaces_stay_loaded(models, own_lookup_cache, monkeypatch):
    """A client inventing a salt a request keeps memory bounded: past CORPORA namespaces the least recently used
    is dropped (and read again from disk when it comes back)."""
    reads: list[str] = []
    load = lookup_cache.load
    monkeypatch.setattr(lookup_cache, "load", lambda key, warn, space: reads.append(space) or load(key, warn, space))
    cm, s = lookup_session(models, KEY_ONE)
    try:
        salts = [f"salt-{i}" for i in range(3 * lookup_cache.CORPORA)]
        corpora = [s.lookup_corpus(salt) for salt in salts]
        assert len(reads) == len(salts) and len(set(reads)) == len(salts)
        assert s.lookup_corpus(salts[-1]) is corpora[-1]  # still loaded: not read again
        assert s.lookup_corpus(salts[-lookup_cache.CORPORA]) is corpora[-lookup_cache.CORPORA]
        assert len(reads) == len(salts)
        s.lookup_corpus(salts[0])  # long dropped: read again
        assert len(reads) == len(salts) + 1
        assert len(s.answers) <= lookup_cache.CORPORA
    finally:
        cm.__exit__(None, None, None)


# --- end to end: `specdec serve` with an API key ----------------------------------------------------------------


def test_a_served_answer_is_kept_in_its_clients_namespace_only(models, own_lookup_cache, umask_022):
    """Without the fix the answer to alice's request went to `<hash>.tok` (0644), which every client (and
    `generate`) drafted from."""
    from test_serve import Served

    s = Served("--target", models["chat"], "--drafter", "lookup", "--debug", env={"SPECDEC_API_KEY": "key-one"})
    try:
        r = s.client(api_key="key-one").chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=24,
            temperature=0,
            extra_body={"cache_salt": "alice"},
        )
        assert r.usage.completion_tokens >= lookup_cache.MIN_TOKENS
    finally:
        assert s.stop() == 0, s.stderr
    (vocab,) = [p.name for p in own_lookup_cache.iterdir()]
    (kept,) = own_lookup_cache.glob("*/*.tok")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and kept.name.count(".") == 2  # `<space>.<hash>.tok`
    alice = lookup_cache.space(KEY_ONE, "alice")
    assert lookup_cache.space_of(kept.name) == alice
    assert len(lookup_cache.load(vocab, space=alice)) == 1
    for other in ("", lookup_cache.space(KEY_ONE, "bob"), lookup_cache.space(KEY_ONE, None)):
        assert lookup_cache.load(vocab, space=other) == []


# --- only its own files (the third hostile pass) -----------------------------------------------------------------


def test_eviction_info_and_clear_touch_only_the_caches_own_files_never_through_a_link(own_lookup_cache, tmp_path):
    """Found by the third pass: eviction removed the oldest `*/*.tok` past the bound, whoever wrote them, through a
    symlinked folder too (three files outside the cache were deleted); clear() removed them all."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    theirs = [outside / f"{'ab' * 10}.tok", own_lookup_cache / "shards" / "a.tok"]
    (own_lookup_cache / "shards").mkdir(parents=True)
    (own_lookup_cache / "fedcba9876543210").symlink_to(outside)  # a vocabulary folder's name, a link
    mine = own_lookup_cache / KEY
    mine.mkdir(mode=0o700)
    theirs += [mine / "notes.tok", mine / "link.tok"]
    for path in theirs[:3]:
        path.write_bytes(lookup_cache.encode(answer(9)))
        os.utime(path, (1, 1))  # the oldest of all: eviction's first pick, were they its own
    theirs[3].symlink_to(theirs[0])
    big = answer(3, 2000)
    lookup_cache.save(KEY, big, max_bytes=len(lookup_cache.encode(big)) + 10)  # over the bound: evicts
    lookup_cache.save(KEY, answer(4, 2000), max_bytes=len(lookup_cache.encode(big)) + 10)
    assert all(os.path.lexists(p) for p in theirs)
    assert lookup_cache.usage()[0] == 1
    lookup_cache.clear()
    assert all(os.path.lexists(p) for p in theirs)
    assert lookup_cache.usage() == (0, 0)


def test_a_vocabulary_folder_that_is_a_link_or_anothers_is_not_used(own_lookup_cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    own_lookup_cache.mkdir(parents=True, exist_ok=True)
    (own_lookup_cache / KEY).symlink_to(elsewhere)
    assert lookup_cache.save(KEY, answer(5)) is None and not list(elsewhere.iterdir())
    (elsewhere / lookup_cache.file_name("", lookup_cache.encode(answer(6)))).write_bytes(lookup_cache.encode(answer(6)))
    assert loaded() == set()  # (a planted answer is not drafted from either)
