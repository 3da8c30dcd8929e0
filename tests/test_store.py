"""Assembling GGUF files from part packages: never a file that looks valid unless it is."""

from __future__ import annotations

import hashlib
import json
from collections import namedtuple

import pytest

from specdec_cli.cli import main
from specdec_cli.errors import SpecdecError
from specdec_cli.models import catalog, store
from specdec_cli.models.catalog import KnownModel, Part

PAYLOAD = bytes(range(256)) * 4096 * 3  # 3 MiB, so assembly takes several chunks


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A KnownModel whose 3 parts are importable fake packages in a temporary folder."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(store, "CHUNK", 256 * 1024)
    pkgs = tmp_path / "site"
    third = len(PAYLOAD) // 3
    parts = []
    for i in range(3):
        mod = pkgs / f"specdec_fake_part{i}"
        (mod / "data").mkdir(parents=True)
        (mod / "__init__.py").write_text("raise ImportError('parts are located, never imported')\n")
        (mod / "data" / "chunk.bin").write_bytes(PAYLOAD[i * third : (i + 1) * third])
        parts.append(Part(f"specdec-fake-part{i}==1.0", f"specdec_fake_part{i}", "data/chunk.bin"))
    monkeypatch.syspath_prepend(str(pkgs))
    model = KnownModel(
        "fake", "draft", "Fake", "fake.gguf", len(PAYLOAD), hashlib.sha256(PAYLOAD).hexdigest(), tuple(parts)
    )
    monkeypatch.setitem(catalog.KNOWN, "fake", model)
    return model


def leftovers(model) -> list[str]:
    folder = store.model_path(model).parent
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_assembles_verifies_and_reports_status(fake_model):
    assert store.status(fake_model).state == "installed"
    seen = []
    path = store.assemble(fake_model, seen.append)
    assert path.read_bytes() == PAYLOAD and sum(seen) == len(PAYLOAD) and len(seen) > 3
    assert store.status(fake_model).state == "assembled"
    assert leftovers(fake_model) == ["fake.gguf"]
    assert store.ensure(fake_model) == path  # already there: no second assembly


def test_hash_mismatch_leaves_nothing(fake_model):
    bad = KnownModel(**{**fake_model.__dict__, "sha256": "0" * 64})
    with pytest.raises(SpecdecError, match="sha256 mismatch"):
        store.assemble(bad)
    assert leftovers(bad) == [] and store.status(bad).state == "installed"


def test_interrupted_assembly_leaves_nothing_that_looks_valid(fake_model):
    def interrupt_halfway(n, done=[0]):
        done[0] += n
        if done[0] > len(PAYLOAD) // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.assemble(fake_model, interrupt_halfway)
    assert leftovers(fake_model) == []
    assert store.status(fake_model).state == "installed"


def test_missing_part_names_the_package(fake_model, tmp_path):
    (tmp_path / "site" / "specdec_fake_part1" / "data" / "chunk.bin").unlink()
    assert store.status(fake_model).state == "not installed"
    with pytest.raises(SpecdecError, match="missing specdec-fake-part1==1.0") as e:
        store.ensure(fake_model)
    assert "pip install" in e.value.hint


def test_part_of_the_wrong_size_is_refused_before_writing(fake_model, tmp_path):
    (tmp_path / "site" / "specdec_fake_part2" / "data" / "chunk.bin").write_bytes(b"short")
    with pytest.raises(SpecdecError, match="expected"):
        store.assemble(fake_model)
    assert leftovers(fake_model) == []


def test_no_disk_space_says_how_much_is_needed(fake_model, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(store.shutil, "disk_usage", lambda _: usage(10**9, 10**9, 1000))
    with pytest.raises(SpecdecError, match=r"not enough disk space .*needs 67 MiB, 0 MiB free"):
        store.assemble(fake_model)
    assert leftovers(fake_model) == []


def test_wrong_size_file_is_corrupt_and_never_used(fake_model):
    path = store.model_path(fake_model)
    path.parent.mkdir(parents=True)
    path.write_bytes(PAYLOAD[:100])
    assert store.status(fake_model).state == "corrupt"
    with pytest.raises(SpecdecError, match="wrong size"):
        store.ensure(fake_model)


def test_models_commands(fake_model, capsys):
    assert main(["models", "pull", "fake"]) == 0
    capsys.readouterr()
    assert main(["models", "path", "fake"]) == 0
    assert capsys.readouterr().out.strip() == str(store.model_path(fake_model))
    assert main(["models", "list", "--json"]) == 0
    rows = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    assert rows["fake"]["status"] == "assembled" and rows["fake"]["size"] == len(PAYLOAD)
    assert main(["models", "verify"]) == 0
    capsys.readouterr()
    # Same size, different bytes: only a full hash finds it.
    path = store.model_path(fake_model)
    data = bytearray(path.read_bytes())
    data[12345] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["models", "verify"]) == 1
    assert "fake: sha256 mismatch" in capsys.readouterr().err


def test_unknown_model_name(capsys):
    assert main(["models", "path", "no-such-model"]) == 1
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
