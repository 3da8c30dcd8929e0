"""Tiny GGUFs for the drafters that read a target's hidden states (EAGLE-3, DFlash): a target with a designed rule
and drafts whose weights compute it, so that acceptance is exercised (random drafts accept nothing).

The target counts. Every byte b has a code c(b): cos and sin of 2*pi*f*b/256 for 16 frequencies f (32 dimensions of
the residual stream), and one dimension holds a constant (CONST). Attention is off (zero weights); layer 0's FFN
rotates the code by one step (c(b) -> c(b + 1): a linear map, made exact by a gate that reads the constant), and layer
1's FFN adds one more step for the bytes in SKIPS (neurons that fire on those codes alone). The output head reads the
code. So greedy decoding writes b + 1 after b, or b + 2 where b + 1 is in SKIPS: "abcdef..." with a byte skipped now
and then. Layer 0's input at a position holds c(b); layer 1's holds c(b + 1), the next byte as far as the rotation
knows (not the skips).

EAGLE-3 (`write_eagle3`): `fc` copies the first target layer's code into g, and the decoder's FFN rotates g one step;
the target's own output head reads it. Reading layer 1 (g = c(x_P + 1), the pair's token being x_{P+1}) it drafts
x_P + 2, x_P + 3, ...: right until a skip. Reading layer 0 (the negative control) it drafts one byte behind, always
wrong.

DFlash (`write_dflash`): every committed position's features are injected into its cache; the block's mask tokens
attend, by RoPE alone (no content), to the position OFFSET back, whose value is its code rotated OFFSET - 1 steps:
c(x_p + 1) -> c(x_p + OFFSET) = the token at the mask's own position. Right until a skip; one behind with layer 0.

All F32, milliseconds to load. Bad files for the refusals: `write_eagle3(hidden=32)`, `layers=(5, ...)`,
`write_dflash(mask=False)`; a qwen2 target (`write_qwen2_target`) cannot feed either.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGUFWriter

from tiny_models import _add_byte_tokenizer, byte_vocab, finish

N_EMBD = 64
N_LAYER = 2
N_FF = 128
N_HEAD, N_HEAD_KV = 4, 2  # the target's (its attention is off)
CODE = 32  # code dimensions: 16 frequencies, cos and sin
CONST_DIM = 63  # the constant's dimension in the target's residual stream
FEATURE_DIM = 62  # DFlash: where fc puts the constant (so the block's own tokens, which lack it, have no key)
CONST = 4.0
SCALE = 0.3  # the output head's: the next byte ~70% likely (a soft distribution to sample from; greedy margins ~4)
SKIPS = frozenset(range(ord("a") + 7, 256, 13))  # bytes the target skips over ("h", "u", 0x82, ...)
BOS_BYTE = ord("`")  # what <s> stands for: after it the target writes "a"
GATE = 20.0  # a gate this large is silu's identity (silu(20) = 20 * (1 - 2e-9))
BLOCK = 5  # DFlash's trained block: 4 drafted tokens
OFFSET = 5  # DFlash attends this many positions back (> the drafted tokens: always a committed position)
ROPE_BASE = 2.0  # DFlash: frequencies close together, so one relative position stands out (margin ~8 of 32)
EPS = 1e-5


def frequencies(seed: int = 3) -> np.ndarray:
    """16 distinct frequencies whose codes are far apart (two bytes' codes agree at most ~half as much as one's own)."""
    return np.random.default_rng(seed).choice(np.arange(1, 128), CODE // 2, replace=False)


FREQ = frequencies()


def code(b) -> np.ndarray:
    """c(b): shape (..., CODE)."""
    angle = 2 * np.pi * np.multiply.outer(np.asarray(b) % 256, FREQ) / 256
    return np.stack([np.cos(angle), np.sin(angle)], axis=-1).reshape(*np.shape(b), CODE)


def rotation(steps: int) -> np.ndarray:
    """R^steps on codes: c(b) -> c(b + steps)."""
    r = np.zeros((CODE, CODE))
    for j, f in enumerate(FREQ):
        a = 2 * np.pi * f * steps / 256
        r[2 * j : 2 * j + 2, 2 * j : 2 * j + 2] = [[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]
    return r


RMS = float(np.sqrt((CODE // 2 + CONST**2) / N_EMBD))  # the residual stream's: a code's norm is constant


def target_rule(b: int) -> int:
    """The byte the target writes after byte b."""
    nxt = (b + 1) % 256
    return (nxt + 1) % 256 if nxt in SKIPS else nxt


def _residual(codes: np.ndarray) -> np.ndarray:
    x = np.zeros((len(codes), N_EMBD))
    x[:, :CODE] = codes
    x[:, CONST_DIM] = CONST
    return x


def _rotating_ffn(prefix: str, steps: int = 1, const_dim: int = CONST_DIM, rms: float = RMS) -> dict:
    """An FFN that adds (R^steps - I) c to the residual, on a stream whose rms is `rms` and whose constant (CONST)
    sits at `const_dim`: gate neurons read the constant (GATE: silu is then linear), up reads the code."""
    gate = np.zeros((N_FF, N_EMBD))
    gate[:CODE, const_dim] = GATE * rms / CONST
    up = np.zeros((N_FF, N_EMBD))
    up[:CODE, :CODE] = np.eye(CODE)
    down = np.zeros((N_EMBD, N_FF))
    down[:CODE, :CODE] = (rotation(steps) - np.eye(CODE)) * rms / _silu(GATE)
    return {f"{prefix}.ffn_gate.weight": gate, f"{prefix}.ffn_up.weight": up, f"{prefix}.ffn_down.weight": down}


def _silu(x: float) -> float:
    return x / (1 + np.exp(-x))


def _skipping_ffn(prefix: str) -> dict:
    """One neuron per skipped byte e: it fires only on c(e) (its gate: the code's agreement with c(e), less all but
    one of a perfect agreement), and moves c(e) to c(e + 1)."""
    gate, up, down = np.zeros((N_FF, N_EMBD)), np.zeros((N_FF, N_EMBD)), np.zeros((N_EMBD, N_FF))
    for n, e in enumerate(sorted(SKIPS)):  # gate = GATE * (agreement - 15): GATE on c(e), <= -100 elsewhere
        gate[n, :CODE] = GATE * RMS * code(e)  # (the stream is normalised by RMS)
        gate[n, CONST_DIM] = -GATE * RMS * (CODE // 2 - 1) / CONST
        up[n, CONST_DIM] = RMS / CONST
        down[:CODE, n] = (code(e + 1) - code(e)) / _silu(GATE)
    return {f"{prefix}.ffn_gate.weight": gate, f"{prefix}.ffn_up.weight": up, f"{prefix}.ffn_down.weight": down}


def target_weights(n_vocab: int) -> dict[str, np.ndarray]:
    bytes_ = np.arange(256)
    embd = np.zeros((n_vocab, N_EMBD))
    embd[:, CONST_DIM] = CONST
    embd[3:] = _residual(code(bytes_))
    embd[1, :CODE] = code(BOS_BYTE)
    out = np.zeros((n_vocab, N_EMBD))
    out[3:, :CODE] = SCALE * code(bytes_)
    out[:3, CONST_DIM] = -30 * SCALE  # control tokens (end of text among them): hardly ever drawn
    head_dim = N_EMBD // N_HEAD
    t = {"token_embd.weight": embd, "output_norm.weight": np.ones(N_EMBD), "output.weight": out}
    for i in range(N_LAYER):
        t |= {
            f"blk.{i}.attn_norm.weight": np.ones(N_EMBD),
            f"blk.{i}.attn_q.weight": np.zeros((N_EMBD, N_EMBD)),
            f"blk.{i}.attn_k.weight": np.zeros((N_HEAD_KV * head_dim, N_EMBD)),
            f"blk.{i}.attn_v.weight": np.zeros((N_HEAD_KV * head_dim, N_EMBD)),
            f"blk.{i}.attn_output.weight": np.zeros((N_EMBD, N_EMBD)),
            f"blk.{i}.ffn_norm.weight": np.ones(N_EMBD),
        }
    t |= _rotating_ffn("blk.0") | _skipping_ffn("blk.1")
    return {k: v.astype(np.float32) for k, v in t.items()}


def _start(path: Path, arch: str, n_layer: int, n_head: int, n_head_kv: int, n_embd: int = N_EMBD) -> GGUFWriter:
    w = GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    w.add_context_length(32768)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(EPS)
    w.add_file_type(0)
    return w


def write_target(path: Path, arch: str = "llama") -> Path:
    """The counting target (arch llama; "qwen2" writes the same weights as a qwen2 model, which cannot feed a
    drafter: llama.cpp extracts no layer inputs from it)."""
    vocab = byte_vocab()
    w = _start(path, arch, N_LAYER, N_HEAD, N_HEAD_KV)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    _add_byte_tokenizer(w, vocab)
    return finish(w, target_weights(len(vocab)), path)


def _tokenizer(w: GGUFWriter, mask: bool) -> None:
    """The target's tokenizer (a drafter borrows its embeddings and head); DFlash's mask token is <unk> (id 0): its
    embedding holds the constant alone."""
    _add_byte_tokenizer(w, byte_vocab())
    if mask:
        w.add_mask_token_id(0)


def write_eagle3(
    path: Path,
    layers: tuple[int, ...] = (1, 1, 1),
    hidden: int = N_EMBD,
    d2t: int | None = None,
    n_embd: int = N_EMBD,
    nan: bool = False,
    embd_rows: int | None = None,
) -> Path:
    """An EAGLE-3 draft for the counting target reading target layers `layers` (their inputs); `hidden`: the target
    hidden size it says it was made for (another than the target's: a bad file); d2t: a reduced draft vocabulary
    (the byte tokens, mapped to target ids from 3 + d2t: 0 is right, past the vocabulary a bad file); nan: its
    output norm NaN (every logit it computes is)."""
    w = _start(path, "eagle3", 1, N_HEAD, N_HEAD_KV, n_embd)
    w.add_rope_dimension_count(n_embd // N_HEAD)
    w.add_array("eagle3.target_layers", list(layers))
    w.add_uint32("eagle3.target_hidden_size", hidden)
    _tokenizer(w, mask=False)
    e = n_embd
    fc = np.zeros((e, len(layers) * hidden))
    fc[:CODE, :CODE] = np.eye(CODE)  # g = the first layer's code ...
    fc[CONST_DIM, CONST_DIM] = 1.0  # ... and its constant
    head_dim = e // N_HEAD
    t = {
        "fc.weight": fc,
        "output_norm.weight": np.ones(e),
        "blk.0.attn_norm.weight": np.ones(e),
        "blk.0.attn_norm_2.weight": np.ones(e),
        "blk.0.attn_q.weight": np.zeros((N_HEAD * head_dim, 2 * e)),
        "blk.0.attn_k.weight": np.zeros((N_HEAD_KV * head_dim, 2 * e)),
        "blk.0.attn_v.weight": np.zeros((N_HEAD_KV * head_dim, 2 * e)),
        "blk.0.attn_output.weight": np.zeros((e, N_HEAD * head_dim)),
        "blk.0.ffn_norm.weight": np.ones(e),
    } | _rotating_ffn("blk.0")
    if d2t is not None:  # a reduced draft vocabulary: its head's rows are the byte tokens, mapped to their target ids
        n = 256
        t["output.weight"] = target_weights(259)["output.weight"][3:]
        t["d2t"] = np.arange(3 + d2t, 3 + d2t + n, dtype=np.int64)
    if nan:
        t["output_norm.weight"] = np.full(e, np.nan)
    if embd_rows is not None:  # its own token embeddings, for that many tokens (fewer than its vocabulary: bad)
        t["token_embd.weight"] = target_weights(259)["token_embd.weight"][:embd_rows]
    return finish(w, {k: v.astype(np.float32) if v.dtype != np.int64 else v for k, v in t.items()}, path)


def write_dflash(
    path: Path,
    layers: tuple[int, ...] = (1,),
    block: int = BLOCK,
    mask: bool = True,
    n_embd: int = N_EMBD,
    dflash2: bool = False,
) -> Path:
    """A DFlash draft for the counting target reading target layers `layers` (the first one's code is used);
    `mask=False`: no mask token (a bad file); `n_embd` other than the target's: a bad file. dflash2: a DFlash2 draft
    that drafts the same (its convolutions pass their input through, its selector scores each candidate by its
    logit alone)."""
    e = n_embd
    w = _start(path, "dflash", 1, 1, 1, e)
    w.add_rope_dimension_count(e)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_key_length(e)
    w.add_value_length(e)
    w.add_array("dflash.target_layers", list(layers))
    w.add_uint32("dflash.block_size", block)
    _tokenizer(w, mask)
    k = len(layers)
    fc = np.zeros((e, k * e))
    if e != N_EMBD:  # a bad file: the shapes of one, no design
        return finish(w, {k: v.astype(np.float32) for k, v in _dflash_tensors(e, fc).items()}, path)
    fc[:CODE, :CODE] = np.eye(CODE)
    fc[FEATURE_DIM, CONST_DIM] = 1.0  # the feature's constant moves: only injected rows have a key
    # The query (a mask token: the constant alone) and the key (an injected row: the feature's constant), each a unit
    # per rotation pair (NeoX: dims j, j + e/2), the key turned so that q.k peaks at OFFSET positions back.
    half = e // 2
    theta = ROPE_BASE ** (-2 * np.arange(half) / e)
    wq, wk = np.zeros((e, e)), np.zeros((e, e))
    rms_mask = CONST / np.sqrt(e)  # a mask token's stream: CONST at one dimension
    wq[:half, CONST_DIM] = 1.0 / (CONST / rms_mask)
    rms_g = RMS  # the injected features' stream, normalised by enc.output_norm (fc keeps code and constant)
    wk[:half, FEATURE_DIM] = np.cos(OFFSET * theta) * rms_g / CONST
    wk[half:, FEATURE_DIM] = np.sin(OFFSET * theta) * rms_g / CONST
    wv = np.zeros((e, e))
    wv[:CODE, :CODE] = rotation(OFFSET - 1) * rms_g  # the value: c(x_p + 1) -> c(x_p + OFFSET)
    wo = np.zeros((e, e))
    wo[:CODE, :CODE] = np.eye(CODE)
    t = _dflash_tensors(e, fc, wq, wk, wv, wo)
    if dflash2:
        t |= _dflash2(w, e)
    return finish(w, {k: v.astype(np.float32) for k, v in t.items()}, path)


DFLASH2_KERNEL, DFLASH2_GROUP, DFLASH2_RANK, DFLASH2_TOP_K = 2, 8, 4, 4


def _dflash2(w: GGUFWriter, e: int) -> dict[str, np.ndarray]:
    """DFlash2's metadata and tensors: identity convolutions (the first tap's weight 1, no dynamic part), a selector
    with no pairwise term (its gate is zero: a candidate's score is its logit)."""
    w.add_uint32("dflash.conv_kernel_size", DFLASH2_KERNEL)
    w.add_uint32("dflash.conv_group_size", DFLASH2_GROUP)
    w.add_uint32("dflash.selector_rank", DFLASH2_RANK)
    w.add_uint32("dflash.selector_top_k", DFLASH2_TOP_K)
    base = np.zeros((2, DFLASH2_KERNEL, e))
    base[:, 0, :] = 1.0
    projected = 2 * DFLASH2_KERNEL * (e // DFLASH2_GROUP)
    rng = np.random.default_rng(5)
    n_vocab = len(byte_vocab())
    return {
        "selector_hidden.weight": np.zeros((DFLASH2_RANK, e)),
        "selector_predecessor.weight": rng.standard_normal((n_vocab, DFLASH2_RANK)),
        "selector_successor.weight": rng.standard_normal((n_vocab, DFLASH2_RANK)),
        "blk.0.attn_conv_base": base,
        "blk.0.attn_conv_proj.weight": np.zeros((projected, e)),
        "blk.0.ffn_conv_base": base,
        "blk.0.ffn_conv_proj.weight": np.zeros((projected, e)),
    }


def _dflash_tensors(e: int, fc, wq=None, wk=None, wv=None, wo=None) -> dict[str, np.ndarray]:
    zero = np.zeros((e, e))
    return {
        "fc.weight": fc,
        "enc.output_norm.weight": np.ones(e),
        "output_norm.weight": np.ones(e),
        "blk.0.attn_norm.weight": np.ones(e),
        "blk.0.attn_q.weight": zero if wq is None else wq,
        "blk.0.attn_k.weight": zero if wk is None else wk,
        "blk.0.attn_v.weight": zero if wv is None else wv,
        "blk.0.attn_output.weight": zero if wo is None else wo,
        "blk.0.attn_q_norm.weight": np.full(e, 5.0),  # with the key's: q.k = 200 at the offset, <= 148 elsewhere
        "blk.0.attn_k_norm.weight": np.full(e, 5.0),
        "blk.0.ffn_norm.weight": np.ones(e),
        "blk.0.ffn_gate.weight": np.zeros((N_FF, e)),
        "blk.0.ffn_up.weight": np.zeros((N_FF, e)),
        "blk.0.ffn_down.weight": np.zeros((e, N_FF)),
    }


def _d2t_short(path: Path) -> Path:
    """A d2t map shorter than its head's rows (llama.cpp asserts they agree)."""
    write_eagle3(path, d2t=0)
    from gguf import GGUFReader

    r = GGUFReader(path)
    w = GGUFWriter(str(path) + ".tmp", "eagle3")
    for k, f in r.fields.items():
        if not k.startswith("GGUF.") and k != "general.architecture":
            vt = f.types[0]
            w.add_key_value(k, f.contents(), vt, f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    tensors = {t.name: np.array(t.data) for t in r.tensors}
    tensors["d2t"] = tensors["d2t"][:200]
    finish(w, tensors, path)
    Path(str(path) + ".tmp").replace(path)
    return path


def counting(start: int, n: int) -> bytes:
    """What the target writes after byte `start`, n bytes."""
    out, b = [], start
    for _ in range(n):
        b = target_rule(b)
        out.append(b)
    return bytes(out)


def write_native_set(folder: Path) -> dict[str, Path]:
    """counter (the target), counter_qwen2 (the same as qwen2: cannot feed a drafter), eagle3 / dflash (drafts that
    agree with it until a skip), eagle3_d2t (a reduced draft vocabulary), eagle3_nan (every logit NaN), dflash2
    (drafts as dflash does),
    eagle3_wrong / dflash_wrong (the negative controls: layer 0, one byte behind), and
    bad files: eagle3_hidden32, eagle3_layer5, dflash_layer2 (= the target's layers: a layer input llama.cpp does not
    extract from llama), dflash_nomask, dflash_embd32, eagle3_d2t_bad (its d2t map past the vocabulary),
    eagle3_d2t_short (a d2t map shorter than its head), eagle3_embd_short (its own embeddings for 100 tokens)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "counter": write_target(folder / "counter.gguf"),
        "counter_qwen2": write_target(folder / "counter_qwen2.gguf", arch="qwen2"),
        "eagle3": write_eagle3(folder / "eagle3.gguf"),
        "eagle3_wrong": write_eagle3(folder / "eagle3_wrong.gguf", layers=(0, 0, 0)),
        "eagle3_d2t": write_eagle3(folder / "eagle3_d2t.gguf", d2t=0),
        "eagle3_nan": write_eagle3(folder / "eagle3_nan.gguf", nan=True),
        "eagle3_d2t_bad": write_eagle3(folder / "eagle3_d2t_bad.gguf", d2t=100),
        "eagle3_d2t_short": _d2t_short(folder / "eagle3_d2t_short.gguf"),
        "eagle3_embd_short": write_eagle3(folder / "eagle3_embd_short.gguf", embd_rows=100),
        "dflash": write_dflash(folder / "dflash.gguf"),
        "dflash_wrong": write_dflash(folder / "dflash_wrong.gguf", layers=(0,)),
        "dflash2": write_dflash(folder / "dflash2.gguf", dflash2=True),
        "eagle3_hidden32": write_eagle3(folder / "eagle3_hidden32.gguf", hidden=32),
        "eagle3_layer5": write_eagle3(folder / "eagle3_layer5.gguf", layers=(0, 1, 5)),
        "dflash_layer2": write_dflash(folder / "dflash_layer2.gguf", layers=(2,)),
        "dflash_nomask": write_dflash(folder / "dflash_nomask.gguf", mask=False),
        "dflash_embd32": write_dflash(folder / "dflash_embd32.gguf", n_embd=32),
    }


def write_like(target: Path, path: Path, arch: str, seed: int = 7) -> Path:
    """A random EAGLE-3 (`arch` "eagle3") or DFlash ("dflash") draft of a real target's proportions, with its
    tokenizer, borrowing its embeddings and head: llama.cpp loads and runs it as it would a published one (which the
    package index has none of); it drafts nothing right. EAGLE-3 reads llama.cpp's convert default layers
    (2, n/2, n - 3), DFlash five layers spread over the target's, a block of 16 with the target's token 0 as mask."""
    from gguf import GGUFReader, GGUFValueType

    r = GGUFReader(target)
    t_arch = r.fields["general.architecture"].contents()
    meta = {k: f.contents() for k, f in r.fields.items() if k.startswith(f"{t_arch}.")}
    e, n, ff = meta[f"{t_arch}.embedding_length"], meta[f"{t_arch}.block_count"], meta[f"{t_arch}.feed_forward_length"]
    heads, kv = meta[f"{t_arch}.attention.head_count"], meta[f"{t_arch}.attention.head_count_kv"]
    hd = e // heads
    w = GGUFWriter(str(path), arch)
    for k, f in r.fields.items():  # its tokenizer, as a published draft carries its target's
        if k.startswith("tokenizer."):
            vt = f.types[0]
            w.add_key_value(k, f.contents(), vt, f.types[-1] if vt == GGUFValueType.ARRAY else None)
    w.add_name(path.stem)
    w.add_context_length(meta[f"{t_arch}.context_length"])
    w.add_embedding_length(e)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(meta.get(f"{t_arch}.rope.freq_base", 10000.0)))
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape) * 0.02

    blocks = 1 if arch == "eagle3" else 2
    w.add_block_count(blocks)
    t: dict[str, np.ndarray] = {"output_norm.weight": np.ones(e)}
    if arch == "eagle3":
        layers = [2, n // 2, n - 3]
        w.add_array("eagle3.target_layers", layers)
        w.add_uint32("eagle3.target_hidden_size", e)
        t |= {"fc.weight": rand(e, 3 * e), "blk.0.attn_norm_2.weight": np.ones(e)}
        width = 2 * e
    else:
        layers = [1 + i * (n - 2) // 4 for i in range(5)]
        w.add_array("dflash.target_layers", layers)
        w.add_uint32("dflash.block_size", 16)
        w.add_mask_token_id(0)
        t |= {"fc.weight": rand(e, 5 * e), "enc.output_norm.weight": np.ones(e)}
        width = e
    for b in range(blocks):
        p = f"blk.{b}."
        t |= {
            p + "attn_norm.weight": np.ones(e),
            p + "attn_q.weight": rand(heads * hd, width),
            p + "attn_k.weight": rand(kv * hd, width),
            p + "attn_v.weight": rand(kv * hd, width),
            p + "attn_output.weight": rand(e, heads * hd),
            p + "ffn_norm.weight": np.ones(e),
            p + "ffn_gate.weight": rand(ff, e),
            p + "ffn_up.weight": rand(ff, e),
            p + "ffn_down.weight": rand(e, ff),
        }
        if arch == "dflash":
            t |= {p + "attn_q_norm.weight": np.ones(hd), p + "attn_k_norm.weight": np.ones(hd)}
    return finish(w, {k: v.astype(np.float32) for k, v in t.items()}, path)


if __name__ == "__main__":  # python tests/native_models.py FOLDER: the set, to try them by hand
    import sys

    for name, path in write_native_set(Path(sys.argv[1] if len(sys.argv) > 1 else "native-fixtures")).items():
        print(f"{name:16} {path}")
