"""A loopback site of fixed answers for the session and redirect tests: each path answers with its
status, headers (raw bytes, sent as they are) and body, and every request's headers are kept as the
bytes received."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    """What a path answers: ``headers`` as (name, raw value) pairs, sent byte for byte."""

    body: str = ""
    status: int = 200
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class Routes:
    """The site: its answers by path, and each request received as (method, path, headers) with
    every header's value as the bytes received (names in lower case; a repeated one's values joined)."""

    answers: dict[str, Answer]
    received: list[tuple[str, str, dict[str, bytes]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent_to(self, path: str) -> list[dict[str, bytes]]:
        """The headers of each request for ``path``."""
        with self.lock:
            return [headers for _, got, headers in self.received if got == path]

    def cookies_to(self, path: str) -> set[bytes]:
        """The cookies (``name=value`` as bytes) of the last request for ``path``."""
        cookie = self.sent_to(path)[-1].get("cookie", b"")
        return set(cookie.split(b"; ")) - {b""}


def _handler(routes: Routes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            path = self.path.split("?", 1)[0]
            received: dict[str, bytes] = {}
            for name, value in self.headers.items():  # http.client reads header bytes as Latin-1
                raw = value.encode("latin-1")
                received[name.lower()] = received[name.lower()] + b", " + raw if name.lower() in received else raw
            with routes.lock:
                routes.received.append((self.command, path, received))
            self.rfile.read(int(self.headers.get("content-length") or 0))
            answer = routes.answers.get(path, Answer("<html><body>not here</body></html>", 404))
            data = answer.body.encode()
            self.send_response(answer.status)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            for name, value in answer.headers:
                self.send_header(name, value.decode("latin-1"))  # http.server writes it back as these bytes
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer  # noqa: N815 - http.server's names

    return Handler


@contextmanager
def serving(routes: Routes) -> Iterator[str]:
    """The site on 127.0.0.1, its base URL (``http://127.0.0.1:PORT``) while the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(routes))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
