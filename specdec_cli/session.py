"""Load a target (and a draft) into their own contexts and run the engine: what every command calls."""

from __future__ import annotations

import math
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

from .backend import vocab
from .backend.native import Context, Model
from .engine import costmodel
from .engine.auto import AutoDrafter
from .engine.drafters import Drafter, ModelDrafter, NoDrafter
from .engine.lookup import LookupDrafter
from .engine.events import Event
from .engine.kv import Sequence
from .engine.sampling import Sampler
from .engine.speculative import Settings, generate
from .errors import SpecdecError, UsageError

# The option each RunConfig field is set by, for messages.
FLAGS = {
    "max_tokens": "-n/--max-tokens", "draft_tokens": "-k/--draft-tokens", "p_min": "--p-min", "branches": "--branches",
    "p_split": "--p-split", "temp": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
    "seed": "--seed", "ctx_size": "-c/--ctx-size", "threads": "-t/--threads", "drafter": "--drafter",
}  # fmt: skip


class OptionError(UsageError):
    """One setting breaks its rule; `key` names the RunConfig field (and config key)."""

    def __init__(self, key: str, rule: str):
        super().__init__(f"{FLAGS[key]} {rule}")
        self.key = key
        self.rule = rule

# --- defaults, one per line ---------------------------------------------------------------------
DRAFT_TOKENS = 4  # llama.cpp uses 3, mlx-lm 3, HF starts at 5; 4 suits a draft that is right ~80% of the time
MAX_TOKENS = 256  # long enough for a code answer, short enough to come back quickly
CTX_SIZE = 4096  # room for a page of prompt plus the answer; the KV cache stays small on a laptop
MAX_DRAFT_TOKENS = 63  # a verify batch has k+1 logits rows; contexts reserve output room for 64
MAX_BRANCHES = 8  # --branches: a tree verify batch holds every branch's nodes, and llama.cpp a seq id per branch
P_SPLIT = 0.1  # fork where the draft's runner-up has >= 10% (llama.cpp's --draft-p-split)
MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS: more threads crash llama.cpp
AUTO_K_MAX = 31  # -k auto drafts at most this many: verifying 32 tokens costs ~11x one here, 15 often pays more
DRAFTERS = ("auto", "model", "lookup", "none")


def default_threads() -> int:
    """The cores this process may use (llama.cpp's decode scales with physical cores)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory the system can give without swapping (Linux's MemAvailable); None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_context(n_ctx: int, models: list[tuple[str, Model]]) -> None:
    """A context no longer than every model was trained for, whose KV caches fit in memory: a bigger
    one only allocates gigabytes that the model cannot use (or gets the process killed)."""
    for role, m in models:
        if n_ctx > m.n_ctx_train > 0:
            raise UsageError(
                f"a context of {n_ctx:,} tokens is more than {role} {m.name} was trained for ({m.n_ctx_train:,})",
                hint=f"use -c/--ctx-size {m.n_ctx_train} or less",
            )
    need = n_ctx * sum(m.kv_bytes_per_token() for _, m in models)
    free = available_memory()
    if free is not None and need > free:
        raise UsageError(
            f"a context of {n_ctx:,} tokens needs {need / 2**30:.1f} GiB of KV cache, but only "
            f"{free / 2**30:.1f} GiB of memory is available",
            hint="use a smaller -c/--ctx-size",
        )


@dataclass(frozen=True)
class RunConfig:
    """Everything `generate` needs, resolved and validated in one place."""

    target: Path
    draft: Path | None = None
    drafter: str = "none"  # one of DRAFTERS
    draft_tokens: int | None = DRAFT_TOKENS  # None: auto, chosen every round by the cost model
    p_min: float = 0.0  # draft model: stop drafting below this confidence (0 = off)
    branches: int = 1  # draft model: at most this many branches per round (tree drafting when > 1)
    p_split: float = P_SPLIT  # tree drafting: fork where the runner-up token has at least this probability
    max_tokens: int = MAX_TOKENS
    temp: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    ctx_size: int = CTX_SIZE
    threads: int = field(default_factory=default_threads)
    chat: bool | None = None  # None: use the chat template when the target has one
    system: str | None = None
    debug: bool = False

    def __post_init__(self) -> None:
        # (field, ok, rule): the message is the option's flag and the rule; a value that came from the
        # config file is reported with the file and key instead (cli_common.run_config).
        floats = ("temp", "top_p", "min_p", "p_min", "p_split")
        checks = [(f, math.isfinite(getattr(self, f)), f"must be a finite number (got {getattr(self, f)})") for f in floats]
        checks += [
            ("max_tokens", self.max_tokens >= 1, f"must be at least 1 (got {self.max_tokens})"),
            ("draft_tokens", self.draft_tokens is None or self.draft_tokens >= 1, f"must be at least 1 (got {self.draft_tokens})"),
            ("draft_tokens", self.draft_tokens is None or self.draft_tokens <= MAX_DRAFT_TOKENS, f"must be at most {MAX_DRAFT_TOKENS} (got {self.draft_tokens})"),
            ("p_min", 0 <= self.p_min <= 1, f"must be in [0, 1] (got {self.p_min}); 0 turns it off"),
            ("branches", 1 <= self.branches <= MAX_BRANCHES, f"must be in 1..{MAX_BRANCHES} (got {self.branches})"),
            ("p_split", 0 < self.p_split <= 1, f"must be in (0, 1] (got {self.p_split})"),
            ("temp", self.temp >= 0, f"must be >= 0 (got {self.temp}); 0 means greedy"),
            ("top_p", 0 < self.top_p <= 1, f"must be in (0, 1] (got {self.top_p}); 1 turns it off"),
            ("min_p", 0 <= self.min_p <= 1, f"must be in [0, 1] (got {self.min_p}); 0 turns it off"),
            ("top_k", self.top_k >= 0, f"must be >= 0 (got {self.top_k}); 0 turns it off"),
            ("seed", self.seed is None or self.seed >= 0, f"must be >= 0 (got {self.seed})"),
            ("ctx_size", self.ctx_size >= 16, f"must be at least 16 (got {self.ctx_size})"),
            ("threads", self.threads >= 1, f"must be at least 1 (got {self.threads})"),
            ("drafter", self.drafter in DRAFTERS, f"must be one of {', '.join(DRAFTERS)} (got {self.drafter!r})"),
            ("threads", self.threads <= MAX_THREADS, f"must be at most {MAX_THREADS}, llama.cpp's limit (got {self.threads}; this machine has {os.cpu_count()} cores)"),
        ]  # fmt: skip
        for key, ok, rule in checks:
            if not ok:
                raise OptionError(key, rule)
        usage = [
            (self.drafter != "model" or self.draft is not None, "--drafter model needs --draft PATH"),
            (
                self.branches == 1 or (self.draft is not None and self.drafter in ("model", "auto")),
                f"--branches {self.branches} needs a draft model: only the draft model forks "
                f"({'--drafter ' + self.drafter if self.drafter in ('lookup', 'none') else 'no --draft given'})",
            ),
        ]
        for ok, message in usage:
            if not ok:
                raise UsageError(message)

    @property
    def sampler(self) -> Sampler:
        return Sampler(self.temp, self.top_k, self.top_p, self.min_p)

    def as_dict(self) -> dict:
        return {
            "target": str(self.target),
            "draft": str(self.draft) if self.draft else None,
            "drafter": self.drafter,
            "draft_tokens": "auto" if self.draft_tokens is None else self.draft_tokens,
            "p_min": self.p_min,
            "branches": self.branches,
            "p_split": self.p_split,
            "max_tokens": self.max_tokens,
            "temp": self.temp,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "seed": self.seed,
            "ctx_size": self.ctx_size,
            "threads": self.threads,
        }


class Session:
    """A loaded target (and draft). Use `open_session`; it frees contexts before models."""

    def __init__(self, cfg: RunConfig, stack: ExitStack):
        self.cfg = cfg
        t0 = time.perf_counter()
        self.target = stack.enter_context(Model(cfg.target))
        self.draft = stack.enter_context(Model(cfg.draft)) if cfg.draft and cfg.drafter != "none" else None
        self._costs: costmodel.Costs | None = None
        # Speculation rolls both caches back after every rejection; plain decoding never does.
        for role, m in (("target", self.target), ("draft", self.draft)):
            problem = m is not None and cfg.drafter != "none" and m.rollback_problem()
            if problem:
                raise SpecdecError(
                    f"{role} {m.name} cannot be used for speculative decoding: {problem}",
                    hint="use --drafter none to decode it without speculation",
                )
        if self.draft is not None:
            why = vocab.incompatibility(self.target, self.draft)
            if why:
                raise SpecdecError(
                    f"draft {self.draft.name} cannot draft for target {self.target.name}: {why}",
                    hint="a draft must share the target's tokenizer (same model family); or use --drafter none",
                )
        check_context(cfg.ctx_size, [("target", self.target)] + ([("draft", self.draft)] if self.draft else []))
        # A tree's verify batch is at most MAX_DRAFT_TOKENS + 1 rows too: draft_tree stops at k nodes deep,
        # and generate() caps k * branches below.
        ctx = dict(n_ctx=cfg.ctx_size, n_threads=cfg.threads, n_seq=MAX_BRANCHES, max_outputs=MAX_DRAFT_TOKENS + 1)
        self.target_ctx = stack.enter_context(Context(self.target, **ctx))
        self.draft_ctx = stack.enter_context(Context(self.draft, **ctx)) if self.draft else None
        self.load_seconds = time.perf_counter() - t0

    @property
    def uses_chat(self) -> bool:
        has = self.target.chat_template() is not None
        if self.cfg.chat and not has:
            raise UsageError(f"--chat: {self.target.name} has no chat template", hint="use --no-chat")
        return has if self.cfg.chat is None else self.cfg.chat

    def prompt_tokens(self, prompt: str) -> list[int]:
        """In chat mode the prompt (and system prompt) is text inside the template; without it, the raw
        prompt's control-token text is parsed (a raw prompt may want them)."""
        n_ctx, size = self.target_ctx.n_ctx, len(prompt.encode("utf-8"))
        # Refuse a text that cannot fit before tokenizing it: llama.cpp's tokenizers are not all linear
        # (SentencePiece's byte fallback grows its buffer one symbol at a time), and do not see Ctrl-C.
        if size > n_ctx and size > n_ctx * self.target.max_token_bytes():
            raise UsageError(
                f"the prompt has {size:,} bytes, more than a context of {n_ctx:,} tokens can hold "
                f"(no token of {self.target.name} is longer than {self.target.max_token_bytes()} bytes)",
                hint="raise -c/--ctx-size or shorten the prompt",
            )
        if self.uses_chat:
            messages = ([("system", self.cfg.system)] if self.cfg.system else []) + [("user", prompt)]
            tokens = self.target.chat_tokens(messages)
        elif self.cfg.system:
            why = "--no-chat turns it off" if self.cfg.chat is False else f"{self.target.name} has none"
            raise UsageError(f"--system needs the chat template, and {why}", hint="put the instructions into the prompt itself")
        else:
            tokens = self.target.tokenize(prompt, special=True)
        if not tokens:
            raise UsageError("the prompt is empty")
        if len(tokens) >= self.target_ctx.n_ctx:
            raise UsageError(
                f"the prompt has {len(tokens)} tokens but the context holds {self.target_ctx.n_ctx}",
                hint="raise -c/--ctx-size or shorten the prompt",
            )
        return tokens

    def generate(self, tokens: list[int], drafter: str | None = None, **overrides) -> Iterator[Event]:
        """Run the engine on prompt tokens. `drafter` overrides the configured one ("none" decodes
        target-only even with a draft loaded: like-for-like baselines); `overrides` replace RunConfig's
        draft_tokens (None = auto) and branches, or Settings fields (benchmarks sweep k and branches)."""
        k = overrides.pop("draft_tokens", self.cfg.draft_tokens)
        branches = overrides.pop("branches", self.cfg.branches)
        settings = Settings(AUTO_K_MAX, self.cfg.max_tokens, self.cfg.sampler, self.cfg.seed, self.cfg.debug)
        settings = replace(settings, draft_tokens=k or AUTO_K_MAX, **overrides)
        if settings.draft_tokens > MAX_DRAFT_TOKENS:
            raise UsageError(f"-k/--draft-tokens must be at most {MAX_DRAFT_TOKENS}")
        return self._run(drafter or self.cfg.drafter, k, tokens, branches, settings)

    def _run(self, name: str, k: int | None, tokens: list[int], branches: int, settings: Settings) -> Iterator[Event]:
        # A generator, so that the drafter's set-up (auto measures the cost curve: about a second) happens
        # as the consumer starts reading: an interruption there is one of the stream's, like any other.
        yield from generate(Sequence.empty(self.target_ctx), self._drafter(name, k, tokens, branches), tokens, settings)

    def _drafter(self, name: str, k: int | None, tokens: list[int], branches: int = 1) -> Drafter:
        if name == "none":
            return NoDrafter()
        model = None
        if self.draft_ctx is not None:
            draft_seq = Sequence.empty(self.draft_ctx)
            model = ModelDrafter(
                draft_seq, self.cfg.p_min, branches, self.cfg.p_split, MAX_DRAFT_TOKENS, vocab=self.target.n_vocab
            )
        if name == "model" and model is None:
            raise UsageError("--drafter model needs a draft model", hint="pass --draft PATH")
        if name == "model" and k is not None:
            return model
        if name == "lookup" and k is not None:
            return LookupDrafter()
        # auto, or -k auto for one drafter: the cost model chooses every round (and may decode plainly).
        return AutoDrafter(
            self.costs(tokens), LookupDrafter() if name in ("auto", "lookup") else None,
            model if name in ("auto", "model") else None,
        )  # fmt: skip

    def costs(self, tokens: list[int]) -> costmodel.Costs:
        """This machine's verify-cost curve, measured once per session (about a second), refined as it runs."""
        if self._costs is None:
            self._costs = costmodel.measure(self.target_ctx, self.draft_ctx, tokens, AUTO_K_MAX + 1)
        return self._costs


class open_session:
    """Context manager: `with open_session(cfg) as s: ...`; frees everything on the way out."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self._stack = ExitStack()

    def __enter__(self) -> Session:
        try:
            return Session(self.cfg, self._stack)
        except BaseException:
            self._stack.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
