"""Assembling GGUF files from part packages: never a file that looks valid unless it is."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections import namedtuple

import pytest

from specdec_cli.cli import main
from specdec_cli.errors import SpecdecError
from specdec_cli.models import catalog, store
from specdec_cli.models.catalog import KnownModel, Part
from test_cli import one_line_error

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
    assert store.status(fake_model).state == store.DOWNLOADED
    seen = []
    path = store.assemble(fake_model, seen.append)
    assert path.read_bytes() == PAYLOAD and sum(seen) == len(PAYLOAD) and len(seen) > 3
    assert store.status(fake_model).state == store.READY
    assert leftovers(fake_model) == ["fake.gguf"]
    assert store.ensure(fake_model) == path  # already there: no second assembly


def test_hash_mismatch_leaves_nothing(fake_model):
    bad = KnownModel(**{**fake_model.__dict__, "sha256": "0" * 64})
    with pytest.raises(SpecdecError, match="sha256 mismatch"):
        store.assemble(bad)
    assert leftovers(bad) == [] and store.status(bad).state == store.DOWNLOADED


def test_interrupted_assembly_leaves_nothing_that_looks_valid(fake_model):
    done = [0]

    def interrupt_halfway(n):
        done[0] += n
        if done[0] > len(PAYLOAD) // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.assemble(fake_model, interrupt_halfway)
    assert leftovers(fake_model) == []
    assert store.status(fake_model).state == store.DOWNLOADED


def test_missing_part_names_the_package(fake_model, tmp_path):
    (tmp_path / "site" / "specdec_fake_part1" / "data" / "chunk.bin").unlink()
    assert store.status(fake_model).state == store.NOT_DOWNLOADED
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
    assert store.status(fake_model).state == store.CORRUPT
    with pytest.raises(SpecdecError, match="wrong size"):
        store.ensure(fake_model)


def test_models_commands(fake_model, capsys):
    assert main(["models", "pull", "fake"]) == 0
    capsys.readouterr()
    assert main(["models", "path", "fake"]) == 0
    assert capsys.readouterr().out.strip() == str(store.model_path(fake_model))
    assert main(["models", "list", "--json"]) == 0
    rows = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    assert rows["fake"]["status"] == store.READY and rows["fake"]["size"] == len(PAYLOAD)
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


def test_pull_repairs_a_corrupt_model_and_generate_says_how(fake_model, capsys):
    path = store.model_path(fake_model)
    path.parent.mkdir(parents=True)
    path.write_bytes(PAYLOAD[:100])  # a truncated copy
    with pytest.raises(SpecdecError, match="wrong size") as e:
        store.ensure(fake_model)  # what generate and models path do: never use it
    assert "specdec models pull fake" in e.value.hint
    assert main(["models", "pull", "fake"]) == 0, capsys.readouterr().err
    assert path.read_bytes() == PAYLOAD and leftovers(fake_model) == ["fake.gguf"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # reaped: no process has it (until the kernel reuses it)


def test_stale_partial_of_a_dead_process_is_removed(fake_model):
    folder = store.model_path(fake_model).parent
    folder.mkdir(parents=True)
    stale = folder / f".fake.gguf.{_dead_pid()}.partial"
    other = folder / f".other.gguf.{_dead_pid()}.partial"
    stale.write_bytes(PAYLOAD[:1000])
    other.write_bytes(b"x")
    store.assemble(fake_model)
    assert leftovers(fake_model) == ["fake.gguf"]


def test_partial_of_a_live_process_is_kept(fake_model):
    folder = store.model_path(fake_model).parent
    folder.mkdir(parents=True)
    live = folder / f".fake.gguf.{os.getppid()}.partial"  # a concurrent pull's work in progress
    live.write_bytes(b"in progress")
    store.assemble(fake_model)
    assert live.read_bytes() == b"in progress"
    assert leftovers(fake_model) == sorted([live.name, "fake.gguf"])


def test_sigterm_during_assembly_removes_the_partial_file(fake_model):
    # cli.main turns SIGTERM and SIGHUP into an interruption, as Ctrl-C is: assembly's `finally` cleans up.
    done = [0]

    def sigterm_halfway(n):
        done[0] += n
        if done[0] > len(PAYLOAD) // 2:
            assert any(name.endswith(".partial") for name in leftovers(fake_model))
            os.kill(os.getpid(), signal.SIGTERM)

    def as_interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, as_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            store.assemble(fake_model, sigterm_halfway)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert leftovers(fake_model) == []


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),
        (lambda p: p.mkdir(), "is a directory, not a regular file"),
        (lambda p: p.symlink_to(p.parent / "elsewhere.gguf"), "is a symlink"),
    ],
    ids=["fifo", "directory", "symlink"],
)
def test_pull_refuses_a_destination_that_is_not_a_regular_file(fake_model, capsys, make, message):
    path = store.model_path(fake_model)
    path.parent.mkdir(parents=True)
    make(path)
    assert main(["models", "pull", "fake"]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert f"cannot assemble fake: {path} {message}" in line, line
    assert not (path.parent / "elsewhere.gguf").exists()  # nothing written through the link


@pytest.mark.parametrize(
    "args",
    [
        ["models", "list"],
        ["models", "list", "--json"],
        ["models", "pull", "fake"],
        ["models", "path", "fake"],
        ["models", "verify"],
        ["generate", "hi", "--target", "fake", "-n", "1"],
    ],
    ids=["list", "list-json", "pull", "path", "verify", "generate"],
)
def test_specdec_home_that_is_a_file_is_one_clear_error(fake_model, tmp_path, monkeypatch, capsys, args):
    home = tmp_path / "home-file"
    home.write_text("not a folder")
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    assert main(args) == 1
    line = one_line_error(capsys.readouterr().err)
    assert line == f"error: cannot use SPECDEC_HOME={home}: {home} is not a directory", line


def test_read_only_specdec_home_is_one_clear_error(fake_model, monkeypatch, capsys):
    def read_only(self, *args, **kw):  # root writes anywhere: simulate EROFS
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(store.Path, "mkdir", read_only)
    assert main(["models", "pull", "fake"]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert line.startswith(f"error: cannot use SPECDEC_HOME={store.home()}: ") and "Read-only file system" in line


@pytest.fixture
def whole_model(tmp_path, monkeypatch):
    """A KnownModel shipped whole in one fake package (as SmolLM2 is)."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    mod = tmp_path / "site" / "specdec_fake_whole"
    mod.mkdir(parents=True)
    (mod / "whole.gguf").write_bytes(PAYLOAD)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    parts = (Part("specdec-fake-whole==1.0", "specdec_fake_whole", "whole.gguf"),)
    return KnownModel("whole", "small", "Whole", "whole.gguf", len(PAYLOAD), hashlib.sha256(PAYLOAD).hexdigest(), parts)


def test_a_model_shipped_whole_is_linked_into_the_cache_not_stored_twice(whole_model, tmp_path):
    package_file = tmp_path / "site" / "specdec_fake_whole" / "whole.gguf"
    seen = []
    path = store.assemble(whole_model, seen.append)
    assert os.path.samefile(path, package_file) and sum(seen) == len(PAYLOAD)  # one copy of the bytes, verified
    assert leftovers(whole_model) == ["whole.gguf"] and store.status(whole_model).state == store.READY
    package_file.unlink()  # `pip uninstall`: the cache's name keeps the bytes
    assert store.status(whole_model).state == store.READY and path.read_bytes() == PAYLOAD


def test_a_whole_model_that_cannot_be_linked_is_copied(whole_model, tmp_path, monkeypatch):
    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(store.os, "link", cross_device)
    path = store.assemble(whole_model)
    assert not os.path.samefile(path, tmp_path / "site" / "specdec_fake_whole" / "whole.gguf")
    assert path.read_bytes() == PAYLOAD


def test_a_linked_package_that_fails_its_hash_is_left_as_it_was(whole_model, tmp_path):
    bad = KnownModel(**{**whole_model.__dict__, "sha256": "0" * 64})
    with pytest.raises(SpecdecError, match="sha256 mismatch"):
        store.assemble(bad)
    assert leftovers(bad) == [] and (tmp_path / "site" / "specdec_fake_whole" / "whole.gguf").read_bytes() == PAYLOAD


def test_a_killed_assemblys_link_under_our_own_pid_is_never_written_through(whole_model, tmp_path, monkeypatch):
    """A process killed while hashing its link leaves `.NAME.PID.partial`, the package's own file under another name;
    a later process with the same pid (a container's) must not truncate it by copying into it."""
    package_file = tmp_path / "site" / "specdec_fake_whole" / "whole.gguf"
    final = store.model_path(whole_model)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.link(package_file, final.with_name(f".{final.name}.{os.getpid()}.partial"))
    monkeypatch.setattr(store.os, "link", lambda src, dst: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device")))
    assert store.assemble(whole_model).read_bytes() == PAYLOAD
    assert package_file.read_bytes() == PAYLOAD


def test_models_list_names_each_status_and_its_caption_says_what_it_means(fake_model, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "specdec (downloaded)" in out and "not yet" not in out
    assert f"downloaded: {store.MEANING[store.DOWNLOADED]}" in out and "ready:" not in out  # only the states shown
    assert main(["models", "pull", "fake"]) == 0
    capsys.readouterr()
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("│ fake ")]  # piped: a line per model
    assert f"ready: {store.MEANING[store.READY]}" in out and "│ specdec " in row and "(" not in row
