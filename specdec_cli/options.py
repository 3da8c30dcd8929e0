"""Every setting of a run, declared once: RunConfig's fields, each with its flags, help, checks and config key.

RunConfig is an ordinary frozen dataclass (editors and type checkers see its fields); each field carries its
Option (the command line's flags and type, the help, the rules, the TOML types a pair may set it with), and
OPTIONS is read off the class. `generate`'s parameters, the config file's keys (PAIR_KEYS), validation, the
`--json` config and the options `bench` shares with `generate` all come from there. Adding a setting is one
field here plus the code that uses it. Which value a run gets (command line > environment > config file >
built-in) is decided in config.py.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from . import drafting
from .backend import devices
from .backend.rpc import problem as rpc_problem
from .declaration import Check, Option, at_least, at_most, finite, option, within
from .drafting import DRAFT_TOKENS, DRAFT_WINDOW, DRAFTERS, NEEDS
from .drafting.window import MIN_WINDOW
from .engine.sampling import Sampler
from .engine.speculative import Settings
from .errors import UsageError

# --- defaults and limits, one per line (a drafter's own, DRAFT_TOKENS and DRAFT_WINDOW, are drafting's) --------
MAX_TOKENS = 256  # long enough for a code answer, short enough to come back quickly
MAX_SEED = 2**64 - 1  # a seed is 64 bits (numpy's generators take more, but a request's larger one is absurd)
MAX_TOKENS_LIMIT = 2**31 - 1  # llama.cpp counts them in an int32 (n_predict); beyond, a request's value is absurd
CTX_SIZE = 4096  # unless -c says or the target was trained for less: a page of prompt plus the answer, a small KV cache
MAX_DRAFT_TOKENS = 63  # a verify batch has k+1 logits rows; contexts reserve output room for 64
MAX_BRANCHES = 8  # --branches: a tree verify batch holds every branch's nodes, and llama.cpp a seq id per branch
P_SPLIT = 0.1  # fork where the draft's runner-up has >= 10% (llama.cpp's --draft-p-split)
MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS: more threads crash llama.cpp
MAX_PREDICTION = 1 << 20  # bytes of --prediction: far more than an answer in any context (32k tokens of ~4 bytes)
MAX_LOGPROBS = 20  # alternatives per token: OpenAI's top_logprobs limit
MIN_CTX = 16  # below this not even a prompt and one verify batch fit
AUTO_K_MAX = 31  # -k auto drafts at most this many: verifying 32 tokens costs ~11x one here, 15 often pays more


def default_threads() -> int:
    """The cores this process may use (llama.cpp's decode scales with physical cores)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Said(str):
    """A rule whose words depend on the value (Option.problem formats a rule with it): `said` gives one."""

    def __new__(cls, problem: Callable[[Any], str | None]) -> _Said:
        rule = super().__new__(cls, "{v}")
        rule.problem = problem
        return rule

    def format(self, *args: Any, v: Any = None, **kwargs: Any) -> str:
        return self.problem(v) or ""


def said(problem: Callable[[Any], str | None]) -> Check:
    """A check whose rule `problem(value)` words itself (None: the value passes), e.g. naming the devices there are."""
    return (lambda v: problem(v) is None), _Said(problem)


def parse_draft_tokens(value: int | str | None) -> int | None:
    """-k's value as the command line, a config file or a request gives it: a whole number, or "auto"
    (None: the cost model chooses every round). Raises ValueError with the rule."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"must be a whole number or 'auto' (got {value!r})")


class OptionError(UsageError):
    """One setting breaks its rule; `key` names the option (and config key)."""

    def __init__(self, key: str, rule: str):
        super().__init__(f"{BY_KEY[key].flag} {rule}")
        self.key = key
        self.rule = rule


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, resolved (config.resolve) and validated here, on every construction and
    every `override`."""

    target: Path = option(
        "--target",
        type=str,
        default=MISSING,
        help="Target GGUF: the model whose output you get. A path, a known model name, or a model's name in "
        "`specdec models list` (ORG/REPO[:QUANT], an Ollama tag, an LM Studio key).",
        config=(str,),
    )
    draft: Path | None = option(
        "--draft",
        type=str,
        help="Draft GGUF (named as --target is): a small model with the same tokenizer; 'auto' (what a --target "
        "without --draft gets): the best local model that can draft for it (`specdec models pair TARGET`).",
        config=(str,),
    )
    drafter: str = option(  # unset: drafting.default (auto with a draft, else none)
        "--drafter",
        type=str,
        help="Who drafts: " + "; ".join(f"'{d.name}' {d.help}" for d in DRAFTERS.values()) + ".",
        config=(str,),
        checks=((lambda v: v in DRAFTERS, "must be one of " + ", ".join(DRAFTERS) + " (got {v!r})"),),
    )
    draft_tokens: int | None = option(  # None: auto; unset (...): the drafter's own (Kind.k)
        "-k",
        "--draft-tokens",
        type=str,
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
        default=...,
        help="Draft model or heads: stop drafting when its probability for its own token is below this "
        "[0: off; mtp: 0.6].",
        config=(int, float),
        checks=(finite(), within(0, 1, "[0, 1]", "; 0 turns it off")),
    )
    branches: int = option(
        "--branches",
        type=int,
        default=1,
        help=f"Draft model: draft up to N branches per round as a tree, verified in one target pass (1..{MAX_BRANCHES}) [1].",
        config=(int,),
        checks=(within(1, MAX_BRANCHES, f"1..{MAX_BRANCHES}"),),
        bounds=(1, MAX_BRANCHES),
    )
    p_split: float = option(
        "--p-split",
        type=float,
        default=P_SPLIT,
        help=f"Tree drafting: fork where the draft's runner-up token has at least this probability [{P_SPLIT}].",
        config=(int, float),
        checks=(finite(), within(0, 1, "(0, 1]", lo_open=True)),
    )
    max_tokens: int = option(
        "-n",
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"Stop after this many tokens [{MAX_TOKENS}].",
        config=(int,),
        checks=(at_least(1), at_most(MAX_TOKENS_LIMIT, " (llama.cpp counts tokens in an int32)")),
    )
    temp: float = option(
        "--temp",
        type=float,
        default=0.0,
        help="Sampling temperature; 0 is greedy [0].",
        config=(int, float),
        checks=(finite(), (lambda v: v >= 0, "must be >= 0 (got {v}); 0 means greedy")),
        bounds=(0, math.inf),
    )
    top_k: int = option(
        "--top-k",
        type=int,
        default=0,
        help="Keep the k most likely tokens; 0 is off [0].",
        config=(int,),
        checks=((lambda v: v >= 0, "must be >= 0 (got {v}); 0 turns it off"), at_most(MAX_TOKENS_LIMIT)),
    )
    top_p: float = option(
        "--top-p",
        type=float,
        default=1.0,
        help="Nucleus sampling mass in (0, 1]; 1 is off [1].",
        config=(int, float),
        checks=(finite(), within(0, 1, "(0, 1]", "; 1 turns it off", lo_open=True)),
    )
    min_p: float = option(
        "--min-p",
        type=float,
        default=0.0,
        help="Drop tokens below min-p x the top probability [0].",
        config=(int, float),
        checks=(finite(), within(0, 1, "[0, 1]", "; 0 turns it off")),
    )
    seed: int | None = option(
        "--seed",
        type=int,
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
        help=f"Context size in tokens \\[the smaller of {CTX_SIZE} and what the target was trained for].",
        config=(int,),
        checks=(at_least(MIN_CTX),),
    )
    threads: int = option(  # 0: every core (default_threads)
        "-t",
        "--threads",
        type=int,
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
        default=False,
        help="Exact mode: the target computes each row of a verify batch as it computes that token alone, so "
        "greedy output is target-only output token for token, on quantized models too (CPU; slower, see README).",
        config=(bool,),
    )
    lookup_cache: bool = option(
        "--lookup-cache/--no-lookup-cache",
        type=bool,
        default=True,
        help="Lookup (auto or lookup drafter) also drafts from earlier answers of this target, kept in the specdec "
        "cache (bounded; `specdec cache clear` empties it; in bench, a row's answers to the prompts before). "
        "Off: nothing is read or written.",
        config=(bool,),
    )
    rpc: str | None = option(
        "--rpc",
        type=str,
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
        default="auto",
        help="Draft model layers on the GPUs, as -ngl \\[auto].",
        config=(int, str),
        checks=(said(devices.layers_problem),),
    )
    device: str | None = option(
        "-dev",
        "--device",
        type=str,
        help="Devices to offload the target to, comma-separated (e.g. CUDA0,CUDA1), or none (no offload) "
        "\\[every GPU; with --rpc, the servers' devices come first].",
        config=(str,),
        checks=(said(devices.names_problem),),
    )
    device_draft: str | None = option(
        "-devd",
        "--device-draft",
        type=str,
        help="Devices to offload the draft model to, or none [-dev's; never an RPC server's].",
        config=(str,),
        checks=(said(devices.names_problem),),
    )
    split_mode: str = option(
        "-sm",
        "--split-mode",
        type=str,
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
        help="The share of the offloaded layers each device gets, in -dev's order, e.g. 3,1 \\[by free memory].",
        config=(str,),
        checks=(said(devices.split_problem),),
    )
    main_gpu: int = option(
        "-mg",
        "--main-gpu",
        type=int,
        default=0,
        help="With -sm none, the device (an index into -dev's list) that holds the whole model [0].",
        config=(int,),
        checks=((lambda v: v >= 0, "must be 0 or more: an index into the devices (got {v})"),),
    )
    chat: bool | None = option(
        "--chat/--no-chat",
        type=bool,
        help="Wrap the prompt in the target's chat template (default: on when it has one). With the template your "
        "text is only text; with --no-chat control tokens written in it (e.g. <|im_start|>) are parsed as such.",
        config=(bool,),
        in_json=False,
    )
    system: str | None = option(
        "--system",
        type=str,
        help="System prompt for the chat template (needs one).",
        config=(str,),
        in_json=False,
    )
    json_schema: str | None = option(
        "--json-schema",
        type=str,
        help="Constrain the answer to this JSON Schema (a file, or the JSON itself), as llama.cpp's grammar; "
        "the output is exactly constrained target-only decoding.",
        config=(str,),
        in_json=False,
    )
    grammar: str | None = option(
        "--grammar",
        type=str,
        help="Constrain the answer to this GBNF grammar file (llama.cpp's format).",
        config=(str,),
        in_json=False,
    )
    prediction: str | None = option(
        "--prediction",
        type=str,
        help="A file the answer is expected to repeat, such as the file being edited (OpenAI's predicted outputs): "
        "lookup drafts from it first (auto or lookup drafter); the answer is the same with or without it.",
        in_json=False,
    )
    remeasure: bool = option(
        "--remeasure",
        type=bool,
        default=False,
        help="Measure auto's cost curve again instead of the one kept in the specdec cache (kept a day per "
        "machine, model files, threads and llama.cpp build; measured again when auto sees the machine drift).",
        in_json=False,
    )
    debug: bool = False  # check the KV caches after every round (--debug, not a run option of its own)
    gbnf: str | None = None  # the grammar --json-schema or --grammar gives, as GBNF text (config.resolve)
    prediction_text: str | None = None  # the --prediction file's text (config.resolve)
    pair: str | None = None  # the config's pair the settings came from (None: none was used)
    target_name: str | None = None  # the target as it was named (a known model's name, or a path)
    # How the draft was chosen ("option": --draft, "pair": the config's pair, "auto": models/pairing.py, None:
    # no draft) and, where chosen, why: said by the run, not part of what it computes.
    draft_chosen_by: str | None = field(default=None, compare=False)
    draft_choice: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        """What a run gets where a setting is unset: the drafter from the draft, -k from the drafter, every
        core; a draft that the drafter never drafts with is not kept. Then every option's rules."""
        derive = object.__setattr__  # frozen: the unset values become what the run gets, once
        if self.drafter is None:
            derive(self, "drafter", drafting.default(self.draft is not None))
        rule = BY_KEY["drafter"].problem(self.drafter)
        if rule:
            raise OptionError("drafter", rule)
        kind = DRAFTERS[self.drafter]
        if not kind.uses_model:
            derive(self, "draft", None)
        if self.draft is None:
            derive(self, "draft_chosen_by", None)
        if self.draft_tokens is ...:
            derive(self, "draft_tokens", kind.k)
        if self.p_min is ...:
            derive(self, "p_min", kind.p_min)
        if self.threads == 0:
            derive(self, "threads", default_threads())
        for o in OPTIONS:
            rule = o.problem(getattr(self, o.key))
            if rule:
                raise OptionError(o.key, rule)
        for key in ("gpu_layers", "gpu_layers_draft"):  # "17" as the command line gives it: 17
            derive(self, key, devices.layers(getattr(self, key)))
        if self.json_schema is not None and self.grammar is not None:
            raise UsageError("--json-schema and --grammar each constrain the answer: give one of them")
        if kind.model == NEEDS and self.draft is None:
            raise OptionError("drafter", f"{self.drafter} needs a draft model: --draft PATH")
        if self.branches > 1 and not (self.draft is not None and kind.trees):
            why = "no --draft given" if kind.trees else f"--drafter {self.drafter}"
            raise UsageError(f"--branches {self.branches} needs a draft model: only the draft model forks ({why})")

    def override(self, **changes: Any) -> RunConfig:
        """This configuration with some settings changed (a request's, a bench row's), by the same rules; the
        others keep their values (a request for another drafter keeps the server's -k)."""
        if "drafter" in changes and "p_min" not in changes and self.p_min == DRAFTERS[self.drafter].p_min:
            changes = {**changes, "p_min": ...}  # the drafter's own floor (Kind.p_min), as a run of it would get
        return replace(self, **changes) if changes else self

    @property
    def sampler(self) -> Sampler:
        return Sampler(self.temp, self.top_k, self.top_p, self.min_p)

    def settings(self, *, prompt_kernels: bool = True, constraint: Any = None) -> Settings:
        """The engine's settings for this run (-k auto: drafts of up to AUTO_K_MAX, as auto chooses);
        `constraint`: the grammar's start state, where the run is constrained."""
        return Settings(
            self.draft_tokens or AUTO_K_MAX,
            self.max_tokens,
            self.sampler,
            self.seed,
            self.debug,
            ordered_cells=self.exact,
            prompt_kernels=prompt_kernels,
            constraint=constraint,
            logprobs=self.logprobs,
        )

    def as_dict(self) -> dict:
        """The --json "config": every option shown there, paths as strings, -k auto as "auto"."""
        out = {}
        for o in OPTIONS:
            if o.in_json:
                v = getattr(self, o.key)
                out[o.key] = str(v) if isinstance(v, Path) else ("auto" if o.key == "draft_tokens" and v is None else v)
        return out | {"draft_chosen_by": self.draft_chosen_by, "draft_choice": self.draft_choice}


OPTIONS: tuple[Option, ...] = tuple(replace(f.metadata["option"], key=f.name) for f in fields(RunConfig) if f.metadata)
BY_KEY = {o.key: o for o in OPTIONS}
# Where the models' layers go: every command that loads them takes these (bench's rows share them).
OFFLOAD = ("gpu_layers", "gpu_layers_draft", "device", "device_draft", "split_mode", "tensor_split", "main_gpu")
PAIR_KEYS = {o.key: o.config if len(o.config) > 1 else o.config[0] for o in OPTIONS if o.config}


def with_options(*keys: str) -> Callable:
    """Give a command function (ending in **settings) a Typer parameter for each named option."""

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        fn.__signature__ = sig.replace(parameters=params + [BY_KEY[k].parameter() for k in keys])
        return fn

    return wrap


def list_problem(key: str, values: list, option: str, auto: bool = False) -> str | None:
    """`bench`'s check of a comma-separated list of an option's values (None: auto), from its bounds."""
    lo, hi = BY_KEY[key].bounds
    if not all(v is None or math.isfinite(v) for v in values):
        return f"{option} must be finite numbers"
    if all(v is None or lo <= v <= hi for v in values):
        return None
    if hi == math.inf:
        return f"{option} must be >= {lo:g}"
    return f"{option} must be between {lo} and {hi}" + (", or auto" if auto else "")


def flag_problem(key: str, value: Any) -> str | None:
    """The message for one value of an option that breaks its rule, or None."""
    rule = BY_KEY[key].problem(value)
    return f"{BY_KEY[key].flag} {rule}" if rule else None
