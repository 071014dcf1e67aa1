"""One gated fetch: ``crawler fetch`` sends the very request a download worker sends, on the wire.

Both go through ``crawler.work.gated_fetch.send``: the same headers in the same order (the
spider's, its cookies, its user agent, what its ``before_send`` hook adds), through the same
proxy, each after taking the site's gate (by address, for ``gate_by = "ip"``), rearmed from its send.
"""

from __future__ import annotations

import hashlib
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from redis import Redis
from routes import Answer, Routes, serving

from crawler.coord import keys
from crawler.coord.session import Jar
from crawler.coord.task import DownloadTask
from crawler.settings import Settings
from crawler.work import jobs
from crawler.work.runtime import Runtime

SITE = "wired"
INTERVAL = 2.0
SPIDER = """
import hashlib
from urllib.parse import urlsplit

from crawler import Spider


class Wired(Spider):
    name = "wired"
    allowed_domains = ["127.0.0.1"]
    interval = {interval}
    gate_by = "ip"
    cookies = True
    proxy = "{proxy}"
    user_agent = "wired-test/1.0"
    headers = {{"Accept-Language": "fr", "X-Token": "t0k3n"}}

    def before_send(self, request):  # signed from what is sent, the site's session cookie included
        request.url += "?signed=1"
        parts = urlsplit(request.url)
        text = " ".join([request.method, parts.path, parts.query, request.cookies["sid"], request.kind])
        request.headers["X-Signature"] = hashlib.sha256(text.encode()).hexdigest()

    def parse(self, page):
        yield {{"url": page.url}}
"""


class RecordingProxy:
    """A forwarding HTTP proxy on loopback: keeps each request's head as received, byte for byte (its
    request line and header lines, in order), then relays the request to its origin and the answer back."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while True:
                    head = b""
                    while not head.endswith(b"\r\n\r\n"):
                        line = self.rfile.readline()
                        if not line:
                            return
                        head += line
                    proxy.heads.append(head)
                    self.wfile.write(_relay(head))

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self) -> str:
        return f"http://crawler:pw@127.0.0.1:{self.port}"

    def heads_for(self, path: str) -> list[bytes]:
        """The heads of the requests whose target's path is ``path``."""
        return [head for head in self.heads if urlsplit(head.split(b" ")[1].decode()).path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _relay(head: bytes) -> bytes:
    """Send a GET's ``head`` (absolute-form target) to its origin, in origin form and without the proxy's
    own headers, and return the origin's whole answer (it closes the connection after it)."""
    request_line, *lines = head.rstrip(b"\r\n").split(b"\r\n")
    method, target, version = request_line.split(b" ")
    parts = urlsplit(target.decode())
    kept = [line for line in lines if not line.lower().startswith(b"proxy-")]
    forwarded = b"\r\n".join([b" ".join([method, parts.path.encode(), version]), *kept]) + b"\r\n\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as upstream:
        upstream.sendall(forwarded)
        answer = b""
        while chunk := upstream.recv(65536):
            answer += chunk
    return answer


@pytest.fixture
def proxy() -> Iterator[RecordingProxy]:
    server = RecordingProxy()
    yield server
    server.close()


def gate_pttl(redis_conn: Redis) -> int:
    """Milliseconds left on the gate of 127.0.0.1's address (``gate_by = "ip"``)."""
    return int(redis_conn.pttl(keys.gate(keys.ip_gate_name("127.0.0.1"))))


def test_crawler_fetch_sends_what_a_download_worker_sends_through_the_same_proxy_and_gate(
    redis_url: str, redis_conn: Redis, sqlite_url: str, settings: Settings, proxy: RecordingProxy
) -> None:
    routes = Routes({"/page": Answer("<html><body><h1>page</h1></body></html>")})
    margin_ms = settings.gate_margin * 1000
    with serving(routes) as base:
        url = f"{base}/page"
        Path(settings.sites_dir, "wired.py").write_text(SPIDER.format(interval=INTERVAL, proxy=proxy.url()))
        origin = base
        redis_conn.set(keys.robots(SITE, origin), "", ex=3600)  # robots.txt read already: no rules
        Jar(redis_conn, SITE).update(url, ["sid=abc123; Path=/"])

        cli_args = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", settings.sites_dir]
        result = CliRunner().invoke(_cli(), [*cli_args, "fetch", url, "--site", SITE])
        assert result.exit_code == 0, result.output
        after_fetch = gate_pttl(redis_conn)
        redis_conn.delete(keys.gate(keys.ip_gate_name("127.0.0.1")))  # the worker need not wait the interval

        rt = Runtime(redis_conn, settings)
        try:
            jobs.download(DownloadTask(SITE, url).to_json(), rt=rt)
        finally:
            rt.close()
        after_download = gate_pttl(redis_conn)

    fetched, downloaded = proxy.heads_for("/page")  # both through the proxy, nothing else
    assert fetched == downloaded, "crawler fetch and a worker sent different requests"
    assert fetched.startswith(f"GET {url}?signed=1 HTTP/1.1\r\n".encode())  # as the spider's before_send left it
    lines = fetched.split(b"\r\n")
    signed = hashlib.sha256(b"GET /page signed=1 abc123 page").hexdigest().encode()
    for header in (
        b"user-agent: wired-test/1.0",
        b"accept-language: fr",
        b"x-token: t0k3n",
        b"cookie: sid=abc123",
        b"x-signature: " + signed,
    ):
        assert any(line.lower() == header for line in lines), header
    assert any(line.lower().startswith(b"proxy-authorization: basic ") for line in lines)
    assert [(method, path) for method, path, _ in routes.received] == [("GET", "/page"), ("GET", "/page")]
    # Each took the gate of the site's address and rearmed it for the interval from its send.
    assert 1000 < after_fetch <= INTERVAL * 1000 + margin_ms
    assert 1000 < after_download <= INTERVAL * 1000 + margin_ms


def _cli():  # imported late: crawler.cli.app registers the commands when it loads
    from crawler.cli.app import cli

    return cli
