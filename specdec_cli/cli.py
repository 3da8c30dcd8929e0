"""The `specdec` command line: thin commands over the library, and the one error boundary."""

from __future__ import annotations

import errno
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

import typer

from . import __version__, config, inputs, options, signals, ui
from .engine.events import Notice, Stopped, Token
from .engine.stats import Result, collect
from .errors import SpecdecError, UsageError
from .cli_bench import bench
from .cli_common import run_config
from .cli_cache import app as cache_app
from .cli_models import app as models_app
from .cli_rpc import rpc_server
from .cli_serve import serve
from .session import open_session

app = typer.Typer(
    name="specdec",
    help="Lossless speculative decoding over llama.cpp GGUF models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

app.add_typer(models_app, name="models")
app.add_typer(cache_app, name="cache")
app.command()(bench)
app.command("rpc-server")(rpc_server)
app.command()(serve)


def _version(value: bool) -> None:
    if value:
        print(f"specdec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Lossless speculative decoding over llama.cpp GGUF models."""


RUN_OPTIONS = tuple(options.BY_KEY)  # generate takes every run option


@app.command()
@options.with_options(*RUN_OPTIONS)
def generate(
    prompt: Optional[str] = typer.Argument(None, help="The prompt; '-' or nothing reads standard input."),
    pair: Optional[str] = typer.Option(None, "--pair", help="A named pair from the config (default: 'default')."),
    config_path: Optional[Path] = typer.Option(
        None, "--config", help="Config file (default: $SPECDEC_CONFIG, else the user config)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of the live stream."),
    debug: bool = typer.Option(False, "--debug", help="Check the KV caches after every round; show tracebacks."),
    **settings_given: Any,
) -> None:
    """Generate text from PROMPT with speculative decoding."""
    given = options.given(settings_given)
    if given.get("system") is not None:
        given["system"] = _text(given["system"], "--system")
    settings = config.resolve(given, pair, config.config_file(config_path))
    prompt_text = _read_prompt(prompt)
    cfg = run_config(settings, debug=debug)
    with open_session(cfg) as session:
        session.lookup_corpus()  # read the lookup cache now: a damaged file's warning comes with the others
        for message in session.warnings:
            ui.warning(message)
        tokens = session.prompt_tokens(prompt_text)
        live = not json_out and ui.live_terminal()
        stream = None if json_out else ui.TokenStream(live)
        if stream:
            stream.start()
        stats, ids, text, interrupted = _consume(session.generate(tokens, instruction=prompt_text), stream)
        if not interrupted and stats.stop_reason in ("eos", "max_tokens"):
            session.remember(ids)  # the lookup cache: a later run may draft from this answer
        with signals.held():  # what the run produced is printed whole
            _report(session, settings, cfg, stats, ids, text, stream, json_out, live)
    if interrupted:
        raise typer.Exit(signals.exit_code())


def _report(session, settings, cfg, stats, ids, text, stream, json_out, live) -> None:
    """The end of `generate`: the rest of the stream, then the JSON object or the statistics."""
    if stream:
        stream.end()
    if json_out:
        ui.print_json(
            {
                "text": text,
                "tokens": ids,
                "stop_reason": stats.stop_reason,
                "stats": {**stats.as_dict(), "load_seconds": round(session.load_seconds, 4)},
                "config": {
                    **cfg.as_dict(),
                    "ctx_size": session.target_ctx.n_ctx,  # as fitted to the models when -c was not given
                    "pair": settings.get("pair"),
                    "chat": session.uses_chat,
                    "target_on": session.where,
                },
            }
        )
    else:
        k = "auto" if cfg.draft_tokens is None else cfg.draft_tokens
        drafter = session.drafter  # none where the target cannot roll back (auto said so)
        title = f"specdec · {drafter}" + (f" · k={k}" if drafter != "none" else "")
        title += f" · branches={cfg.branches}" if cfg.branches > 1 else ""
        title += " · exact" if cfg.exact else ""
        title += f" · target on {session.where}" if cfg.rpc else ""
        ui.show_stats(stats, title, live)


def _consume(events, stream: ui.TokenStream | None) -> Result:
    """Fold the engine's events into statistics, token ids and text, streaming them if asked.
    Ctrl-C ends it early; the statistics so far stand (the engine rolled its caches back)."""

    def show(event) -> None:
        if isinstance(event, Notice):
            ui.warning(event.message)
        elif stream is None:
            return
        elif isinstance(event, Token):
            stream.token(event)
        elif isinstance(event, Stopped):
            stream.text(event.tail)

    return collect(events, show, signals.INTERRUPTS)


def _read_prompt(prompt: str | None) -> str:
    if prompt is not None and prompt != "-":
        return _text(prompt, "the PROMPT argument")
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError(
            "no prompt given", hint="pass PROMPT as an argument, or pipe it: echo 'hi' | specdec generate -"
        )
    text = inputs.read_text(sys.stdin.buffer, "standard input")
    if not text.strip():
        raise UsageError("the prompt read from standard input is empty")
    return text


def _text(value: str, what: str) -> str:
    """A command-line string as UTF-8 text: Python hands over undecodable argument bytes as surrogates."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{what} is not valid UTF-8", hint="pass UTF-8 text, or pipe a file: specdec generate - < FILE"
        ) from None
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
        if not e.format_message():  # a group called without a command: Click has printed its help
            return 2
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
