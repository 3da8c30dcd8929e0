"""What the server does with a request, without HTTP: one loaded pair, its slots (one, or --parallel N: gate.py hands
them out, pool.py runs each generation in its own), a bounded queue, prefix reuse, and a stream of the answer's items
(items.py) that stops when the client leaves or the server stops."""

from __future__ import annotations

import queue
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .. import chat, ui
from ..chat import ToolCall, calls, fim
from ..batching.claim import Claim, Left
from ..batching.rendezvous import Steps
from ..engine.events import Prefilled, Round, Stopped, Token
from ..engine.stats import Fold, Stats
from ..errors import SpecdecError, UsageError
from ..options import OptionError
from ..prefixes import STOP_SECONDS
from ..run_inputs import Inputs
from ..session import PromptTooLong, Session
from ..batching.slots import Slot
from .api import api_name, completion, finish_reason, new_id
from .body import ApiError
from .cuts import Cuts
from .gate import Gate
from .items import STARTED, WAITING, Finished, Item, Streamed, whole
from .jobs import END, Job, Newest, shutting_down
from .pool import Pool
from .request import Request
from .toolcalls import Calls, constraint


KEEP_ALIVE = 5.0  # seconds a stream may go without an item: the stream loop has its dialect answer WAITING then
WATCH = 0.25  # seconds between looks at a waiting request's connection (and whether a newer request superseded it)


@dataclass(frozen=True)
class Run:
    """A request's run, checked: its settings over the server's (RunConfig.override's keywords, nothing else) and
    what it reads besides them (run_inputs.Inputs: its grammar, the calls' trigger, its prediction, its salt), and how
    the model writes the calls it may make (None: its answer is text)."""

    settings: dict[str, Any]
    inputs: Inputs
    call_format: calls.Format | None


class Service:
    def __init__(self, session: Session, model: str, model_ids: set[str], waiting: int):
        self.session = session
        self.model = model  # the id responses and /v1/models show
        self.model_ids = model_ids  # the names a request's `model` may use
        steps = Steps()
        self.gate = Gate(session.open_slots(steps), waiting)  # (the session's slots: the one count of them)
        self.pool = Pool(steps)
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._submitting = threading.Lock()  # a job is handed over, or refused once `work` has ended: never lost
        self._closed = False
        self._latest: dict[str, object] = {}  # client -> its newest request (Newest)

    def check_model(self, name: str | None) -> None:
        """GET /v1/models/NAME: only the served names exist. A generation's `model` may name anything (a
        client configured for another server's model, a batch file written for OpenAI's): the loaded pair
        answers it, and the response's `model` says which model that is."""
        if name is not None and name not in self.model_ids:
            raise ApiError(
                404,
                f"the model {name!r} does not exist: this server serves {', '.join(sorted(self.model_ids))}",
                param="model",
                code="model_not_found",
            )

    def tokens(self, req: Request) -> list[int]:
        """The prompt as the target reads it: chat messages in its template (the server's --system
        first, when the request has no system message), a completion's prompt as it is. On a connection's
        thread: a stopping server ends its tokenizing and rendering where they are (chat/limits.py), with 503."""
        with chat.limits.stopping(lambda: self.gate.closing):
            return self._tokens(req)

    def _tokens(self, req: Request) -> list[int]:
        s = self.session
        try:
            if req.kind == "chat":
                if not s.uses_chat:
                    raise ApiError(400, f"{s.target.name} has no chat template: use /v1/completions")
                messages = req.messages
                if s.cfg.system and not any(m.role == "system" for m in messages):
                    messages = [chat.Message("system", s.cfg.system), *messages]
                return s.prompt_tokens(messages=messages, tools=req.tools)
            if req.suffix is not None:
                why = fim.refusal(s.target)
                if why:  # llama-server's status for /infill: 501
                    raise ApiError(501 if req.kind == "infill" else 400, why, param="suffix")
                return s.infill_tokens(req.prompt, req.suffix, req.extra, req.continued)
            return s.prompt_tokens(req.prompt, chat=req.template)
        except chat.Cancelled:
            raise shutting_down() from None
        except UsageError as e:
            raise ApiError(
                400,
                e.message,
                param="messages" if req.kind == "chat" else "prompt",
                code="context_length_exceeded" if isinstance(e, PromptTooLong) else None,
            ) from None

    def overrides(self, req: Request) -> Run:
        """The request's run: its settings over the server's, checked by the options' own rules (RunConfig.override),
        and its inputs; its grammar is its tools' calls' (built and checked now: a schema refused is a 400 before a
        stream's first line), else its own (response_format and the like; None: the server's)."""
        cfg = self.session.cfg
        if req.exact is not None and req.exact != cfg.exact:
            raise ApiError(
                400,
                f"exact mode is chosen when the server starts (this one runs {'with' if cfg.exact else 'without'}"
                " --exact): it changes how the target model is loaded",
                param="exact",
            )
        try:
            run = cfg.override(**req.settings)
            if run.drafter != cfg.drafter:
                self.session.able(run.drafter)
        except OptionError as e:
            raise ApiError(400, f"{api_name(e.key)} {e.rule}", param=api_name(e.key)) from None
        except UsageError as e:
            raise ApiError(400, e.message) from None
        fmt = self.call_format(req)
        tools = constraint(req.tools, fmt) if fmt is not None else None
        inputs = Inputs(
            instruction=req.instruction,
            reuse=req.cache_prompt is not False,
            grammar=tools.gbnf if tools else req.grammar,
            trigger=tools.trigger if tools else None,
            prediction=req.prediction,
            salt=req.cache_salt,
        )
        asked = {} if req.logprobs is None else {"logprobs": req.logprobs}
        return Run({**req.settings, **asked}, inputs, fmt)

    def greedy(self, req: Request) -> bool:
        """Whether this request's answer is greedy: the same every time it is asked (its settings: checked by
        `overrides` already)."""
        return self.session.cfg.override(**req.settings).sampler.greedy

    def call_format(self, req: Request) -> calls.Format | None:
        """How the model writes its tool calls (None: this request's answer is text)."""
        if req.tools is None or req.tools.choice == "none":
            return None
        return calls.format_of(self.session.target.chat_template())

    def run(self, req: Request, tokens: list[int], gone: Callable[[], bool]) -> Iterator[Streamed]:
        """The answer's items as they are generated, then Finished (on the caller's thread: an HTTP connection's).
        The generation itself runs in a slot (pool.py). Holds the slot throughout; the request leaves (its claim: one
        way, read by its slot's next decode and between rounds) when the client is `gone` or a newer request from
        the same client supersedes it, looked at every WATCH seconds while it waits for an item (a long prompt stops
        at its next chunk); a closing server ends it with ApiError 503. A stream also gets STARTED when its turn comes,
        and WAITING every KEEP_ALIVE seconds without a piece (a long prompt's prefill): agents give up on a stream that
        has been still for 300 s (Claude Code and Codex CLI, which then send the request again), and on this CPU an
        agent's first prompt takes longer to prefill."""
        run = self.overrides(req)
        newer, claim = Newest(self._latest, req.client), Claim(req.priority)
        reuse = (lambda slot: slot.reuses(tokens, req.cache_salt)) if run.inputs.reuse else (lambda slot: 0)
        with self.gate.admit(claim, newer.arrive, reuse) as slot:
            job = Job(lambda: self._generate(req, tokens, run, claim, slot), claim)
            self._submit(job)
            try:
                if req.stream:
                    yield STARTED  # a stream's headers go now, before a long prompt's prefill
                still = looked = time.monotonic()  # (the last item; the last look at the client)
                while True:
                    try:
                        item = job.out.get(timeout=min(WATCH, KEEP_ALIVE))
                    except queue.Empty:
                        item = None
                    now = time.monotonic()
                    if now - looked >= WATCH:  # (items flowing or not)
                        self._watch(claim, gone, newer)
                        looked = now
                    if item is None:
                        if req.stream and now - still >= KEEP_ALIVE:
                            still = now
                            yield WAITING
                        continue
                    still = now
                    if item is END:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    yield item
            finally:
                claim.leave("gone")  # (a finished generation's claim is no one's to read)
                job.done.wait()  # the slot is free only once the engine has let go of the caches

    @staticmethod
    def _watch(claim: Claim, gone: Callable[[], bool], newer: Callable[[], bool]) -> None:
        if newer():
            claim.leave("superseded")
        elif gone():
            claim.leave("gone")

    def answer(self, req: Request) -> dict:
        """The whole response `run` would give, generated on the calling thread, with no queue (a batch)."""
        tokens, run = self.tokens(req), self.overrides(req)
        text, finished = whole(self._generate(req, tokens, run, Claim()))
        return completion(req, new_id(req.kind), self.model, text, finished)

    def work(self, stop: threading.Event) -> None:
        """Run the generations until `stop`: the steps on the calling thread (the main thread: llama.cpp's OpenMP
        threads belong to the thread that calls it, and a second team, made by a connection's thread, spins against
        the first for the same cores: a third slower, measured), each generation on a thread of its own (pool.py).
        A signal raised here cuts the running generations cleanly and ends the loop."""
        try:
            self.pool.work(stop, self._jobs, self._keep_prompt)
        finally:
            # Close the gate before the cut generations' connections let go of their slots (or a waiter would get
            # one and hand over a job that nobody runs), then refuse whatever was handed over.
            self.gate.close()
            with self._submitting:
                self._closed = True
                while True:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    job.refuse(shutting_down())

    def _keep_prompt(self, deadline: float = float("inf")) -> None:
        """The last prompt's blocks to the prefix cache, on this thread: llama.cpp's. A signal that cuts it leaves
        the prompt pending, for `keep_before_stopping`."""
        try:
            self.session.keep_prompt(deadline)
        except Exception as e:  # a bug in a cache must not take the server down: the next request runs
            ui.warning(f"could not keep the prompt in the prefix cache: {e!r}")

    def keep_before_stopping(self) -> None:
        """A graceful stop: the last prompt's blocks not yet on disk are written (STOP_SECONDS at most, said in
        one line), so that a script that asks and stops a server still gets the cache. A signal during it
        (the caller lets a second one through) stops it at once; a block half-written is a temporary file."""
        n = self.session.unsaved_blocks()
        if n:
            ui.note(
                f"writing {n} block(s) of the last prompt to the prefix cache ({STOP_SECONDS:g} s at most; "
                "a second signal stops at once)"
            )
            self._keep_prompt(time.monotonic() + STOP_SECONDS)

    def _submit(self, job: Job) -> None:
        with self._submitting:
            if self._closed:
                job.refuse(shutting_down())
            else:
                self._jobs.put(job)
                self.pool.steps.poke()

    def _generate(
        self, req: Request, tokens: list[int], run: Run, claim: Claim, slot: Slot | None = None
    ) -> Iterator[Item]:
        """The answer's items: the engine's events through the cuts (stop strings, n_indent, the time limit, the
        log probabilities: cuts.Cuts), then through the tool calls' reader (toolcalls.Calls), then Finished. Ends
        without it where its client left; with it, superseded, where a newer request from the same client came."""
        if claim.reason == "superseded":  # superseded while it waited: nothing to prefill for
            yield Finished(Stats(), 0, "length", superseded=True)
            return
        events, fold, superseded = self.session.generate(tokens, run.inputs, slot, **run.settings), Fold(), False
        piece = self.session.target.piece if req.logprobs is not None else None  # (the scored tokens' texts)
        cut, reader = Cuts(req.stop, req.indent, req.time_limit, piece), Calls(run.call_format)
        try:
            for event in events:
                fold.add(event)
                if isinstance(event, Token):
                    yield from reader.read(cut.token(event))
                    if cut.ended:
                        break
                elif isinstance(event, Prefilled):
                    cut.prefilled()
                elif isinstance(event, Stopped):
                    yield from reader.read(cut.stopped(event.tail))
                elif isinstance(event, Round):  # once a verification, not a token
                    if self.gate.closing:
                        raise shutting_down(": generation stopped")
                    if claim.left:
                        superseded = claim.reason == "superseded"
                        if not superseded:
                            return
                        break
        except SpecdecError as e:
            raise ApiError(500 if not isinstance(e, UsageError) else 400, e.message) from None
        except Left:  # it left during its prompt (a slot's decodes stop at once)
            if claim.reason != "superseded":
                return
            superseded = True
        finally:
            events.close()  # the engine's rollback, when it stopped early
        if fold.stats.stop_reason in ("eos", "max_tokens") and not (cut.ended or superseded):
            with slot.released() if slot is not None else nullcontext():  # (a file written: the others go on)
                self.session.remember(fold.tokens, req.cache_salt)  # (its namespace's: no other client drafts from it)
        last, made = reader.end()
        yield from last
        yield _finished(fold, cut, made, superseded)


def _finished(fold: Fold, cut: Cuts, made: list[ToolCall], superseded: bool) -> Finished:
    """The end, with OpenAI's finish_reason: "length" where a limit or a newer request ended the text, else as the
    engine or a stop sequence ended it; "tool_calls" where the answer made calls (and was not cut)."""
    reason = "length" if cut.limit or superseded else finish_reason(fold.stats.stop_reason, cut.stop.hit)
    reason = "tool_calls" if made and reason != "length" else reason
    return Finished(fold.stats, fold.cached, reason, made, cut.stop.hit, cut.scored, cut.limit, superseded)
