"""The fetcher against real HTTP servers on loopback: caps on size, time and address, no redirects."""

from __future__ import annotations

import email.utils
import functools
import gzip
import json
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from crawler.errors import (
    BadResponse,
    BodyTooLarge,
    ConnectError,
    FetchTimeout,
    PermanentError,
    PrivateAddress,
    UnsupportedScheme,
)
from crawler.http.addresses import RESOLVER_THREADS, is_public_address
from crawler.http.content import inflate_capped
from crawler.http.fetch import Fetcher, Response
from crawler.http.headers import charset_of, parse_retry_after

CAP = 100 * 1024
TIMEOUT = 0.5
MiB = 1024 * 1024
LATIN1_PAGE = "<html><body><p>Crème brûlée</p></body></html>".encode("latin-1")
GZIP_BOMB = gzip.compress(b"\0" * (2 * 1024 * 1024))
PAGE = b"<html><body>" + b"<p>stacked content-codings</p>" * 300 + b"</body></html>"

try:
    import brotli
except ImportError:
    brotli = None


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


#: Content-coding name as sent -> encoder; "raw-deflate" is sent as "deflate" (what some servers do).
ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "raw-deflate": raw_deflate,
    "identity": lambda data: data,
}
if brotli is not None:
    ENCODERS["br"] = brotli.compress


def content_encoding(chain: list[str]) -> str:
    return ", ".join("deflate" if coding == "raw-deflate" else coding for coding in chain)


@functools.cache
def zeros_bomb(chain: tuple[str, ...], size: int) -> bytes:
    """``size`` zero bytes encoded by ``chain`` (in the order applied), built without holding ``size`` bytes.

    The first coding is made from one compressed MiB repeated (a full flush makes each copy
    self-contained), with correct checksums; the next ones compress that, as usual.
    """
    first, *rest = chain
    if first == "br":
        compressor = brotli.Compressor(quality=1)
        data = b"".join(compressor.process(bytes(MiB)) for _ in range(size // MiB)) + compressor.finish()
    else:
        compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
        segment = compressor.compress(bytes(MiB)) + compressor.flush(zlib.Z_FULL_FLUSH)
        data = segment * (size // MiB) + b"\x03\x00"  # and an empty final block
        crc, adler = 0, 1
        for _ in range(size // MiB):
            crc, adler = zlib.crc32(bytes(MiB), crc), zlib.adler32(bytes(MiB), adler)
        if first == "gzip":
            data = (
                b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
                + data
                + crc.to_bytes(4, "little")
                + (size % 2**32).to_bytes(4, "little")
            )
        elif first == "deflate":
            data = b"\x78\xda" + data + adler.to_bytes(4, "big")
    for coding in rest:
        data = ENCODERS[coding](data)
    return data


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        SERVED.append(self.path)
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


def echo_accept_encoding(h: Handler) -> None:
    h.reply(200, h.headers.get("accept-encoding", "").encode(), "text/plain")


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


def chain_of(h: Handler) -> list[str]:
    return parse_qs(urlsplit(h.path).query)["chain"][0].split(",")


def encoded(h: Handler) -> None:
    """PAGE encoded by ``?chain=a,b`` (applied in that order), labelled with that Content-Encoding."""
    chain = chain_of(h)
    body = PAGE
    for coding in chain:
        body = ENCODERS[coding](body)
    h.reply(200, body, "text/html", Content_Encoding=content_encoding(chain))


def two_gzip_members(h: Handler) -> None:
    h.reply(200, gzip.compress(PAGE[:1000]) + gzip.compress(PAGE[1000:]), "text/html", Content_Encoding="gzip")


def bomb(h: Handler) -> None:
    """``?size=N`` zero bytes encoded by ``?chain=…``."""
    chain = chain_of(h)
    size = int(parse_qs(urlsplit(h.path).query)["size"][0])
    h.reply(200, zeros_bomb(tuple(chain), size), "text/html", Content_Encoding=content_encoding(chain))


def unknown_coding(h: Handler) -> None:
    h.reply(200, b"(LZW bytes)", "text/html", Content_Encoding="compress")


def corrupt_gzip(h: Handler) -> None:
    h.reply(200, b"\x1f\x8b\x08\x00 not really gzip", "text/html", Content_Encoding="gzip")


def huge_headers(h: Handler) -> None:
    h.send_response(200)
    for n in range(200):  # 200 KB of headers: more than any client should buffer
        h.send_header(f"X-Filler-{n}", "x" * 1000)
    h.send_header("Content-Length", "2")
    h.end_headers()
    h.wfile.write(b"ok")


def set_cookie(h: Handler) -> None:
    h.reply(200, b"<p>hello</p>", Set_Cookie="session=abc; Path=/")


def echo_cookie(h: Handler) -> None:
    h.reply(200, (h.headers.get("Cookie") or "").encode(), "text/plain")


def many_headers(h: Handler) -> None:
    body = f"host={h.headers.get('Host')}".encode()
    lines = [
        b"HTTP/1.1 200 OK",
        b"Content-Type: text/plain",
        b"Content-Length: %d" % len(body),
        b"X-Twice: a",
        b"x-twice: b",
        b"Set-Cookie: one=1; Path=/",
        b"Set-Cookie: two=2",
        "X-Name: Crème brûlée".encode(h.path.split("?")[-1]),  # UTF-8, or Latin-1
    ]
    h.wfile.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)


def hang_up(h: Handler) -> None:
    h.close_connection = True  # and say nothing: a server that died mid-request


ROUTES: dict[str, Callable[[Handler], None]] = {
    "/ok": ok,
    "/agent": echo_agent,
    "/accept-encoding": echo_accept_encoding,
    "/untyped": untyped,
    "/declared-too-large": declared_too_large,
    "/endless": endless_chunked,
    "/gzip-bomb": gzip_bomb,
    "/drip": slow_drip,
    "/thinking": thinking,
    "/slow-headers": slow_headers,
    "/moved": moved,
    "/busy": busy,
    "/encoded": encoded,
    "/two-gzip-members": two_gzip_members,
    "/bomb": bomb,
    "/unknown-coding": unknown_coding,
    "/corrupt-gzip": corrupt_gzip,
    "/huge-headers": huge_headers,
    "/hang-up": hang_up,
    "/many-headers": many_headers,
    "/set-cookie": set_cookie,
    "/cookie": echo_cookie,
}
#: Every path the server was asked for, in order.
SERVED: list[str] = []


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # clients that hang up on purpose
            super().handle_error(request, client_address)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = QuietServer(("127.0.0.1", 0), Handler)
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


@pytest.mark.parametrize(
    "content_type",
    [
        "text/html; charset=ISO-8859-1",
        'text/html; charset="utf-8"',
        "text/html;charset=UTF-8; foo=bar",
        "text/html; CHARSET=windows-1252",
        "text/html",
        "text/html; charset=",
        'text/html; charset="unterminated',
        "; charset=koi8-r",
        "",
    ],
)
def test_the_charset_is_read_from_content_type_as_httpx_reads_it(content_type: str) -> None:
    expected = httpx.Response(200, headers={"content-type": content_type}).charset_encoding
    assert charset_of(content_type) == expected
    assert charset_of(content_type) == expected  # the cached answer too
    assert charset_of(None) is None


@pytest.mark.integration
@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_response_headers_are_read_as_httpx_reads_them(server: str, fetcher: Fetcher, encoding: str) -> None:
    url = f"{server}/many-headers?{encoding}"
    response = fetcher.get(url)
    with httpx.Client() as client:
        expected = client.get(url)
    assert response.headers == {k.lower(): v for k, v in expected.headers.items() if k.lower() != "set-cookie"}
    assert response.headers["x-twice"] == "a, b" and response.headers["x-name"] == "Crème brûlée"
    assert response.set_cookies == expected.headers.get_list("set-cookie") == ["one=1; Path=/", "two=2"]
    assert response.body == expected.content == f"host={server.removeprefix('http://')}".encode()


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


def test_cookies_are_neither_kept_nor_sent(server: str, fetcher: Fetcher) -> None:
    response = fetcher.get(f"{server}/set-cookie")
    assert "set-cookie" not in response.headers  # shown and handed on: never the cookie values
    assert response.set_cookies[0].startswith("session=abc")  # for the site's jar (``session``)
    assert fetcher.get(f"{server}/cookie").body == b""  # what any worker process would send


def test_environment_proxies_are_not_used(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy would hide the address connected to, past the address check and the deadline.
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    fetcher = Fetcher(timeout=TIMEOUT, max_body_bytes=CAP, user_agent="test-agent/1.0")
    try:
        assert fetcher.get(f"{server}/ok").status == 200  # straight to the server
    finally:
        fetcher.close()


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


@pytest.mark.integration
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


# content-codings: decoded here, stage by stage, within the cap ----------------------------


CHAINS = [
    ["gzip"],
    ["deflate"],
    ["raw-deflate"],
    ["identity"],
    ["gzip", "gzip"],
    ["deflate", "gzip"],
    ["raw-deflate", "gzip", "identity"],
    ["gzip", "deflate", "gzip"],
]
if brotli is not None:
    CHAINS += [["br"], ["gzip", "br"], ["br", "gzip"]]


@pytest.mark.parametrize("chain", CHAINS, ids=",".join)
def test_stacked_content_codings_are_undone_in_order(server: str, fetcher: Fetcher, chain: list[str]) -> None:
    response = fetcher.get(f"{server}/encoded?chain={','.join(chain)}")
    assert response.body == PAGE
    assert response.headers["content-encoding"] == content_encoding(chain)


def test_every_member_of_a_multi_member_gzip_body_is_decoded(server: str, fetcher: Fetcher) -> None:
    assert fetcher.get(f"{server}/two-gzip-members").body == PAGE


def test_accept_encoding_offers_only_the_codings_decoded_here(server: str, fetcher: Fetcher) -> None:
    offered = fetcher.get(f"{server}/accept-encoding").body.decode()
    assert offered == ("gzip, deflate, br" if brotli is not None else "gzip, deflate")


@pytest.mark.parametrize(
    ("path", "reason"),
    [("/unknown-coding", "unsupported content-coding 'compress'"), ("/corrupt-gzip", "undecodable body")],
)
def test_an_unknown_coding_or_corrupt_body_is_a_permanent_bad_response(
    server: str, fetcher: Fetcher, path: str, reason: str
) -> None:
    with pytest.raises(BadResponse, match=reason):
        fetcher.get(f"{server}{path}")


@pytest.mark.parametrize("chain", [["gzip", "gzip"], ["deflate", "gzip", "gzip"]], ids=",".join)
def test_stacked_bomb_is_refused_at_the_cap(server: str, fetcher: Fetcher, chain: list[str]) -> None:
    assert len(zeros_bomb(tuple(chain), 256 * MiB)) < CAP  # only decoding makes it large
    started = time.monotonic()
    with pytest.raises(BodyTooLarge, match="decoded"):
        fetcher.get(f"{server}/bomb?chain={','.join(chain)}&size={256 * MiB}")
    assert time.monotonic() - started < 2  # cut at the cap, not inflated to the end


#: Run in a child process: fetch argv[1] with a cap of argv[2] bytes, print the outcome and peak RSS.
#: (VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec.)
MEASURE_FETCH = """
import json, re, sys
from crawler.errors import CrawlerError
from crawler.http.fetch import Fetcher

def peak_kib():
    with open("/proc/self/status") as status:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))

fetcher = Fetcher(timeout=60, max_body_bytes=int(sys.argv[2]), user_agent="rss-probe")
before = peak_kib()
try:
    fetcher.get(sys.argv[1])
    outcome = "ok"
except CrawlerError as exc:
    outcome = type(exc).__name__
print(json.dumps({"outcome": outcome, "before_kib": before, "peak_kib": peak_kib()}))
"""

RSS_CHAINS = [["gzip", "gzip"], ["deflate", "gzip", "gzip"], ["raw-deflate", "gzip", "gzip", "gzip"]]
if brotli is not None:
    RSS_CHAINS.append(["br", "gzip"])


@pytest.mark.parametrize("chain", RSS_CHAINS, ids=",".join)
def test_peak_memory_stays_near_the_cap_whatever_the_bomb_inflates_to(server: str, chain: list[str]) -> None:
    cap, decoded = 8 * MiB, 1024 * MiB
    body = zeros_bomb(tuple(chain), decoded)
    url = f"{server}/bomb?chain={','.join(chain)}&size={decoded}"
    child = subprocess.run(
        [sys.executable, "-c", MEASURE_FETCH, url, str(cap)], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(child.stdout)
    peak = result["peak_kib"] * 1024
    print(
        f"{content_encoding(chain)}: {len(body)} bytes on the wire, 1 GiB decoded, cap 8 MiB: "
        f"peak RSS {peak / MiB:.1f} MiB (after start-up {result['before_kib'] / 1024:.1f} MiB)"
    )
    assert result["outcome"] == "BodyTooLarge"
    assert peak < cap + 60 * MiB, f"peak RSS {peak / MiB:.0f} MiB for a cap of {cap / MiB:.0f} MiB"


def test_inflate_capped_returns_what_fits_and_refuses_a_bomb_without_inflating_it() -> None:
    assert inflate_capped(zlib.compress(PAGE), len(PAGE)) == PAGE
    bomb = zeros_bomb(("deflate",), 256 * MiB)
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge):
            inflate_capped(bomb, MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MiB  # the cap and a little, not 256 MiB
    with pytest.raises(zlib.error):
        inflate_capped(zlib.compress(PAGE)[:-10], len(PAGE))  # truncated


def test_truncate_at_returns_the_first_decoded_bytes_instead_of_failing(server: str, fetcher: Fetcher) -> None:
    endless = fetcher.get(f"{server}/endless", truncate_at=CAP + 5)  # past the cap: truncation replaces it
    assert (len(endless.body), endless.truncated) == (CAP + 5, True)
    assert endless.body == b"x" * (CAP + 5)
    zeros_bomb(("gzip", "gzip"), 64 * MiB)  # built before the request: its checksums take the server long under load
    bombed = fetcher.get(f"{server}/bomb?chain=gzip,gzip&size={64 * MiB}", truncate_at=1000)
    assert (bombed.body, bombed.truncated) == (b"\0" * 1000, True)
    whole = fetcher.get(f"{server}/encoded?chain=gzip", truncate_at=len(PAGE))
    assert (whole.body, whole.truncated) == (PAGE, False)


# the timeout bounds the whole request -----------------------------------------------------


class DripServer:
    """A raw keep-alive HTTP/1.1 server: /drip sends its status line and headers one byte every
    0.2 s; anything else answers "ok" at once. Logs (connection number, path) of each request."""

    HEADERS = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
        + b"X-Pad: "
        + b"p" * 400
        + b"\r\n"
        + (b"Content-Length: 2\r\n\r\nok")
    )

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests: list[tuple[int, str]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        number = 0
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            number += 1
            threading.Thread(target=self._serve, args=(connection, number), daemon=True).start()

    def _serve(self, connection: socket.socket, number: int) -> None:
        with connection:
            buffered = b""
            try:
                while True:
                    while b"\r\n\r\n" not in buffered:
                        data = connection.recv(4096)
                        if not data:
                            return
                        buffered += data
                    head, buffered = buffered.split(b"\r\n\r\n", 1)
                    path = head.split(b" ")[1].decode()
                    self.requests.append((number, path))
                    if path != "/drip":
                        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        continue
                    for byte in self.HEADERS:  # ~90 s in all; a client gone ends it
                        connection.sendall(bytes([byte]))
                        time.sleep(0.2)
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


@pytest.mark.integration
@pytest.mark.parametrize("connection", ["new", "pooled"])
def test_headers_dripped_a_byte_at_a_time_time_out_at_the_deadline(connection: str) -> None:
    drip = DripServer()
    fetcher = Fetcher(timeout=1.0, max_body_bytes=CAP, user_agent="t")
    try:
        if connection == "pooled":
            assert fetcher.get(f"{drip.url}/warm-up").body == b"ok"
        started = time.monotonic()
        with pytest.raises(FetchTimeout, match="whole request"):
            fetcher.get(f"{drip.url}/drip")
        elapsed = time.monotonic() - started
        assert 1.0 <= elapsed < 1.5, f"gave up after {elapsed:.2f}s"
        assert fetcher.get(f"{drip.url}/after").body == b"ok"  # the pool still works
    finally:
        fetcher.close()
        drip.close()
    paths = [path for _, path in drip.requests]
    assert paths[-2:] == ["/drip", "/after"]
    if connection == "pooled":  # the drip came on the pooled connection, not a new one
        assert drip.requests[0][0] == drip.requests[1][0]


# permanent, not transient ------------------------------------------------------------------


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1/"])
def test_non_http_schemes_are_permanently_refused(fetcher: Fetcher, url: str) -> None:
    with pytest.raises(UnsupportedScheme) as caught:
        fetcher.get(url)
    assert isinstance(caught.value, PermanentError)


def test_oversized_response_headers_are_a_permanent_bad_response(server: str, fetcher: Fetcher) -> None:
    with pytest.raises(BadResponse) as caught:
        fetcher.get(f"{server}/huge-headers")
    assert isinstance(caught.value, PermanentError)
    assert fetcher.get(f"{server}/ok").status == 200


def test_a_server_hanging_up_without_an_answer_stays_transient(server: str, fetcher: Fetcher) -> None:
    with pytest.raises(ConnectError, match="disconnected"):
        fetcher.get(f"{server}/hang-up")


# DNS rebinding: the address connected to is checked ------------------------------------------


@pytest.fixture
def rebinding_dns(monkeypatch: pytest.MonkeyPatch) -> str:
    """``rebind.test`` resolves to 127.0.0.1 in this process, as a rebinding DNS server would answer."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == "rebind.test" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return "rebind.test"


def test_a_name_resolving_to_loopback_is_refused_before_the_request_is_sent(
    server: str, fetcher: Fetcher, rebinding_dns: str
) -> None:
    url = server.replace("127.0.0.1", rebinding_dns) + "/ok?rebound"
    SERVED.clear()
    with pytest.raises(PrivateAddress, match="rebind.test resolves to 127.0.0.1"):
        fetcher.get(url)
    assert "/ok?rebound" not in SERVED  # refused before a byte of the request was written
    assert fetcher.get(url, allow_private=True).status == 200  # the spider opted in
    assert SERVED == ["/ok?rebound"]


def test_an_ip_address_or_localhost_named_in_the_url_may_be_private(server: str, fetcher: Fetcher) -> None:
    port = urlsplit(server).port
    assert fetcher.get(f"http://127.0.0.1:{port}/ok").status == 200
    assert fetcher.get(f"http://localhost:{port}/ok").status == 200


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("240.0.0.1", False),
        ("::1", False),
        ("fe80::1%eth0", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:10.0.0.1", False),
    ],
)
def test_is_public_address(address: str, public: bool) -> None:
    assert is_public_address(address) is public


def test_lookups_that_hang_end_each_fetch_by_its_deadline_and_hold_a_bounded_number_of_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    asked: list[str] = []
    lock = threading.Lock()

    def hanging(host: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            asked.append(host)
        release.wait(30)  # a name server that never answers (until the test ends)
        raise socket.gaierror(socket.EAI_AGAIN, "no answer")

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    fetcher = Fetcher(timeout=0.5, max_body_bytes=1 << 20, user_agent="t")
    outcomes: dict[int, tuple[str, float]] = {}

    def fetch(n: int, name: str) -> None:
        started = time.monotonic()
        try:
            fetcher.get(f"http://{name}/")
            outcomes[n] = ("answered", time.monotonic() - started)
        except Exception as exc:
            outcomes[n] = (type(exc).__name__, time.monotonic() - started)

    names = ["same.hang.test"] * 4 + [f"n{i}.hang.test" for i in range(RESOLVER_THREADS + 8)]
    threads = [threading.Thread(target=fetch, args=(n, name), daemon=True) for n, name in enumerate(names)]
    try:
        threads[0].start()
        deadline = time.monotonic() + 2
        while "same.hang.test" not in asked and time.monotonic() < deadline:
            time.sleep(0.01)
        for thread in threads[1:]:
            thread.start()
        deadline = time.monotonic() + 3
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        finished = dict(outcomes)
        with lock:
            looked_up = list(asked)
    finally:
        release.set()
        fetcher.close()

    assert len(finished) == len(names), f"{len(names) - len(finished)} fetches still hang on their lookups"
    assert {kind for kind, _ in finished.values()} == {"FetchTimeout"}
    assert max(took for _, took in finished.values()) < 1.0  # the 0.5 s deadline, lookup included
    assert looked_up.count("same.hang.test") == 1  # one name, one lookup, however many wait for it
    assert len(looked_up) == RESOLVER_THREADS  # the others gave up waiting for a free lookup thread
