"""`specdec serve`: the loaded pair behind OpenAI's, Anthropic's and llama-server's APIs."""

from __future__ import annotations

import ipaddress
import math
import os
import threading
from pathlib import Path
from typing import Any, List, Optional

import typer

from .. import options, prefixes, signals, ui
from ..declaration import SERVER
from .common import CONFIG, PAIR, model_names, opened, resolve
from ..errors import SpecdecError, UsageError
from ..chat import isolation
from ..serve import guard
from ..serve.http import Server
from ..serve.service import Service
from ..layout import DEFAULT_SLOTS
from ..session import Session

PORT = 8080  # llama-server's default: clients configured for it find us
QUEUE = 16  # requests that may wait for the one generating; more get 503 with Retry-After
API_KEY_ENV = "SPECDEC_API_KEY"  # a key in the environment stays out of `ps` and shell history
GIB = 1 << 30
PREFIX_CACHE = "Prefix cache"  # --help's panel for the three (apart from SERVER: their --no-... column narrows it)
PARALLEL = typer.Option(
    None,
    "-np",
    "--parallel",
    help=f"Requests generated at once, decoded together in one batch (llama-server's -np); each has its whole "
    f"context (-c), so the caches take N times the memory. Default: {DEFAULT_SLOTS} where they fit in memory, "
    "else as many as fit.",
    rich_help_panel=SERVER,
)
ALLOW_ORIGIN = typer.Option(
    None,
    "--allow-origin",
    metavar="ORIGIN",
    help="A web page (scheme://host[:port]) whose requests are answered, with CORS headers; again for more. "
    "Others' are refused (403).",
    rich_help_panel=SERVER,
)

# The connection guard's limits and the prefix cache's settings: declared here, each group under its --help panel.
MAX_CONNECTIONS = typer.Option(
    guard.MAX_CONNECTIONS,
    "--max-connections",
    help="Connections at once; past it a new one closes the one waiting longest for its request (503 if none).",
    rich_help_panel=SERVER,
)
HEADER_TIMEOUT = typer.Option(
    guard.HEAD_SECONDS,
    "--header-timeout",
    help="Seconds a request's line and headers may take, in all.",
    rich_help_panel=SERVER,
)
BODY_TIMEOUT = typer.Option(
    guard.BODY_SECONDS,
    "--body-timeout",
    help="Seconds a request's body may take, in all, after its headers.",
    rich_help_panel=SERVER,
)
PREFIX_CACHE_ON = typer.Option(
    True,
    "--prefix-cache/--no-prefix-cache",
    help="Keep the KV cells of long prompts (1,024+ tokens) in the specdec cache, so that a prompt seen before, "
    "after a restart too, is read back instead of prefilled ($SPECDEC_PREFIX_CACHE moves it).",
    rich_help_panel=PREFIX_CACHE,
)
PREFIX_CACHE_SIZE = typer.Option(
    prefixes.MAX_BYTES / GIB,
    "--prefix-cache-size",
    help="GiB the prefix cache may hold on disk, over every model; the least recently used go first.",
    rich_help_panel=PREFIX_CACHE,
)
PREFIX_CACHE_HOURS = typer.Option(
    prefixes.LIFETIME / 3600,
    "--prefix-cache-hours",
    help="Hours a prompt may stay in the prefix cache unused; then its files are removed.",
    rich_help_panel=PREFIX_CACHE,
)


@options.with_options(*(k for k in options.BY_KEY if k != "prediction"))  # a request's own (its `prediction`)
def serve(
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to listen on; anything but loopback needs --api-key (or --insecure-no-key) and is not "
        "checked for its Host header.",
        rich_help_panel=SERVER,
    ),
    port: int = typer.Option(
        PORT, "-p", "--port", help="Port to listen on (0: any free one; the URL says which).", rich_help_panel=SERVER
    ),
    api_key: Optional[str] = typer.Option(
        None,
        "--api-key",
        help=f"Require 'Authorization: Bearer KEY' on every request but /health (default: ${API_KEY_ENV}).",
        rich_help_panel=SERVER,
    ),
    insecure_no_key: bool = typer.Option(
        False,
        "--insecure-no-key",
        help="Serve a --host other machines reach without --api-key: anyone may use it.",
        rich_help_panel=SERVER,
    ),
    allow_origin: Optional[List[str]] = ALLOW_ORIGIN,
    parallel: Optional[int] = PARALLEL,
    queue: int = typer.Option(
        QUEUE, "--queue", help="Requests that may wait while the slots generate; more get 503.", rich_help_panel=SERVER
    ),
    max_connections: int = MAX_CONNECTIONS,
    header_timeout: float = HEADER_TIMEOUT,
    body_timeout: float = BODY_TIMEOUT,
    prefix_cache: bool = PREFIX_CACHE_ON,
    prefix_cache_size: float = PREFIX_CACHE_SIZE,
    prefix_cache_hours: float = PREFIX_CACHE_HOURS,
    pair: Optional[str] = PAIR,
    config_path: Optional[Path] = CONFIG,
    debug: bool = typer.Option(False, "--debug", help="Check the KV caches after every round; log every request."),
    **given: Any,
) -> None:
    """Serve the pair over HTTP: OpenAI's /v1/chat/completions, /v1/completions, /v1/responses and /v1/models;
    Anthropic's /v1/messages; llama-server's /infill and /completion (editors); /health."""
    _check(queue, prefix_cache_size, prefix_cache_hours, port, parallel)
    limits = _limits(max_connections, header_timeout, body_timeout)
    origins = _origins(allow_origin or [])
    api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    address = _address(host, api_key, insecure_no_key)
    cfg = resolve(given, pair, config_path, debug=debug)
    guard.raise_file_limit()  # a descriptor for each of the cap's connections, and to spare
    server = _listen(address, port, host, api_key, debug, limits, origins)  # before loading: a taken port fails now
    try:
        with opened(cfg, costs=True, slots=parallel or 0) as session:
            # The lookup cache's namespaces, as the prefix cache's: by the API key (a hash of it).
            session.answers.key_hash = prefixes.key_hash(api_key)
            if prefix_cache:
                _prefix_cache(session, int(prefix_cache_size * GIB), prefix_cache_hours * 3600, api_key)
            server.service = Service(session, *model_names(cfg), queue)
            isolation.prestart()  # the chat template's renderer: its child's 50 ms not in the first request's
            _serve(server, host, api_key is not None, cfg)
    finally:
        server.close()


def _listen(
    address: str, port: int, host: str, api_key: str | None, debug: bool, limits: guard.Limits, origins: frozenset[str]
) -> Server:
    """The listening server, with no service yet: a taken port fails in a second, not after the models load."""
    try:
        return Server((address, port), None, api_key, debug, limits, host, origins)
    except OSError as e:
        raise SpecdecError(
            f"cannot listen on {host}:{port}: {e.strerror or e}",
            hint="another server may hold the port: pick another with --port",
        ) from None


def _check(queue: int, prefix_cache_size: float, prefix_cache_hours: float, port: int, parallel: int | None) -> None:
    if parallel is not None and parallel < 1:
        raise UsageError(f"--parallel must be at least 1 (got {parallel})")
    if queue < 0:
        raise UsageError(f"--queue must be at least 0 (got {queue})")
    if not (math.isfinite(prefix_cache_size) and prefix_cache_size > 0):
        raise UsageError(f"--prefix-cache-size must be a positive number of GiB (got {prefix_cache_size})")
    if not (math.isfinite(prefix_cache_hours) and prefix_cache_hours > 0):
        raise UsageError(f"--prefix-cache-hours must be a positive number of hours (got {prefix_cache_hours})")
    if not 0 <= port < 65536:
        raise UsageError(f"--port must be 0-65535 (got {port})")


def _prefix_cache(session: Session, size: int, lifetime: float, api_key: str | None) -> None:
    """Long prompts' cells kept on disk (--prefix-cache), namespaced by the API key."""
    why = session.keep_prefixes(size, ui.warning, api_key, lifetime)
    if why:
        ui.note(f"prefix cache off: {why}")


def _serve(server: Server, host: str, keyed: bool, cfg) -> None:
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    url = f"http://{shown}:{bound_port}/v1"
    if not ipaddress.ip_address(bound_host).is_loopback and not keyed:
        ui.warning(
            f"{host} is reachable from other machines and this server has no authentication (--insecure-no-key): "
            f"anyone who reaches it can use it"
        )
    listener = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="specdec-http", daemon=True
    )
    stop = threading.Event()
    try:  # from here on a signal stops the server cleanly, wherever it lands
        how = ui.label(server.service.session.drafter, cfg.draft_tokens, cfg.branches, k_for_auto=True, exact=cfg.exact)
        n = server.service.gate.slots
        ui.note(f"serving {server.service.model} ({how}, {n} slot{'s' * (n > 1)}) at {url}; Ctrl-C stops it")
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
    with signals.second_stops():  # the last prompt's blocks, once no request runs; a second signal cuts it
        server.service.keep_before_stopping()
    ui.note("stopped")


def _limits(max_connections: int, header_timeout: float, body_timeout: float) -> guard.Limits:
    if max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1 (got {max_connections})")
    for flag, seconds in (("--header-timeout", header_timeout), ("--body-timeout", body_timeout)):
        if not (math.isfinite(seconds) and seconds > 0):
            raise UsageError(f"{flag} must be a positive number of seconds (got {seconds})")
    return guard.Limits(max_connections, header_timeout, body_timeout)


def _origins(given: list[str]) -> frozenset[str]:
    out = set()
    for value in (v for item in given for v in item.split(",")):
        origin = guard.origin(value)
        if origin is None:
            raise UsageError(
                f"--allow-origin must be an origin, scheme://host[:port] (got {value!r})",
                hint="e.g. --allow-origin http://localhost:3000 (no path, no trailing slash)",
            )
        out.add(origin)
    return frozenset(out)


def _address(host: str, api_key: str | None, insecure_no_key: bool) -> str:
    """--host as an IP address; one other machines reach only with a key (or --insecure-no-key, said)."""
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty")
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = str(ipaddress.ip_address(host))
    except ValueError:
        raise UsageError(
            f"--host must be an IP address (got {host!r})",
            hint="e.g. --host 127.0.0.1 (this machine only) or --host 0.0.0.0 (every interface)",
        ) from None
    if not ipaddress.ip_address(address).is_loopback and api_key is None and not insecure_no_key:
        raise UsageError(
            f"--host {host} is reachable from other machines: give --api-key KEY (or ${API_KEY_ENV})",
            hint="or --insecure-no-key to let anyone who reaches it use it",
        )
    return address
