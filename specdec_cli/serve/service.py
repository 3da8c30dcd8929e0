"""What the server does with a request, without HTTP: one loaded pair, one generation at a time, a bounded
queue, prefix reuse, and a stream of text pieces that stops when the client leaves or the server stops."""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from .. import chat, ui
from ..backend import grammar
from ..backend.schema import schema_to_gbnf
from ..chat import calls, fim
from ..engine.events import Prefilled, Round, Stopped, Token
from ..engine.stats import Fold, Stats
from ..errors import SpecdecError, UsageError
from ..options import OptionError
from ..session import PromptTooLong, Session
from . import body, cuts
from .body import STARTED, WAITING
from .cuts import Indent, Ledger, Probs, Scored, Text
from .jobs import END, Job, Newest, shutting_down
from .prefixes import STOP_SECONDS
from .api import ApiError, Request, StopText, api_name, completion, finish_reason, new_id


KEEP_ALIVE = 5.0  # seconds a stream may go without an event: each dialect answers WAITING (body.py) then


@dataclass
class Finished:
    """A generation's end, after its text: its statistics, reused prompt tokens and OpenAI's finish_reason."""

    stats: Stats
    cached: int
    reason: str
    calls: list[chat.ToolCall] = field(default_factory=list)  # the tool calls the answer made (its text: none of them)
    stop_sequence: str | None = None  # the stop sequence that ended the text
    probs: list[Scored] = field(default_factory=list)  # each token's log probabilities, where the request asked
    limit: bool = False  # a request's time or indentation limit ended it (llama-server's stop_type "limit")
    superseded: bool = False  # a newer request from the same client ended it


def whole(items: Iterable[str | calls.Piece | Finished]) -> tuple[str, Finished | None]:
    """A generation's text pieces joined, and its end (None: it stopped first, its client gone); its tool
    calls are the end's."""
    text, finished = [], None
    for item in items:
        if isinstance(item, Finished):
            finished = item
        elif isinstance(item, str):
            text.append(item)
    return "".join(text), finished


class Gate:
    """One generation at a time on the loaded pair; at most `queue` requests wait for it, the rest get 503."""

    def __init__(self, queue: int):
        self.queue = queue
        self.closing = False
        self._cond = threading.Condition()
        self._busy = False
        self._waiting = 0
        self._seconds = 1.0  # a running mean of how long a generation holds the gate: for Retry-After

    @contextmanager
    def turn(self, admitted: Callable[[], None] = lambda: None) -> Iterator[None]:
        """The generation's turn; `admitted` runs once the request has a place (not refused with 503)."""
        with self._cond:
            if self._busy and self._waiting >= self.queue:
                raise ApiError(
                    503,
                    f"busy: a generation is running and {self._waiting} request(s) wait (the queue holds {self.queue})",
                    code="queue_full",
                    retry_after=self._retry_after(),
                )
            admitted()
            self._waiting += 1
            try:
                while self._busy and not self.closing:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            if self.closing:
                raise shutting_down()
            self._busy = True
        t0 = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                self._seconds = 0.8 * self._seconds + 0.2 * (time.monotonic() - t0)
                self._busy = False
                self._cond.notify()

    def _retry_after(self) -> int:
        return max(1, round(self._seconds * (self._waiting + 1)))

    def close(self) -> None:
        """No new generations; waiting requests get 503, the one running ends after its current round."""
        with self._cond:
            self.closing = True
            self._cond.notify_all()


class Service:
    def __init__(self, session: Session, model: str, model_ids: set[str], waiting: int):
        self.session = session
        self.model = model  # the id responses and /v1/models show
        self.model_ids = model_ids  # the names a request's `model` may use
        self.gate = Gate(waiting)
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

    def overrides(self, req: Request) -> dict:
        """The request's settings over the server's, checked by the options' own rules (RunConfig.override)."""
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
        return {**req.settings, **self._tool_grammar(req)}

    def greedy(self, req: Request) -> bool:
        """Whether this request's answer is greedy: the same every time it is asked."""
        return self.session.cfg.override(**self.overrides(req)).sampler.greedy

    def call_format(self, req: Request) -> calls.Format | None:
        """How the model writes its tool calls (None: this request's answer is text)."""
        if req.tools is None or req.tools.choice == "none":
            return None
        return calls.format_of(self.session.target.chat_template())

    def _tool_grammar(self, req: Request) -> dict:
        """The calls' grammar (each tool's arguments by its schema), lazy with tool_choice "auto". A tool whose
        schema the converter cannot express (or llama.cpp could not take) gets any JSON object for arguments,
        said in a warning: the request is still answered (tools come from third parties, MCP servers)."""
        from dataclasses import replace

        fmt = self.call_format(req)
        if fmt is None:
            return {}

        def constraint(tools: calls.Tools) -> calls.Constraint:
            c = calls.constraint(tools, fmt, schema_to_gbnf)
            grammar.check(c.gbnf, schema=True)
            return c

        try:
            c = constraint(req.tools)
        except UsageError as e:
            refused = e
            kept, loosened = [], []
            for t in req.tools.tools:
                try:  # alone, as a call: its $refs resolve where they do among the others
                    if req.tools.choice in ("auto", "required", t.name):
                        constraint(replace(req.tools, tools=(t,), choice="required"))
                    kept.append(t)
                except UsageError as why:
                    kept.append(replace(t, parameters={"type": "object"}))
                    loosened.append(f"{t.name} ({why.message.removeprefix('--json-schema').lstrip(': ')})")
            if not loosened:  # each converts alone: together they are past a bound
                raise body.schema_refused(refused, "tools") from None
            ui.warning(f"tools: any JSON object stands for the arguments of {'; '.join(loosened)}")
            try:
                c = constraint(replace(req.tools, tools=tuple(kept)))
            except UsageError as e:
                raise body.schema_refused(e, "tools") from None
        return {"gbnf": c.gbnf, "trigger": c.trigger}

    def run(self, req: Request, tokens: list[int], gone: Callable[[], bool]) -> Iterator[str | Finished]:
        """Text pieces as they are generated, then Finished (on the caller's thread: an HTTP
        connection's). The generation itself runs on the thread in `work`. Holds the gate throughout;
        stops early, rolling the caches back, when the client is `gone` or the server is closing (then
        ApiError 503). A stream also gets STARTED when its turn comes, and WAITING every KEEP_ALIVE seconds
        without a piece (a long prompt's prefill): agents give up on a stream that has been still for 300 s
        (Claude Code and Codex CLI, which then send the request again), and on this CPU an agent's first prompt
        takes longer to prefill."""
        changes = self.overrides(req)
        newer = Newest(self._latest, req.client)
        with self.gate.turn(newer.arrive):
            job = Job(lambda cancelled: self._generate(req, tokens, changes, lambda: gone() or cancelled(), newer))
            self._submit(job)
            try:
                if req.stream:
                    yield STARTED  # a stream's headers go now, before a long prompt's prefill
                while True:
                    try:
                        item = job.out.get(timeout=KEEP_ALIVE if req.stream else None)
                    except queue.Empty:
                        yield WAITING
                        continue
                    if item is END:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    yield item
            finally:
                job.cancel.set()
                job.done.wait()  # the gate opens only once the engine has let go of the caches

    def answer(self, req: Request) -> dict:
        """The whole response `run` would give, generated on the calling thread, with no queue (a batch)."""
        tokens, changes = self.tokens(req), self.overrides(req)
        text, finished = whole(self._generate(req, tokens, changes, lambda: False))
        return completion(req, new_id(req.kind), self.model, text, finished)

    def work(self, stop: threading.Event) -> None:
        """Run the generations, one at a time, on the calling thread until `stop` (the main thread:
        llama.cpp's OpenMP threads belong to the thread that calls it, and a second team, made by a
        connection's thread, spins against the first for the same cores: a third slower, measured).
        A signal raised here cuts the running generation cleanly and ends the loop."""
        try:
            while not stop.is_set():
                try:
                    job = self._jobs.get(timeout=0.1)
                except queue.Empty:
                    continue
                job.execute()
                if self._jobs.empty():  # its answer is out and nobody waits: keep its prompt on disk now
                    self._keep_prompt()
        finally:
            # Close the gate before the cut generation's connection lets go of it (or a waiter would get
            # its turn and hand over a job that nobody runs), then refuse whatever was handed over.
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
            ui.note(f"writing {n} block(s) of the last prompt to the prefix cache ({STOP_SECONDS:g} s at most; "
                    "a second signal stops at once)")  # fmt: skip
            self._keep_prompt(time.monotonic() + STOP_SECONDS)

    def _submit(self, job: Job) -> None:
        with self._submitting:
            if self._closed:
                job.refuse(shutting_down())
            else:
                self._jobs.put(job)

    def _generate(
        self, req: Request, tokens: list[int], changes: dict, stop: Callable[[], bool], newer=lambda: False
    ) -> Iterator[str | calls.Piece | Probs | Finished]:
        """The answer's items: text pieces (tool calls' Pieces where it makes them; Probs before the text of the
        tokens they score, where asked), then Finished. Ends without it when `stop` says the client went; with
        it, superseded, when a `newer` request came from the same client."""
        if newer():  # superseded while it waited: nothing to prefill for
            yield Finished(Stats(), 0, "length", superseded=True)
            return
        if req.logprobs is not None:
            changes = {**changes, "logprobs": req.logprobs}
        events = self.session.generate(
            tokens,
            instruction=req.instruction,
            reuse=req.cache_prompt is not False,
            prediction=req.prediction,
            salt=req.cache_salt,
            **changes,
        )
        fold, cut, indent, ledger = Fold(), StopText(req.stop), Indent(req.indent), Ledger()
        fmt = self.call_format(req)
        reader = calls.Reader(fmt) if fmt is not None else None
        scored, started, late, superseded = [], None, False, False

        def release(piece: str) -> Iterator[str | calls.Piece | Probs]:
            """Text that goes out, after the probabilities of the tokens it completes (a stop string's, or a
            line's cut by n_indent, never go out), as Text that knows how many tokens it completes."""
            count, probs = ledger.release(len(piece))
            if probs:
                scored.extend(probs)
                yield Probs(probs)
            yield from _read(reader, Text.of(piece, count))

        try:
            for event in events:
                fold.add(event)
                if isinstance(event, Token):
                    probs = cuts.scored(event, self.session.target.piece) if req.logprobs is not None else None
                    ledger.add(len(event.text), probs)
                    piece = indent.push(cut.push(event.text))
                    # llama-server's t_max_predict_ms: a line that ends past the time limit ends the text
                    late = req.time_limit is not None and "\n" in event.text and time.perf_counter() > started
                    if late and not cut.hit:  # what a stop string might have become is text after all
                        piece += indent.push(cut.flush())
                    if cut.hit or late:  # (an indentation the line's next character would have judged: kept)
                        piece += indent.flush()
                    if piece:
                        yield from release(piece)
                    if cut.hit or indent.hit or late:
                        break
                elif isinstance(event, Prefilled):
                    started = time.perf_counter() + (req.time_limit or 0.0)
                elif isinstance(event, Stopped):
                    piece = cut.push(event.tail) + ("" if cut.hit else cut.flush())
                    piece = indent.push(piece) + indent.flush()
                    if piece:
                        yield from release(piece)
                elif isinstance(event, Round):  # once a verification, not a token: a select costs a syscall
                    if self.gate.closing:
                        raise shutting_down(": generation stopped")
                    if stop():
                        return
                    if newer():
                        superseded = True
                        break
        except SpecdecError as e:
            raise ApiError(500 if not isinstance(e, UsageError) else 400, e.message) from None
        finally:
            events.close()  # the engine's rollback, when it stopped early
        if fold.stats.stop_reason in ("eos", "max_tokens") and not (cut.hit or indent.hit or late or superseded):
            self.session.remember(fold.tokens, req.cache_salt)  # (its namespace's: no other client drafts from it)
        made: list[chat.ToolCall] = []
        if reader is not None:
            last, _, made = reader.end()
            yield from (p.text if p.kind == "text" else p for p in last)
        limit = indent.hit or late
        reason = "length" if limit or superseded else finish_reason(fold.stats.stop_reason, cut.hit)
        reason = "tool_calls" if made and reason != "length" else reason
        yield Finished(fold.stats, fold.cached, reason, made, cut.hit, scored, limit, superseded)


def _read(reader: calls.Reader | None, text: str) -> Iterator[str | calls.Piece]:
    """A piece of the answer's text: as it is, or through the tool calls' reader (text as str, calls as Piece)."""
    if reader is None:
        yield text
        return
    for p in reader.push(text):
        yield p.text if p.kind == "text" else p
