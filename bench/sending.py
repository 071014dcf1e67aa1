"""One request's CPU on one thread: our ``Fetcher`` against httpx's transport and a bare httpcore pool.

Invocation: ``python -m bench sending [--quick]``.

A keep-alive server in a process of its own (raw sockets, a 20 KB page) answers on loopback;
each way of sending makes ``REQUESTS`` requests of one page after a warm-up, the ways taking
turns for ``ROUNDS`` rounds. The figure of each way is its least disturbed round, in µs of the
calling thread's CPU a request (``time.process_time``: the server's CPU is its own):

- ``fetcher``: ``crawler.http.fetch.Fetcher.get``, with the gate's two hooks, as a download
  job calls it (every guard: the deadline on each socket operation, the address check, the
  per-origin pools, decoding, the caps);
- ``httpx transport``: ``httpx.HTTPTransport.handle_request`` with an ``httpx.Request``, the
  body read raw (how the ``Fetcher`` sent until session 24);
- ``httpcore``: ``httpcore.ConnectionPool.handle_request``, the body read raw: what every way
  above is built on, with no guard.

``bench models`` measures the same under 200 threads and Redis, for the crawl as a whole.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable

from .common import BenchRedis, BenchResult, Check

REQUESTS = 2000
QUICK_REQUESTS = 200
ROUNDS = 5
QUICK_ROUNDS = 2
WARMUP = 100

SERVER = r"""
import socket, sys, threading
body = b"<html>" + b"x" * 20000 + b"</html>"
answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n" % len(body) + body
def serve(conn):
    pending = b""
    while True:
        data = conn.recv(65536)
        if not data:
            return
        pending += data
        while b"\r\n\r\n" in pending:
            _, pending = pending.split(b"\r\n\r\n", 1)
            conn.sendall(answer)
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def _ways(url: str) -> dict[str, Callable[[], None]]:
    import httpcore
    import httpx

    from crawler.http.fetch import Fetcher

    fetcher = Fetcher(timeout=30, max_body_bytes=10 * 1024 * 1024, user_agent="bench")
    transport = httpx.HTTPTransport()
    headers = httpx.Headers({"user-agent": "bench", "accept-encoding": "identity"})
    pool = httpcore.ConnectionPool()
    raw_headers = [(b"host", httpx.URL(url).netloc), (b"user-agent", b"bench"), (b"accept-encoding", b"identity")]

    def through_fetcher() -> None:
        fetcher.get(url, on_sent=lambda: None, before_send=lambda: None)

    def through_transport() -> None:
        response = transport.handle_request(httpx.Request("GET", url, headers=headers))
        b"".join(response.iter_raw())
        response.close()

    def through_httpcore() -> None:
        response = pool.handle_request(httpcore.Request("GET", url, headers=raw_headers))
        b"".join(response.iter_stream())
        response.close()

    return {"fetcher": through_fetcher, "httpx transport": through_transport, "httpcore": through_httpcore}


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    requests, rounds = (QUICK_REQUESTS, QUICK_ROUNDS) if quick else (REQUESTS, ROUNDS)
    result = BenchResult("sending", {"requests a round": requests, "rounds": rounds, "page bytes": 20013})
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/page?x=1"
        socket.create_connection(("127.0.0.1", int(url.split(":")[2].split("/")[0])), timeout=5).close()
        ways = _ways(url)
        best = dict.fromkeys(ways, float("inf"))
        rows = []
        for round_ in range(rounds):
            for name, send in ways.items():
                for _ in range(WARMUP):
                    send()
                started = time.process_time()
                for _ in range(requests):
                    send()
                us = (time.process_time() - started) / requests * 1e6
                best[name] = min(best[name], us)
                rows.append([round_ + 1, name, us])
    finally:
        server.kill()
        server.wait()
    result.table("µs of CPU a request, by round", ["round", "way", "µs/request"], rows)
    base = best["httpcore"]
    result.table(
        "best round",
        ["way", "µs/request", "ratio to httpcore"],
        [[name, us, us / base] for name, us in best.items()],
    )
    ours, theirs = best["fetcher"], best["httpx transport"]
    result.checks.append(
        Check(
            "CPU a request, fetcher vs httpx transport (best round)",
            f"{ours:.0f} vs {theirs:.0f} µs ({ours / theirs:.2f}x)",
            "informational",
            None,
        )
    )
    return result
