"""The `specdec` command line: thin commands over the library, and the one error boundary."""

from __future__ import annotations

import errno
import io
import os
import sys
import traceback
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from . import __version__, config, inputs, signals, ui
from .engine.events import Notice, Stopped, Token
from .engine.stats import Stats
from .errors import SpecdecError, UsageError
from .cli_bench import bench
from .cli_common import run_config
from .cli_models import app as models_app
from .session import AUTO_K_MAX, CTX_SIZE, DRAFT_TOKENS, MAX_BRANCHES, MAX_TOKENS, P_SPLIT, open_session

app = typer.Typer(
    name="specdec",
    help="Lossless speculative decoding over llama.cpp GGUF models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

app.add_typer(models_app, name="models")
app.command()(bench)



class DrafterName(str, Enum):
    auto = "auto"
    model = "model"
    lookup = "lookup"
    none = "none"


def _version(value: bool) -> None:
    if value:
        print(f"specdec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Lossless speculative decoding over llama.cpp GGUF models."""


@app.command()
def generate(
    prompt: Optional[str] = typer.Argument(None, help="The prompt; '-' or nothing reads standard input."),
    target: Optional[str] = typer.Option(
        None, "--target", help="Target GGUF (a path or a known model name): the model whose output you get."
    ),
    draft: Optional[str] = typer.Option(None, "--draft", help="Draft GGUF: a small model with the same tokenizer."),
    drafter: Optional[DrafterName] = typer.Option(
        None, "--drafter",
        help="Who drafts: 'auto' (default with a draft: each round plain, lookup or the model, whichever pays), "
        "'model' (the draft model), 'lookup' (copy from the prompt and text so far) or 'none' (target-only).",
    ),
    pair: Optional[str] = typer.Option(None, "--pair", help="A named pair from the config (default: 'default')."),
    config_path: Optional[Path] = typer.Option(
        None, "--config", help="Config file (default: $SPECDEC_CONFIG, else the user config)."
    ),
    draft_tokens: Optional[str] = typer.Option(
        None, "-k", "--draft-tokens",
        help=f"Tokens drafted per round, or 'auto' to choose every round (up to {AUTO_K_MAX}) "
        f"[auto with --drafter auto, else {DRAFT_TOKENS}].",
    ),
    p_min: Optional[float] = typer.Option(
        None, "--p-min", help="Draft model: stop drafting when its probability for its own token is below this [0: off]."
    ),
    branches: Optional[int] = typer.Option(
        None, "--branches",
        help=f"Draft model: draft up to N branches per round as a tree, verified in one target pass (1..{MAX_BRANCHES}) [1].",
    ),
    p_split: Optional[float] = typer.Option(
        None, "--p-split", help=f"Tree drafting: fork where the draft's runner-up token has at least this probability [{P_SPLIT}]."
    ),
    max_tokens: Optional[int] = typer.Option(None, "-n", "--max-tokens", help=f"Stop after this many tokens [{MAX_TOKENS}]."),
    temp: Optional[float] = typer.Option(None, "--temp", help="Sampling temperature; 0 is greedy [0]."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Keep the k most likely tokens; 0 is off [0]."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Nucleus sampling mass in (0, 1]; 1 is off [1]."),
    min_p: Optional[float] = typer.Option(None, "--min-p", help="Drop tokens below min-p x the top probability [0]."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed: the same seed gives the same text."),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size", help=f"Context size in tokens [{CTX_SIZE}]."),
    threads: int = typer.Option(0, "-t", "--threads", help="CPU threads; 0 means every core this process may use."),
    chat: Optional[bool] = typer.Option(
        None, "--chat/--no-chat",
        help="Wrap the prompt in the target's chat template (default: on when it has one). With the template your "
        "text is only text; with --no-chat control tokens written in it (e.g. <|im_start|>) are parsed as such.",
    ),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt for the chat template (needs one)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of the live stream."),
    debug: bool = typer.Option(False, "--debug", help="Check the KV caches after every round; show tracebacks."),
) -> None:
    """Generate text from PROMPT with speculative decoding."""
    system = _text(system, "--system") if system is not None else None
    given = dict(
        target=target, draft=draft, drafter=drafter.value if drafter else None, draft_tokens=draft_tokens,
        p_min=p_min, branches=branches, p_split=p_split, max_tokens=max_tokens, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, ctx_size=ctx_size,
        chat=chat, system=system,
    )  # fmt: skip
    settings = config.resolve(given, pair, config.config_file(config_path))
    text = _read_prompt(prompt)
    cfg = run_config(settings, threads=threads, debug=debug)
    with open_session(cfg) as session:
        tokens = session.prompt_tokens(text)
        live = not json_out and ui.live_terminal()
        stream = None if json_out else ui.TokenStream(live)
        if stream:
            stream.start()
        stats, ids, text, interrupted = _consume(session.generate(tokens), stream)
        if stream:
            stream.end()
        if json_out:
            ui.print_json(
                {
                    "text": text,
                    "tokens": ids,
                    "stop_reason": stats.stop_reason,
                    "stats": {**stats.as_dict(), "load_seconds": round(session.load_seconds, 4)},
                    "config": {**cfg.as_dict(), "pair": settings.get("pair"), "chat": session.uses_chat},
                }
            )
        else:
            k = "auto" if cfg.draft_tokens is None else cfg.draft_tokens
            title = f"specdec · {cfg.drafter}" + (f" · k={k}" if cfg.drafter != "none" else "")
            title += f" · branches={cfg.branches}" if cfg.branches > 1 else ""
            ui.show_stats(stats, title, live)
    if interrupted:
        raise typer.Exit(signals.exit_code())


def _consume(events, stream: ui.TokenStream | None) -> tuple[Stats, list[int], str, bool]:
    """Fold the engine's events into statistics, token ids and text, streaming them if asked.
    Ctrl-C ends it early; the statistics so far stand (the engine rolled its caches back)."""
    stats, ids, pieces = Stats(), [], []
    try:
        for event in events:
            stats.add(event)
            if isinstance(event, Token):
                ids.append(event.id)
                pieces.append(event.text)
                if stream:
                    stream.token(event)
            elif isinstance(event, Stopped):
                pieces.append(event.tail)
                if stream:
                    stream.text(event.tail)
            elif isinstance(event, Notice):
                ui.warning(event.message)
    except signals.INTERRUPTS:
        stats.stop_reason = "interrupted"
        return stats, ids, "".join(pieces), True
    finally:
        events.close()
    return stats, ids, "".join(pieces), False


def _read_prompt(prompt: str | None) -> str:
    if prompt is not None and prompt != "-":
        return _text(prompt, "the PROMPT argument")
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("no prompt given", hint="pass PROMPT as an argument, or pipe it: echo 'hi' | specdec generate -")
    text = inputs.read_text(sys.stdin.buffer, "standard input")
    if not text.strip():
        raise UsageError("the prompt read from standard input is empty")
    return text


def _text(value: str, what: str) -> str:
    """A command-line string as UTF-8 text: Python hands over undecodable argument bytes as surrogates."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not valid UTF-8", hint="pass UTF-8 text, or pipe a file: specdec generate - < FILE") from None
    return value


# --- the one error boundary -------------------------------------------------------------------
_ClickUsageError = typer.BadParameter.__mro__[1]  # Click's UsageError; Typer exports only this subclass


def main(argv: list[str] | None = None, *, restore_signals: bool = True) -> int:
    """Console entry point: every known error becomes one `error: ...` line and an exit status."""
    argv = sys.argv[1:] if argv is None else argv
    show_traceback = "--debug" in argv or os.environ.get("SPECDEC_DEBUG") == "1"
    _hold_closed_stdio()
    restore = signals.install()
    stdout, sys.stdout = sys.stdout, _Stdout(sys.stdout)
    try:
        code = app(args=argv, prog_name="specdec", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except SpecdecError as e:
        if show_traceback:
            traceback.print_exc()
        hint = e.hint or ("see 'specdec --help'" if isinstance(e, UsageError) else None)
        ui.error(e.message, hint)
        return e.exit_code
    except _ClickUsageError as e:
        command = e.ctx.command_path if getattr(e, "ctx", None) else "specdec"
        ui.error(e.format_message(), f"see '{command} --help'")
        return 2
    except (*signals.INTERRUPTS, typer.Abort):
        ui.error("interrupted")
        return signals.exit_code()
    except BrokenPipeError:  # stdout failed outside Click's own handling of it: as quiet (see _Stdout)
        return 1
    except OSError as e:  # the system refused something (a full disk, a read-only folder): not a bug of ours
        if show_traceback:
            traceback.print_exc()
        ui.error(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
        return 1
    except Exception as e:  # a bug: still one line, unless asked for the traceback
        if show_traceback:
            traceback.print_exc()
        ui.error(f"unexpected {type(e).__name__}: {e}", "rerun with --debug (or SPECDEC_DEBUG=1) for the traceback")
        return 1
    finally:
        sys.stdout = stdout
        if restore_signals:
            restore()
        else:
            signals.over()


class _Stdout:
    """Standard output, with every failure to write it (a closed pipe, a full disk, a descriptor closed
    before we started) turned into the closed-pipe error, which ends the run quietly with status 1 (as
    Click does for a pipe): nobody is there to read a message, and the statistics on stderr stand."""

    def __init__(self, stream):
        self._stream = stream  # None: closed when we started

    def write(self, text: str) -> int:
        return self._guard(lambda s: s.write(text))

    def flush(self) -> None:
        self._guard(lambda s: s.flush())

    def _guard(self, op):
        if self._stream is None:
            raise BrokenPipeError(errno.EPIPE, "standard output is closed")
        try:
            return op(self._stream)
        except OSError as e:
            self._stream = None
            _point_at_null(1)  # what is still buffered can then never fail the interpreter's flush at exit
            raise BrokenPipeError(errno.EPIPE, f"standard output: {e.strerror}") from None

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno() if self._stream is not None else 1  # 1 now holds /dev/null

    def __getattr__(self, name: str):  # encoding, errors, ... as the real stream has them
        return getattr(self._stream if self._stream is not None else sys.__stderr__, name)


def _hold_closed_stdio() -> None:
    """A closed stdin, stdout or stderr (`2>&-`) leaves its descriptor free, and the next file opened
    would take it: a model, a bench file, whose bytes would then mix with our output. Hold each closed
    one with /dev/null; statistics then go nowhere instead of into the answer."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _point_at_null(fd)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")


def _point_at_null(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


def run() -> None:
    sys.exit(main(restore_signals=False))  # our handlers stay, so a late Ctrl-C cannot interrupt the exit
