"""llama.cpp's RPC backend: the target's layers on other machines' devices (`--rpc`), and this machine's
devices served to others (`specdec rpc-server`).

llama.cpp's RPC client aborts the process on any failure (GGML_ABORT: no server, a refused connection,
another protocol version, a server that dies). So before the library connects, `check` does the
protocol's handshake itself, with timeouts, and turns each failure into one line; a server lost later
still aborts, and native's abort handler explains it with `abort_message`.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
import sys

import llama_cpp.llama_cpp as L

from ..errors import SpecdecError, UsageError
from .devices import ACCEL as _ACCEL
from .devices import CPU as _CPU
from .devices import ggml as _ggml  # ggml's device and RPC functions, their signatures declared once there
from .devices import local
from .native import explain_aborts

DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
# The protocol of the ggml that this llama-cpp-python ships (ggml-rpc.h, RPC_PROTO_*_VERSION): a client
# talks to a server of the same major and an equal or older minor version. tests/test_rpc.py checks
# it against a real server of the installed build.
PROTOCOL = (7, 0)
_HELLO, _CAPS = 14, 24  # RPC_CMD_HELLO (fixed forever by the protocol), RPC_CONN_CAPS_SIZE
TIMEOUT = 5.0  # seconds to connect and to answer the handshake


def install_command() -> str:
    """The one command that gives this Python an RPC-capable llama-cpp-python of the installed version.
    --no-cache-dir: pip caches the wheel it built by version, not by CMAKE_ARGS, so a cached non-RPC
    wheel would otherwise be installed again."""
    from importlib.metadata import version

    return (
        f'CMAKE_ARGS="-DGGML_RPC=ON" {sys.executable} -m pip install --force-reinstall --no-cache-dir --no-deps '
        f"llama-cpp-python=={version('llama-cpp-python')}"
    )


def require() -> None:
    if not L.llama_supports_rpc():
        raise SpecdecError(
            "this llama-cpp-python was built without RPC support (llama.cpp's GGML_RPC)",
            hint=f"rebuild it with RPC (about 4 minutes): {install_command()}",
        )


# --- endpoints ----------------------------------------------------------------------------------
def parse(value: str) -> list[tuple[str, int]]:
    """ "HOST:PORT[,HOST:PORT...]" to [(host, port)]; UsageError for anything else. llama.cpp splits an
    endpoint at its first colon, so IPv6 addresses cannot be written (use a host name)."""
    endpoints = []
    for item in value.split(","):
        host, sep, port = item.strip().partition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or ":" in port:
            raise UsageError(
                f"--rpc: {item.strip()!r} is not HOST:PORT (a host name or IPv4 address, a port 1-65535)",
                hint=f"e.g. --rpc 127.0.0.1:{DEFAULT_PORT},192.168.1.20:{DEFAULT_PORT}",
            )
        endpoints.append((host, int(port)))
    if len(set(endpoints)) != len(endpoints):
        raise UsageError(f"--rpc names a server twice ({value})", hint="name each server once")
    return endpoints


def problem(value: str) -> str | None:
    try:
        parse(value)
    except UsageError as e:
        return e.message
    return None


def label(endpoints: list[tuple[str, int]]) -> str:
    return ",".join(f"{h}:{p}" for h, p in endpoints)


def check(host: str, port: int) -> tuple[int, int, int]:
    """Connect and do the RPC handshake (HELLO) with timeouts; the server's protocol version. The server
    serves one client at a time and goes back to listening when we close, ready for the library."""
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=TIMEOUT)
    except socket.gaierror as e:
        raise SpecdecError(f"RPC server {where}: cannot resolve {host!r} ({e.strerror})") from None
    except ConnectionRefusedError:
        raise SpecdecError(
            f"no RPC server at {where} (connection refused)",
            hint=f"start one on that machine: specdec rpc-server --port {port}",
        ) from None
    except (TimeoutError, socket.timeout):
        raise SpecdecError(f"RPC server {where}: no answer to connect within {TIMEOUT:.0f} s") from None
    except OSError as e:
        raise SpecdecError(f"RPC server {where}: cannot connect ({e.strerror or e})") from None
    with sock:
        try:
            sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
            reply = _recv(sock, 8 + 4 + _CAPS)
        except (TimeoutError, socket.timeout):
            raise SpecdecError(
                f"{where} accepted the connection but did not answer the RPC handshake within {TIMEOUT:.0f} s",
                hint="an RPC server serves one client at a time: is another program using it? Or it is not "
                "a llama.cpp RPC server",
            ) from None
        except (ConnectionError, EOFError, OSError):
            raise SpecdecError(
                f"{where} closed the connection during the RPC handshake: it is not a llama.cpp RPC server, "
                "or one of another version",
                hint="run the same specdec (and llama-cpp-python) version there: specdec rpc-server",
            ) from None
    size, major, minor, patch = struct.unpack_from("<QBBB", reply)
    if size != 4 + _CAPS or (major, minor) > PROTOCOL or major != PROTOCOL[0]:
        raise SpecdecError(
            f"the RPC server at {where} speaks protocol v{major}.{minor}.{patch}; this llama.cpp speaks "
            f"v{PROTOCOL[0]}.{PROTOCOL[1]}",
            hint="run the same specdec (and llama-cpp-python) version on both machines",
        )
    return major, minor, patch


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


# --- the client: a target on RPC devices -------------------------------------------------------
_REGISTERED: dict[tuple[str, int], list[int]] = {}  # endpoint -> its devices (ggml_backend_dev_t)
_LIVE: list[str] = []  # endpoints in use, for abort_message
_PEERS: set[tuple[str, int]] = set()  # their (IPv4 address, port), to find the library's connections
# A server whose machine vanishes (power, cable, partition) sends nothing, and a client waiting for a
# reply would wait forever: keepalive probes after 5 s of silence, 1 s apart, 3 unanswered end the
# connection (and the run, with one line); data unacknowledged for 10 s does too. A server busy computing
# does not trip either: its kernel acknowledges and answers probes.
KEEPALIVE = (5, 1, 3)
USER_TIMEOUT_MS = 10_000


def devices(endpoints: list[tuple[str, int]]) -> list[int]:
    """The RPC devices of these servers (each checked first), registered once per process: ggml keeps
    one connection per endpoint, and a second registration would make one server two devices."""
    require()
    lib = _ggml()
    out = []
    for host, port in endpoints:
        if (host, port) not in _REGISTERED:
            check(host, port)
            _PEERS.add((socket.gethostbyname(host), port))  # as llama.cpp resolves it (IPv4)
            _LIVE.append(f"{host}:{port}")  # before the library connects: it may abort there
            reg = lib.ggml_backend_rpc_add_server(f"{host}:{port}".encode())
            lib.ggml_backend_register(reg)
            n = lib.ggml_backend_reg_dev_count(reg)
            _REGISTERED[(host, port)] = [lib.ggml_backend_reg_dev_get(reg, i) for i in range(n)]
        out += _REGISTERED[(host, port)]
    return out


def watch_connections() -> int:
    """Keepalive and a send timeout (KEEPALIVE, USER_TIMEOUT_MS) on llama.cpp's open connections to the
    servers, found among this process's descriptors by their peer; how many. Call it once a model is
    loaded: the library reconnects while it sets up, and keeps one connection while buffers live."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # not Linux: no /proc, and the options below are Linux's
        return 0
    found = 0
    for fd in fds:
        try:
            sock = socket.socket(fileno=os.dup(fd))  # a second handle on the same socket; closing it leaves fd
        except OSError:
            continue
        with sock:
            try:
                peer = sock.getpeername() if sock.family == socket.AF_INET else None
            except OSError:
                peer = None
            if peer not in _PEERS:
                continue
            idle, interval, count = KEEPALIVE
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
            found += 1
    return found


def local_gpus() -> list[int]:
    """The devices llama.cpp would give a model by default, less every RPC server: discrete GPUs, else
    integrated ones (none on a CPU build). A draft gets these: it must never run over the network."""
    return [d.handle for d in local()]


def in_use() -> bool:
    return bool(_REGISTERED)


def abort_message(what: str) -> tuple[str, str] | None:
    """native's abort handler asks: the one line (and hint) for a failure of the RPC client, else None.
    `what` is "file.cpp: message"; a server's own aborts (it registers no server) are not explained."""
    if not _LIVE or not what.startswith("ggml-rpc"):
        return None
    what = what.partition(": ")[2] or what
    servers = ", ".join(_LIVE) or "the RPC server"
    return (
        f"lost the connection to the RPC server ({servers}): it stopped, crashed or the network failed "
        f"(llama.cpp: {what})",
        "restart it (specdec rpc-server) and run again",
    )


explain_aborts(abort_message)  # a lost RPC server is llama.cpp's abort too


# --- the server ----------------------------------------------------------------------------------


def server_devices() -> list[int]:
    """What llama.cpp's rpc-server serves by default: every GPU (and integrated GPU), else the CPU."""
    lib = _ggml()
    devs = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    return [d for d in devs if lib.ggml_backend_dev_type(d) not in (_CPU, _ACCEL)] or [
        d for d in devs if lib.ggml_backend_dev_type(d) == _CPU
    ][:1]


def describe(dev: int) -> str:
    lib = _ggml()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    name, desc = lib.ggml_backend_dev_name(dev).decode(), lib.ggml_backend_dev_description(dev).decode().strip()
    return f"{name} ({desc}, {total.value // 2**20:,} MiB, {free.value // 2**20:,} MiB free)"


def check_bind(host: str, port: int) -> None:
    """The server can listen there: an IPv4 address (llama.cpp binds with inet_addr), a free port."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise UsageError(
            f"--host must be an IPv4 address (got {host!r}): llama.cpp's RPC server binds IPv4 only",
            hint="e.g. --host 127.0.0.1 (this machine only) or --host 0.0.0.0 (every interface)",
        ) from None
    if not 0 < port < 65536:
        raise UsageError(f"--port must be 1-65535 (got {port})")
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama.cpp's server socket
    try:
        probe.bind((host, port))
    except OSError as e:
        raise SpecdecError(
            f"cannot listen on {host}:{port}: {e.strerror or e}",
            hint="another server may hold the port: pick another with --port",
        ) from None
    finally:
        probe.close()


def is_loopback(host: str) -> bool:
    return ipaddress.IPv4Address(host).is_loopback


# ggml's structs, for --mem: a device's memory report is read through `ggml_backend_dev_memory(dev)`,
# and the server asks the device of each backend it made (`ggml_backend_get_device`). So --mem serves a
# copy of the device whose get_memory reports the given size, and points its backend at that copy.
_DEVICE_IFACE = (
    "get_name get_description get_memory get_type get_props init_backend get_buffer_type get_host_buffer_type "
    "buffer_from_host_ptr supports_op supports_buft offload_op event_new event_free event_synchronize"
).split()


class _Device(ctypes.Structure):  # struct ggml_backend_device (ggml-backend-impl.h)
    _fields_ = [(name, ctypes.c_void_p) for name in _DEVICE_IFACE] + [
        ("reg", ctypes.c_void_p),
        ("context", ctypes.c_void_p),
    ]


_GET_MEMORY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
_INIT_BACKEND = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_KEEP: list = []  # the copies and callbacks C holds pointers to, for the process's lifetime


def with_memory(dev: int, mem_bytes: int) -> int:
    """A copy of device `dev` that reports `mem_bytes` free and total; its backends point at the copy."""
    lib = _ggml()
    copy = _Device.from_buffer_copy(ctypes.string_at(dev, ctypes.sizeof(_Device)))
    if copy.reg != lib.ggml_backend_dev_backend_reg(dev):  # the struct is not laid out as we think
        raise SpecdecError("--mem is not supported by this llama.cpp build (its device struct differs)")
    real_init = _INIT_BACKEND(copy.init_backend)

    @_GET_MEMORY
    def get_memory(_dev, free, total) -> None:
        free[0] = total[0] = mem_bytes

    @_INIT_BACKEND
    def init_backend(_dev, params):
        backend = real_init(dev, params)
        if backend:  # struct ggml_backend: guid, iface (function pointers), device, context
            slots = (ctypes.c_void_p * 64).from_address(backend)
            hits = [i for i in range(64) if slots[i] == dev]
            if len(hits) == 1:
                slots[hits[0]] = ctypes.addressof(copy)
        return backend

    copy.get_memory = ctypes.cast(get_memory, ctypes.c_void_p).value
    copy.init_backend = ctypes.cast(init_backend, ctypes.c_void_p).value
    _KEEP.extend([copy, get_memory, init_backend, real_init])
    return ctypes.addressof(copy)


def start_server(host: str, port: int, threads: int, devs: list[int]) -> None:
    """llama.cpp's RPC server on these devices; blocks for as long as it serves (returns if it cannot)."""
    lib = _ggml()
    arr = (ctypes.c_void_p * len(devs))(*devs)
    lib.ggml_backend_rpc_start_server(f"{host}:{port}".encode(), None, threads, len(devs), arr)
