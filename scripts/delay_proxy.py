"""A TCP proxy that delays every byte by a fixed time each way: a slow link, simulated in user space.

    python scripts/delay_proxy.py LISTEN_PORT HOST:PORT --one-way-ms 2.5

Listens on 127.0.0.1:LISTEN_PORT and forwards each connection to HOST:PORT; what either side sends
arrives `--one-way-ms` later, in order (a 5 ms round trip is --one-way-ms 2.5). Bandwidth is not
limited. It stands in for `tc qdisc ... netem delay`, which needs the kernel's sch_netem module (this
project's machines do not have it). Ctrl-C or SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import queue
import signal
import socket
import sys
import threading
import time


def pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Copy src to dst, each chunk sent `delay` seconds after it was read (a reader thread stamps them)."""
    chunks: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            try:
                data = src.recv(1 << 20)
            except OSError:
                data = b""
            chunks.put((time.monotonic() + delay, data))
            if not data:
                return

    threading.Thread(target=read, daemon=True).start()
    while True:
        due, data = chunks.get()
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)
        except OSError:
            return


def serve(listen_port: int, host: str, port: int, delay: float) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(16)
    print(f"delay proxy: 127.0.0.1:{listen_port} -> {host}:{port}, {delay * 1e3:g} ms each way", flush=True)
    while True:
        client, _ = server.accept()
        upstream = socket.create_connection((host, port))
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as llama.cpp's RPC sockets
        threading.Thread(target=pump, args=(client, upstream, delay), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client, delay), daemon=True).start()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("listen_port", type=int)
    p.add_argument("upstream", help="HOST:PORT to forward to")
    p.add_argument("--one-way-ms", type=float, required=True)
    a = p.parse_args()
    host, _, port = a.upstream.rpartition(":")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(a.listen_port, host, int(port), a.one_way_ms / 1e3)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
