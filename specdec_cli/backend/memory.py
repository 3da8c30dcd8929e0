"""What a model's caches cost and how they drop a rejected draft: a KV cell per token for attention
layers, one state per sequence for recurrent ones (and the per-token snapshots llama.cpp keeps of it for
some architectures), read from the GGUF header and asked of llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import llama_cpp.llama_cpp as L

from ..errors import SpecdecError
from . import gguf_file

RECURRENT_TENSORS = ("ssm_", "shortconv.", "time_mix_")  # a layer with any of these keeps a recurrent state


def rollback(model_ptr, name: str) -> str:
    """A recurrent or hybrid model's cache: "snapshots" where llama.cpp keeps per-token snapshots of its
    state for the architecture (n_rs_seq), else "none". llama.cpp says which by honouring n_rs_seq in a
    context (it clamps it to 0 otherwise), so a small probe context asks it."""
    params = L.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 16
    params.n_seq_max, params.n_rs_seq, params.n_threads, params.n_threads_batch = 1, 1, 1, 1
    ctx = L.llama_init_from_model(model_ptr, params)
    if not ctx:
        raise SpecdecError(f"cannot create a llama.cpp context for {name}")
    try:
        return "snapshots" if L.llama_n_rs_seq(ctx) > 0 else "none"
    finally:
        L.llama_free(ctx)


def kv_bytes_per_token(model_ptr, meta: Callable[[str], str | None], hybrid: Path | None = None) -> int:
    """KV-cache bytes one context position takes: F16 keys and values in every attention layer (`meta`: the
    model's metadata; `hybrid`: a hybrid model's file, whose recurrent layers have no cells)."""
    n_head = L.llama_model_n_head(model_ptr)
    if n_head <= 0:  # no attention (recurrent): its state does not grow with the context
        return 0
    arch = meta("general.architecture")
    # Heads may be wider than n_embd / n_head (Qwen3: 128 vs 64): the file says so when they are.
    k_dim = int(meta(f"{arch}.attention.key_length") or L.llama_model_n_embd(model_ptr) // n_head)
    v_dim = int(meta(f"{arch}.attention.value_length") or k_dim)
    n_layer, n_head_kv = L.llama_model_n_layer(model_ptr), L.llama_model_n_head_kv(model_ptr)
    if hybrid is not None:  # only its attention layers have cells (their head count, per layer)
        h = gguf_file.header(hybrid)
        n_layer -= len(recurrent_layers(h))
        n_head_kv = max(gguf_file.per_layer(h.metadata, f"{arch}.attention.head_count_kv") or [n_head_kv])
    return n_layer * n_head_kv * (k_dim + v_dim) * 2


def kv_bytes_in_header(path: Path) -> int:
    """The same, from the GGUF header alone (a model loaded without its weights has no hyperparameters):
    the widest layer's key-value heads in every attention layer."""
    h = gguf_file.header(path)
    meta = h.metadata
    arch = meta.get("general.architecture")
    heads = gguf_file.per_layer(meta, f"{arch}.attention.head_count") or [0]
    if max(heads) <= 0:
        return 0
    n_embd = gguf_file.int_value(meta, f"{arch}.embedding_length") or 0
    k_dim = gguf_file.int_value(meta, f"{arch}.attention.key_length") or n_embd // max(heads)
    v_dim = gguf_file.int_value(meta, f"{arch}.attention.value_length") or k_dim
    n_layer = (gguf_file.int_value(meta, f"{arch}.block_count") or 0) - len(recurrent_layers(h))
    n_head_kv = max(gguf_file.per_layer(meta, f"{arch}.attention.head_count_kv") or heads)
    return n_layer * n_head_kv * (k_dim + v_dim) * 2


def recurrent_layers(h: gguf_file.Header) -> set[int]:
    """The layers that keep a recurrent state (the others, in a hybrid model, attend over KV cells)."""
    return {
        int(t.name.split(".")[1])
        for t in h.tensors
        if t.name.startswith("blk.") and any(t.name.split(".", 2)[-1].startswith(p) for p in RECURRENT_TENSORS)
    }


def state_bytes(path: Path) -> int:
    """Bytes of one sequence's recurrent state (one snapshot), as llama.cpp sizes it: F32 rows of
    llama_hparams::n_embd_r (the convolution's last tokens) + n_embd_s (the scan's state) in every layer
    that has recurrent tensors. Mamba, Mamba-2, Gated DeltaNet (qwen35), short-conv (lfm2) and RWKV."""
    h = gguf_file.header(path)
    arch = h.metadata.get("general.architecture")

    def key(name: str) -> int:
        return gguf_file.int_value(h.metadata, f"{arch}.{name}") or 0

    n_embd, head = key("embedding_length"), key("wkv.head_size")
    if head:  # RWKV: token shifts and the wkv state
        r, s = (key("token_shift_count") or 2) * n_embd, n_embd * head
    elif key("shortconv.l_cache"):  # LFM2: the short convolution's last tokens
        r, s = n_embd * (key("shortconv.l_cache") - 1), 0
    else:  # Mamba-like: the convolution over x, B and C, and a state per inner channel
        inner, state = key("ssm.inner_size"), key("ssm.state_size")
        r = max(key("ssm.conv_kernel") - 1, 0) * (inner + 2 * key("ssm.group_count") * state)
        s = state * inner
    return 4 * len(recurrent_layers(h)) * (r + s)
