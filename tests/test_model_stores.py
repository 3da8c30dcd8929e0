"""The models users already have: the stores other tools keep (laid out here as those tools write them, in a
temporary HOME, from the tiny fixtures), the names people use for them, a draft chosen for a target, the
header cache, and stores that are damaged or hostile."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from tiny_models import write_no_text, N_LAYER, byte_vocab, random_weights, write_model

from specdec_cli.backend import vocab
from specdec_cli.backend.native import Model
from specdec_cli.cli import main
from specdec_cli.models import facts as facts_mod
from specdec_cli.models import layouts, names, pairing, stores
from specdec_cli.ui import models as ui_models

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty HOME, no store variables, and a specdec cache of its own (no catalogue model assembled)."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    for var in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "LLAMA_CACHE", "OLLAMA_MODELS", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "specdec"))
    monkeypatch.delenv("SPECDEC_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return h


@pytest.fixture(scope="module")
def small(tmp_path_factory, models) -> dict[str, Path]:
    """Beside the fixture set: a one-layer model with the target's vocabulary (a draft smaller than it), a
    projector, a LoRA adapter, a vocabulary-only file, and the target split in three parts."""
    folder = tmp_path_factory.mktemp("small")
    tokens = byte_vocab()
    base = random_weights(seed=1234, n_vocab=len(tokens))
    out = {"small": write_model(folder / "small.gguf", base, tokens, n_layer=N_LAYER - 1)}
    other = byte_vocab(shuffle_seed=7)
    out["small_other"] = write_model(folder / "small_other.gguf", base, other, n_layer=N_LAYER - 1)
    out["small_no_text"] = write_no_text(folder / "small_no_text.gguf", base, n_layer=N_LAYER - 1)
    for kind, extra in (("projector", {"general.type": "mmproj"}), ("adapter", {"general.type": "adapter"})):
        w = GGUFWriter(str(folder / f"{kind}.gguf"), "clip" if kind == "projector" else "llama")
        for k, v in extra.items():
            w.add_string(k, v)
        w.add_tensor("x.weight", np.zeros((4, 4), np.float32))
        out[kind] = _finish(w, folder / f"{kind}.gguf")
    w = GGUFWriter(str(folder / "vocab.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    out["vocab"] = _finish(w, folder / "vocab.gguf", tensors=False)
    split = folder / "split" / "tiny-q8_0.gguf"
    split.parent.mkdir()
    write_model(split, base, tokens, split_max_tensors=8)  # the target's weights, in three parts
    out["split"] = sorted(split.parent.glob("*.gguf"))
    assert len(out["split"]) == 3
    return out


def _finish(w: GGUFWriter, path: Path, tensors: bool = True) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    if tensors:
        w.write_tensors_to_file()
    w.close()
    return path


# --- the stores, as their tools lay them out -------------------------------------------------------------
def hf_repo(cache: Path, repo: str, files: dict[str, Path], commit: str = COMMIT, link: bool = False) -> Path:
    """models--ORG--REPO: blobs named by content, snapshots/COMMIT/FILE symlinks into them, refs/main.
    link: each blob a symlink to its file (a real model is not copied; nothing reads a blob's name)."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    for rel, src in files.items():
        blob = root / "blobs" / hashlib.sha256(str(src).encode() if link else src.read_bytes()).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.symlink_to(src) if link else shutil.copy(src, blob)
        snap = root / "snapshots" / commit / rel
        snap.parent.mkdir(parents=True, exist_ok=True)
        snap.symlink_to(os.path.relpath(blob, snap.parent))
    return root / "snapshots" / commit


def ollama(
    models: Path, name: str, src: Path, registry: str = "registry.ollama.ai", namespace: str = "library", link=False
) -> Path:
    """manifests/REGISTRY/NAMESPACE/MODEL/TAG, its layers (template, params, the model) as blobs/sha256-HEX.
    link: the model's blob a symlink to `src`, under a made-up digest (nothing hashes a store's blobs)."""
    model, tag = name.split(":")
    layers = []
    for media, data in (
        ("application/vnd.ollama.image.template", b"{{ .Prompt }}"),
        ("application/vnd.ollama.image.model", None),
        ("application/vnd.ollama.image.params", b'{"stop": ["<|im_end|>"]}'),
    ):
        content = src.read_bytes() if data is None and not link else data
        digest = hashlib.sha256(content).hexdigest() if content is not None else "d" * 64
        blob = models / "blobs" / f"sha256-{digest}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.symlink_to(src) if content is None else blob.write_bytes(content)
        layers.append({"mediaType": media, "digest": f"sha256:{digest}", "size": 1})
    manifest = models / "manifests" / registry / namespace / model / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    config = {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64}
    manifest.write_text(json.dumps({"schemaVersion": 2, "config": config, "layers": layers}))
    return models / "blobs" / f"sha256-{layers[1]['digest'][7:]}"


def lmstudio(home: Path, key: str, src: Path) -> Path:
    path = home / ".lmstudio" / "models" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, path)
    return path


def llama_flat(cache: Path, repo: str, file: str, src: Path, tag: str = "latest") -> Path:
    """llama.cpp's cache before 2026: ORG_REPO_FILE beside manifest=ORG=REPO=TAG.json."""
    org, name = repo.split("/")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"manifest={org}={name}={tag}.json").write_text(json.dumps({"ggufFile": {"rfilename": file}}))
    path = cache / f"{org}_{name}_{file}"
    shutil.copy(src, path)
    return path


def every_store(home: Path, models, small) -> dict[str, tuple[str, Path]]:
    """One of each store, each with its own copy of a fixture; name -> (source, path)."""
    hub = home / ".cache" / "huggingface" / "hub"
    snap = hf_repo(hub, "tiny-org/Tiny-GGUF", {"tiny-q8_0.gguf": models["target"], "tiny-f16.gguf": models["draft"]})
    hf_repo(hub, "tiny-org/Tiny-GGUF-mmproj", {"mmproj-tiny-f16.gguf": small["projector"]})
    splits = hf_repo(hub, "tiny-org/Split-GGUF", {f"Q8_0/{p.name}": p for p in small["split"]})
    hf_repo(hub, "tiny-org/Vocab-GGUF", {"ggml-vocab-tiny.gguf": small["vocab"]})
    flat = llama_flat(home / ".cache" / "llama.cpp", "old-org/Old-GGUF", "old-Q4_0.gguf", models["chat"])
    lms = lmstudio(home, "lmstudio-community/Small-GGUF/Small-Q4_K_M.gguf", small["small"])
    lmstudio(home, "lmstudio-community/Small-GGUF/lora-Small.gguf", small["adapter"])
    lmstudio(home, "x/Vision-GGUF/vision-F16.gguf", small["projector"])  # (named mmproj-*, it is not even read)
    blob = ollama(home / ".ollama" / "models", "tiny:latest", models["other_vocab"])
    hfblob = ollama(home / ".ollama" / "models", "Tiny-GGUF:Q4_K_M", models["same"], "hf.co", "tiny-org")
    return {
        "tiny-org/Tiny-GGUF:Q8_0": ("hf", snap / "tiny-q8_0.gguf"),
        "tiny-org/Tiny-GGUF:F16": ("hf", snap / "tiny-f16.gguf"),
        "tiny-org/Split-GGUF:Q8_0": ("hf", splits / "Q8_0" / small["split"][0].name),
        "old-org/Old-GGUF": ("llama.cpp", flat),
        "lmstudio-community/Small-GGUF/Small-Q4_K_M.gguf": ("lmstudio", lms),
        "tiny:latest": ("ollama", blob),
        "hf.co/tiny-org/Tiny-GGUF:Q4_K_M": ("ollama", hfblob),
    }


def listing(capsys, *args) -> dict:
    assert main(["models", "list", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_store_layout_is_found_once_with_its_source_and_name(home, models, small, capsys):
    want = every_store(home, models, small)
    got = listing(capsys)
    found = {m["name"]: (m["source"], Path(m["path"])) for m in got["models"] if m["source"] != "specdec"}
    assert found == want
    split = next(m for m in got["models"] if m["name"] == "tiny-org/Split-GGUF:Q8_0")
    assert split["parts"] == 3 and split["size"] == sum(p.stat().st_size for p in small["split"])
    target = next(m for m in got["models"] if m["name"] == "tiny:latest")
    assert {"name", "source", "path", "size", "arch", "params", "quant"} <= set(target)
    assert (target["arch"], target["quant"], target["size"]) == ("llama", "F32", models["other_vocab"].stat().st_size)
    assert target["params"] == sum(int(np.prod(t.shape)) for t in _tensors(models["other_vocab"]))
    skipped = "\n".join(got["skipped"])  # projector, adapter and vocabulary: found, not models
    assert "a projector file, not a model" in skipped and "an adapter file, not a model" in skipped
    assert "a vocabulary file, not a model" in skipped


def _tensors(path: Path):
    from gguf import GGUFReader

    return GGUFReader(path).tensors


def test_store_variables_move_the_stores(home, models, small, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama"))
    hf_repo(tmp_path / "hub", "a/B-GGUF", {"b-Q4_K_M.gguf": models["target"]})
    ollama(tmp_path / "ollama", "tiny:7b", models["draft"])
    hf_repo(tmp_path / "llama", "c/D-GGUF", {"d-Q8_0.gguf": models["chat"]})  # llama.cpp's -hf since 2026
    hf_repo(home / ".cache" / "huggingface" / "hub", "x/Y-GGUF", {"y-Q4_0.gguf": models["same"]})  # still read
    got = {m["name"]: m["source"] for m in listing(capsys)["models"] if m["source"] != "specdec"}
    assert got == {"a/B-GGUF:Q4_K_M": "hf", "tiny:7b": "ollama", "c/D-GGUF:Q8_0": "llama.cpp", "x/Y-GGUF:Q4_0": "hf"}


def test_config_model_dirs_are_listed(home, models, small, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "mine"
    (folder / "deep" / "er").mkdir(parents=True)
    shutil.copy(models["target"], folder / "deep" / "er" / "mine.gguf")
    for p in small["split"]:
        shutil.copy(p, folder / p.name)
    cfg = tmp_path / "specdec.toml"
    cfg.write_text(f'model_dirs = ["{folder}"]\n')
    monkeypatch.setenv("SPECDEC_CONFIG", str(cfg))
    got = {m["name"]: (m["source"], m["parts"]) for m in listing(capsys)["models"] if m["source"] != "specdec"}
    assert got == {"mine": ("config", 1), "tiny-q8_0": ("config", 3)}
    cfg.write_text('model_dirs = "nope"\n')
    assert main(["models", "list"]) == 1
    assert "model_dirs: must be a list of folders" in capsys.readouterr().err


# --- names --------------------------------------------------------------------------------------------------
def generate_text(capsys, target: str) -> str:
    code = main(["generate", "hello", "--target", target, "--drafter", "none", "-n", "12", "--json", "-t", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)["text"]


def test_generate_by_each_kind_of_name_gives_the_text_by_path(home, models, small, capsys):
    want = every_store(home, models, small)
    by_path = {name: generate_text(capsys, str(path)) for name, (_, path) in want.items() if "Split" not in name}
    for name, text in by_path.items():
        assert generate_text(capsys, name) == text, name
    assert generate_text(capsys, "tiny") == by_path["tiny:latest"]  # :latest implied
    assert generate_text(capsys, "library/tiny:latest") == by_path["tiny:latest"]
    assert generate_text(capsys, "TINY-ORG/tiny-gguf:q8_0") == by_path["tiny-org/Tiny-GGUF:Q8_0"]  # as -hf takes it
    assert generate_text(capsys, "tiny-org/Tiny-GGUF/tiny-f16.gguf") == by_path["tiny-org/Tiny-GGUF:F16"]
    assert (
        generate_text(capsys, "lmstudio-community/Small-GGUF")
        == by_path["lmstudio-community/Small-GGUF/Small-Q4_K_M.gguf"]
    )
    split = generate_text(capsys, "tiny-org/Split-GGUF:Q8_0")  # the three parts load as one model
    assert split == by_path["tiny-org/Tiny-GGUF:Q8_0"]  # the same weights as the target


def test_unknown_and_ambiguous_names_are_one_line_with_the_closest_and_exit_2(home, models, small, capsys):
    every_store(home, models, small)
    hf_repo(
        home / ".cache" / "huggingface" / "hub",
        "tiny-org/Two-GGUF",
        {"a/two-Q8_0.gguf": models["target"], "b/two-Q8_0.gguf": models["same"]},
    )
    code = main(["generate", "hi", "--target", "tiny-org/Tiny-GGUF:Q5_K_M"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[0].startswith("error: --target 'tiny-org/Tiny-GGUF:Q5_K_M': no such file or model")
    assert "closest: tiny-org/Tiny-GGUF:Q8_0 (hf, " in err[1] and len(err) == 2  # in the hint
    code = main(["generate", "hi", "--target", "tiny-org/Two-GGUF:Q8_0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "names 2 models: tiny-org/Two-GGUF/a/two-Q8_0.gguf (hf, " in err[0]
    assert main(["generate", "hi", "--target", "tiny-org/Two-GGUF/b/two-Q8_0.gguf", "-n", "2", "-t", "1"]) == 0
    capsys.readouterr()
    code = main(["generate", "hi", "--target", "gemma:2b", "--draft", "nothing-like-it:1b"])
    err = capsys.readouterr().err
    assert code == 2 and "error: --target 'gemma:2b': no such file or model" in err


def test_a_store_prefix_picks_one_of_two_names(home, models, small):
    every_store(home, models, small)
    lmstudio(home, "tiny-org/Tiny-GGUF/tiny-q8_0.gguf", models["target"])  # the same repo from LM Studio
    found = stores.scan()
    assert names.find("tiny-org/Tiny-GGUF:Q8_0", found).source == "hf"  # a name beats another's alias
    with pytest.raises(names.UsageError, match="names 2 models"):
        names.find("tiny-org/Tiny-GGUF", found)  # each store's default for the repository
    assert names.find("lmstudio:tiny-org/Tiny-GGUF", found).source == "lmstudio"
    assert names.find("hf:tiny-org/Tiny-GGUF", found).source == "hf"


# --- a draft chosen for a target ---------------------------------------------------------------------------
def test_the_header_rule_agrees_with_llama_cpps(models, small):
    files = [models["target"], models["draft"], models["other_vocab"], models["extra_vocab"], small["small"]]
    for t in files:
        for d in files:
            ft, fd = facts_mod.read(t), facts_mod.read(d)
            with Model(t, vocab_only=True) as mt, Model(d, vocab_only=True) as md:
                assert (pairing.vocab_problem(ft.vocab, fd.vocab) is None) == (vocab.incompatibility(mt, md) is None)


def test_pair_ranks_the_drafts_and_says_why_the_others_cannot(home, models, small, capsys):
    every_store(home, models, small)
    lmstudio(home, "x/Extra-GGUF/extra-F32.gguf", models["extra_vocab"])
    assert main(["models", "pair", "tiny-org/Tiny-GGUF:Q8_0", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in got["drafts"]}
    assert got["chosen"] == "lmstudio-community/Small-GGUF/Small-Q4_K_M.gguf" == got["drafts"][0]["name"]
    assert rows[got["chosen"]]["can_draft"] and rows[got["chosen"]]["kin"] == "architecture"
    assert rows["tiny:latest"]["problem"].startswith("not smaller")  # another vocabulary: it would draft through text
    assert rows["tiny-org/Tiny-GGUF:F16"]["problem"].startswith("not smaller than the target")
    assert rows["hf.co/tiny-org/Tiny-GGUF:Q4_K_M"]["problem"].startswith("not smaller")  # (a copy of it)
    assert "not smaller" in rows["x/Extra-GGUF/extra-F32.gguf"]["problem"]  # its vocabulary pairs; its size does not
    assert "tiny-org/Tiny-GGUF:Q8_0" not in rows  # the target is no draft of its own


def test_pair_lists_a_smaller_model_of_another_tokenizer_after_those_of_the_targets(home, models, small, capsys):
    lmstudio(home, "a/Target-GGUF/target-F32.gguf", models["target"])
    lmstudio(home, "a/Sibling-GGUF/sibling-F32.gguf", small["small"])
    lmstudio(home, "a/Other-GGUF/other-F32.gguf", small["small_other"])
    assert main(["models", "pair", "a/Target-GGUF", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["drafts"]
    assert [r["name"].split("/")[1] for r in rows] == ["Sibling-GGUF", "Other-GGUF"]
    assert rows[1]["can_draft"] and rows[1]["kin"] == "tokenizer" and "another tokenizer" in rows[1]["shares"]
    assert pairing.KIN_PRIORS["tokenizer"] < min(v for k, v in pairing.KIN_PRIORS.items() if k != "tokenizer")


def test_generate_without_a_draft_chooses_one_and_says_so(home, models, small, capsys):
    every_store(home, models, small)
    code = main(["generate", "hello", "--target", "tiny-org/Tiny-GGUF:Q8_0", "-n", "8", "--json", "-t", "1"])
    out, err = capsys.readouterr()
    config = json.loads(out)["config"]
    assert code == 0 and config["draft_chosen_by"] == "auto" and config["drafter"] == "auto"
    assert config["draft"] == str(home / ".lmstudio/models/lmstudio-community/Small-GGUF/Small-Q4_K_M.gguf")
    assert "draft: lmstudio-community/Small-GGUF/Small-Q4_K_M.gguf (lmstudio), the only local model" in err
    # No model of its vocabulary is smaller: one of another drafts through text.
    code = main(["generate", "hello", "--target", "tiny:latest", "-n", "8", "--json", "-t", "1"])
    out, err = capsys.readouterr()
    config = json.loads(out)["config"]
    assert code == 0 and config["draft"].endswith("Small-Q4_K_M.gguf") and config["draft_chosen_by"] == "auto"
    assert "another tokenizer: it drafts through text" in err
    given = ["generate", "hi", "--target", "tiny-org/Tiny-GGUF:Q8_0", "-n", "4", "--json", "-t", "1"]
    for extra, by in ((["--draft", "tiny-org/Tiny-GGUF:F16"], "option"), (["--drafter", "lookup"], None)):
        assert main([*given, *extra]) == 0
        assert json.loads(capsys.readouterr().out)["config"]["draft_chosen_by"] == by
    assert main([*given, "--draft", "auto"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["draft_chosen_by"] == "auto"


def test_a_chosen_draft_that_llama_cpp_refuses_is_a_warning_and_the_run_goes_on(
    home, models, small, capsys, monkeypatch
):
    lmstudio(home, "a/Target-GGUF/target-F32.gguf", models["target"])
    lmstudio(home, "a/Other-GGUF/other-F32.gguf", small["small_no_text"])  # smaller, another vocabulary
    code = main(["generate", "hi", "--target", "a/Target-GGUF", "-n", "4", "--json", "-t", "1"])
    out, err = capsys.readouterr()
    assert code == 0 and "cannot draft for it: its tokens spell no text" in err  # what the header cannot say
    assert json.loads(out)["config"]["draft_loaded"] is False


# --- the header cache -------------------------------------------------------------------------------------
def test_headers_are_read_once_and_again_when_a_file_changes(home, models, small, monkeypatch):
    every_store(home, models, small)
    reads = []
    real = facts_mod.read
    monkeypatch.setattr(facts_mod, "read", lambda p: reads.append(p) or real(p))
    first = stores.scan()
    assert len(reads) >= len(first.entries) > 0
    reads.clear()
    again = stores.scan()
    assert reads == [] and [e.name for e in again.entries] == [e.name for e in first.entries]
    lms = home / ".lmstudio/models/lmstudio-community/Small-GGUF/Small-Q4_K_M.gguf"
    shutil.copy(models["target"], lms)  # another model in its place: another size
    os.utime(lms, ns=(time.time_ns(), time.time_ns()))
    changed = {e.name: e for e in stores.scan().entries}
    assert reads == [lms.resolve()]
    assert changed["lmstudio-community/Small-GGUF/Small-Q4_K_M.gguf"].facts.params == real(models["target"]).params


def test_a_damaged_header_cache_is_read_as_empty(home, models, small):
    every_store(home, models, small)
    n = len(stores.scan().entries)
    index = Path(os.environ["SPECDEC_HOME"]) / "gguf-facts.json"
    for junk in (b"{not json", b'{"version": 1, "files": {"x": {"size": 1, "mtime_ns": 1, "facts": {"kind": 3}}}}'):
        index.write_bytes(junk)
        assert len(stores.scan().entries) == n
    index.unlink()
    os.mkfifo(index)  # a FIFO in its place: not read (it would block), replaced
    assert len(stores.scan().entries) == n


# --- hostile stores ----------------------------------------------------------------------------------------
def test_hostile_stores_are_skipped_entries_never_a_crash(home, models, small, capsys, monkeypatch):
    every_store(home, models, small)
    o = home / ".ollama" / "models"
    bad = o / "manifests" / "registry.ollama.ai" / "library"
    (bad / "notjson").mkdir(parents=True)
    (bad / "notjson" / "latest").write_text("{{{")
    (bad / "noblob").mkdir()
    (bad / "noblob" / "latest").write_text(
        json.dumps({"layers": [{"mediaType": layouts.OLLAMA_MODEL, "digest": "sha256:" + "1" * 64}]})
    )
    (bad / "nomodel").mkdir()
    (bad / "nomodel" / "latest").write_text(json.dumps({"layers": [{"mediaType": "x", "digest": 5}]}))
    (o / "blobs" / f"sha256-{'2' * 64}").write_text("not a gguf")
    (bad / "notgguf").mkdir()
    (bad / "notgguf" / "latest").write_text(
        json.dumps({"layers": [{"mediaType": layouts.OLLAMA_MODEL, "digest": "sha256:" + "2" * 64}]})
    )
    lms = home / ".lmstudio" / "models" / "evil" / "Repo"
    lms.mkdir(parents=True)
    (lms / "loop-a.gguf").symlink_to(lms / "loop-b.gguf")
    (lms / "loop-b.gguf").symlink_to(lms / "loop-a.gguf")
    (lms / "cycle").symlink_to(lms, target_is_directory=True)  # a folder that contains itself
    (lms / "truncated-Q4_0.gguf").write_bytes(models["target"].read_bytes()[:5000])
    (lms / "empty.gguf").write_bytes(b"")
    os.mkfifo(lms / "fifo.gguf")
    fifo_ref = hf_repo(home / ".cache" / "huggingface" / "hub", "x/Fifo-GGUF", {"f-Q4_0.gguf": models["target"]})
    ref = fifo_ref.parent.parent / "refs" / "main"
    ref.unlink()
    os.mkfifo(ref)  # read plainly, it would block the listing: the newest snapshot stands in
    locked = home / ".lmstudio" / "models" / "locked"
    locked.mkdir()
    real_scandir = os.scandir
    monkeypatch.setattr(layouts.os, "scandir", lambda p: _refuse(p, locked, real_scandir))  # root reads anything
    got = listing(capsys, "--verbose")
    names_found = {m["name"] for m in got["models"] if m["source"] != "specdec"}
    assert names_found == set(every_store_names()) | {"x/Fifo-GGUF:Q4_0"}
    skipped = "\n".join(got["skipped"])
    for needle in (
        "notjson/latest: Expecting",
        "model blob sha256-1111",
        "nomodel/latest: no model layer",
        "notgguf/latest: not a GGUF file",
        "loop-a.gguf",
        "truncated-Q4_0.gguf: truncated",
        "empty.gguf",
        "fifo.gguf: not a regular file",
        "locked: Permission denied",
    ):
        assert needle in skipped, needle
    assert main(["models", "list", "-v"]) == 0
    assert "warning: skipped " in capsys.readouterr().err


def every_store_names() -> list[str]:
    return [
        "tiny-org/Tiny-GGUF:Q8_0",
        "tiny-org/Tiny-GGUF:F16",
        "tiny-org/Split-GGUF:Q8_0",
        "old-org/Old-GGUF",
        "lmstudio-community/Small-GGUF/Small-Q4_K_M.gguf",
        "tiny:latest",
        "hf.co/tiny-org/Tiny-GGUF:Q4_K_M",
    ]


def _refuse(path, locked: Path, real):
    if Path(path) == locked:
        raise PermissionError(13, "Permission denied", str(path))
    return real(path)


def test_ten_thousand_files_end_and_a_huge_tree_stops(home, models, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(10_000):
        (folder / f"note-{i}.txt").write_text("x")
    for i in range(20):
        os.link(models["target"], folder / f"m{i}-Q8_0.gguf")  # (hard links: 20 entries, one file each)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'model_dirs = ["{folder}"]\n')
    monkeypatch.setenv("SPECDEC_CONFIG", str(cfg))
    got = listing(capsys)
    assert len([m for m in got["models"] if m["source"] == "config"]) == 20
    monkeypatch.setattr(layouts, "MAX_VISITS", 5_000)
    got = listing(capsys)
    assert any("stopped after 5,000 entries" in s for s in got["skipped"])


def test_a_config_pair_names_store_models_and_a_draft_auto(home, models, small, tmp_path, monkeypatch, capsys):
    every_store(home, models, small)
    cfg = tmp_path / "pairs.toml"
    cfg.write_text(
        '[pairs.mine]\ntarget = "tiny-org/Tiny-GGUF:Q8_0"\ndraft = "auto"\n[pairs.given]\n'
        'target = "tiny-org/Tiny-GGUF:Q8_0"\ndraft = "tiny:latest"\ndrafter = "lookup"\n'
    )
    monkeypatch.setenv("SPECDEC_CONFIG", str(cfg))
    assert main(["generate", "hi", "--pair", "mine", "-n", "2", "--json", "-t", "1"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["draft_chosen_by"] == "auto" and config["draft"].endswith("Small-Q4_K_M.gguf")
    assert config["target"].endswith("tiny-q8_0.gguf")
    assert main(["generate", "hi", "--pair", "given", "-n", "2", "--json", "-t", "1"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]  # a lookup run keeps no draft (nor loads one)
    assert (config["draft"], config["draft_chosen_by"], config["drafter"]) == (None, None, "lookup")


# --- names a user types, as errors and tables show them ------------------------------------------------------------
def test_a_catalogue_name_not_yet_assembled_is_offered_as_the_closest(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "fresh"))  # a first run: nothing assembled, no store
    with pytest.raises(names.UsageError) as e:
        names.find("smollm2", stores.Scan(), role="--target")
    assert e.value.message == "--target 'smollm2': no such file or model"
    assert e.value.hint.startswith("closest: smollm2-135m (specdec, ")
    with pytest.raises(names.UsageError) as e:
        names.find("hf:smollm2", stores.Scan())  # another store's prefix: not the catalogue's
    assert "smollm2-135m" not in e.value.hint


@pytest.mark.parametrize("columns", [80, 120])
def test_models_list_never_wraps_a_name_and_fits_the_terminal(columns, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr(ui_models, "live_terminal", lambda: True)
    rows = [
        {"name": name, "source": source, "size": 1 << 30, "arch": "qwen2", "params": 1_500_000_000, "quant": "Q4_K_M",
         "path": f"/home/someone/.cache/huggingface/hub/models--org--repo/snapshots/{'a' * 40}/{name}.gguf", **extra}
        for name, source, extra in [
            ("qwen2.5-coder-1.5b", "specdec", {"status": "not downloaded"}),
            ("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M", "hf", {}),
            ("unsloth/gemma-3-270m-it-GGUF:Q8_0", "hf", {}),
        ]
    ]  # fmt: skip
    ui_models.models_table(rows)
    out = capsys.readouterr().out
    assert all(len(line) <= columns for line in out.splitlines()), out
    for r in rows:
        assert any(f"│ {r['name']} " in line for line in out.splitlines()), (r["name"], out)
    assert "not downloaded: its packages are missing: pip install 'specdec[models]'" in out.replace("\n", " ")
    assert "size" in out and ("path" in out.splitlines()[2] or "(paths: `specdec models list --json`" in out)
