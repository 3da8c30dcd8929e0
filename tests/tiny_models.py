"""Tiny random GGUF models for hermetic tests: F32, a byte vocabulary, milliseconds to load.

llama (attention only), mamba (recurrent: no rollback) and two hybrids that llama.cpp rolls back
through recurrent-state snapshots (n_rs_seq): lfm2 (short convolutions) and qwen35 (Gated DeltaNet).

F32 weights make batched and one-token evaluation agree exactly (for llama, in exact mode), so greedy
speculative output must equal target-only output token for token. The hybrids' rows do not, in exact
mode either: a batch's differ from one-token rows by up to ~1e-3 (their recurrent blocks compute a
batch differently), so only their argmax usually agrees. A draft made from the target's weights plus a little noise
agrees with it most of the time but not always: partial acceptance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2  # grouped-query attention, like the real models
N_FF = 128
N_CTX_TRAIN = 32768  # like the real models: -c is bounded by it
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_order(shuffle_seed: int | None = None) -> list[int]:
    order = list(range(256))
    if shuffle_seed is not None:
        np.random.default_rng(shuffle_seed).shuffle(order)
    return order


def byte_vocab(shuffle_seed: int | None = None) -> list[str]:
    """<unk>, <s>, </s>, then the 256 byte tokens; shuffled bytes make an incompatible vocabulary."""
    return ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in byte_order(shuffle_seed)]


def permuted(weights: dict[str, np.ndarray], shuffle_seed: int) -> dict[str, np.ndarray]:
    """`weights` (of the byte vocabulary) for the vocabulary shuffled by `shuffle_seed`: each byte's rows at its id
    there. The same function of the text in other ids: a draft of another vocabulary that is always right."""
    rows = np.array([0, 1, 2] + [3 + b for b in byte_order(shuffle_seed)])
    return weights | {name: weights[name][rows] for name in ("token_embd.weight", "output.weight")}


# Multi-byte tokens (SentencePiece spells a space as "▁"), merged by their scores: a vocabulary whose tokens straddle
# another's, with byte fallback for the rest.
MERGES = (
    "▁",
    "th",
    "he",
    "in",
    "er",
    "an",
    "▁t",
    "▁a",
    "the",
    "▁the",
    "ing",
    "on",
    "re",
    "▁s",
    "nd",
    "ou",
    "is",
    "ll",
    "o▁",
)


def write_merged(path: Path, seed: int, space_prefix: bool = False) -> Path:
    """A random model over shuffled byte tokens and MERGES (its tokens straddle a byte vocabulary's); space_prefix:
    its tokenizer adds a space before a text (SentencePiece's dummy prefix, as Llama 2's does)."""
    tokens = byte_vocab(shuffle_seed=11) + list(MERGES)
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    w = start(path, "llama", N_CTX_TRAIN, N_LAYER, N_HEAD_KV)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    _add_byte_tokenizer(w, tokens, types + [TokenType.NORMAL] * len(MERGES), space_prefix)
    return finish(w, random_weights(seed, len(tokens)), path)


def write_no_text(path: Path, weights: dict[str, np.ndarray], n_layer: int = N_LAYER) -> Path:
    """A model of another vocabulary whose every token is a control token: its tokens spell no text."""
    types = [TokenType.UNKNOWN] + [TokenType.CONTROL] * 258
    return write_model(path, weights, byte_vocab(shuffle_seed=3), types=types, n_layer=n_layer)


def random_weights(seed: int, n_vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    head_dim = N_EMBD // N_HEAD
    t = {
        "token_embd.weight": w(n_vocab, N_EMBD, scale=1.0),
        "output_norm.weight": np.ones(N_EMBD, np.float32),
        # Large output weights make the next-token distribution peaked, like a trained model's.
        "output.weight": w(n_vocab, N_EMBD, scale=0.6),
    }
    for i in range(N_LAYER):
        t |= {
            f"blk.{i}.attn_norm.weight": np.ones(N_EMBD, np.float32),
            f"blk.{i}.attn_q.weight": w(N_EMBD, N_EMBD, scale=0.15),
            f"blk.{i}.attn_k.weight": w(N_HEAD_KV * head_dim, N_EMBD, scale=0.15),
            f"blk.{i}.attn_v.weight": w(N_HEAD_KV * head_dim, N_EMBD, scale=0.15),
            f"blk.{i}.attn_output.weight": w(N_EMBD, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_norm.weight": np.ones(N_EMBD, np.float32),
            f"blk.{i}.ffn_gate.weight": w(N_FF, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_up.weight": w(N_FF, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_down.weight": w(N_EMBD, N_FF, scale=0.15),
        }
    return t


def add_noise(weights: dict[str, np.ndarray], seed: int, rel: float) -> dict[str, np.ndarray]:
    """Perturb every matrix by `rel` of its own scale (a stand-in for a smaller, cheaper model)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, a in weights.items():
        if a.ndim == 2:
            a = a + (rng.standard_normal(a.shape) * rel * a.std()).astype(np.float32)
        out[name] = a
    return out


def start(
    path: Path, arch: str, context_length: int, n_layer: int, head_count_kv: int | list[int], split_max_tensors: int = 0
) -> GGUFWriter:
    """A writer with the hyperparameters every fixture shares (its width, heads and feed-forward size);
    split_max_tensors: written as a split model (NAME-00001-of-0000N.gguf), that many tensors a part."""
    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_name(path.stem)
    w.add_context_length(context_length)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(head_count_kv)
    return w


def write_model(
    path: Path, weights: dict[str, np.ndarray], tokens: list[str], chat_template: str | None = None,
    types: list[TokenType] | None = None, context_length: int = N_CTX_TRAIN, n_layer: int = N_LAYER,
    split_max_tensors: int = 0, fim: dict[str, int] | None = None,
) -> Path:  # fmt: skip
    """context_length: the context it was "trained" for (llama.cpp's n_ctx_train), which bounds -c; n_layer:
    blk.0 .. blk.n_layer-1 of `weights`; split_max_tensors: see `start`; fim: the fill-in-the-middle tokens' ids
    by llama.cpp's names (pre, suf, mid, rep, sep)."""
    w = start(path, "llama", context_length, n_layer, N_HEAD_KV, split_max_tensors)
    weights = {k: v for k, v in weights.items() if not k.startswith("blk.") or int(k.split(".")[1]) < n_layer}
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # all F32
    _add_byte_tokenizer(w, tokens, types)
    if chat_template:
        w.add_chat_template(chat_template)
    for name, token in (fim or {}).items():
        w.add_uint32(f"tokenizer.ggml.fim_{name}_token_id", token)
    return finish(w, weights, path)


# Qwen2.5-Coder's fill-in-the-middle tokens, after the byte vocabulary: the FIM fixtures' (write_fim).
FIM_TOKENS = {"pre": "<|fim_prefix|>", "suf": "<|fim_suffix|>", "mid": "<|fim_middle|>"}
FIM_TOKENS |= {"rep": "<|repo_name|>", "sep": "<|file_sep|>"}


def write_fim(path: Path, names: tuple[str, ...] = tuple(FIM_TOKENS), noise: float = 0.0) -> Path:
    """A model with FIM control tokens (`names` of them, with their GGUF ids) after the 259 byte-vocabulary ones;
    noise > 0: its weights perturbed so (a draft for the noise=0 one, by add_noise)."""
    vocab = byte_vocab() + [FIM_TOKENS[n] for n in names]
    weights = random_weights(seed=4321, n_vocab=len(vocab))
    if noise:
        weights = add_noise(weights, seed=99, rel=noise)
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.CONTROL] * len(names)
    return write_model(path, weights, vocab, types=types, fim={n: 259 + i for i, n in enumerate(names)})


def write_recurrent(path: Path) -> Path:
    """A one-layer Mamba model: its state cannot be rolled back to an earlier token."""
    tokens = byte_vocab()
    v, e, inner, state, conv, rank = len(tokens), 32, 64, 8, 4, 4
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    g = GGUFWriter(str(path), "mamba")
    g.add_context_length(N_CTX_TRAIN)
    g.add_embedding_length(e)
    g.add_block_count(1)
    g.add_feed_forward_length(0)
    g.add_head_count(0)
    g.add_ssm_conv_kernel(conv)
    g.add_ssm_inner_size(inner)
    g.add_ssm_state_size(state)
    g.add_ssm_time_step_rank(rank)
    g.add_layer_norm_rms_eps(1e-5)
    g.add_file_type(0)
    _add_byte_tokenizer(g, tokens)
    weights = {
        "token_embd.weight": w(v, e), "output_norm.weight": np.ones(e, np.float32), "output.weight": w(v, e),
        "blk.0.attn_norm.weight": np.ones(e, np.float32), "blk.0.ssm_in.weight": w(2 * inner, e),
        "blk.0.ssm_conv1d.weight": w(inner, conv), "blk.0.ssm_conv1d.bias": w(inner),
        "blk.0.ssm_x.weight": w(rank + 2 * state, inner), "blk.0.ssm_dt.weight": w(inner, rank),
        "blk.0.ssm_dt.bias": w(inner), "blk.0.ssm_a": w(inner, state), "blk.0.ssm_d": w(inner),
        "blk.0.ssm_out.weight": w(e, inner),
    }  # fmt: skip
    return finish(g, weights, path)


# Hybrids: a few layers, at least one recurrent and one attention, so that a rollback goes through both
# llama.cpp's recurrent snapshots and its KV cells.
LFM2_HEAD_COUNT_KV = [0, N_HEAD_KV, 0]  # per layer; 0 marks a short-conv layer: conv, attention, conv
LFM2_L_CACHE = 3  # conv kernel width; the state is the last L_CACHE - 1 inputs, like the real models'


def _randn(seed: int):
    rng = np.random.default_rng(seed)
    return lambda *shape, scale: (rng.standard_normal(shape) * scale).astype(np.float32)


def lfm2_weights(seed: int, n_vocab: int) -> dict[str, np.ndarray]:
    """LFM2: short-conv and attention (QK-norm) mixers, each followed by a SwiGLU FFN."""
    w, one, head_dim = _randn(seed), lambda n: np.ones(n, np.float32), N_EMBD // N_HEAD
    t = {
        "token_embd.weight": w(n_vocab, N_EMBD, scale=1.0),
        "token_embd_norm.weight": one(N_EMBD),  # LFM2's final norm goes by this name
        "output.weight": w(n_vocab, N_EMBD, scale=0.6),  # peaked distributions, as in random_weights
    }
    for i, n_kv in enumerate(LFM2_HEAD_COUNT_KV):
        t |= {
            f"blk.{i}.attn_norm.weight": one(N_EMBD),
            f"blk.{i}.ffn_norm.weight": one(N_EMBD),
            f"blk.{i}.ffn_gate.weight": w(N_FF, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_up.weight": w(N_FF, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_down.weight": w(N_EMBD, N_FF, scale=0.15),
        }
        if n_kv:
            t |= {
                f"blk.{i}.attn_q_norm.weight": one(head_dim),
                f"blk.{i}.attn_k_norm.weight": one(head_dim),
                f"blk.{i}.attn_q.weight": w(N_EMBD, N_EMBD, scale=0.15),
                f"blk.{i}.attn_k.weight": w(n_kv * head_dim, N_EMBD, scale=0.15),
                f"blk.{i}.attn_v.weight": w(n_kv * head_dim, N_EMBD, scale=0.15),
                f"blk.{i}.attn_output.weight": w(N_EMBD, N_EMBD, scale=0.15),
            }
        else:
            t |= {
                f"blk.{i}.shortconv.conv.weight": w(N_EMBD, LFM2_L_CACHE, scale=0.5),
                f"blk.{i}.shortconv.in_proj.weight": w(3 * N_EMBD, N_EMBD, scale=0.15),
                f"blk.{i}.shortconv.out_proj.weight": w(N_EMBD, N_EMBD, scale=0.15),
            }
    return t


def write_lfm2(
    path: Path, weights: dict[str, np.ndarray], tokens: list[str], context_length: int = N_CTX_TRAIN
) -> Path:  # fmt: skip
    """A hybrid whose recurrent layers keep only a short-conv window: the cheapest snapshots."""
    w = start(path, "lfm2", context_length, len(LFM2_HEAD_COUNT_KV), LFM2_HEAD_COUNT_KV)
    w.add_shortconv_l_cache(LFM2_L_CACHE)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    _add_byte_tokenizer(w, tokens)
    return finish(w, weights, path)


# Qwen3.5: Gated DeltaNet layers, and full (gated, QK-norm, M-RoPE) attention every QWEN35_INTERVAL-th layer.
QWEN35_LAYERS, QWEN35_INTERVAL = 3, 3  # linear, linear, full attention
QWEN35_HEAD_DIM = 16  # attention key/value length; the query projection is twice as wide (query + gate)
QWEN35_ROPE_DIM, QWEN35_SECTIONS = 8, [2, 1, 1, 0]  # partial rotary; sections sum to ROPE_DIM / 2
QWEN35_CONV = 4  # ssm.conv_kernel
QWEN35_STATE = 16  # ssm.state_size: the key and value head size of a DeltaNet layer
QWEN35_K_HEADS, QWEN35_V_HEADS = 2, 4  # ssm.group_count, ssm.time_step_rank
QWEN35_INNER = QWEN35_STATE * QWEN35_V_HEADS  # ssm.inner_size: the value width


def qwen35_is_recurrent(i: int) -> bool:
    return (i + 1) % QWEN35_INTERVAL != 0


def qwen35_weights(seed: int, n_vocab: int) -> dict[str, np.ndarray]:
    w, one = _randn(seed), lambda n: np.ones(n, np.float32)
    key_dim = QWEN35_STATE * QWEN35_K_HEADS
    t = {
        "token_embd.weight": w(n_vocab, N_EMBD, scale=1.0),
        "output_norm.weight": one(N_EMBD),
        "output.weight": w(n_vocab, N_EMBD, scale=0.6),  # peaked distributions, as in random_weights
    }
    for i in range(QWEN35_LAYERS):
        t |= {
            f"blk.{i}.attn_norm.weight": one(N_EMBD),
            f"blk.{i}.post_attention_norm.weight": one(N_EMBD),
            f"blk.{i}.ffn_gate.weight": w(N_FF, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_up.weight": w(N_FF, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_down.weight": w(N_EMBD, N_FF, scale=0.15),
        }
        if qwen35_is_recurrent(i):
            t |= {
                f"blk.{i}.attn_qkv.weight": w(2 * key_dim + QWEN35_INNER, N_EMBD, scale=0.15),
                f"blk.{i}.attn_gate.weight": w(QWEN35_INNER, N_EMBD, scale=0.15),
                f"blk.{i}.ssm_conv1d.weight": w(2 * key_dim + QWEN35_INNER, QWEN35_CONV, scale=0.5),
                f"blk.{i}.ssm_dt.bias": w(QWEN35_V_HEADS, scale=0.5),
                # -exp(A_log): a negative decay rate per value head, as the converter writes it
                f"blk.{i}.ssm_a": -np.exp(w(QWEN35_V_HEADS, scale=0.5)),
                f"blk.{i}.ssm_beta.weight": w(QWEN35_V_HEADS, N_EMBD, scale=0.15),
                f"blk.{i}.ssm_alpha.weight": w(QWEN35_V_HEADS, N_EMBD, scale=0.15),
                f"blk.{i}.ssm_norm.weight": one(QWEN35_STATE),
                f"blk.{i}.ssm_out.weight": w(N_EMBD, QWEN35_INNER, scale=0.15),
            }
        else:
            t |= {
                f"blk.{i}.attn_q.weight": w(2 * N_HEAD * QWEN35_HEAD_DIM, N_EMBD, scale=0.15),
                f"blk.{i}.attn_k.weight": w(N_HEAD_KV * QWEN35_HEAD_DIM, N_EMBD, scale=0.15),
                f"blk.{i}.attn_v.weight": w(N_HEAD_KV * QWEN35_HEAD_DIM, N_EMBD, scale=0.15),
                f"blk.{i}.attn_q_norm.weight": one(QWEN35_HEAD_DIM),
                f"blk.{i}.attn_k_norm.weight": one(QWEN35_HEAD_DIM),
                f"blk.{i}.attn_output.weight": w(N_EMBD, N_HEAD * QWEN35_HEAD_DIM, scale=0.15),
            }
    return t


def write_qwen35(
    path: Path, weights: dict[str, np.ndarray], tokens: list[str], context_length: int = N_CTX_TRAIN
) -> Path:  # fmt: skip
    """A hybrid whose recurrent layers keep a DeltaNet matrix state per head: large snapshots."""
    heads = any(k.startswith(f"blk.{QWEN35_LAYERS}.") for k in weights)  # a NextN block (qwen35_head)
    w = start(path, "qwen35", context_length, QWEN35_LAYERS + heads, N_HEAD_KV)
    if heads:
        w.add_nextn_predict_layers(1)
    w.add_key_length(QWEN35_HEAD_DIM)
    w.add_value_length(QWEN35_HEAD_DIM)
    w.add_rope_dimension_count(QWEN35_ROPE_DIM)
    w.add_rope_dimension_sections(QWEN35_SECTIONS)
    w.add_rope_freq_base(10000.0)
    w.add_full_attention_interval(QWEN35_INTERVAL)
    w.add_ssm_conv_kernel(QWEN35_CONV)
    w.add_ssm_inner_size(QWEN35_INNER)
    w.add_ssm_state_size(QWEN35_STATE)
    w.add_ssm_time_step_rank(QWEN35_V_HEADS)
    w.add_ssm_group_count(QWEN35_K_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0)
    _add_byte_tokenizer(w, tokens)
    return finish(w, weights, path)


# Multi-token prediction (NextN) heads, appended after the trunk as blocks n_layer.. (llama.cpp's layout). A
# head reads (the token at p, the target's hidden state at p - 1) and predicts the token at p + 1. A trained head
# agrees with its target most of the time; a random one never would. So the fixtures' targets lean on one
# layer (the others add little: `quiet`), their embeddings have unit RMS (the head's input norm keeps them as
# they are), and each head is that layer again, a little perturbed: given the token, it computes about what
# the target computes, and guesses its next token about as often as a noisy draft model does. `mirror` heads
# instead pass the hidden state alone through a block that adds nothing: they repeat the target's prediction
# at p - 1, which is the token at p (a check that the hidden states reach the head at the right positions).
MIMO2_LAYERS = 2
MIMO2_SWA = [False, True]  # the trunk's layers: full attention, then a sliding window (the heads: full)
MIMO2_WINDOW = 4096
MTP_NOISE = 0.05  # a head's perturbation of the layer it copies (relative, as add_noise)


def unit_rms(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    e = weights["token_embd.weight"]
    return weights | {"token_embd.weight": (e / np.sqrt((e**2).mean(axis=1, keepdims=True))).astype(np.float32)}


def quiet(weights: dict[str, np.ndarray], layers: list[int], factor: float = 0.1) -> dict[str, np.ndarray]:
    """Scale down what these layers add to the residual stream (their output projections)."""
    outs = ("ffn_down.weight", "attn_output.weight", "ssm_out.weight")
    return {
        k: v * factor if k.startswith("blk.") and int(k.split(".")[1]) in layers and k.endswith(outs) else v
        for k, v in weights.items()
    }


def mtp_heads(weights: dict[str, np.ndarray], copy: int, first: int, n: int, seed: int, mirror: bool = False):
    """n NextN blocks from block `first` on, each block `copy` perturbed (mirror: see above), with the head's
    projection over [the token's normed embedding, the normed hidden state] and its norms."""
    rng = np.random.default_rng(seed)
    eye, zero = np.eye(N_EMBD, dtype=np.float32), np.zeros((N_EMBD, N_EMBD), np.float32)
    heads = {}
    for i in range(first, first + n):
        for k, v in weights.items():
            if k.startswith(f"blk.{copy}."):
                noisy = (
                    v + (rng.standard_normal(v.shape) * MTP_NOISE * v.std()).astype(np.float32) if v.ndim == 2 else v
                )
                heads[f"blk.{i}." + k.split(".", 2)[2]] = noisy * 0 if mirror and v.ndim == 2 else noisy
        heads |= {
            f"blk.{i}.nextn.eh_proj.weight": np.concatenate([zero, eye] if mirror else [eye, zero], axis=1),
            f"blk.{i}.nextn.enorm.weight": np.ones(N_EMBD, np.float32),
            f"blk.{i}.nextn.hnorm.weight": np.ones(N_EMBD, np.float32),
        }
    return heads


def mimo2_weights(seed: int, n_vocab: int, heads: int = 2, mirror: bool = False) -> dict[str, np.ndarray]:
    """MiMo-V2: attention (fused QKV) with dense SwiGLU FFNs, then `heads` NextN blocks (chained)."""
    w, one, head_dim = _randn(seed), lambda n: np.ones(n, np.float32), N_EMBD // N_HEAD
    t = {
        "token_embd.weight": w(n_vocab, N_EMBD, scale=1.0),
        "output_norm.weight": one(N_EMBD),
        "output.weight": w(n_vocab, N_EMBD, scale=0.6),  # peaked distributions, as in random_weights
    }
    for i in range(MIMO2_LAYERS):
        t |= {
            f"blk.{i}.attn_norm.weight": one(N_EMBD),
            f"blk.{i}.attn_qkv.weight": w(N_EMBD + 2 * N_HEAD_KV * head_dim, N_EMBD, scale=0.15),
            f"blk.{i}.attn_output.weight": w(N_EMBD, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_norm.weight": one(N_EMBD),
            f"blk.{i}.ffn_gate.weight": w(N_FF, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_up.weight": w(N_FF, N_EMBD, scale=0.15),
            f"blk.{i}.ffn_down.weight": w(N_EMBD, N_FF, scale=0.15),
        }
    t = quiet(unit_rms(t), [1])
    return t | mtp_heads(t, 0, MIMO2_LAYERS, heads, seed + 1, mirror)


def write_mimo2(path: Path, weights: dict[str, np.ndarray], tokens: list[str]) -> Path:
    """Attention only, with as many NextN heads as `weights` has blocks past the trunk's."""
    blocks = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("blk."))
    w = start(path, "mimo2", N_CTX_TRAIN, blocks, N_HEAD_KV)
    w.add_nextn_predict_layers(blocks - MIMO2_LAYERS)
    w.add_expert_feed_forward_length(N_FF)
    w.add_sliding_window(MIMO2_WINDOW)
    w.add_sliding_window_pattern(MIMO2_SWA + [False] * (blocks - MIMO2_LAYERS))
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    _add_byte_tokenizer(w, tokens)
    return finish(w, weights, path)


def qwen35_mtp_weights(seed: int, n_vocab: int, mirror: bool = False) -> dict[str, np.ndarray]:
    """Qwen3.5 with its NextN block (block QWEN35_LAYERS): a copy of its full-attention layer, the DeltaNet ones
    quiet (they still carry the recurrent state that a rejected draft must be rolled out of)."""
    attention = [i for i in range(QWEN35_LAYERS) if not qwen35_is_recurrent(i)][0]
    t = quiet(unit_rms(qwen35_weights(seed, n_vocab)), [i for i in range(QWEN35_LAYERS) if i != attention])
    return t | mtp_heads(t, attention, QWEN35_LAYERS, 1, seed + 1, mirror)


def finish(w: GGUFWriter, weights: dict[str, np.ndarray], path: Path) -> Path:
    for name, a in weights.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_byte_tokenizer(
    w: GGUFWriter, tokens: list[str], types: list[TokenType] | None = None, space_prefix: bool = False
) -> None:
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(
        types or [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * (len(tokens) - 3)
    )
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(space_prefix)


def nan_weights(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One NaN in the final norm: every logit the model computes is NaN."""
    norm = weights["output_norm.weight"].copy()
    norm[0] = np.nan
    return weights | {"output_norm.weight": norm}


EXTRA_TOKENS = 40  # real (normal) tokens past the target's vocabulary: within llama.cpp's 128-id tolerance


def write_extra_vocab_draft(path: Path, weights: dict[str, np.ndarray], seed: int = 5) -> Path:
    """A draft whose vocabulary is the target's plus EXTRA_TOKENS real tokens, which it proposes often:
    each extra token's output row is twice a random byte token's, so it wins wherever that byte would."""
    rng = np.random.default_rng(seed)
    vocab = byte_vocab() + [f"<extra_{i}>" for i in range(EXTRA_TOKENS)]
    copies = rng.choice(np.arange(3, len(vocab) - EXTRA_TOKENS), EXTRA_TOKENS, replace=False)
    w = dict(weights)
    w["output.weight"] = np.concatenate([w["output.weight"], 2.0 * w["output.weight"][copies]])
    w["token_embd.weight"] = np.concatenate([w["token_embd.weight"], w["token_embd.weight"][copies]])
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    return write_model(path, w, vocab, types=types + [TokenType.NORMAL] * EXTRA_TOKENS)


def write_fixture_set(folder: Path) -> dict[str, Path]:
    """target, draft (noisy: partial acceptance), same (identical copy: full acceptance),
    other_vocab (incompatible), other_vocab_same and other_vocab_draft (the target's and the draft's functions in
    another vocabulary's ids), merged (another vocabulary, multi-byte tokens; merged_space: SentencePiece's dummy space too), no_text (tokens that spell nothing), chat (target weights with a ChatML template), recurrent (Mamba),
    fim (FIM tokens, the repository's and the file separator too), fim_draft (its noisy draft), fim_plain (FIM
    tokens, no repository or file separator),
    short_ctx (target weights, trained for 1,024 tokens: -c is bounded by it);
    hostile drafts: nan_draft (every logit NaN), extra_vocab (proposes ids the target lacks);
    hybrids that roll back through recurrent snapshots, each with its own noisy draft and identical
    copy: lfm2, lfm2_draft, lfm2_same (short conv) and qwen35, qwen35_draft, qwen35_same (DeltaNet), and each one's
    function in another vocabulary's ids (lfm2_other, qwen35_other); models with
    MTP heads: mtp (mimo2, two chained heads), mtp_one (one head), qwen35_mtp (the hybrid's), mtp_mirror."""
    vocab = byte_vocab()
    base = random_weights(seed=1234, n_vocab=len(vocab))
    noisy = add_noise(base, seed=99, rel=0.02)
    paths = {
        "nan_draft": write_model(folder / "nan_draft.gguf", nan_weights(noisy), vocab),
        "extra_vocab": write_extra_vocab_draft(folder / "extra_vocab.gguf", noisy),
        "target": write_model(folder / "target.gguf", base, vocab),
        "draft": write_model(folder / "draft.gguf", noisy, vocab),
        "same": write_model(folder / "same.gguf", base, vocab),
        "other_vocab": write_model(folder / "other_vocab.gguf", base, byte_vocab(shuffle_seed=7)),
        "other_vocab_same": write_model(
            folder / "other_vocab_same.gguf", permuted(base, 7), byte_vocab(shuffle_seed=7)
        ),
        "other_vocab_draft": write_model(
            folder / "other_vocab_draft.gguf", permuted(noisy, 7), byte_vocab(shuffle_seed=7)
        ),
        "merged": write_merged(folder / "merged.gguf", seed=4321),
        "merged_space": write_merged(folder / "merged_space.gguf", seed=4321, space_prefix=True),
        "no_text": write_no_text(folder / "no_text.gguf", base),
        "chat": write_model(folder / "chat.gguf", base, vocab, chat_template=CHATML),
        "recurrent": write_recurrent(folder / "recurrent.gguf"),
        "short_ctx": write_model(folder / "short_ctx.gguf", base, vocab, context_length=1024),
        "fim": write_fim(folder / "fim.gguf"),
        "fim_draft": write_fim(folder / "fim_draft.gguf", noise=0.02),
        "fim_plain": write_fim(folder / "fim_plain.gguf", ("pre", "suf", "mid")),
    }
    for arch, weights, write in (("lfm2", lfm2_weights, write_lfm2), ("qwen35", qwen35_weights, write_qwen35)):
        hybrid = weights(seed=1234, n_vocab=len(vocab))
        paths[arch] = write(folder / f"{arch}.gguf", hybrid, vocab)
        # the same function in another vocabulary's ids: a recurrent draft that drafts through text
        paths[f"{arch}_other"] = write(folder / f"{arch}_other.gguf", permuted(hybrid, 7), byte_vocab(shuffle_seed=7))
        # rel=0.02 here too: the draft's greedy choice is the target's about 80% of the time
        paths[f"{arch}_draft"] = write(folder / f"{arch}_draft.gguf", add_noise(hybrid, seed=99, rel=0.02), vocab)
        paths[f"{arch}_same"] = write(folder / f"{arch}_same.gguf", hybrid, vocab)
    # MTP (NextN) heads: attention only with two chained heads and with one; the DeltaNet hybrid with its one;
    # a mirror head (it repeats the target's last prediction: the hidden states' positions made visible)
    paths["mtp"] = write_mimo2(folder / "mtp.gguf", mimo2_weights(1234, len(vocab), heads=2), vocab)
    paths["mtp_one"] = write_mimo2(folder / "mtp_one.gguf", mimo2_weights(1234, len(vocab), heads=1), vocab)
    paths["qwen35_mtp"] = write_qwen35(folder / "qwen35_mtp.gguf", qwen35_mtp_weights(1234, len(vocab)), vocab)
    mirror = mimo2_weights(1234, len(vocab), heads=1, mirror=True)
    paths["mtp_mirror"] = write_mimo2(folder / "mtp_mirror.gguf", mirror, vocab)
    return paths
