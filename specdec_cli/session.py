"""Load a target (and a draft) into their own contexts and run the engine: what every command calls."""

from __future__ import annotations

import functools
import time
from contextlib import ExitStack
from dataclasses import replace
from typing import Iterator

from . import contexts, drafting, drafts, fit, prefixes
from .backend import devices, gguf_file, mtp, rpc, vocab
from .backend.context import Context
from .backend.grammar import Grammar
from .backend.native import Model
from .batching.rendezvous import Steps
from .batching.slots import Slot, home, shares
from .drafting import cache as lookup_cache
from .drafting import NEVER, cost, measure
from .drafting.bridge import Bridge
from .drafting.corpus import Corpus
from .run_inputs import CACHED, Inputs
from .engine import kv
from .chat import fim, prompt
from .chat.prompt import PromptTooLong  # noqa: F401 (re-exported: the server and tests catch it)
from .engine.events import Event, with_setup
from .engine.speculative import generate
from .once import Once
from .fit import context_sizes
from .text import with_text
from .options import AUTO_K_MAX, MAX_BRANCHES, MAX_DRAFT_TOKENS, RunConfig  # noqa: F401 (RunConfig: re-exported)


class Session:
    """A loaded target (and draft). Use `open_session`; it frees contexts before models."""

    def __init__(
        self,
        cfg: RunConfig,
        stack: ExitStack,
        max_draft: int | None = None,
        lazy_draft: bool = False,
        slots: int = 1,
        measuring: measure.Measuring = measure.unseen,
    ):
        """max_draft: the longest draft a run may send (default: -k, else auto's longest): a recurrent
        target keeps a snapshot of its state per draft token. lazy_draft: load the draft model at its first
        draft (a one-shot run's, or a batch's: a run that never drafts with it never loads it), not now. slots: a
        server's generations at once (`open_slots`), each with its share of the contexts (layout.py); 0: as many as
        fit in memory, up to DEFAULT_SLOTS. measuring: what shows the user that auto is measuring this machine (the
        UI's spinner), given the threads and where the curve is kept."""
        self.cfg, self._stack = cfg, stack
        t0 = time.perf_counter()
        # --rpc: the target's layers on the servers (and this machine's GPUs, as llama.cpp would); the draft
        # never leaves this machine (fit.wants). Where each model's layers go is decided before it loads.
        servers = rpc.parse(cfg.rpc) if cfg.rpc else []
        self.where = f"rpc {rpc.label(servers)}" if servers else "local"
        remote = [devices.device(d) for d in rpc.devices(servers)] if servers else []
        uses_draft = cfg.draft is not None and drafting.kind(cfg.drafter).uses_model
        self._plan = plan = fit.plan(cfg, remote, cfg.draft if uses_draft else None)
        self.warnings: list[str] = plan.notes  # for the command to show, once
        # The target's own draft heads (MTP), loaded where it has them and the drafter may draft with them (auto,
        # mtp: then a request or a bench row may too). A MoE model's heads hold an expert layer's weights.
        self.mtp_layers = mtp.heads_in_header(gguf_file.check(cfg.target))
        heads = drafting.kind(cfg.drafter).heads != NEVER and mtp.usable(cfg.target)
        # Exact mode changes how the target computes; the draft's numerics never change the output.
        self.target = stack.enter_context(Model(cfg.target, exact=cfg.exact, offload=plan.target, heads=heads))
        drafter = drafts.speculation(cfg, self.target, self.mtp_layers, self.warnings.append)  # (plain: no rollback)
        self.speculates = not drafting.kind(drafter).plain
        # The draft: a draft model, or one trained on the target's hidden states (checked against it: drafts.py).
        self.draft_of = drafts.read(cfg, self.target, stack, self.speculates, self.warnings.append)
        self._draft_file, info = self.draft_of.model, self.draft_of.info
        self.drafter = drafts.drafter(drafter, self.draft_of, cfg.branches)  # model -> eagle3 for an EAGLE-3 file
        self.answers = lookup_cache.Answers(lambda: self.vocab_key, self.warnings.append)  # lookup's earlier answers
        self.draft: Model | None = None  # loaded, with its context, where it first drafts (`draft_context`)
        self.draft_ctx: Context | None = None
        self.draft_context = Once(self._load_draft)  # the draft's context, the model loaded at its first draft
        self._draft = self.draft_context if self._draft_file else None  # (None: no draft model)
        # A draft whose cache cannot slide (a recurrent state, sliding-window layers) holds the whole text (window.py).
        self.draft_slides = info is not None and not info.recurrent and not info.sliding_window
        self.check_branches(cfg.branches, info)
        # The target drops a rejected tail of up to max_draft tokens: a recurrent target keeps that many
        # snapshots of its state (the verify batch of max_draft + 1 tokens holds them all).
        self.max_draft = max_draft or cfg.draft_tokens or AUTO_K_MAX
        sizes = context_sizes(cfg.ctx_size, self.target, info)
        snapshots = self.max_draft if self.speculates and self.target.rollback == "snapshots" else 0
        hidden, heads = self.draft_of.hidden, self.mtp_layers
        shaped, self._draft_bytes = contexts.fitted(
            slots, sizes, self.target, info, plan, hidden is not None, cfg.exact, snapshots, heads
        )
        self.layout, self.target_contexts, placed = contexts.target(self.target, shaped, cfg.threads, stack)
        self.placement = {"target": placed, "draft": None}  # where the layers went
        self.target_ctx, self.n_ctx = self.target_contexts[0], self.layout.n_ctx  # (n_ctx: a request's context)
        self.companions = contexts.companions(
            self.target_contexts, self.layout, hidden, plan, self._draft_bytes, cfg.threads, stack
        )
        # The pair's cost curve: the draft's file counts even unloaded, a hidden-state draft's target's too.
        paths = [cfg.target] + [p for p in (self._draft_file, cfg.draft if hidden else None) if p]
        where = self.where + fit.layout(plan)  # a curve measured with other layers offloaded is another's
        anew, weights = not self.speculates or cfg.remeasure, self.target.weight_bytes
        self.curve = measure.of_pair(
            self.target_ctx, self._draft, paths, cfg.threads, cfg.exact, where, AUTO_K_MAX + 1, weights,
            anew=anew, measuring=measuring, warn=self.warnings.append,
        )  # fmt: skip
        self.kept = kv.Kept(lambda: self.curve.measurements)  # a measurement empties both caches
        self.home = home(self.target_ctx, self._draft, self.kept, self.companions)
        self.prefixes: prefixes.Store | None = None  # a server's long prompts on disk (keep_prefixes)
        self._stored = self.home  # the slot whose prompt the prefix store saves next (its last restore's)
        # A recurrent draft's state is probed with its weights (memory.rollback): it is loaded now.
        if self._draft_file and (not lazy_draft or info.recurrent):
            self.draft_context()
        if servers:
            rpc.watch_connections()  # a server machine that vanishes ends the run instead of hanging it
        self.warnings += contexts.exact_caveat(self.target, self.target_ctx)
        self.load_seconds = time.perf_counter() - t0

    @property
    def has_draft(self) -> bool:
        """Whether a draft model serves this session (loaded now, or at its first draft)."""
        return self._draft_file is not None

    def _load_draft(self) -> Context:
        """The draft model and its context (its load time goes to the cost curve)."""
        t0 = time.perf_counter()
        want, shape = self._plan.draft_want, self.layout.draft
        placed = fit.offload(want, self._draft_file, shape.n_ctx, self._draft_bytes)[0] if want else None
        draft = self._stack.enter_context(Model(self._draft_file, offload=placed))
        (ctx,), self.placement["draft"] = contexts.opened(draft, shape, self.cfg.threads, self._stack)
        self.draft, self.draft_ctx = draft, ctx
        self.curve.draft_load = time.perf_counter() - t0
        return ctx

    def check_branches(self, branches: int, draft: Model | None = None) -> None:
        drafting.check_branches(branches, [m for m in (self.target, draft or self.draft) if m is not None])

    def able(self, drafter: str, branches: int = 1) -> str:
        """`drafter` where this target can draft with it (drafting.able: plain decoding, or an error, elsewhere), and
        with this draft (drafts.drafter: `model` with an EAGLE-3 draft is eagle3)."""
        return drafts.drafter(drafting.able(drafter, self.target, self.mtp_layers), self.draft_of, branches)

    @property
    def uses_chat(self) -> bool:
        return prompt.uses_chat(self.target, self.cfg.chat)

    def prompt_tokens(self, text: str = "", **kw) -> list[int]:
        """The prompt's tokens for this target and context, with --chat and --system (chat/prompt.py: `messages`,
        `tools`, `chat`)."""
        n_ctx, chat, system = self.n_ctx, self.cfg.chat, self.cfg.system
        return prompt.prompt_tokens(self.target, n_ctx, text, **kw, configured_chat=chat, system=system)

    def infill_tokens(self, prefix: str, suffix: str, extra: list[fim.Extra] = (), text: str = "") -> list[int]:
        """A fill-in-the-middle prompt's tokens for this target and context (chat/prompt.py)."""
        return prompt.infill_tokens(self.target, self.n_ctx, prefix, suffix, extra, text)

    def open_slots(self, steps: Steps) -> list[Slot]:
        """A server's slots, their decodes through `steps` (batching/slots.py), with what they draft with loaded now (a
        load in a request's run would stall every other slot). The cost curve is measured first, where it was not (a
        request may ask for auto): measuring empties every sequence."""
        if self.curve.costs is None:
            self.curve.get(self.target.tokenize("Hello, world.", special=True))
        if self._draft is not None:
            self._draft()
        for i in range(self.layout.target.count):
            for opened in self.companions:
                if opened is not None and self.speculates:
                    opened(i)
        kept = functools.partial(kv.Kept, lambda: self.curve.measurements)
        return shares(self.layout, self.target_contexts, self._draft, steps, kept, self.companions)

    def generate(
        self, tokens: list[int], inputs: Inputs = Inputs(), slot: Slot | None = None, **changes
    ) -> Iterator[Event]:
        """Run the engine on prompt tokens, reading `inputs` (run_inputs.py: the instruction, corpus, reuse, grammar,
        prediction, salt). `changes`: settings of this run other than the session's (RunConfig.override, checked
        by the options' rules): a request's, a bench row's; drafter="none" decodes target-only even with a draft
        loaded (like-for-like baselines)."""
        run = self.cfg.override(**changes)
        self.check_branches(run.branches)
        name = self.able(run.drafter, run.branches) if "drafter" in changes else self.drafter
        corpus = self.lookup_corpus(inputs.salt) if inputs.corpus is CACHED else inputs.corpus
        prediction = inputs.prediction if inputs.prediction is not None else run.prediction_text
        return self._run(name, run, tokens, replace(inputs, corpus=corpus, prediction=prediction), slot or self.home)

    def _run(self, name: str, run: RunConfig, tokens: list[int], inputs: Inputs, slot: Slot) -> Iterator[Event]:
        # A generator, so that the drafter's set-up (auto measures the cost curve: a few seconds) happens
        # as the consumer starts reading: an interruption there is one of the stream's, like any other. The
        # user waits for the set-up too: its time is the prefill's (Prefilled.seconds), but for the measurement,
        # told apart (Prefilled.measure_seconds: once per model and -t, it is not what a prompt costs).
        t0 = time.perf_counter()
        reuse, salt = inputs.reuse, inputs.salt
        slot.begin(len(tokens))
        slot.kept.begin(fit=reuse or not run.exact)  # exact mode's prompt cells differ without reuse (below)
        # --json-schema, --grammar, a request's response_format: parsed for this model's vocabulary (microseconds)
        gbnf = inputs.grammar if inputs.grammar is not None else run.gbnf
        grammar = Grammar(self.target, gbnf, inputs.trigger) if gbnf else None
        # Another namespace's cells are not reused (taken empty), though this run's may serve its own next run.
        own, slot.salt = salt == slot.salt, salt
        # A draft of another vocabulary reads the prompt in its own tokens (drafting/bridge.py): its cells are those.
        bridge = Bridge(self.target, self.draft_of.info) if self.draft_of.foreign else None
        held = lambda: bridge.prompt(tokens) if bridge is not None else tokens  # noqa: E731 (only where it drafts)
        draft = (lambda: slot.kept.take(slot.draft(), held(), reuse and own)) if slot.draft else None
        for made in (slot.heads and slot.heads.made, slot.hidden and slot.hidden.made):  # the target's decodes feed
            if made is not None:  # them only in runs that draft with them
                made.detach()
        heads = slot.heads if drafting.kind(name).heads != NEVER else None
        hidden = slot.hidden if drafting.kind(name).uses_model else None
        tokenize = functools.partial(self.target.tokenize, special=False)  # as the answer's text tokenizes
        predicted = tuple(tokenize(inputs.prediction)) if inputs.prediction is not None else None
        sources = drafting.for_run(
            run,
            self.target,
            costs=slot.costs(functools.partial(self.curve.get, tokens)),
            draft=draft,
            draft_loaded=lambda: self.draft_ctx is not None,
            heads=heads,
            hidden=hidden,
            hidden_kind=drafting.native_kind(self.draft_of.native) if hidden else None,
            keep=self.curve.keep,
            slides=self.draft_slides,
            tokenize=tokenize,
            instruction=inputs.instruction,
            corpus=inputs.corpus,
            prediction=predicted or (),
            grammar=grammar.start if grammar else None,
            max_nodes=MAX_DRAFT_TOKENS,
            max_leaves=MAX_BRANCHES,
            n_ctx=slot.target.n_ctx,
            bridge=bridge,
        )
        measurements = self.curve.measurements
        drafter = drafting.build(name, sources)  # (auto's measures the machine here, on its first run)
        main = slot.kept.take(slot.target, tokens, reuse and own)
        if reuse and self.prefixes is not None:  # the prompt's saved blocks, where they reach further (and kept)
            self.prefixes.restore(main, tokens, salt, slot.released)
            self._stored = slot
        # Exact mode's prompt normally goes through the fast kernels (every run of a prompt decodes it
        # alike); a reused prefix was decoded in other batches (an earlier prompt, an answer verified in
        # draft-sized ones), so with reuse every prompt token gets the cells its lone decode gives, and a
        # reused prefix holds exactly the cells a cold run computes.
        settings = run.settings(prompt_kernels=not reuse, constraint=grammar.start() if grammar else None)
        measured = self.curve.seconds if self.curve.measurements > measurements else 0.0
        doubted = self.curve.doubted if measured else None
        setup = time.perf_counter() - t0 - measured
        try:
            events = with_setup(generate(main, drafter, tokens, settings), setup, predicted, measured, doubted)
            yield from with_text(events, self.target.piece)
        except GeneratorExit:  # the consumer walked away between rounds: the caches are rolled back, whole
            slot.kept.keep()
            raise
        slot.kept.keep()  # (a run that fails leaves nothing to trust)
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

    def keep_prefixes(
        self, max_bytes: int, warn: prefixes.Warn, api_key: str | None = None, lifetime: float = prefixes.LIFETIME
    ) -> str | None:
        """A server's: long prompts' cells kept on disk (prefixes/), restored where a prompt reuses them, bounded by
        `max_bytes`, namespaced by `api_key`; the reason where this target cannot have them (None: it has)."""
        key = prefixes.model_key(self.cfg, self.where)
        store = prefixes.opened(self.target, self.target_ctx, key, max_bytes, warn, api_key, lifetime)
        if isinstance(store, str):
            return store
        self.prefixes = store
        return None

    def keep_prompt(self, deadline: float = float("inf")) -> None:
        """The last prompt's blocks to the prefix store (keep_prefixes), where it has one and the prompt's cells are
        still held; by `deadline` (time.monotonic())."""
        if self.prefixes is not None:
            with self._stored.kept.unparked(self._stored.target) as seq:
                self.prefixes.keep(seq, deadline)

    def unsaved_blocks(self) -> int:
        """How many of the last prompt's blocks `keep_prompt` would write."""
        held = self._stored.kept.held(self._stored.target)
        return self.prefixes.unkept(held) if self.prefixes is not None else 0

    @property
    def _looks_up(self) -> bool:
        return self.cfg.lookup_cache and drafting.kind(self.drafter).lookup

    def costs(self, tokens: list[int], measured: cost.Costs | None = None) -> cost.Costs:
        """This machine's costs, measured on first use (about a second; it empties both caches) unless a
        measurement is handed in (the bench's thorough one), and refined as auto runs."""
        return self.curve.adopt(measured) if measured is not None else self.curve.get(tokens)


class open_session:
    """`with open_session(cfg) as s: ...`: a Session that frees everything on the way out (contexts before models). A
    class, not a generator: a caller that keeps only the session (`open_session(cfg).__enter__()`) keeps it loaded."""

    def __init__(
        self,
        cfg: RunConfig,
        max_draft: int | None = None,
        lazy_draft: bool = False,
        slots: int = 1,
        measuring: measure.Measuring = measure.unseen,
    ):
        self.cfg, self.max_draft, self.lazy_draft, self.slots = cfg, max_draft, lazy_draft, slots
        self.measuring = measuring
        self._stack = ExitStack()

    def __enter__(self) -> Session:
        try:
            return Session(self.cfg, self._stack, self.max_draft, self.lazy_draft, self.slots, self.measuring)
        except BaseException:
            self._stack.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
