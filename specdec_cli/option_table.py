"""Every run option, declared once: the fields of RunOptions, each with its flags, help, checks and config key.

RunOptions is the table RunConfig (options.py) is built on: an ordinary frozen dataclass whose fields carry their
Option (the command line's flags and type, the help, the rules, the TOML types a pair may set it with). Adding
a setting is one field here plus the code that uses it; the rules across options, and what a run derives where
a setting is unset, are RunConfig's.
"""

from __future__ import annotations

import math
import os
from dataclasses import MISSING, dataclass
from pathlib import Path

from .backend import devices
from .backend.rpc import problem as rpc_problem
from .declaration import (
    CACHES,
    DRAFTING,
    MODELS,
    OFFLOAD,
    PROMPT,
    SAMPLING,
    at_least,
    at_most,
    finite,
    option,
    said,
    within,
)
from .drafting import DRAFT_TOKENS, DRAFT_WINDOW, DRAFTERS
from .drafting.window import MIN_WINDOW
from .option_limits import (
    AUTO_K_MAX,
    CTX_SIZE,
    MAX_BRANCHES,
    MAX_DRAFT_TOKENS,
    MAX_LOGPROBS,
    MAX_SEED,
    MAX_THREADS,
    MAX_TOKENS,
    MAX_TOKENS_LIMIT,
    MIN_CTX,
    P_SPLIT,
)


@dataclass(frozen=True)
class RunOptions:
    """The settings a user gives a run, as the command line, a config file and a request name them."""

    target: Path = option(
        "--target",
        type=str,
        panel=MODELS,
        aliases=("-m", "--model"),
        llama=("-hf", "-hfr", "--hf-repo"),
        default=MISSING,
        help="Target GGUF: the model whose output you get. A path, a known model name, or a model's name in "
        "`specdec models list` (ORG/REPO[:QUANT], an Ollama tag, an LM Studio key).",
        config=(str,),
    )
    draft: Path | None = option(
        "--draft",
        type=str,
        panel=MODELS,
        aliases=("-md", "--model-draft"),
        llama=("--spec-draft-model", "-hfd", "-hfrd", "--hf-repo-draft"),
        help="Draft GGUF (named as --target is): a small model with the same tokenizer; 'auto' (what a --target "
        "without --draft gets): the best local model that can draft for it (`specdec models pair TARGET`).",
        config=(str,),
    )
    drafter: str = option(  # unset: drafting.default (auto with a draft, else none)
        "--drafter",
        type=str,
        panel=DRAFTING,
        help="Who drafts: " + "; ".join(f"'{d.name}' {d.help}" for d in DRAFTERS.values()) + ".",
        config=(str,),
        checks=((lambda v: v in DRAFTERS, "must be one of " + ", ".join(DRAFTERS) + " (got {v!r})"),),
    )
    draft_tokens: int | None = option(  # None: auto; unset (...): the drafter's own (Kind.k)
        "-k",
        "--draft-tokens",
        type=str,
        panel=DRAFTING,
        aliases=("--draft-max",),
        llama=("--spec-draft-n-max", "--draft-n"),
        default=...,
        help=f"Tokens drafted per round, or 'auto' to choose every round (up to {AUTO_K_MAX}) "
        f"(auto with --drafter auto or lookup, else {DRAFT_TOKENS}).",
        config=(int, str),
        checks=(at_least(1), (lambda v: v <= MAX_DRAFT_TOKENS, f"must be at most {MAX_DRAFT_TOKENS} (got {{v}})")),
        bounds=(1, MAX_DRAFT_TOKENS),
    )
    draft_window: int = option(
        "--draft-window",
        type=int,
        panel=DRAFTING,
        default=DRAFT_WINDOW,
        help=f"Draft model: the tokens of the text its cache holds, its first quarter and its last three quarters "
        f"(the window slides as the answer grows); 0 is the whole text [{DRAFT_WINDOW}; auto may choose less where "
        "its prefill would not pay].",
        config=(int,),
        checks=(
            (lambda v: v == 0 or v >= MIN_WINDOW, f"must be 0 (the whole text) or at least {MIN_WINDOW} (got {{v}})"),
        ),
    )
    p_min: float = option(  # unset (...): the drafter's own (Kind.p_min)
        "--p-min",
        type=float,
        panel=DRAFTING,
        aliases=("--draft-p-min",),
        llama=("--spec-draft-p-min",),
        default=...,
        help="Draft model or heads: stop drafting when its probability for its own token is below this "
        "[0: off; mtp: 0.6].",
        config=(int, float),
        checks=(finite(), within(0, 1, "[0, 1]", "; 0 turns it off")),
    )
    branches: int = option(
        "--branches",
        type=int,
        panel=DRAFTING,
        default=1,
        help=f"Draft model: draft up to N branches per round as a tree, verified in one target pass (1..{MAX_BRANCHES}) [1].",
        config=(int,),
        checks=(within(1, MAX_BRANCHES, f"1..{MAX_BRANCHES}"),),
        bounds=(1, MAX_BRANCHES),
    )
    p_split: float = option(
        "--p-split",
        type=float,
        panel=DRAFTING,
        aliases=("--draft-p-split",),
        llama=("--spec-draft-p-split",),
        default=P_SPLIT,
        help=f"Tree drafting: fork where the draft's runner-up token has at least this probability [{P_SPLIT}].",
        config=(int, float),
        checks=(finite(), within(0, 1, "(0, 1]", lo_open=True)),
    )
    max_tokens: int = option(
        "-n",
        "--max-tokens",
        type=int,
        panel=SAMPLING,
        aliases=("--n-predict",),
        llama=("--predict",),
        default=MAX_TOKENS,
        help=f"Stop after this many tokens [{MAX_TOKENS}].",
        config=(int,),
        checks=(at_least(1), at_most(MAX_TOKENS_LIMIT, " (llama.cpp counts tokens in an int32)")),
    )
    temp: float = option(
        "--temp",
        type=float,
        panel=SAMPLING,
        llama=("--temperature",),
        default=0.0,
        help="Sampling temperature; 0 is greedy [0].",
        config=(int, float),
        checks=(finite(), (lambda v: v >= 0, "must be >= 0 (got {v}); 0 means greedy")),
        bounds=(0, math.inf),
    )
    top_k: int = option(
        "--top-k",
        type=int,
        panel=SAMPLING,
        default=0,
        help="Keep the k most likely tokens; 0 is off [0].",
        config=(int,),
        checks=((lambda v: v >= 0, "must be >= 0 (got {v}); 0 turns it off"), at_most(MAX_TOKENS_LIMIT)),
    )
    top_p: float = option(
        "--top-p",
        type=float,
        panel=SAMPLING,
        default=1.0,
        help="Nucleus sampling mass in (0, 1]; 1 is off [1].",
        config=(int, float),
        checks=(finite(), within(0, 1, "(0, 1]", "; 1 turns it off", lo_open=True)),
    )
    min_p: float = option(
        "--min-p",
        type=float,
        panel=SAMPLING,
        default=0.0,
        help="Drop tokens below min-p x the top probability [0].",
        config=(int, float),
        checks=(finite(), within(0, 1, "[0, 1]", "; 0 turns it off")),
    )
    seed: int | None = option(
        "--seed",
        type=int,
        panel=SAMPLING,
        llama=("-s",),
        help="Random seed: the same seed gives the same text.",
        config=(int,),
        checks=((lambda v: v >= 0, "must be >= 0 (got {v})"), at_most(MAX_SEED)),
    )
    logprobs: int | None = option(
        "--logprobs",
        type=int,
        help="Each token's log probability under the target (softmax of its logits, after a grammar's mask) and its "
        "N most likely alternatives, in --json's tokens (0: the token's alone). The text is the same.",
        checks=(within(0, MAX_LOGPROBS, f"0..{MAX_LOGPROBS}"),),
    )
    ctx_size: int | None = option(
        "-c",
        "--ctx-size",
        type=int,
        panel=MODELS,
        help=f"Context size in tokens \\[the smaller of {CTX_SIZE} and what the target was trained for].",
        config=(int,),
        checks=(at_least(MIN_CTX),),
    )
    threads: int = option(  # 0: every core (default_threads)
        "-t",
        "--threads",
        type=int,
        panel=MODELS,
        default=0,
        help="CPU threads; 0 means every core this process may use [0].",
        checks=(
            at_least(1, "; 0 means every core"),
            (
                lambda v: v <= MAX_THREADS,
                f"must be at most {MAX_THREADS}, llama.cpp's limit (got {{v}}; this machine has {os.cpu_count()} cores)",
            ),
        ),
    )
    exact: bool = option(
        "--exact/--no-exact",
        type=bool,
        panel=CACHES,
        default=False,
        help="Exact mode: the target computes each row of a verify batch as it computes that token alone, so "
        "greedy output is target-only output token for token, on quantized models too (CPU; slower, see README).",
        config=(bool,),
    )
    lookup_cache: bool = option(
        "--lookup-cache/--no-lookup-cache",
        type=bool,
        panel=CACHES,
        default=True,
        help="Lookup (auto or lookup drafter) also drafts from earlier answers of this target, kept in the specdec "
        "cache (bounded; `specdec cache clear` empties it; in bench, a row's answers to the prompts before). "
        "Off: nothing is read or written.",
        config=(bool,),
    )
    rpc: str | None = option(
        "--rpc",
        type=str,
        panel=OFFLOAD,
        help="Run the target's layers on llama.cpp RPC servers (specdec rpc-server), HOST:PORT[,HOST:PORT...]; "
        "the draft stays on this machine (default: $SPECDEC_RPC, else the pair's rpc).",
        config=(str,),
        checks=((lambda v: rpc_problem(v) is None, "must be HOST:PORT[,HOST:PORT...], each server once (got {v!r})"),),
        env="SPECDEC_RPC",
    )
    gpu_layers: int | str = option(
        "-ngl",
        "--gpu-layers",
        type=str,
        panel=OFFLOAD,
        llama=("--n-gpu-layers",),
        default="auto",
        help="Target layers on the GPUs, as llama.cpp counts them (its n_layer + 1 is every layer, the output layer "
        "the first offloaded): a number, 'all', or 'auto': every layer where they fit the devices' free memory, "
        "else as many as fit \\[auto].",
        config=(int, str),
        checks=(said(devices.layers_problem),),
    )
    gpu_layers_draft: int | str = option(
        "-ngld",
        "--gpu-layers-draft",
        type=str,
        panel=OFFLOAD,
        llama=("--n-gpu-layers-draft", "--spec-draft-ngl"),
        default="auto",
        help="Draft model layers on the GPUs, as -ngl \\[auto].",
        config=(int, str),
        checks=(said(devices.layers_problem),),
    )
    device: str | None = option(
        "-dev",
        "--device",
        type=str,
        panel=OFFLOAD,
        help="Devices to offload the target to, comma-separated (e.g. CUDA0,CUDA1), or none (no offload) "
        "\\[every GPU; with --rpc, the servers' devices come first].",
        config=(str,),
        checks=(said(devices.names_problem),),
    )
    device_draft: str | None = option(
        "-devd",
        "--device-draft",
        type=str,
        panel=OFFLOAD,
        llama=("--spec-draft-device",),
        help="Devices to offload the draft model to, or none [-dev's; never an RPC server's].",
        config=(str,),
        checks=(said(devices.names_problem),),
    )
    split_mode: str = option(
        "-sm",
        "--split-mode",
        type=str,
        panel=OFFLOAD,
        default="layer",
        help="How to split the layers between several GPUs: none (one GPU: -mg), layer (whole layers, by -ts), row "
        "(rows of each matrix), tensor (tensor parallel, experimental) \\[layer].",
        config=(str,),
        checks=((lambda v: v in devices.SPLIT_MODES, "must be one of none, layer, row, tensor (got {v!r})"),),
    )
    tensor_split: str | None = option(
        "-ts",
        "--tensor-split",
        type=str,
        panel=OFFLOAD,
        help="The share of the offloaded layers each device gets, in -dev's order, e.g. 3,1 \\[by free memory].",
        config=(str,),
        checks=(said(devices.split_problem),),
    )
    main_gpu: int = option(
        "-mg",
        "--main-gpu",
        type=int,
        panel=OFFLOAD,
        default=0,
        help="With -sm none, the device (an index into -dev's list) that holds the whole model [0].",
        config=(int,),
        checks=((lambda v: v >= 0, "must be 0 or more: an index into the devices (got {v})"),),
    )
    chat: bool | None = option(
        "--chat/--no-chat",
        type=bool,
        panel=PROMPT,
        help="Wrap the prompt in the target's chat template (default: on when it has one). With the template your "
        "text is only text; with --no-chat control tokens written in it (e.g. <|im_start|>) are parsed as such.",
        config=(bool,),
        in_json=False,
    )
    system: str | None = option(
        "--system",
        type=str,
        panel=PROMPT,
        llama=("-sys", "--system-prompt"),
        help="System prompt for the chat template (needs one).",
        config=(str,),
        in_json=False,
    )
    json_schema: str | None = option(
        "--json-schema",
        type=str,
        panel=SAMPLING,
        llama=("-j", "-jf", "--json-schema-file"),
        help="Constrain the answer to this JSON Schema (a file, or the JSON itself), as llama.cpp's grammar; "
        "the output is exactly constrained target-only decoding.",
        config=(str,),
        in_json=False,
    )
    grammar: str | None = option(
        "--grammar",
        type=str,
        panel=SAMPLING,
        llama=("--grammar-file",),
        help="Constrain the answer to this GBNF grammar file (llama.cpp's format).",
        config=(str,),
        in_json=False,
    )
    prediction: str | None = option(
        "--prediction",
        type=str,
        panel=CACHES,
        help="A file the answer is expected to repeat, such as the file being edited (OpenAI's predicted outputs): "
        "lookup drafts from it first (auto or lookup drafter); the answer is the same with or without it.",
        in_json=False,
    )
    remeasure: bool = option(
        "--remeasure",
        type=bool,
        panel=CACHES,
        default=False,
        help="Measure auto's cost curve again instead of the one kept in the specdec cache (kept a day per "
        "machine, model files, threads and llama.cpp build; measured again when auto sees the machine drift).",
        in_json=False,
    )


# llama.cpp's options that no option here means: refused with what specdec does instead, rather than ignored.
_NO_MIN_DRAFT = (
    "specdec has no minimum draft length: it verifies every draft however short; -k/--draft-tokens sets the "
    "most, and -k auto chooses each round's length (none where drafting does not pay)"
)
REFUSED = dict.fromkeys(("--draft-min", "--draft-n-min", "--spec-draft-n-min"), _NO_MIN_DRAFT)
