"""`specdec rpc-server`: this machine's devices, served to a specdec elsewhere with llama.cpp's RPC server."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Optional

import typer

from .. import options, signals, ui
from ..backend import rpc
from ..errors import SpecdecError, UsageError

START_SECONDS = 10.0  # to answer its first handshake


def rpc_server(
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to listen on (IPv4). Anything but loopback "
        "lets every machine that reaches it use this one: see the warning.",
    ),
    port: int = typer.Option(rpc.DEFAULT_PORT, "-p", "--port", help="Port to listen on."),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", help="CPU threads (default: every core)."),
    mem: Optional[int] = typer.Option(
        None,
        "--mem",
        help="MiB this server reports as free: clients split a model's layers across servers "
        "by it (default: the device's free memory).",
    ),
) -> None:
    """Serve this machine's devices (GPU, else CPU) to `specdec generate/bench --rpc HOST:PORT` elsewhere."""
    rpc.require()
    threads = threads or options.default_threads()
    problem = options.flag_problem("threads", threads)
    if problem:
        raise UsageError(problem)
    if mem is not None and mem < 1:
        raise UsageError(f"--mem must be at least 1 MiB (got {mem})")
    rpc.check_bind(host, port)
    devices = rpc.server_devices()
    if mem is not None:
        devices = [rpc.with_memory(d, mem * 2**20) for d in devices]
    if not rpc.is_loopback(host):
        ui.warning(
            f"llama.cpp's RPC protocol has no authentication and no encryption: anyone who reaches {host}:{port} "
            "can use this machine's devices and read what they compute. On an untrusted network keep the default "
            f"--host 127.0.0.1 and connect through an SSH tunnel: ssh -N -L {port}:127.0.0.1:{port} USER@THIS-HOST"
        )
    server = threading.Thread(target=rpc.start_server, args=(host, port, threads, devices), daemon=True)
    server.start()
    _wait_ready("127.0.0.1" if host == "0.0.0.0" else host, port, server)
    served = "; ".join(rpc.describe(d) for d in devices)
    try:  # (the notes too: a client may signal as soon as it reads the first)
        ui.note(f"serving {served} on {host}:{port}, {threads} threads, protocol v{rpc.PROTOCOL[0]}.{rpc.PROTOCOL[1]}")
        ui.note("Ctrl-C stops it")
        while server.is_alive():
            server.join(0.5)
    except signals.INTERRUPTS:
        ui.note("rpc-server stopped")
        _exit(0)
    raise SpecdecError(f"the RPC server on {host}:{port} stopped (llama.cpp could not accept a connection)")


def _wait_ready(host: str, port: int, server: threading.Thread) -> None:
    """Until the server answers a handshake: clients started after the 'serving' line find it ready."""
    deadline = time.monotonic() + START_SECONDS
    while True:
        try:
            rpc.check(host, port)
            return
        except SpecdecError as e:
            if not server.is_alive():
                raise SpecdecError(f"the RPC server on {host}:{port} did not start") from None
            if time.monotonic() > deadline:
                raise SpecdecError(f"the RPC server on {host}:{port} did not start: {e.message}") from None
        time.sleep(0.05)


def _exit(code: int) -> None:
    """Out at once: the server thread is inside llama.cpp (blocked in accept or serving a client) and
    cannot be joined; the process's exit closes its sockets, and a client sees the connection end."""
    signals.over()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
