"""llama.cpp's library, once per process: its log (the recent error lines kept to explain a failure, the placement
lines captured while a model or context is made) and ggml's aborts (one line and exit 1)."""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import llama_cpp.llama_cpp as L

from .. import signals


# Who can say more of an abort than ggml's own line (rpc.py: a lost RPC server): "file.cpp: what" -> (line, hint).
_ABORT_EXPLAINERS: list[Callable[[str], tuple[str, str] | None]] = []

# llama.cpp logs every load step to stderr; we keep the recent error lines to explain failures instead, and while
# a model or context is made (`capture`), the lines that say where its buffers went (devices.placement reads them).
_LOG_LINES: deque[str] = deque(maxlen=40)
_LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR; 5 (CONT) continues any level, e.g. the load progress dots
_PLACEMENT = (b"load_tensors:", b"llama_kv_cache:", b"llama_memory_recurrent:", b"sched_reserve:", b"llama_context:")
_captures: list[list[str]] = []  # the captures under way, innermost last
_forward = [False]  # SPECDEC_LLAMA_LOG: every line to stderr as well, as llama.cpp's own logger writes it


@L.llama_log_callback
@signals.native_callback
def _log_to_buffer(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # Called for every line llama.cpp and ggml log: a prefix test and an append at most, unless forwarding.
    if not text:
        return
    if _forward[0]:
        try:
            os.write(2, text)
        except OSError:  # stderr closed: nothing to tell
            pass
    if level == _LOG_ERROR:
        line = text.decode("utf-8", "replace").strip()
        if line:
            _LOG_LINES.append(line)
    elif _captures and text.startswith(_PLACEMENT):
        _captures[-1].append(text.decode("utf-8", "replace"))


@contextmanager
def capture() -> Iterator[list[str]]:
    """The placement lines llama.cpp logs inside the block (a model's load, a context's creation)."""
    lines: list[str] = []
    _captures.append(lines)
    try:
        yield lines
    finally:
        _captures.remove(lines)


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
@signals.native_callback
def _on_abort(message: bytes | None) -> None:
    """ggml's last call before abort() (a failed GGML_ASSERT): one line and exit 1, instead of a
    debugger backtrace on stdout and a core dump. The message is "path/file.cpp:line: what"."""
    try:
        where, _, what = (message or b"").decode("utf-8", "replace").partition(": ")
        text = f"{os.path.basename(where)}: {what}" if what else where
        line = f"error: llama.cpp aborted: {' '.join(text.split())}\n"
        explained = next(filter(None, (explain(" ".join(text.split())) for explain in _ABORT_EXPLAINERS)), None)
        if explained:
            line = f"error: {explained[0]}\nhint: {explained[1]}\n"
        os.write(2, line.encode())
    finally:
        os._exit(1)


def explain_aborts(explain: Callable[[str], tuple[str, str] | None]) -> None:
    """Have ggml's aborts explained by `explain` where it knows them (the one line and hint, else None)."""
    _ABORT_EXPLAINERS.append(explain)


def _set_abort_handler() -> None:
    """Hand _on_abort to ggml_set_abort_callback, looked up through libllama (native_lib says why); a build
    without the hook is left as it is."""
    setter = getattr(native_lib(), "ggml_set_abort_callback", None)
    if setter is not None:
        setter.argtypes, setter.restype = [type(_on_abort)], ctypes.c_void_p
        setter(_on_abort)  # the module keeps _on_abort alive for the process's lifetime


@functools.cache
def native_lib() -> ctypes.CDLL | None:
    """libllama, opened by the path llama_cpp opened it by (so the same handle): the wheel ships
    libggml-base.so and libggml-base.so.0 as separate copies, and opening one by name could load a
    second ggml that nobody else calls. A handle's lookup also searches the libraries it depends on,
    where the ggml that libllama uses is."""
    lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(L.__file__).parent / "lib")
    for name in ("libllama.so", "libllama.dylib", "llama.dll", "libllama.dll"):  # llama_cpp's names
        try:
            return ctypes.CDLL(str(lib_dir / name))
        except OSError:
            continue
    return None


_backend_ready = False


def init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        # Quiet unless SPECDEC_LLAMA_LOG asks for llama.cpp's own output: its log (forwarded by our callback,
        # which reads the placement lines either way), and the gdb backtrace it prints on stdout for an uncaught
        # C++ exception (std::terminate, which no callback sees).
        _forward[0] = bool(os.environ.get("SPECDEC_LLAMA_LOG"))
        L.llama_log_set(_log_to_buffer, ctypes.c_void_p(0))
        if not _forward[0]:
            os.environ.setdefault("GGML_NO_BACKTRACE", "1")
        _set_abort_handler()
        L.llama_backend_init()
        _backend_ready = True


def last_log_error() -> str:
    return _LOG_LINES[-1] if _LOG_LINES else ""


def load_error() -> str:
    """llama.cpp's own reason for a failed load. It logs `llama_model_load: error loading model: <why>`,
    then a generic `failed to load model`; when <why> is only "failed to load model from PATH" (a GGUF
    it could not parse), the parser's first error line says why."""
    marker = "error loading model: "
    why = next((line.partition(marker)[2] for line in reversed(_LOG_LINES) if marker in line), "")
    if not why or "failed to load model from" in why:
        why = next((line for line in _LOG_LINES if line.startswith("gguf_")), why or last_log_error())
    # Without the C function in front ("check_tensor_dims: tensor ...") and the column padding.
    return " ".join(re.sub(r"^\w+: ", "", why).split())


def clear_log() -> None:
    """Forget the error lines logged so far (a load's own explain its failure)."""
    _LOG_LINES.clear()
