"""`specdec serve`: the loaded pair behind OpenAI's, Anthropic's and llama-server's APIs."""

from __future__ import annotations

import ipaddress
import math
import os
import threading
from pathlib import Path
from typing import Any, Optional

import typer

from .. import options, signals, ui
from .common import CONFIG, PAIR, model_names, opened, resolve
from ..errors import SpecdecError, UsageError
from ..serve import prefixes
from ..serve.http import Server
from ..serve.service import Service

PORT = 8080  # llama-server's default: clients configured for it find us
QUEUE = 16  # requests that may wait for the one generating; more get 503 with Retry-After
API_KEY_ENV = "SPECDEC_API_KEY"  # a key in the environment stays out of `ps` and shell history
GIB = 1 << 30


@options.with_options(*(k for k in options.BY_KEY if k != "prediction"))  # a request's own (its `prediction`)
def serve(
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on; anything but loopback needs --api-key."
    ),
    port: int = typer.Option(PORT, "-p", "--port", help="Port to listen on (0: any free one; the URL says which)."),
    api_key: Optional[str] = typer.Option(
        None,
        "--api-key",
        help=f"Require 'Authorization: Bearer KEY' on every request but /health (default: ${API_KEY_ENV}).",
    ),
    queue: int = typer.Option(QUEUE, "--queue", help="Requests that may wait while one generates; more get 503."),
    prefix_cache: bool = typer.Option(
        True,
        "--prefix-cache/--no-prefix-cache",
        help="Keep the KV cells of long prompts (1,024+ tokens) in the specdec cache, so that a prompt seen before, "
        "after a restart too, is read back instead of prefilled ($SPECDEC_PREFIX_CACHE moves it).",
    ),
    prefix_cache_size: float = typer.Option(
        prefixes.MAX_BYTES / GIB,
        "--prefix-cache-size",
        help="GiB the prefix cache may hold on disk, over every model; the least recently used go first.",
    ),
    pair: Optional[str] = PAIR,
    config_path: Optional[Path] = CONFIG,
    debug: bool = typer.Option(False, "--debug", help="Check the KV caches after every round; log every request."),
    **given: Any,
) -> None:
    """Serve the pair over HTTP: OpenAI's /v1/chat/completions, /v1/completions, /v1/responses and /v1/models;
    Anthropic's /v1/messages; llama-server's /infill and /completion (editors); /health."""
    if queue < 0:
        raise UsageError(f"--queue must be at least 0 (got {queue})")
    if not (math.isfinite(prefix_cache_size) and prefix_cache_size > 0):
        raise UsageError(f"--prefix-cache-size must be a positive number of GiB (got {prefix_cache_size})")
    if not 0 <= port < 65536:
        raise UsageError(f"--port must be 0-65535 (got {port})")
    api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty")
    address = _address(host)
    cfg = resolve(given, pair, config_path, debug=debug)
    try:  # listen before loading: a taken port fails in a second, not after the models load
        server = Server((address, port), None, api_key, debug)
    except OSError as e:
        raise SpecdecError(
            f"cannot listen on {host}:{port}: {e.strerror or e}",
            hint="another server may hold the port: pick another with --port",
        ) from None
    try:
        with opened(cfg, costs=True) as session:
            why = prefixes.attach(session, int(prefix_cache_size * GIB), ui.warning) if prefix_cache else None
            if why:
                ui.note(f"prefix cache off: {why}")
            server.service = Service(session, *model_names(cfg), queue)
            _serve(server, host, api_key is not None, cfg)
    finally:
        server.close()


def _serve(server: Server, host: str, keyed: bool, cfg) -> None:
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    url = f"http://{shown}:{bound_port}/v1"
    if not ipaddress.ip_address(bound_host).is_loopback and not keyed:
        ui.warning(
            f"{host} is reachable from other machines and this server has no authentication: anyone who reaches it "
            f"can use it; give --api-key KEY (or ${API_KEY_ENV})"
        )
    listener = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="specdec-http", daemon=True
    )
    stop = threading.Event()
    try:  # from here on a signal stops the server cleanly, wherever it lands
        how = ui.label(server.service.session.drafter, cfg.draft_tokens, cfg.branches, k_for_auto=True, exact=cfg.exact)
        ui.note(f"serving {server.service.model} ({how}) at {url}; Ctrl-C stops it")
        try:
            print(url, flush=True)  # standard output: a script reads the address (with --port 0, the port) here
        except BrokenPipeError:
            pass  # nobody reads it (a closed pipe): the server is no less useful
        listener.start()
        server.service.work(stop)  # generations run here, on the main thread, until a signal
    except signals.INTERRUPTS:
        ui.note("stopping")
    finally:
        stop.set()
        if listener.is_alive():
            server.shutdown()  # the listener's loop ends
            listener.join()
        server.close()
    ui.note("stopped")


def _address(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise UsageError(
            f"--host must be an IP address (got {host!r})",
            hint="e.g. --host 127.0.0.1 (this machine only) or --host 0.0.0.0 (every interface)",
        ) from None
