"""The spider's ``before_send(request)`` hook, on the wire: run in the download worker after the site's
gate is taken and before the request's first byte (``crawler.work.gated_fetch.send``).

A loopback API (``SignedApi``) checks each request's HMAC signature (over the method, the path,
the query and an ``X-Timestamp`` header) and the timestamp against the request's arrival as the
kernel stamped it (``crawler.demo.wire``): within the second before it. Crawls run download and
parse workers in threads against a real Redis, as a worker process runs them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from crawling import run_in_threads
from redis import Redis

import crawler.coord.gate as gate_module
from crawler.coord.connection import connect
from crawler.coord.frontier import seed
from crawler.coord.gate import SEND_GRACE
from crawler.demo.wire import WireStampedHandler, WireStampedServer
from crawler.ops.failures import failed_pages
from crawler.settings import Settings, load_settings
from crawler.spiders.loading import SpiderSet
from crawler.spiders.spider import Page, Request, Spider
from crawler.store.database import Store
from crawler.testing import join_burst_workers, start_burst_workers
from crawler.work.runtime import Runtime

KEY = b"api-secret"
INTERVAL = 0.3
PAGES = 6


def signature(method: str, path: str, query: str, timestamp: str) -> str:
    """What the API expects in ``X-Signature``: HMAC-SHA256 of the method, path, query and timestamp."""
    message = "\n".join([method, path, query, timestamp]).encode()
    return hmac.new(KEY, message, hashlib.sha256).hexdigest()


@dataclass
class Arrival:
    time: float  # when the kernel received the request line (``WireStampedHandler.arrival``)
    method: str
    target: str
    headers: dict[str, str]
    verdict: str  # "ok", or why the API refused it


class SignedApi:
    """A loopback JSON API: ``GET /items?page=N`` answers page N's items when the request is signed
    (``signature``) with a timestamp at most 1 s before its arrival; 401 and the reason otherwise.
    ``/robots.txt`` and ``/plain`` need no signature; ``delay`` seconds before each answer."""

    def __init__(self, delay: float = 0.0) -> None:
        self.arrivals: list[Arrival] = []
        self.lock = threading.Lock()
        api = self

        class Handler(WireStampedHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                arrived = self.arrival()
                headers = {k.lower(): v for k, v in self.headers.items()}
                parts = urlsplit(self.path)
                verdict = "ok" if parts.path in ("/robots.txt", "/plain") else api.verdict(arrived, parts, headers)
                with api.lock:
                    api.arrivals.append(Arrival(arrived, self.command, self.path, headers, verdict))
                time.sleep(delay)
                if parts.path == "/robots.txt":
                    status, kind, body = 200, "text/plain", b"User-agent: *\nAllow: /\n"
                elif verdict != "ok":
                    status, kind, body = 401, "text/plain", verdict.encode()
                else:
                    status, kind, body = 200, "application/json", json.dumps({"items": [self.path]}).encode()
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = WireStampedServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def verdict(arrived: float, parts: Any, headers: dict[str, str]) -> str:
        stamp, signed = headers.get("x-timestamp"), headers.get("x-signature")
        if stamp is None or signed is None:
            return "unsigned"
        if not hmac.compare_digest(signed, signature("GET", parts.path, parts.query, stamp)):
            return "bad signature"
        if not 0 <= arrived - float(stamp) < 1.0:
            return f"timestamp {arrived - float(stamp):+.3f}s from the arrival"
        return "ok"

    def to(self, path: str) -> list[Arrival]:
        with self.lock:
            return [a for a in self.arrivals if urlsplit(a.target).path == path]

    def gaps(self) -> list[float]:
        with self.lock:
            times = sorted(a.time for a in self.arrivals)
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[SignedApi]:
    served = SignedApi()
    yield served
    served.close()


class Signed(Spider):
    """Signs each request as it is sent: HMAC over the method, path, query and a timestamp header."""

    name = "signed"
    allowed_domains = ["127.0.0.1"]
    interval = INTERVAL
    content_types = ("application/json",)

    def before_send(self, request: Any) -> None:
        parts = urlsplit(request.url)
        stamp = f"{time.time():.3f}"
        request.headers["X-Timestamp"] = stamp
        request.headers["X-Signature"] = signature(request.method, parts.path, parts.query, stamp)

    def parse(self, page: Page) -> Iterator[Any]:
        for path in page.json()["items"]:
            yield {"sku": path}


def crawl(
    redis_conn: Redis, settings: Settings, spider: type[Spider], urls: list[str], timeout: float = 60
) -> list[dict[str, Any]]:
    """Crawl ``urls`` with ``spider`` (two download workers, a parse worker, in threads); its fetch records."""
    rt = Runtime(redis_conn, settings, SpiderSet({spider.name: spider}, []))
    try:
        rt.publish(spider.name)
        seed(rt.frontier(spider.name), urls)
        run_in_threads(rt, sites=(spider.name,), timeout=timeout)
    finally:
        rt.close()
    store = Store(settings.database_url)
    try:
        return store.fetch_rows(spider.name)
    finally:
        store.close()


def downloads(records: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == "download" and urlsplit(r["url"]).path == path]


def items_of(database_url: str, site: str) -> set[str]:
    store = Store(database_url)
    try:
        return {row["data"]["sku"] for row in store.item_rows(site)}
    finally:
        store.close()


def test_a_spider_signs_each_request_as_it_is_sent_and_the_api_verifies_the_signature_and_its_second(
    redis_conn: Redis, settings: Settings, api: SignedApi
) -> None:
    urls = [f"{api.url}/items?page={n}" for n in range(1, PAGES + 1)]
    records = crawl(redis_conn, settings, Signed, urls)
    # All queued at once, sent INTERVAL apart: the last left ~1.5 s after it was queued, so only a
    # signature made as it is sent is within the second the API allows.
    verdicts = {a.target: a.verdict for a in api.to("/items")}
    assert verdicts == {urlsplit(url).path + "?" + urlsplit(url).query: "ok" for url in urls}
    assert max(a.time for a in api.to("/items")) - min(a.time for a in api.to("/items")) >= 1.0
    assert items_of(settings.database_url, "signed") == set(verdicts)
    assert not [r for r in records if r["outcome"] == "failed"]
    # robots.txt is the crawler's request, not the spider's: not through the hook.
    assert all("x-signature" not in a.headers for a in api.to("/robots.txt"))
    assert min(api.gaps()) >= INTERVAL, "the hook ran, the site's interval held on the wire"


class LoggingIn(Signed):
    """Logs in (a GET of ``/login``, then of ``/do-login``): every request signed, each kind noted."""

    name = "logging-in"
    kinds: list[tuple[str, str]] = []

    def login(self, page: Page) -> Request:
        return Request(page.urljoin("/do-login"))

    def before_send(self, request: Any) -> None:
        self.kinds.append((request.kind, urlsplit(request.url).path))
        super().before_send(request)


def test_a_logins_requests_go_through_the_hook_too_told_apart_by_kind(
    redis_conn: Redis, settings: Settings, api: SignedApi
) -> None:
    spider = type("LoggingIn", (LoggingIn,), {"login_url": f"{api.url}/login", "kinds": []})
    records = crawl(redis_conn, settings, spider, [f"{api.url}/items?page=1"])
    assert [a.verdict for a in api.to("/login") + api.to("/do-login") + api.to("/items")] == ["ok"] * 3
    assert spider.kinds == [("login", "/login"), ("login", "/do-login"), ("page", "/items")]
    assert not [r for r in records if r["outcome"] == "failed"]


class Failing(Signed):
    name = "failing"

    def before_send(self, request: Any) -> None:
        if "page=2" in request.url:
            raise KeyError("no key for page 2")
        super().before_send(request)


def test_a_before_send_that_raises_fails_its_page_with_the_traceback_unsent_and_the_crawl_goes_on(
    redis_conn: Redis, settings: Settings, api: SignedApi
) -> None:
    urls = [f"{api.url}/items?page={n}" for n in (1, 2, 3)]
    records = crawl(redis_conn, settings, Failing, urls)
    assert [a.target for a in api.to("/items")] and all(a.verdict == "ok" for a in api.to("/items"))
    assert "/items?page=2" not in {a.target for a in api.to("/items")}, "the failing request was sent"
    assert items_of(settings.database_url, "failing") == {"/items?page=1", "/items?page=3"}
    (failed,) = [r for r in downloads(records, "/items") if r["outcome"] == "failed"]
    assert failed["url"].endswith("page=2")
    assert failed["error"].startswith("before_send raised: Traceback")
    assert "raise KeyError" in failed["error"] and "KeyError: 'no key for page 2'" in failed["error"]
    store = Store(settings.database_url)
    try:  # listed by `crawler failed`, for `crawler retry`
        assert [page.url for page in failed_pages(store, "failing")] == [failed["url"]]
    finally:
        store.close()


class Moving(Signed):
    name = "moving"

    def before_send(self, request: Any) -> None:
        if "page=2" in request.url:  # the same server under another name: not the origin the gate was taken for
            request.url = request.url.replace("127.0.0.1", "localhost") + "&moved=1"
        else:
            request.url += "&extra=1"  # the query may change: sent as written, signed as sent
        super().before_send(request)


def test_a_before_send_that_moves_the_request_to_another_host_is_refused_and_recorded(
    redis_conn: Redis, settings: Settings, api: SignedApi
) -> None:
    urls = [f"{api.url}/items?page={n}" for n in (1, 2, 3)]
    records = crawl(redis_conn, settings, Moving, urls)
    sent = sorted(a.target for a in api.to("/items"))
    assert sent == ["/items?page=1&extra=1", "/items?page=3&extra=1"], sent
    (failed,) = [r for r in downloads(records, "/items") if r["outcome"] == "failed"]
    assert failed["url"].endswith("page=2")
    assert "before_send moved the request" in failed["error"] and f"localhost:{api.port}" in failed["error"]


class Slow(Signed):
    """Its hook takes ``pause`` seconds the first time it runs for page 1 (a token fetched once, say);
    ``page_1_stamps``: the timestamps it signed page 1 with, in order."""

    name = "slow"
    pause = 0.0
    page_1_stamps: list[str] = []

    def before_send(self, request: Any) -> None:
        if "page=1" in request.url:
            if not self.page_1_stamps:
                time.sleep(self.pause)
            super().before_send(request)
            self.page_1_stamps.append(request.headers["X-Timestamp"])
        else:
            super().before_send(request)


def test_a_slow_before_send_past_the_send_grace_sends_after_the_gate_is_taken_again_spacing_held(
    redis_url: str,
    redis_conn: Redis,
    settings: Settings,
    api: SignedApi,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two worker processes (a Runtime each: threads of one process take turns at the gate). Page 1's
    # hook outlasts the gate's whole first lifetime (interval, margin, send grace) by a second, in which
    # the other process takes the gate and sends a page every interval; page 1, taken by surprise
    # mid-sequence, goes only once the gate is taken again, an interval after the other's last send.
    # The late-send warning is rate-limited process-wide: another test's in this process must not hide this one's.
    monkeypatch.setattr(gate_module, "_late_sends", gate_module._LateSends())
    slow = type("Slow", (Slow,), {"pause": INTERVAL + settings.gate_margin + SEND_GRACE + 1.0, "page_1_stamps": []})
    spiders = SpiderSet({"slow": slow}, [])
    first, second = Runtime(redis_conn, settings, spiders), Runtime(connect(redis_url), settings, spiders)
    try:
        first.publish("slow")
        seed(first.frontier("slow"), [f"{api.url}/items?page={n}" for n in range(1, 9)])
        with caplog.at_level(logging.WARNING, logger="crawler.gate"):
            threads, stop = start_burst_workers(first, ("slow",), 1, 1)
            more, stop_more = start_burst_workers(second, ("slow",), 1, 0)
            join_burst_workers(threads, stop, 60)
            join_burst_workers(more, stop_more, 60)
    finally:
        first.close()
        second.close()
        second.connection.close()
    assert all(a.verdict == "ok" for a in api.to("/items")) and len(api.to("/items")) == 8
    assert min(api.gaps()) >= INTERVAL, f"two requests {min(api.gaps()):.3f}s apart"
    assert any("send grace ran out" in r.getMessage() for r in caplog.records), "no late send noticed"
    # The hook ran again once the gate was taken again: page 1 went signed as of its send, not of
    # before the wait for the gate (a stale timestamp, which a wait longer than a second makes refused).
    (page_1,) = [a for a in api.to("/items") if a.target == "/items?page=1"]
    assert len(slow.page_1_stamps) == 2 and page_1.headers["x-timestamp"] == slow.page_1_stamps[-1]


def test_the_time_before_send_takes_counts_against_the_requests_deadline(
    redis_conn: Redis, tmp_path: Any, sqlite_url: str
) -> None:
    # A site answering in 0.6 s, a hook of 0.6 s, a timeout of 1 s: the request times out.
    settings = load_settings(
        database_url=sqlite_url,
        timeout=1.0,
        max_retries=0,
        backoff=0.1,
        sites_dir=str(tmp_path),
        state_dir=str(tmp_path),
    )
    served = SignedApi(delay=0.6)
    try:
        slow = type("Slow", (Slow,), {"pause": 0.6, "page_1_stamps": []})
        records = crawl(redis_conn, settings, slow, [f"{served.url}/items?page=1", f"{served.url}/items?page=2"])
    finally:
        served.close()
    outcomes = {urlsplit(r["url"]).query: (r["outcome"], r["error"]) for r in downloads(records, "/items")}
    assert outcomes["page=2"] == ("ok", None)
    outcome, error = outcomes["page=1"]
    assert outcome == "failed" and "timed out" in (error or "").lower(), error


def test_a_before_send_longer_than_the_whole_timeout_sends_nothing(
    redis_conn: Redis, tmp_path: Any, sqlite_url: str, api: SignedApi
) -> None:
    settings = load_settings(
        database_url=sqlite_url,
        timeout=0.5,
        max_retries=0,
        backoff=0.1,
        sites_dir=str(tmp_path),
        state_dir=str(tmp_path),
    )
    slow = type("Slow", (Slow,), {"pause": 0.7, "page_1_stamps": []})
    records = crawl(redis_conn, settings, slow, [f"{api.url}/items?page=1"])
    assert api.to("/items") == []
    (record,) = downloads(records, "/items")
    assert record["outcome"] == "failed" and "before_send took" in record["error"]
