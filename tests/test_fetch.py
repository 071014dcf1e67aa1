"""The fetcher against a real HTTP server on loopback: caps on size and time, no redirects."""

from __future__ import annotations

import email.utils
import gzip
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from crawler.errors import BodyTooLarge, ConnectError, FetchTimeout
from crawler.fetch import Fetcher, Response, parse_retry_after

CAP = 100 * 1024
TIMEOUT = 0.5
LATIN1_PAGE = "<html><body><p>Crème brûlée</p></body></html>".encode("latin-1")
GZIP_BOMB = gzip.compress(b"\0" * (2 * 1024 * 1024))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        route = ROUTES.get(self.path.split("?")[0])
        try:
            if route is None:
                self.reply(404, b"not found", "text/plain")
            else:
                route(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up on purpose: that is what several tests check

    def reply(self, status: int, body: bytes, content_type: str | None = "text/html", **headers: str) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)


def ok(h: Handler) -> None:
    h.reply(200, LATIN1_PAGE, "text/html; charset=ISO-8859-1", X_Served_By="test")


def echo_agent(h: Handler) -> None:
    h.reply(200, h.headers.get("user-agent", "").encode(), "text/plain")


def untyped(h: Handler) -> None:
    h.reply(200, b"<p>no type</p>", None)


def declared_too_large(h: Handler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/html")
    h.send_header("Content-Length", str(CAP + 1))
    h.end_headers()
    h.wfile.write(b"x" * 1024)  # the client should hang up long before CAP + 1 bytes


def endless_chunked(h: Handler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/html")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    chunk = b"x" * 8192
    for _ in range(10_000):  # ~80 MB: far past the cap, bounded in case the client keeps reading
        h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    h.wfile.write(b"0\r\n\r\n")


def gzip_bomb(h: Handler) -> None:
    h.reply(200, GZIP_BOMB, "text/html", Content_Encoding="gzip")


def slow_drip(h: Handler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/html")
    h.send_header("Content-Length", "1000")
    h.end_headers()
    for _ in range(1000):  # 1 byte per 20 ms: each read is quick, the whole body takes 20 s
        h.wfile.write(b"x")
        h.wfile.flush()
        time.sleep(0.02)


def slow_headers(h: Handler) -> None:
    time.sleep(TIMEOUT * 3)
    h.reply(200, b"late")


def moved(h: Handler) -> None:
    h.reply(301, b"", "text/html", Location="/ok")


def thinking(h: Handler) -> None:
    time.sleep(0.3)
    ok(h)


def busy(h: Handler) -> None:
    h.reply(503, b"busy", "text/plain", Retry_After="120")


ROUTES: dict[str, Callable[[Handler], None]] = {
    "/ok": ok,
    "/agent": echo_agent,
    "/untyped": untyped,
    "/declared-too-large": declared_too_large,
    "/endless": endless_chunked,
    "/gzip-bomb": gzip_bomb,
    "/drip": slow_drip,
    "/thinking": thinking,
    "/slow-headers": slow_headers,
    "/moved": moved,
    "/busy": busy,
}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def fetcher() -> Iterator[Fetcher]:
    f = Fetcher(timeout=TIMEOUT, max_body_bytes=CAP, user_agent="test-agent/1.0")
    yield f
    f.close()


def test_ok_page_comes_back_with_body_headers_and_charset(server: str, fetcher: Fetcher) -> None:
    response = fetcher.get(f"{server}/ok")
    assert response.status == 200
    assert response.body == LATIN1_PAGE
    assert response.headers["x-served-by"] == "test"
    assert response.headers["content-type"] == "text/html; charset=ISO-8859-1"
    assert response.encoding is not None and response.encoding.lower() == "iso-8859-1"
    assert response.content_type == "text/html"
    assert response.is_html
    assert response.url == f"{server}/ok"
    assert 0 <= response.elapsed < 5
    assert response.started.tzinfo is not None


def test_default_and_per_request_user_agent_are_sent(server: str, fetcher: Fetcher) -> None:
    assert fetcher.get(f"{server}/agent").body == b"test-agent/1.0"
    assert fetcher.get(f"{server}/agent", user_agent="spider/2").body == b"spider/2"


def test_error_statuses_come_back_as_responses(server: str, fetcher: Fetcher) -> None:
    assert fetcher.get(f"{server}/missing").status == 404
    busy = fetcher.get(f"{server}/busy")
    assert busy.status == 503
    assert busy.retry_after() == 120.0


def test_redirects_are_not_followed(server: str, fetcher: Fetcher) -> None:
    response = fetcher.get(f"{server}/moved")
    assert response.status == 301
    assert response.location == "/ok"
    assert response.body == b""


def test_declared_content_length_over_the_cap_is_refused(server: str, fetcher: Fetcher) -> None:
    with pytest.raises(BodyTooLarge, match="Content-Length"):
        fetcher.get(f"{server}/declared-too-large")


def test_endless_chunked_body_is_cut_at_the_cap(server: str, fetcher: Fetcher) -> None:
    started = time.monotonic()
    with pytest.raises(BodyTooLarge, match="cap"):
        fetcher.get(f"{server}/endless")
    assert time.monotonic() - started < 5


def test_gzip_body_that_inflates_past_the_cap_is_refused(server: str, fetcher: Fetcher) -> None:
    assert len(GZIP_BOMB) < CAP  # the wire size is within the cap: only decompression exceeds it
    with pytest.raises(BodyTooLarge):
        fetcher.get(f"{server}/gzip-bomb")


def test_gzip_body_within_the_cap_is_decompressed(server: str) -> None:
    roomy = Fetcher(timeout=5, max_body_bytes=4 * 1024 * 1024, user_agent="t")
    try:
        response = roomy.get(f"{server}/gzip-bomb")
    finally:
        roomy.close()
    assert response.body == b"\0" * (2 * 1024 * 1024)


def test_slow_drip_body_past_the_time_cap_times_out(server: str, fetcher: Fetcher) -> None:
    started = time.monotonic()
    with pytest.raises(FetchTimeout):
        fetcher.get(f"{server}/drip")
    elapsed = time.monotonic() - started
    assert TIMEOUT <= elapsed < TIMEOUT + 3, f"gave up after {elapsed:.2f}s"


def test_server_that_never_answers_times_out(server: str, fetcher: Fetcher) -> None:
    with pytest.raises(FetchTimeout):
        fetcher.get(f"{server}/slow-headers")


def test_connection_refused_is_a_connect_error(fetcher: Fetcher) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port now.
    with pytest.raises(ConnectError):
        fetcher.get(f"http://127.0.0.1:{port}/")


def test_pooled_connection_survives_a_refused_body(server: str, fetcher: Fetcher) -> None:
    with pytest.raises(BodyTooLarge):
        fetcher.get(f"{server}/endless")
    assert fetcher.get(f"{server}/ok").status == 200


# parse_retry_after and Response helpers ---------------------------------------------------


def test_on_sent_runs_once_the_request_is_written_before_the_answer(server: str, fetcher: Fetcher) -> None:
    sent: list[float] = []
    started = time.monotonic()
    response = fetcher.get(f"{server}/thinking", on_sent=lambda: sent.append(time.monotonic()))
    answered = time.monotonic()
    assert response.status == 200
    assert len(sent) == 1
    assert sent[0] - started < 0.2 < answered - started  # before the server's 0.3 s of thinking ended


def test_retry_after_in_seconds() -> None:
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 7 ") == 7.0
    assert parse_retry_after("0") == 0.0


def test_retry_after_as_http_date() -> None:
    now = 1_700_000_000.0
    later = email.utils.formatdate(now + 90, usegmt=True)
    assert parse_retry_after(later, now=now) == pytest.approx(90.0)
    earlier = email.utils.formatdate(now - 90, usegmt=True)
    assert parse_retry_after(earlier, now=now) == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "-5", "1.5e3x", "Mon, 99 Foo 2024"])
def test_retry_after_junk_is_none(value: str | None) -> None:
    assert parse_retry_after(value) is None


def make_response(headers: dict[str, str]) -> Response:
    return Response("http://x.example/", 200, headers, b"", datetime.now(UTC), 0.0)


@pytest.mark.parametrize(
    ("content_type", "html"),
    [
        ("text/html", True),
        ("text/html; charset=utf-8", True),
        ("TEXT/HTML", True),
        ("application/xhtml+xml", True),
        (None, True),
        ("application/pdf", False),
        ("application/json", False),
        ("text/plain", False),
    ],
)
def test_is_html(content_type: str | None, html: bool) -> None:
    headers = {"content-type": content_type} if content_type else {}
    assert make_response(headers).is_html is html


def test_untyped_body_counts_as_html(server: str, fetcher: Fetcher) -> None:
    response = fetcher.get(f"{server}/untyped")
    assert response.content_type == ""
    assert response.is_html
