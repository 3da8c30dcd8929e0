#!/usr/bin/env python3
"""The synthetic model pair of scripts/gpu_check.sh: a random-weight qwen2 target at real proportions, quantized, and
an early-exit draft cut from it. No download: Qwen2.5-Coder's vocabulary comes from a GGUF of metadata alone
(--vocab, no tensors), the weights from numpy's PCG64 seeded with (--seed, crc32 of the tensor's name).

    python scripts/gpu_models.py write OUTDIR/target-F16.gguf --vocab vocab.gguf [--tiny] [--alpha 0.01] [--arch qwen2]
    python scripts/gpu_models.py quantize OUTDIR/target-F16.gguf OUTDIR/target-Q4_K_M.gguf Q4_K_M
    python scripts/gpu_models.py cut OUTDIR/target-Q4_K_M.gguf OUTDIR/draft-Q4_K_M.gguf [--blocks N]
    python scripts/gpu_models.py hidden OUTDIR/target-Q4_K_M.gguf OUTDIR/eagle3.gguf --kind eagle3   (or dflash)

The target is shaped like Qwen2.5-1.5B (28 blocks x 1536, feed-forward 8960, 12 heads, 2 KV heads, tied embeddings),
of architecture llama (--arch qwen2: Qwen2's, with its q/k/v biases; llama is one llama.cpp hands its layer inputs out
of, which EAGLE-3 and DFlash drafts read); --tiny gives a stand-in for CPU tests (8 blocks x 256). Blocks from --draft-blocks on have their output
projections (attn_output, ffn_down) scaled by ALPHA: 0 makes the target compute what its first blocks compute, every
draft token accepted; larger makes it diverge. The draft is the target's first blocks byte for byte, cut after
quantizing: Q4_K_M picks attn_v and ffn_down types by a block's depth, so quantizing a short model would differ.
`hidden` writes a random EAGLE-3 or DFlash draft of the target's proportions (tests/native_models.py write_like:
EAGLE-3's one layer reading the target's layers 2, n/2 and n - 3; DFlash's two reading five, a block of 16), F32: they
draft nothing right, so their rows measure what a round costs, beside llama.cpp's loops on the same files.

`quantize` goes through llama.cpp's C API (llama-cpp-python, LLAMA_CPP_LIB_PATH), the same function llama-quantize
calls, for builds without that tool. Needs numpy and gguf (and llama_cpp for quantize).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import gguf
from gguf import GGUFReader, GGUFValueType, GGUFWriter

ALPHA = 0.01  # 2-core CPU, F16, greedy, k 8: specdec's draft model accepted 0.60 (0.57 at 0.012, 0.63 at 0.009)
SEED = 1234
DRAFT_BLOCKS = 4  # of 28: the draft costs about a seventh of the target per token
EMB_STD = 0.02  # small beside the blocks' outputs (~1): the logits follow the blocks, not the input token
OUT_NORM = 10.0  # output_norm's weight: logits of std ~8, peaked as a trained model's are
Q_GAIN = 2.0  # attention scores of std ~4: sharper than uniform, as trained attention is
FULL = dict(n_embd=1536, n_ff=8960, n_head=12, n_head_kv=2, n_layer=28, n_draft=DRAFT_BLOCKS)  # Qwen2.5-1.5B
TINY = dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=8, n_draft=2)  # 256: Q4_K's block width
CTX = 32768  # Qwen2.5's trained context
DRAFT_KEY = "specdec.gpu_check.draft_blocks"  # the target says where its draft ends (quantizing keeps the key)
VOCAB_SKIP = (
    "general.architecture",
    "general.file_type",
    "general.name",
    "general.size_label",
    "general.finetune",
    "general.basename",
    "general.quantization_version",
)


def copy_fields(reader: GGUFReader, writer: GGUFWriter, skip, replace: dict | None = None) -> None:
    """Every metadata key of `reader` into `writer`, with its own GGUF type, less `skip`; `replace`: new values."""
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or skip(key):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, (replace or {}).get(key, field.contents()), vtype, sub)


def tensor_plan(s: dict, n_vocab: int, biases: bool = True) -> list[tuple[str, tuple, float | None, type, bool]]:
    """(name, numpy shape, std (None: a norm), dtype, scaled by alpha) for every tensor, in file order (biases:
    Qwen2's q/k/v biases)."""
    d, ff = s["n_embd"], s["n_ff"]
    dkv = d // s["n_head"] * s["n_head_kv"]
    plan = [
        ("token_embd.weight", (n_vocab, d), EMB_STD, np.float16, False),
        ("output_norm.weight", (d,), None, np.float32, False),
    ]
    for i in range(s["n_layer"]):
        late, p = i >= s["n_draft"], f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", (d,), None, np.float32, False),
            (p + "attn_q.weight", (d, d), Q_GAIN / d**0.5, np.float16, False),
            (p + "attn_q.bias", (d,), 0.1, np.float32, False),
            (p + "attn_k.weight", (dkv, d), 1 / d**0.5, np.float16, False),
            (p + "attn_k.bias", (dkv,), 0.1, np.float32, False),
            (p + "attn_v.weight", (dkv, d), 1 / d**0.5, np.float16, False),
            (p + "attn_v.bias", (dkv,), 0.1, np.float32, False),
            (p + "attn_output.weight", (d, d), 1 / d**0.5, np.float16, late),
            (p + "ffn_norm.weight", (d,), None, np.float32, False),
            (p + "ffn_gate.weight", (ff, d), 1 / d**0.5, np.float16, False),
            (p + "ffn_up.weight", (ff, d), 1 / d**0.5, np.float16, False),
            (p + "ffn_down.weight", (d, ff), 1 / ff**0.5, np.float16, late),
        ]
    return [t for t in plan if biases or not t[0].endswith(".bias")]


def values(item: tuple, seed: int, alpha: float) -> np.ndarray:
    """One tensor's values: its own seeded stream, so that they do not depend on the order or process making them."""
    name, shape, std, dtype, late = item
    if std is None:  # a norm
        return np.full(shape, OUT_NORM if name == "output_norm.weight" else 1.0, np.float32)
    a = np.random.default_rng([seed, zlib.crc32(name.encode())]).standard_normal(shape, dtype=np.float32)
    a *= std * (alpha if late else 1.0)
    return a.astype(dtype)


def write(out: Path, vocab: Path, tiny: bool, alpha: float, seed: int, jobs: int, arch: str = "llama") -> None:
    """The F16 target, written to OUT.part and renamed whole (a killed run leaves no half model); its tensors made
    by `jobs` processes (a 1.5B one takes minutes on one core), written in order as they come."""
    t0 = time.time()
    s = TINY if tiny else FULL
    voc = GGUFReader(vocab)
    n_vocab = len(voc.fields["tokenizer.ggml.tokens"].data)
    part = out.with_name(out.name + ".part")
    w = GGUFWriter(str(part), arch)
    copy_fields(voc, w, lambda k: k.startswith("qwen2.") or k in VOCAB_SKIP)
    w.add_name(f"specdec gpu_check random {arch} ({'tiny' if tiny else '1.5B'}) alpha={alpha:g} seed={seed}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_block_count(s["n_layer"])
    w.add_context_length(CTX)
    w.add_embedding_length(s["n_embd"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(DRAFT_KEY, s["n_draft"])
    if arch == "llama":
        w.add_rope_dimension_count(s["n_embd"] // s["n_head"])
    plan = tensor_plan(s, n_vocab, biases=arch == "qwen2")
    for name, shape, _, dtype, _ in plan:
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        for a in pool.map(functools.partial(values, seed=seed, alpha=alpha), plan):
            w.write_tensor_data(a)
    w.close()
    part.replace(out)
    shape = "tiny" if tiny else "1.5B"
    print(f"wrote {out} ({shape}, alpha {alpha:g}, seed {seed}) in {time.time() - t0:.1f} s with {jobs} processes")


def cut(src: Path, dst: Path, blocks: int | None) -> None:
    """An early-exit draft: the first `blocks` blocks of `src` (None: as many as the target's unscaled blocks),
    its token_embd and output_norm, byte for byte."""
    t0 = time.time()
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    n_layer = r.fields[f"{arch}.block_count"].contents()
    if blocks is None:
        blocks = r.fields[DRAFT_KEY].contents() if DRAFT_KEY in r.fields else DRAFT_BLOCKS
    if not 0 < blocks < n_layer:
        sys.exit(f"error: --blocks must be 1..{n_layer - 1} for {src} ({n_layer} blocks), got {blocks}")
    part = dst.with_name(dst.name + ".part")
    w = GGUFWriter(str(part), arch)
    name = r.fields["general.name"].contents() if "general.name" in r.fields else src.name
    replace = {f"{arch}.block_count": blocks, "general.name": f"early-exit draft ({blocks} blocks) of {name}"}
    copy_fields(r, w, lambda k: k == "general.architecture", replace)
    keep = [t for t in r.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < blocks]
    for t in keep:  # quantized tensors are written as their raw blocks, with their own type
        raw = t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, raw_dtype=t.tensor_type if raw else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in keep:
        w.write_tensor_data(np.asarray(t.data))
    w.close()
    part.replace(dst)
    print(
        f"wrote {dst}: {len(keep)} tensors, the first {blocks} of {n_layer} blocks of {src} in {time.time() - t0:.1f} s"
    )


def hidden(target: Path, dst: Path, kind: str) -> None:
    """tests/native_models.py's write_like, to DST.part and renamed whole."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import native_models

    t0 = time.time()
    part = dst.with_name(dst.name + ".part")
    native_models.write_like(target, part, kind)
    part.replace(dst)
    print(f"wrote {dst} ({kind}, {dst.stat().st_size / 2**20:.0f} MiB) in {time.time() - t0:.1f} s")


def quantize(src: Path, dst: Path, qtype: str, threads: int) -> None:
    """llama_model_quantize, as llama-quantize calls it (its default parameters, all cores unless --threads)."""
    import llama_cpp.llama_cpp as L

    t0 = time.time()
    ftype = getattr(L, f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}", None)
    if ftype is None:
        sys.exit(f"error: unknown quantization {qtype!r} (e.g. Q4_K_M, Q8_0)")
    params = L.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, threads
    part = dst.with_name(dst.name + ".part")
    L.llama_backend_init()
    if L.llama_model_quantize(str(src).encode(), str(part).encode(), params) != 0:
        sys.exit(f"error: llama_model_quantize failed for {src} -> {qtype}")
    part.replace(dst)
    mb = dst.stat().st_size / 2**20
    print(f"wrote {dst} ({qtype}, {mb:.0f} MiB) through llama_model_quantize in {time.time() - t0:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="the F16 target")
    w.add_argument("out", type=Path)
    w.add_argument("--vocab", type=Path, required=True, help="a GGUF with Qwen2.5's tokenizer metadata")
    w.add_argument("--tiny", action="store_true", help="8 blocks x 256, for CPU tests")
    w.add_argument("--alpha", type=float, default=ALPHA)
    w.add_argument("--seed", type=int, default=SEED)
    w.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes making tensors [every core]")
    q = sub.add_parser("quantize", help="through llama.cpp's C API")
    q.add_argument("src", type=Path)
    q.add_argument("dst", type=Path)
    q.add_argument("type")
    q.add_argument("--threads", type=int, default=0)
    c = sub.add_parser("cut", help="an early-exit draft from a (quantized) target")
    c.add_argument("src", type=Path)
    c.add_argument("dst", type=Path)
    c.add_argument("--blocks", type=int, help=f"blocks to keep [the target's {DRAFT_KEY}, else {DRAFT_BLOCKS}]")
    h = sub.add_parser("hidden", help="a random EAGLE-3 or DFlash draft of the target's proportions")
    h.add_argument("target", type=Path)
    h.add_argument("dst", type=Path)
    h.add_argument("--kind", choices=["eagle3", "dflash"], required=True)
    w.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
    a = ap.parse_args()
    if a.cmd == "write":
        write(a.out, a.vocab, a.tiny, a.alpha, a.seed, a.jobs, a.arch)
    elif a.cmd == "hidden":
        hidden(a.target, a.dst, a.kind)
    elif a.cmd == "quantize":
        quantize(a.src, a.dst, a.type, a.threads)
    else:
        cut(a.src, a.dst, a.blocks)


if __name__ == "__main__":
    main()
