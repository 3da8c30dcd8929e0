"""How many of a model's layers fit the devices: what n offloaded layers take of each, by llama.cpp's arithmetic
(llama_model_base::load_tensors, get_layer_buft_list, sched_reserve), read off the GGUF header; no device is
asked. `most_layers` is what both -ngl auto and the memory check use (llama.cpp's own auto, common_fit_params,
is in libcommon, which Python cannot reach).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from . import gguf_file


@dataclass(frozen=True)
class Shape:
    """A model as its offload costs it: each layer's weights (the output layer last) and context bytes."""

    weights: tuple[int, ...]  # n_layer + 1 entries
    context: tuple[int, ...]  # the KV cache (and recurrent state) each layer holds; the output layer none
    compute: int  # a device's compute buffer, wherever it holds layers

    @property
    def n(self) -> int:
        return len(self.weights)


def layer_weights(h: gguf_file.Header) -> tuple[int, ...]:
    """Bytes of each offloadable layer's weights: blk.i.* for each of the block_count layers, then the output
    layer (output.weight, output_norm; a model with no output matrix of its own multiplies by token_embd, which
    llama.cpp copies to the output layer's device). token_embd itself stays on the CPU."""
    arch = h.metadata.get("general.architecture")
    n_layer = gguf_file.int_value(h.metadata, f"{arch}.block_count") or 0
    sizes = [0] * (n_layer + 1)
    names = {t.name for t in h.tensors}
    for t in h.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < n_layer:
            sizes[int(parts[1])] += t.nbytes
        elif parts[0] in ("output", "output_norm") or t.name == "token_embd.weight" and "output.weight" not in names:
            sizes[n_layer] += t.nbytes
    return tuple(sizes)


def compute_bytes(h: gguf_file.Header, n_ctx: int, n_ubatch: int = 512, n_outputs: int = 64) -> int:
    """A margin for one device's compute buffer, as llama.cpp reserves it (sched_reserve: a ubatch of n_ubatch
    tokens, n_outputs rows of logits), in F32: the FFN's widest activations (3 x n_ff per token), attention's
    (4 x n_embd; flash attention, which llama.cpp turns on where a GPU has it, keeps no scores), the attention
    mask (n_ctx per token) and the logits (n_vocab per row). An upper bound: llama.cpp reuses buffers between
    ops (SmolLM2-135M on Vulkan, -c 4096: 16.0 MiB reserved, 33.5 MiB by this)."""
    meta = h.metadata
    arch = meta.get("general.architecture")
    embd = gguf_file.int_value(meta, f"{arch}.embedding_length") or 0
    ff = max(gguf_file.per_layer(meta, f"{arch}.feed_forward_length") or [0])
    vocab = getattr(meta.get("tokenizer.ggml.tokens"), "length", 0)
    u = min(n_ctx, n_ubatch)
    return 4 * (u * (3 * ff + 4 * embd + n_ctx) + min(n_outputs, u) * vocab)


def shape(path, context_bytes: int, n_ctx: int) -> Shape:
    """A model file's Shape, its context (`context_bytes`: KV cache and recurrent state) spread over its layers."""
    h = gguf_file.header(path)
    weights = layer_weights(h)
    n_layer = len(weights) - 1
    per = context_bytes // n_layer if n_layer else 0
    return Shape(weights, (per,) * n_layer + (0,), compute_bytes(h, n_ctx))


def cuts(free: list[int], split: tuple[float, ...] | None) -> list[float]:
    """The cumulative split points llama.cpp cuts the offloaded layers at (float32, as it computes them): by -ts,
    else by each device's free memory."""
    given = list(split or ())[: len(free)] + [0.0] * (len(free) - len(split or ()))  # (llama.cpp pads with 0)
    weights = np.array(given if any(given) else free, dtype=np.float32)
    points = np.cumsum(weights, dtype=np.float32)
    return list(points / points[-1]) if len(points) and points[-1] > 0 else [np.float32(1)] * len(free)


def assign(n_total: int, n_gpu: int, points: list[float]) -> list[int]:
    """The device index of each offloaded layer, for the last n_gpu of n_total (llama.cpp's get_layer_buft_list:
    the upper bound of the layer's fraction among the split points)."""
    n = min(n_gpu, n_total)
    if not points or n <= 0:
        return []
    last = len(points) - 1
    return [min(bisect.bisect_right(points, np.float32(i) / np.float32(n)), last) for i in range(n)]


def need(s: Shape, n_gpu: int, points: list[float]) -> list[tuple[int, int]]:
    """(layers, bytes) each device holds with n_gpu layers offloaded: their weights and context, and a compute
    buffer on each device that holds any."""
    out = [[0, 0] for _ in points]
    first = s.n - min(n_gpu, s.n)
    for i, dev in enumerate(assign(s.n, n_gpu, points)):
        out[dev][0] += 1
        out[dev][1] += s.weights[first + i] + s.context[first + i]
    return [(n, b + (s.compute if n else 0)) for n, b in out]


def most_layers(s: Shape, points: list[float], room: list[int]) -> int:
    """The most layers (of s.n) whose need fits the room (bytes) of every device: what -ngl auto offloads, and
    the -ngl a refusal suggests."""
    for n in range(s.n, 0, -1):
        if all(b <= r for (_, b), r in zip(need(s, n, points), room)):
            return n
    return 0
