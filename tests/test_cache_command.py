"""`specdec cache`: every cache specdec keeps besides the models (lookup answers, cost curves, prompt blocks)
shown with its count, size and path, and cleared all at once or by kind; a clear removes only that cache's own
files: never a model, never a file of the user's beside them. Everything under a temporary SPECDEC_HOME."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from specdec_cli.cli import main
from specdec_cli.drafting import cache as lookup_cache
from specdec_cli.prefixes import blocks
from test_cli import one_line_error

CURVE = "0123456789abcdef01234567"  # a curve's key: identity.key, 24 hex digits
MODEL_KEY = "89abcdef0123456789abcdef"  # a prefix block's folder: a model key


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A specdec home with a file in every cache, a model, and a file of the user's beside each cache's own."""
    home = tmp_path / "specdec"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    for variable in ("SPECDEC_LOOKUP_CACHE", "SPECDEC_COST_CURVES", "SPECDEC_PREFIX_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    lookup_cache.save("0123456789abcdef", np.arange(64).tolist())
    (home / "curves").mkdir(parents=True)
    (home / "curves" / f"{CURVE}.json").write_text("{}")
    (home / "curves" / "mine.json").write_text("not a curve")
    secret = blocks.secret(blocks.root())
    (blocks.root() / MODEL_KEY).mkdir()
    digest = "ab" * 16
    state = bytes(range(256))
    with open(blocks.root() / MODEL_KEY / f"{digest}.kv", "wb") as f:
        for part in blocks.encode(secret, MODEL_KEY, digest, 0, blocks.BLOCK, state):
            f.write(part)
    (blocks.root() / MODEL_KEY / "notes.kv").write_text("the user's")
    (home / "models").mkdir()
    (home / "models" / "model.gguf").write_bytes(b"GGUF" + bytes(100))
    return home


def info(capsys) -> dict:
    assert main(["cache", "info", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info_shows_every_cache_with_its_count_size_and_path(home, capsys):
    got = info(capsys)
    assert {k: got[k]["count"] for k in ("lookup", "curves", "prefix")} == {"lookup": 1, "curves": 1, "prefix": 1}
    assert got["curves"]["path"] == str(home / "curves") and got["prefix"]["path"] == str(home / "prefix")
    assert got["prefix"]["max_bytes"] == 2 << 30 and got["curves"]["bytes"] == 2
    assert main(["cache", "info"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["lookup", "1", "answers"],
        ["curves", "1", "curves"],
        ["prefix", "1", "blocks"],
    ]
    assert "models" in err and "never removed" in err


def test_clear_by_kind_removes_that_cache_alone_and_never_a_model_or_a_users_file(home, capsys):
    assert main(["cache", "clear", "curves"]) == 0
    assert capsys.readouterr().out.startswith("removed 1 curves")
    got = info(capsys)
    assert (got["lookup"]["count"], got["curves"]["count"], got["prefix"]["count"]) == (1, 0, 1)
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1:3] for line in out] == [["1", "answers"], ["0", "curves"], ["1", "blocks"]]
    assert all(info(capsys)[k]["count"] == 0 for k in ("lookup", "curves", "prefix"))
    assert (home / "models" / "model.gguf").read_bytes()[:4] == b"GGUF"  # models are not a cache
    assert (home / "curves" / "mine.json").read_text() == "not a curve"
    assert (blocks.root() / MODEL_KEY / "notes.kv").read_text() == "the user's"
    assert (blocks.root() / blocks.SECRET).exists()  # later blocks keep their names' meaning


def test_info_makes_nothing_where_no_cache_is(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "none"))
    for variable in ("SPECDEC_LOOKUP_CACHE", "SPECDEC_COST_CURVES", "SPECDEC_PREFIX_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    assert all(info(capsys)[k]["count"] == 0 for k in ("lookup", "curves", "prefix"))
    assert main(["cache", "clear"]) == 0
    assert not os.path.exists(tmp_path / "none")


def test_an_unknown_kind_is_one_line_naming_the_kinds(home, capsys):
    assert main(["cache", "clear", "models"]) == 2
    err = capsys.readouterr().err
    assert "no cache named 'models'" in one_line_error(err) and "lookup, curves, prefix" in err
    assert (home / "models" / "model.gguf").exists()
