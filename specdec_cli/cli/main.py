"""The `specdec` command line: the app, its commands (a module each, beside this one), and the one error
boundary: every known error becomes `error: ...` plus a hint, and an exit status."""

from __future__ import annotations

import errno
import faulthandler
import os
import sys
import traceback

import typer

from .. import __version__, signals, ui
from ..chat import template
from ..errors import SpecdecError, UsageError
from ..option_table import REFUSED
from ..options import LLAMA_NAMES
from .batch import batch
from .bench import bench
from .cache import app as cache_app
from .generate import generate
from .models import app as models_app
from .rpc import rpc_server
from .serve import serve

app = typer.Typer(
    name="specdec",
    # what holds, in one line (README's "Exact output" has the figures): not lossless unless --exact
    help="Speculative decoding over llama.cpp GGUF models: the target's output distribution (with --exact, "
    "its greedy output token for token).",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

app.add_typer(models_app, name="models")
app.add_typer(cache_app, name="cache")
app.command()(bench)
app.command()(batch)
app.command("rpc-server")(rpc_server)
app.command()(serve)
app.command()(generate)


def _version(value: bool) -> None:
    if value:
        print(f"specdec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    pass  # (the app's help says what specdec is)


# --- the one error boundary -------------------------------------------------------------------
_ClickUsageError = typer.BadParameter.__mro__[1]  # Click's UsageError; Typer exports only this subclass


def main(argv: list[str] | None = None, *, restore_signals: bool = True) -> int:
    """Console entry point: every known error becomes one `error: ...` line and an exit status."""
    argv = sys.argv[1:] if argv is None else argv
    show_traceback = "--debug" in argv or os.environ.get("SPECDEC_DEBUG") == "1"
    _hold_closed_stdio()
    _name_native_crashes()
    restore = signals.install()
    template.warn_with(ui.warning)  # (chat/ says its warnings through the UI, which it does not import)
    stdout, sys.stdout = sys.stdout, _Stdout(sys.stdout)
    try:
        code = app(args=argv, prog_name="specdec", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except SpecdecError as e:
        if show_traceback:
            traceback.print_exc()
        hint = e.hint or (help_hint(_command_path(argv)) if isinstance(e, UsageError) else None)
        ui.error(e.message, hint)
        return e.exit_code
    except _ClickUsageError as e:
        if not e.format_message():  # a group called without a command: Click has printed its help
            return 2
        command = e.ctx.command_path if getattr(e, "ctx", None) else _command_path(argv)
        ui.error(_llama_name(e, argv) or e.format_message(), help_hint(command))
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


def _llama_name(e: Exception, argv: list[str]) -> str | None:
    """An unknown option that is llama.cpp's name for one this command has, or one specdec refuses: said so,
    where Click would guess by spelling (`--temperature` -> `--remeasure`). None: not one of llama.cpp's."""
    if type(e).__name__ != "NoSuchOption":  # (Click's; a known option without its value is not one of these)
        return None
    name = e.option_name
    if len(name) == 2:  # Click names the first letter of an unknown `-sys`: the word as typed
        name = next((a for a in argv if a.startswith(name) and (a in LLAMA_NAMES or a in REFUSED)), name)
    if name in REFUSED:
        return f"{name} is llama.cpp's; {REFUSED[name]}"
    option = LLAMA_NAMES.get(name)
    params = e.ctx.command.params if option and getattr(e, "ctx", None) else []
    ours = [f for p in params for f in p.opts if f in option.flags]  # this command's flags for it
    return f"no such option: {name}; llama.cpp's {name} is {'/'.join(ours)} here" if ours else None


def help_hint(command: str) -> str:
    """The hint of a usage error without its own: the help of the command it was given to, which lists its options."""
    return f"see '{command} --help'"


def _command_path(argv: list[str]) -> str:
    """The command `argv` runs (`specdec models pair`), as far as its words name one."""
    path, group = ["specdec"], typer.main.get_command(app)
    for word in argv:
        sub = getattr(group, "commands", {}).get(word)
        if sub is None:
            break
        path.append(word)
        group = sub
    return " ".join(path)


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


def _name_native_crashes() -> None:
    """A crash inside llama.cpp or a GPU driver (SIGSEGV, SIGBUS, SIGILL, SIGFPE) kills the process before any
    Python handler runs: without this it dies silent (exit -11, nothing on stderr). faulthandler prints every
    thread's Python stack first, so the report names the call (a decode, a load) that crashed."""
    if not faulthandler.is_enabled():
        try:
            faulthandler.enable(file=sys.__stderr__ if sys.__stderr__ is not None else 2, all_threads=True)
        except (ValueError, RuntimeError, OSError):  # no usable stderr: nobody would read the stack anyway
            pass


def _point_at_null(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


def run() -> None:
    sys.exit(main(restore_signals=False))  # our handlers stay, so a late Ctrl-C cannot interrupt the exit
