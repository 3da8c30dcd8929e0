"""Output paths: a regular file or a new path is written (through symlinks, atomically); a device, a
FIFO, a directory, a missing folder or an input is refused with the reason, before any model loads."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from specdec_cli.backend import native
from specdec_cli.cli import main
from specdec_cli.errors import SpecdecError, UsageError
from test_cli import one_line_error

ORIGINAL = "keep me\n"


# --- the rules, one by one -----------------------------------------------------------------------


def test_regular_file_is_replaced_and_new_path_created(tmp_path):
    from specdec_cli.outputs import output_path, write_atomic

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(ORIGINAL)
    for path in (old, new):
        target = output_path(path, "--json")
        write_atomic(target, "{}\n")
        assert path.read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "old.json"]  # no temporary files


def test_symlink_is_written_through_and_stays_a_link(tmp_path):
    from specdec_cli.outputs import output_path, write_atomic

    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "results.json"
    real.write_text(ORIGINAL)
    link = tmp_path / "results.json"
    link.symlink_to(real)
    target = output_path(link, "--json")
    assert target == real.resolve()
    write_atomic(link, "new\n")  # given the link itself, it writes through too
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new\n"
    assert [p.name for p in real.parent.iterdir()] == ["results.json"]


def test_dangling_symlink_is_refused_with_the_reason(tmp_path):
    from specdec_cli.outputs import output_path

    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "gone" / "out.json")
    with pytest.raises(UsageError, match=r"--json: .*out.json is a dangling symlink \(to .*gone/out.json\)"):
        output_path(link, "--json")
    assert link.is_symlink() and not (tmp_path / "gone").exists()


@pytest.mark.parametrize(
    "make, kind",
    [
        (lambda p: os.mkfifo(p), "a FIFO"),
        (lambda p: p.mkdir(), "a directory"),
        (None, "a character device"),  # /dev/null itself
    ],
)
def test_not_a_regular_file_is_refused(tmp_path, make, kind):
    from specdec_cli.outputs import output_path

    path = Path("/dev/null")
    if make:
        path = tmp_path / "out.json"
        make(path)
    with pytest.raises(UsageError, match=f"--json: {path} is {kind}, not a regular file"):
        output_path(path, "--json")


def test_missing_folder_is_refused(tmp_path):
    from specdec_cli.outputs import output_path

    with pytest.raises(UsageError, match=r"--csv: .*/nope/b.csv is in .*/nope, which is not an existing directory"):
        output_path(tmp_path / "nope" / "b.csv", "--csv")


def test_an_input_is_refused_hard_links_too(tmp_path):
    from specdec_cli.outputs import output_path

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(ORIGINAL)
    os.link(prompts, tmp_path / "hard.jsonl")
    for path in (prompts, tmp_path / "hard.jsonl"):
        with pytest.raises(UsageError, match="is the same file as --prompts"):
            output_path(path, "--json", {"--prompts": prompts, "the draft model": None})
    # two outputs on one new path: the same file too
    with pytest.raises(UsageError, match="--csv: .*b.out is the same file as --json"):
        output_path(tmp_path / "b.out", "--csv", {"--json": tmp_path / "x" / ".." / "b.out"})


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from specdec_cli import outputs

    path = tmp_path / "b.json"
    path.write_text(ORIGINAL)

    def disk_full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs.os, "replace", disk_full)
    with pytest.raises(SpecdecError, match="cannot write .*b.json: No space left on device"):
        outputs.write_atomic(path, "new\n")
    assert path.read_text() == ORIGINAL and [p.name for p in tmp_path.iterdir()] == ["b.json"]


# --- bench: every output checked before any model loads ----------------------------------------------


@pytest.fixture
def no_model_loads(monkeypatch):
    def fail(*_, **__):
        raise AssertionError("a model was loaded before the outputs were checked")

    monkeypatch.setattr(native.Model, "__init__", fail)


def _char_device(path: Path) -> Path:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a null device of our own, not /dev/null
    except PermissionError:
        pytest.skip("mknod needs root")
    return path


def _dangling(path: Path) -> Path:
    path.symlink_to(path.parent / "missing" / "b.json")
    return path


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: _char_device(d / "b.json"), "is a character device, not a regular file"),
        (lambda d: (os.mkfifo(d / "b.json"), d / "b.json")[1], "is a FIFO, not a regular file"),
        (lambda d: ((d / "b.json").mkdir(), d / "b.json")[1], "is a directory, not a regular file"),
        (lambda d: d / "nope" / "b.json", "which is not an existing directory"),
        (lambda d: _dangling(d / "b.json"), "is a dangling symlink"),
        (lambda d: d / "p.jsonl", "is the same file as --prompts"),
        (lambda d: d / "target.gguf", "is the same file as the target model"),
        (lambda d: d / "config.toml", "is the same file as the config file"),
    ],
    ids=["char-device", "fifo", "directory", "missing-folder", "dangling-link", "prompts", "model", "config"],
)
def test_bench_refuses_a_bad_output_before_loading_models(capsys, models, tmp_path, no_model_loads, make, message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    target = tmp_path / "target.gguf"
    shutil.copy(models["target"], target)  # a copy: a failing test must not destroy the shared fixture
    config = tmp_path / "config.toml"
    config.write_text("")
    out = make(tmp_path)
    before = {p: p.read_bytes() for p in (prompts, target, config)}
    code = main([
        "bench", "--target", str(target), "--prompts", str(prompts), "--config", str(config),
        "--json", str(out), "-n", "4", "-t", "2",
    ])  # fmt: skip
    line = one_line_error(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: --json: ") and message in line, line
    assert {p: p.read_bytes() for p in before} == before


def test_bench_refuses_json_and_csv_on_one_file(capsys, models, tmp_path, no_model_loads):
    same = tmp_path / "b.out"
    same.write_text(ORIGINAL)
    link = tmp_path / "link.csv"
    link.symlink_to(same)
    for csv_path in (same, link):
        code = main(["bench", "--target", str(models["target"]), "--json", str(same), "--csv", str(csv_path)])
        line = one_line_error(capsys.readouterr().err)
        assert code == 2 and "--csv: " in line and "is the same file as --json" in line, line
    assert same.read_text() == ORIGINAL


def test_bench_writes_through_a_symlinked_output(capsys, models, tmp_path):
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "b.json"
    real.write_text(ORIGINAL)
    link = tmp_path / "b.json"
    link.symlink_to(real)
    code = main([
        "bench", "--target", str(models["target"]), "--drafters", "none", "--categories", "math",
        "-n", "4", "-t", "2", "--json", str(link),
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert link.is_symlink() and json.loads(real.read_text())["rows"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["b.json", "b.json", "real"]
