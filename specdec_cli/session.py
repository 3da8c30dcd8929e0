"""Load a target (and a draft) into their own contexts and run the engine: what every command calls."""

from __future__ import annotations

import functools
import time
from contextlib import ExitStack
from dataclasses import replace
from typing import Iterator

from . import chat as chat_, drafting, fit
from .backend import devices, gguf_file, mtp, native, rpc, vocab
from .backend.context import Context
from .backend.grammar import Grammar
from .backend.native import Model
from .drafting import cache as lookup_cache
from .drafting import NEEDS, NEVER, cost, curves, measure
from .drafting.mtp import HeadCache, unusable
from .drafting.corpus import Corpus
from .engine import kv
from .chat import fim, prompt
from .chat.prompt import PromptTooLong  # noqa: F401 (re-exported: the server and tests catch it)
from .engine.events import Event, Prefilled
from .engine.speculative import generate
from .errors import SpecdecError, UsageError
from .once import Once
from .fit import check_memory, context_sizes
from .text import with_text
from .options import AUTO_K_MAX, MAX_BRANCHES, MAX_DRAFT_TOKENS, RunConfig  # noqa: F401 (RunConfig: re-exported)


CACHED = Corpus([])  # Session.generate's default corpus: the lookup cache (a marker, never searched)


def _seqs(model: Model, role: str) -> int:
    """Sequences a context needs: a tree's branches; a recurrent model drafts no tree, so a target needs its
    own and a draft also a copy to draft in (ModelDrafter)."""
    return MAX_BRANCHES if model.rollback == "cells" else 1 + (role == "draft")


class Session:
    """A loaded target (and draft). Use `open_session`; it frees contexts before models."""

    def __init__(self, cfg: RunConfig, stack: ExitStack, max_draft: int | None = None, lazy_draft: bool = False):
        """max_draft: the longest draft a run may send (default: -k, else auto's longest): a recurrent
        target keeps a snapshot of its state per draft token. lazy_draft: load the draft model at its first
        draft (a one-shot run's, or a batch's: a run that never drafts with it never loads it), not now."""
        self.cfg = cfg
        self._stack = stack
        t0 = time.perf_counter()
        # --rpc: the target's layers on the servers (and this machine's GPUs, as llama.cpp would); the draft
        # never leaves this machine (fit.wants). Where each model's layers go is decided before it loads.
        servers = rpc.parse(cfg.rpc) if cfg.rpc else []
        self.where = f"rpc {rpc.label(servers)}" if servers else "local"
        remote = [devices.device(d) for d in rpc.devices(servers)] if servers else []
        uses_draft = cfg.draft is not None and drafting.kind(cfg.drafter).uses_model
        plan = fit.plan(cfg, remote, cfg.draft if uses_draft else None)
        self.warnings: list[str] = plan.notes  # for the command to show, once
        self._draft_want = plan.draft_want
        # The target's own draft heads (MTP), loaded where it has them and the drafter may draft with them (auto,
        # mtp: then a request or a bench row may too). A MoE model's heads hold an expert layer's weights.
        self.mtp_layers = mtp.heads_in_header(gguf_file.check(cfg.target))
        heads = drafting.kind(cfg.drafter).heads != NEVER and mtp.usable(cfg.target)
        # Exact mode changes how the target computes; the draft's numerics never change the output.
        self.target = stack.enter_context(Model(cfg.target, exact=cfg.exact, offload=plan.target, heads=heads))
        # The heads beside the target's context, opened at the first run that drafts with them.
        self.heads = Once(lambda: HeadCache(stack.enter_context(mtp.Heads(self.target_ctx, cfg.threads))))
        self.drafter = self._speculation(cfg)  # the drafter, plain decoding where the target cannot roll back
        self.speculates = not drafting.kind(self.drafter).plain
        self.answers = lookup_cache.Answers(lambda: self.vocab_key, self.warnings.append)  # lookup's earlier answers
        self.draft: Model | None = None  # loaded, with its context, where it first drafts (`draft_context`)
        self.draft_ctx: Context | None = None
        self.draft_context = Once(self._load_draft)  # the draft's context, the model loaded at its first draft
        # The draft's vocabulary and sizes, read without its weights: whether it pairs, what its cache costs.
        self._draft_file = cfg.draft if cfg.draft and self.speculates else None
        info = stack.enter_context(Model(self._draft_file, vocab_only=True)) if self._draft_file else None
        why = vocab.incompatibility(self.target, info) if info is not None else None
        if why and cfg.draft_chosen_by == "auto":  # chosen by its header: llama.cpp's own check has the last word
            self.warnings.append(f"{info.name}, the draft chosen for {self.target.name}, cannot draft for it: {why}")
            self._draft_file = info = None
        elif why:
            raise SpecdecError(
                f"draft {info.name} cannot draft for target {self.target.name}: {why}",
                hint="a draft must share the target's tokenizer (same model family); or use --drafter none",
            )
        # A draft whose cache cannot slide holds the whole text (drafting/window.py): a recurrent state, or
        # layers with a sliding window of their own.
        self.draft_slides = info is not None and not info.recurrent and not info.sliding_window
        self.draft_recurrent = info is not None and info.recurrent
        self.check_branches(cfg.branches, info)
        n_ctx, draft_n_ctx = context_sizes(cfg.ctx_size, self.target, info)
        # The target drops a rejected tail of up to max_draft tokens: a recurrent target keeps that many
        # snapshots of its state (the verify batch of max_draft + 1 tokens holds them all).
        self.max_draft = max_draft or cfg.draft_tokens or AUTO_K_MAX
        snapshots = self.max_draft if self.speculates and self.target.rollback == "snapshots" else 0
        seqs = _seqs(self.target, "target")
        draft_seqs = MAX_BRANCHES if info is not None and not info.recurrent else 2
        target_need = (n_ctx * self.target.kv_bytes_per_token(), self.target.state_bytes() * (1 + snapshots) * seqs)
        draft_need = (draft_n_ctx * info.kv_bytes_per_token(), info.state_bytes() * draft_seqs) if info else (0, 0)
        self._draft_bytes = sum(draft_need)  # its KV cache and states, for its fit when it loads
        check_memory(  # each context's share in this machine's memory: the rest goes with the offloaded layers
            [(*target_need, plan.target)]
            + ([(*draft_need, plan.draft)] if info else [])
            + ([(mtp.kv_bytes(self.target, n_ctx, self.mtp_layers), 0, plan.target)] if self.target.heads else [])
        )
        # A tree's verify batch is at most MAX_DRAFT_TOKENS + 1 rows too: ModelDrafter caps a tree's nodes
        # at MAX_DRAFT_TOKENS (max_nodes, below).
        self._ctx = dict(n_threads=cfg.threads, max_outputs=MAX_DRAFT_TOKENS + 1)
        with native.capture() as made:
            self.target_ctx = stack.enter_context(
                Context(self.target, n_ctx=n_ctx, n_seq=seqs, snapshots=snapshots, **self._ctx)
            )
        self.placement = {"target": fit.placement(self.target, made), "draft": None}  # where the layers went
        self._draft_ctx_args = dict(n_ctx=draft_n_ctx, n_seq=draft_seqs)
        paths = [cfg.target] + ([self._draft_file] if self._draft_file else [])
        where = self.where + fit.layout(plan)  # a curve measured with other layers offloaded is another's
        about = curves.about(paths, cfg.threads, cfg.exact, where, AUTO_K_MAX + 1)
        key = curves.key(about)
        kept = curves.load(key, self.warnings.append) if self.speculates and not cfg.remeasure else None
        draft = self.draft_context if self._draft_file else None
        self.curve = measure.Curve(self.target_ctx, draft, AUTO_K_MAX + 1, key=key, kept=kept, about=about)
        self.kept = kv.Kept(lambda: self.curve.measurements)  # a measurement empties both caches
        self.prefixes = None  # a server's long prompts kept on disk (serve/prefixes.py), restored where reused
        self._salt: str | None = None  # the cache_salt of the run whose cells the caches keep (reused by its own)
        # A recurrent draft's state is probed with its weights (memory.rollback): it is loaded now.
        if self._draft_file and (not lazy_draft or self.draft_recurrent):
            self.draft_context()
        if servers:
            rpc.watch_connections()  # a server machine that vanishes ends the run instead of hanging it
        if self.target_ctx.other_backends:
            self.warnings.append(
                f"--exact holds on CPU backends only; {self.target.name} also runs on {self.target_ctx.other_backends} "
                "other backend(s) (GPU or RPC), whose kernels depend on the batch: greedy output may still differ from "
                "--drafter none at near-ties"
            )
        self.load_seconds = time.perf_counter() - t0

    @property
    def has_draft(self) -> bool:
        """Whether a draft model serves this session (loaded now, or at its first draft)."""
        return self._draft_file is not None

    def _load_draft(self) -> Context:
        """The draft model and its context (its load time goes to the cost curve)."""
        t0 = time.perf_counter()
        want, n_ctx = self._draft_want, self._draft_ctx_args["n_ctx"]
        placed = fit.offload(want, self._draft_file, n_ctx, self._draft_bytes)[0] if want else None
        draft = self._stack.enter_context(Model(self._draft_file, offload=placed))
        with native.capture() as made:
            ctx = self._stack.enter_context(Context(draft, **self._draft_ctx_args, **self._ctx))
        self.draft, self.draft_ctx = draft, ctx
        self.placement["draft"] = fit.placement(draft, made)
        self.curve.draft_load = time.perf_counter() - t0
        return ctx

    def _speculation(self, cfg: RunConfig) -> str:
        """The drafter, once the target's cache is known: auto decodes plainly where it cannot roll back."""
        if cfg.exact and self.target.recurrent:
            raise UsageError(
                f"--exact: {self.target.name} ({self.target.architecture}) keeps a recurrent state, whose batched "
                "and one-token kernels exact mode does not cover",
                hint="run without --exact (README: Models)",
            )
        drafter = self.able(cfg.drafter)
        if drafter != cfg.drafter:
            self.warnings.append(
                f"{self.target.name} cannot speculate: {self.target.rollback_problem()}; auto decodes it plainly"
            )
        return drafter

    def check_branches(self, branches: int, draft: Model | None = None) -> None:
        recurrent = [m for m in (self.target, draft or self.draft) if m is not None and m.recurrent]
        if branches > 1 and recurrent:
            raise UsageError(
                f"--branches {branches}: tree drafting forks every branch's state, and {recurrent[0].name} "
                f"({recurrent[0].architecture}) keeps a recurrent state that specdec does not fork for trees",
                hint="use --branches 1 (chains speculate on it)",
            )

    def able(self, drafter: str) -> str:
        """`drafter` where the target can roll back; elsewhere plain decoding for a drafter that falls back to
        it (auto), and an error for the others."""
        kind = drafting.kind(drafter)
        why = unusable(self.target.name, self.mtp_layers, self.target.heads) if kind.heads == NEEDS else None
        if why:  # (auto drafts without them)
            raise UsageError(f"--drafter {drafter}: {why[0]}", hint=why[1])
        problem = not kind.plain and self.target.rollback_problem()
        if problem and not kind.falls_back:
            plain = drafting.plain()
            raise UsageError(
                f"--drafter {drafter}: target {self.target.name} cannot speculate: {problem}",
                hint=f"use --drafter {plain} (or one that decodes it plainly: "
                + ", ".join(k.name for k in drafting.DRAFTERS.values() if k.falls_back)
                + ")",
            )
        return drafting.plain() if problem else drafter

    @property
    def uses_chat(self) -> bool:
        return prompt.uses_chat(self.target, self.cfg.chat)

    def prompt_tokens(
        self,
        text: str = "",
        *,
        messages: list[chat_.Message] | None = None,
        tools: chat_.Tools | None = None,
        chat: bool | None = None,
    ) -> list[int]:
        """The prompt's tokens for this target and context (chat/prompt.py), with --chat and --system."""
        return prompt.prompt_tokens(
            self.target,
            self.target_ctx.n_ctx,
            text,
            messages=messages,
            tools=tools,
            chat=chat,
            configured_chat=self.cfg.chat,
            system=self.cfg.system,
        )

    def infill_tokens(self, prefix: str, suffix: str, extra: list[fim.Extra] = (), text: str = "") -> list[int]:
        """A fill-in-the-middle prompt's tokens for this target and context (chat/prompt.py)."""
        return prompt.infill_tokens(self.target, self.target_ctx.n_ctx, prefix, suffix, extra, text)

    def generate(
        self,
        tokens: list[int],
        *,
        instruction: str = "",
        corpus: Corpus | None = CACHED,
        reuse: bool = False,
        trigger=None,
        prediction: str | None = None,
        salt: str | None = None,
        **changes,
    ) -> Iterator[Event]:
        """Run the engine on prompt tokens. `changes`: settings of this run other than the session's
        (RunConfig.override, checked by the options' rules): a request's, a bench row's; drafter="none"
        decodes target-only even with a draft loaded (like-for-like baselines).
        Lookup's sources: `instruction`, the user's prompt (the names it mentions are where the answer
        edits), and `corpus`, earlier answers: the lookup cache unless given (the bench brings its own).
        `reuse`: keep what both caches hold of this prompt from the run before (a server's chat turns);
        Prefilled.cached says how much. `trigger`: the grammar (gbnf) applies from there on (a tool call's
        opening marker, with tool_choice "auto"), LazyState. `prediction`: text the answer is expected to repeat
        (OpenAI's predicted outputs; default: the --prediction file's), lookup's first source, counted in Stats.
        `salt`: a request's cache_salt: a run reuses only cells of runs with the same salt (in memory and on disk),
        so that a client cannot learn from Prefilled.cached, or from the time, what another namespace asked."""
        run = self.cfg.override(**changes)
        self.check_branches(run.branches)
        name = self.able(run.drafter) if "drafter" in changes else self.drafter
        corpus = self.lookup_corpus(salt) if corpus is CACHED else corpus
        prediction = prediction if prediction is not None else run.prediction_text
        return self._run(name, run, tokens, instruction, corpus, reuse, trigger, prediction, salt)

    def _run(
        self,
        name: str,
        run: RunConfig,
        tokens: list[int],
        instruction: str,
        corpus: Corpus | None,
        reuse: bool,
        trigger=None,
        prediction: str | None = None,
        salt: str | None = None,
    ) -> Iterator[Event]:
        # A generator, so that the drafter's set-up (auto measures the cost curve: about a second) happens
        # as the consumer starts reading: an interruption there is one of the stream's, like any other. The
        # user waits for the set-up too: its time is the prefill's (Prefilled.seconds).
        t0 = time.perf_counter()
        self.kept.begin(fit=reuse or not run.exact)  # exact mode's prompt cells differ without reuse (below)
        # --json-schema, --grammar, a request's response_format: parsed for this model's vocabulary (microseconds)
        grammar = Grammar(self.target, run.gbnf, trigger) if run.gbnf else None
        # Another namespace's cells are not reused (taken empty), though this run's may serve its own next run.
        own, self._salt = salt == self._salt, salt
        draft = (lambda: self.kept.take(self.draft_context(), tokens, reuse and own)) if self._draft_file else None
        if self.heads.made is not None:  # the target's decodes feed the heads only in runs that draft with them
            self.heads.made.heads.detach()
        heads = self.heads if self.target.heads and drafting.kind(name).heads != NEVER else None
        tokenize = functools.partial(self.target.tokenize, special=False)  # as the answer's text tokenizes
        predicted = tuple(tokenize(prediction)) if prediction is not None else None
        drafter = drafting.build(
            name,
            drafting.Sources(
                k=run.draft_tokens,
                costs=functools.partial(self.curve.get, tokens),
                draft=draft,
                draft_loaded=lambda: self.draft_ctx is not None,
                heads=heads,
                is_eog=self.target.is_eog,
                p_min=run.p_min,
                branches=run.branches,
                p_split=run.p_split,
                max_nodes=MAX_DRAFT_TOKENS,
                vocab=self.target.n_vocab,
                window=run.draft_window or None if self.draft_slides else None,
                max_tokens=run.max_tokens,
                lookup_branches=MAX_BRANCHES if self.target.rollback == "cells" else 1,
                instruction=instruction,
                corpus=corpus,
                prediction=predicted or (),
                tokenize=tokenize,
                grammar=grammar.start if grammar else None,
                piece=self.target.piece,
            ),
        )
        main = self.kept.take(self.target_ctx, tokens, reuse and own)
        if reuse and self.prefixes is not None:  # the prompt's saved blocks, where they reach further (and kept)
            self.prefixes.restore(main, tokens, salt)
        # Exact mode's prompt normally goes through the fast kernels (every run of a prompt decodes it
        # alike); a reused prefix was decoded in other batches (an earlier prompt, an answer verified in
        # draft-sized ones), so with reuse every prompt token gets the cells its lone decode gives, and a
        # reused prefix holds exactly the cells a cold run computes.
        settings = run.settings(prompt_kernels=not reuse, constraint=grammar.start() if grammar else None)
        setup = time.perf_counter() - t0
        try:
            events = generate(main, drafter, tokens, settings)
            yield from with_text(_with_setup(events, setup, predicted), self.target.piece)
        except GeneratorExit:  # the consumer walked away between rounds: the caches are rolled back, whole
            self.kept.keep()
            raise
        self.kept.keep()  # (a run that fails leaves nothing to trust)
        self.curve.check_drift()

    def lookup_corpus(self, salt: str | None = None) -> Corpus | None:
        """The lookup cache's answers for this target in the namespace of this server's key and `salt` (None: off)."""
        return self.answers.corpus(salt) if self._looks_up else None

    @functools.cached_property
    def vocab_key(self) -> str:
        return vocab.fingerprint(self.target)

    def remember(self, answer: list[int], salt: str | None = None) -> None:
        """Keep an answer in the lookup cache for later runs of its namespace (with the cache on, and lookup in use)."""
        if self._looks_up:
            self.answers.remember(answer, salt)

    def keep_prompt(self, deadline: float = float("inf")) -> None:
        """The last prompt's blocks to the prefix store (a server's, serve/prefixes.py), where it has one and the
        prompt's cells are still held; by `deadline` (time.monotonic())."""
        store = self.prefixes
        if store is None or store.pending is None:
            return
        (tokens, salt), seq = store.pending, self.kept.held(self.target_ctx)  # (seq None: emptied since)
        try:
            if seq is not None:
                store.save(seq, tokens, salt, deadline)
        except Exception:  # (a signal that cuts it leaves the prompt pending, for a stop's last write)
            store.pending = None
            raise
        store.pending = None

    def unsaved_blocks(self) -> int:
        """How many of the last prompt's blocks `keep_prompt` would write."""
        store = self.prefixes
        seq = self.kept.held(self.target_ctx) if store is not None and store.pending is not None else None
        return store.unsaved(seq, *store.pending) if seq is not None else 0

    @property
    def _looks_up(self) -> bool:
        return self.cfg.lookup_cache and drafting.kind(self.drafter).lookup

    def costs(self, tokens: list[int], measured: cost.Costs | None = None) -> cost.Costs:
        """This machine's costs, measured on first use (about a second; it empties both caches) unless a
        measurement is handed in (the bench's thorough one), and refined as auto runs."""
        return self.curve.adopt(measured) if measured is not None else self.curve.get(tokens)


def _with_setup(events: Iterator[Event], seconds: float, predicted: tuple[int, ...] | None) -> Iterator[Event]:
    """The engine's events, the run's set-up before the engine started counted in its prefill, and the predicted
    answer's length (None: none) told with it: the engine sees token ids only, not where a drafter's came from."""
    n = len(predicted) if predicted is not None else None
    for event in events:
        yield replace(event, seconds=event.seconds + seconds, prediction=n) if isinstance(event, Prefilled) else event


class open_session:
    """Context manager: `with open_session(cfg) as s: ...`; frees everything on the way out."""

    def __init__(self, cfg: RunConfig, max_draft: int | None = None, lazy_draft: bool = False):
        self.cfg = cfg
        self.max_draft = max_draft
        self.lazy_draft = lazy_draft
        self._stack = ExitStack()

    def __enter__(self) -> Session:
        try:
            return Session(self.cfg, self._stack, self.max_draft, self.lazy_draft)
        except BaseException:
            self._stack.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
