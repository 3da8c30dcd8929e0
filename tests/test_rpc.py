"""The target over llama.cpp's RPC backend: real `specdec rpc-server` processes on 127.0.0.1.

Every client runs in a subprocess: llama.cpp keeps RPC servers registered for the life of a process,
and aborts it when one goes away."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

import llama_cpp.llama_cpp as L

from specdec_cli.backend import rpc
from specdec_cli.cli import main
from test_cli import MEASURING

START_SECONDS = 60  # a server answers its first handshake well within this, even on a loaded machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args, timeout: float = 300, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_DEBUG", "SPECDEC_RPC")}
    cmd = [sys.executable, "-m", "specdec_cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env={**base, **(env or {})}, timeout=timeout, **kw)


def error_line(r: subprocess.CompletedProcess, code: int = 1) -> str:
    """Exit `code`, `error: ...` on stderr's first line, at most a hint after it, no traceback."""
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith(MEASURING)]
    shown = f"exit {r.returncode}\nstderr: {r.stderr[-2000:]}"
    assert r.returncode == code, shown
    assert lines and lines[0].startswith("error: "), shown
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), shown
    return lines[0]


class Server:
    """A `specdec rpc-server` process on 127.0.0.1 and a free port, ready when constructed."""

    def __init__(self, *args: str):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "specdec_cli", "rpc-server", "--port", str(self.port), "-t", "1", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:  # all of stderr, so that the pipe never fills
            for line in self.proc.stderr:
                self.lines.append(line)
                if "Ctrl-C stops it" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(START_SECONDS):
            self.stop()
            pytest.fail(f"rpc-server did not start: {''.join(self.lines)}")

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextmanager
def servers(n: int = 1, *args: str):
    started = [Server(*args) for _ in range(n)]
    try:
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def two_servers():
    with servers(2) as s:
        yield s


def tokens_of(*args) -> tuple[list[int], dict]:
    r = cli("generate", *args, "--json", "-t", "1")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    return doc["tokens"], doc["config"]


# --- the build -------------------------------------------------------------------------------------
def test_this_llama_cpp_build_supports_rpc():
    """README's install builds llama-cpp-python with GGML_RPC: every test below needs it."""
    assert L.llama_supports_rpc(), f"llama-cpp-python lacks RPC; fix: {rpc.install_command()}"


def test_a_build_without_rpc_says_how_to_fix_it(capsys, models, monkeypatch):
    monkeypatch.setattr(L, "llama_supports_rpc", lambda: False)
    for args in (["generate", "hi", "--target", str(models["target"]), "--rpc", "127.0.0.1:1"], ["rpc-server"]):
        assert main(args) == 1
        err = capsys.readouterr().err
        assert "error: this llama-cpp-python was built without RPC support" in err, err
        assert 'CMAKE_ARGS="-DGGML_RPC=ON"' in err and "--no-cache-dir" in err and "llama-cpp-python==" in err


def test_protocol_version_is_the_installed_servers(two_servers):
    """rpc.PROTOCOL (what `check` accepts) is what a server of this very build says it speaks."""
    major, minor, _ = rpc.check("127.0.0.1", two_servers[0].port)
    assert (major, minor) == rpc.PROTOCOL


# --- output and placement --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "drafter",
    [["--drafter", "none"], ["--drafter", "model", "-k", "3"], ["--drafter", "lookup"], ["--drafter", "auto"]],
)
def test_greedy_output_over_rpc_is_local_output(models, two_servers, drafter):
    """The fixtures through one server and split across two: the same tokens as on this machine."""
    args = ["def fib(n):", "--target", models["target"], "--draft", models["draft"], "-n", "40", *drafter]
    local, cfg = tokens_of(*args)
    one, cfg1 = tokens_of(*args, "--rpc", two_servers[0].endpoint)
    both, cfg2 = tokens_of(*args, "--rpc", f"{two_servers[0].endpoint},{two_servers[1].endpoint}")
    assert local == one == both and len(local) == 40
    assert cfg["rpc"] is None and cfg["target_on"] == "local"
    assert cfg1["rpc"] == two_servers[0].endpoint and cfg1["target_on"] == f"rpc {two_servers[0].endpoint}"
    assert cfg2["target_on"] == f"rpc {two_servers[0].endpoint},{two_servers[1].endpoint}"


def test_smollm2_over_rpc_is_local_output(smollm2, two_servers):
    """A real quantized model (Q4_1, Q8_0 embeddings), drafting for itself and by lookup."""
    for drafter in (["--drafter", "none"], ["--drafter", "model", "-k", "4"], ["--drafter", "lookup"]):
        args = ["Write a Python function that reverses a list.", "--target", smollm2, "--draft", smollm2, "-n", "32"]
        local, _ = tokens_of(*args, *drafter)
        remote, _ = tokens_of(*args, *drafter, "--rpc", two_servers[0].endpoint)
        assert remote == local, drafter


def test_exact_mode_over_rpc_says_where_it_does_not_hold(models, two_servers):
    """The servers' kernels are their own (exact mode sets only this machine's): one warning line."""
    r = cli("generate", "hi", "--target", models["target"], "-n", "4", "-t", "1", "--exact", "--rpc",
            two_servers[0].endpoint)  # fmt: skip
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert r.returncode == 0 and len(warnings) == 1, r.stderr
    assert warnings[0].startswith("warning: --exact holds on CPU backends only") and "(GPU or RPC)" in warnings[0]


def test_the_target_layers_are_on_the_servers_and_the_draft_is_not(smollm2, two_servers):
    """llama.cpp's own report of where each layer and buffer went: every layer of the target on the
    two servers, both holding part of it; the draft (the same file) wholly on this machine."""
    r = cli(
        "generate", "hi", "--target", smollm2, "--draft", smollm2, "--drafter", "model", "-n", "4", "-t", "1", "--rpc",
        f"{two_servers[0].endpoint},{two_servers[1].endpoint}", env={"SPECDEC_LLAMA_LOG": "1"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    layers = re.findall(r"layer +\d+ assigned to device (\S+),", r.stderr)
    n_layer = len(layers) // 2  # two loads: the target's, then the draft's
    target, draft = layers[:n_layer], layers[n_layer:]
    assert n_layer >= 30 and set(target) == {"RPC0", "RPC1"} and set(draft) == {"CPU"}, layers
    sizes = {at: float(mib) for at, mib in re.findall(r"RPC\d\[([^\]]+)\] model buffer size = +([\d.]+) MiB", r.stderr)}
    assert set(sizes) == {s.endpoint for s in two_servers} and min(sizes.values()) > 10, sizes


def test_server_memory_holds_the_model_while_a_client_uses_it(smollm2):
    """The server's own memory grows by the weights it was sent (and the KV cache) while a client runs."""
    with servers(1) as (server,):
        before = server.rss_mib()
        client = subprocess.Popen(
            [sys.executable, "-m", "specdec_cli", "generate", "Tell a long story.", "--target", str(smollm2),
             "-n", "2000", "-t", "1", "--rpc", server.endpoint], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert client.stdout.read(1)  # generating: the weights are on the server
            during = server.rss_mib()
        finally:
            client.kill()
            client.wait()
    assert during - before > 60, (before, during)  # SmolLM2's layers are 71 MiB of its 98


# --- faults ----------------------------------------------------------------------------------------
def test_a_server_killed_mid_generation_is_one_error_line_within_seconds(models):
    with servers(1) as (server,):
        client = subprocess.Popen(
            [sys.executable, "-m", "specdec_cli", "generate", "hello", "--target", str(models["target"]),
             "--draft", str(models["draft"]), "-c", "16384", "-n", "16000", "-t", "1", "--rpc", server.endpoint],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert client.stdout.read(1)  # generation has started
        server.stop(signal.SIGKILL)
        t0 = time.monotonic()
        _, err = client.communicate(timeout=30)
        took = time.monotonic() - t0
    r = subprocess.CompletedProcess(client.args, client.returncode, "", err)
    line = error_line(r)
    assert took < 10, took
    assert line.startswith(f"error: lost the connection to the RPC server ({server.endpoint})"), line


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="a network namespace needs root and iproute2")
def test_a_server_machine_that_vanishes_is_one_error_line_not_a_hang(models):
    """The server in a network namespace of its own, reached over a veth pair (addresses that exist only
    inside this test); its end of the link goes down mid-generation, as a machine that loses power: no
    FIN, no RST, the packets vanish. Without keepalive and a send timeout the client waits for minutes."""
    ns, port = f"specdec-t{os.getpid()}", free_port()
    host_if, ns_if = f"sdt{os.getpid() % 10000}a", f"sdt{os.getpid() % 10000}b"
    ip = lambda *a: subprocess.run(["ip", *a], check=True, capture_output=True)  # noqa: E731
    ip("netns", "add", ns)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", "10.213.7.1/24", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", "10.213.7.2/24", "dev", ns_if)
        ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "specdec_cli", "rpc-server", "--host", "10.213.7.2",
             "--port", str(port), "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            for line in server.stderr:
                if "Ctrl-C stops it" in line:
                    break
            else:
                pytest.fail("rpc-server did not start in the namespace")
            client = subprocess.Popen(
                [sys.executable, "-m", "specdec_cli", "generate", "hello", "--target", str(models["target"]),
                 "-c", "16384", "-n", "16000", "-t", "1", "--rpc", f"10.213.7.2:{port}"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert client.stdout.read(1)
            ip("netns", "exec", ns, "ip", "link", "set", ns_if, "down")
            t0 = time.monotonic()
            try:
                _, err = client.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                client.kill()
                pytest.fail("the client hung on a vanished server")
            took = time.monotonic() - t0
        finally:
            server.kill()
            server.wait()
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
    r = subprocess.CompletedProcess(client.args, client.returncode, "", err)
    assert error_line(r).startswith("error: lost the connection to the RPC server (10.213.7.2:")
    assert took < 20, took


def test_ctrl_c_ends_a_client_whose_server_froze(models):
    """A frozen server (SIGSTOP: its kernel still acknowledges and answers keepalives) leaves the client
    inside llama.cpp, where Python's handler cannot run: the watchdog still ends it, with one line."""
    with servers(1) as (server,):
        client = subprocess.Popen(
            [sys.executable, "-m", "specdec_cli", "generate", "hello", "--target", str(models["target"]),
             "-c", "16384", "-n", "16000", "-t", "1", "--rpc", server.endpoint],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert client.stdout.read(1)
            server.proc.send_signal(signal.SIGSTOP)
            time.sleep(1)  # the client is now waiting for a reply that does not come
            client.send_signal(signal.SIGINT)
            t0 = time.monotonic()
            try:
                _, err = client.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                client.kill()
                pytest.fail("Ctrl-C did not end a client whose RPC server froze")
        finally:
            server.proc.send_signal(signal.SIGCONT)
    assert client.returncode == 130 and time.monotonic() - t0 < 15
    assert err.strip().splitlines()[-1] == (
        "error: interrupted, and llama.cpp did not return within 5 s (an RPC server that stopped answering, or a long prompt being read): stopped at once"
    ), err


def test_a_port_without_a_server_is_one_error_line(models):
    port = free_port()
    t0 = time.monotonic()
    r = cli("generate", "hi", "--target", models["target"], "--rpc", f"127.0.0.1:{port}")
    assert error_line(r) == f"error: no RPC server at 127.0.0.1:{port} (connection refused)"
    assert time.monotonic() - t0 < 30


@contextmanager
def fake_server(reply: bytes | None):
    """A TCP server that answers every connection's first bytes with `reply` (None: never answers)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    conns = []

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conns.append(conn)
            conn.recv(64)
            if reply is not None:
                conn.sendall(reply)
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
        for c in conns:
            c.close()


@pytest.mark.parametrize(
    "reply, expected",
    [
        (struct.pack("<QBBBB", 28, 6, 1, 0, 0) + bytes(24), "speaks protocol v6.1.0; this llama.cpp speaks v7.0"),
        (struct.pack("<QBBBB", 28, 7, 9, 0, 0) + bytes(24), "speaks protocol v7.9.0"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "closed the connection during the RPC handshake"),
        (b"", "closed the connection during the RPC handshake"),
        (None, "did not answer the RPC handshake within 5 s"),
    ],
)
def test_a_server_of_another_version_or_kind_is_one_error_line(models, reply, expected):
    """llama.cpp's own client aborts the process on each of these; specdec checks first."""
    with fake_server(reply) as endpoint:
        r = cli("generate", "hi", "--target", models["target"], "--rpc", endpoint, timeout=60)
    assert expected in error_line(r)


def test_bad_rpc_values_are_usage_errors(capsys, models):
    for value, why in [("foo", "'foo'"), ("127.0.0.1:0", "'127.0.0.1:0'"), ("h:1,h:1", "each server once"),
                       ("[::1]:50052", "[::1]"), ("127.0.0.1:x", "127.0.0.1:x")]:  # fmt: skip
        code = main(["generate", "hi", "--target", str(models["target"]), "--rpc", value])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: --rpc must be HOST:PORT") and why in err, err


def test_rpc_from_the_environment_and_the_config(models, tmp_path):
    """SPECDEC_RPC and a pair's `rpc` key both send the target to the server they name; the command
    line wins over the environment, which wins over the config."""
    port = free_port()
    r = cli("generate", "hi", "--target", models["target"], env={"SPECDEC_RPC": f"127.0.0.1:{port}"})
    assert f"no RPC server at 127.0.0.1:{port}" in error_line(r)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[pairs.far]\ntarget = "{models["target"]}"\nrpc = "127.0.0.1:{port + 1}"\n')
    r = cli("generate", "hi", "--pair", "far", "--config", cfg)
    assert f"127.0.0.1:{port + 1}" in error_line(r)
    r = cli("generate", "hi", "--pair", "far", "--config", cfg, env={"SPECDEC_RPC": f"127.0.0.1:{port}"})
    assert f"127.0.0.1:{port} " in error_line(r)
    r = cli("generate", "hi", "--pair", "far", "--config", cfg, "--rpc", f"127.0.0.1:{port + 2}",
            env={"SPECDEC_RPC": f"127.0.0.1:{port}"})  # fmt: skip
    assert f"127.0.0.1:{port + 2}" in error_line(r)


def test_ctrl_c_over_rpc_prints_the_statistics(models):
    with servers(1) as (server,):
        proc = subprocess.Popen(
            [sys.executable, "-m", "specdec_cli", "generate", "hello", "--target", str(models["target"]),
             "--draft", str(models["draft"]), "-c", "16384", "-n", "16000", "-t", "1", "--rpc", server.endpoint],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout.read(1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        # The server is free for the next client: what the interrupted one held was released.
        again = cli("generate", "hi", "--target", models["target"], "-n", "4", "--rpc", server.endpoint)
    err = err.decode()
    assert proc.returncode == 130 and "stop: interrupted" in err and "accept rate" in err, err
    assert f"target on rpc {server.endpoint}" in err and "Traceback" not in err
    assert again.returncode == 0, again.stderr


def test_bench_over_rpc_keeps_its_finished_rows_when_the_server_dies(models, tmp_path):
    out, prompts = tmp_path / "b.json", tmp_path / "p.txt"
    prompts.write_text("hello\ndef fib(n):\n")
    with servers(1) as (server,):
        proc = subprocess.Popen(  # the none row takes a few seconds, the model row longer: killed during it
            [sys.executable, "-m", "specdec_cli", "bench", "--target", str(models["target"]), "--draft",
             str(models["draft"]), "--drafters", "none,model", "--draft-tokens", "3", "-n", "3000", "-c", "4096",
             "--prompts", str(prompts),
             "-t", "1", "--json", str(out), "--rpc", server.endpoint],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and json.loads(out.read_text())["rows"]:
                break
            time.sleep(0.05)
        server.stop(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    doc = json.loads(out.read_text())
    assert proc.returncode == 1 and "lost the connection to the RPC server" in err, err
    assert doc["rows"] and doc["models"]["target_on"] == f"rpc {server.endpoint}"


# --- the server ------------------------------------------------------------------------------------
def test_rpc_server_stops_cleanly_on_sigterm_and_ctrl_c():
    for sig in (signal.SIGTERM, signal.SIGINT):
        with servers(1) as (server,):
            assert server.stop(sig) == 0
            assert "rpc-server stopped" in server.stderr and "Traceback" not in server.stderr
            rpc.check_bind("127.0.0.1", server.port)  # the port is free again


def test_rpc_server_on_a_non_loopback_address_warns():
    with servers(1, "--host", "0.0.0.0") as (server,):
        assert rpc.check("127.0.0.1", server.port)[:2] == rpc.PROTOCOL
    warning = [line for line in server.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "no authentication and no encryption" in warning[0] and "ssh -N -L" in warning[0]
    with servers(1) as (local,):
        pass
    assert "warning" not in local.stderr


def test_rpc_server_mem_is_what_clients_see(models):
    with servers(1, "--mem", "1234") as (server,):
        r = subprocess.run(
            [sys.executable, "-c", "import sys; from specdec_cli.backend import rpc; "
             "print(rpc.describe(rpc.devices(rpc.parse(sys.argv[1]))[0]))", server.endpoint],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "1,234 MiB, 1,234 MiB free" in r.stdout and "1,234 MiB" in server.stderr


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (["--host", "localhost"], 2, "error: --host must be an IPv4 address (got 'localhost')"),
        (["--port", "0"], 2, "error: --port must be 1-65535 (got 0)"),
        (["--mem", "0"], 2, "error: --mem must be at least 1 MiB (got 0)"),
        (["-t", "-1"], 2, "error: -t/--threads must be at least 1"),
    ],
)
def test_rpc_server_bad_options(capsys, args, code, expected):
    assert main(["rpc-server", *args]) == code
    assert capsys.readouterr().err.startswith(expected)


def test_rpc_server_on_a_taken_port_is_one_error_line():
    with servers(1) as (server,):
        r = cli("rpc-server", "--port", server.port, timeout=60)
    assert error_line(r).startswith(f"error: cannot listen on 127.0.0.1:{server.port}: Address already in use")
