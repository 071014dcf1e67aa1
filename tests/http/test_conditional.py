"""Conditional refreshes: a refresh sends the page's validators; a 304 is recorded unchanged, not parsed."""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from crawling import installed_runtime, run_in_threads
from redis import Redis
from sqlalchemy import inspect

from crawler.coord import keys
from crawler.coord.frontier import DownloadTask, seed
from crawler.coord.scheduler import Scheduler, decode_entry
from crawler.demo import ShopSite
from crawler.demo.spider import DemoShop
from crawler.http.conditional import check_validators, request_headers, validators_of
from crawler.ops.failures import failed_pages
from crawler.settings import Settings
from crawler.spiders.loading import SpiderSet
from crawler.spiders.spider import Page
from crawler.store.database import FAILED, OK, UNCHANGED, Store
from crawler.work import jobs

PRODUCTS = 8
REFRESH = 1.0


class ConditionalShop(DemoShop):
    """The demo spider with product pages refreshed every second, no robots.txt."""

    obey_robots = False
    refresh = {"parse_product": REFRESH}


class UnconditionalShop(ConditionalShop):
    conditional_refresh = False


class FlakyShop(ConditionalShop):
    """Fails to parse product 1 the first time (a spider bug fixed between two refreshes)."""

    failures: set[str] = set()

    def parse_product(self, page: Page) -> Any:
        if page.url.endswith("/product/1") and page.url not in self.failures:
            self.failures.add(page.url)
            raise RuntimeError("selector changed")
        yield from super().parse_product(page)


def pending_refreshes(connection: Redis) -> list[DownloadTask]:
    tasks = []
    for member in connection.zrange(keys.recrawls(), 0, -1):
        site, priority, _nonce, entry = member.decode().split("\t", 3)
        tasks.append(DownloadTask.from_entry(site, entry, int(priority)))
    return tasks


def promote_all(connection: Redis, count: int) -> None:
    """Wait for ``count`` refreshes to come due and move them to the frontier (as workers do)."""
    scheduler, deadline, promoted = Scheduler(connection), time.monotonic() + 10, 0
    while promoted < count:
        assert time.monotonic() < deadline, "the refreshes never came due"
        promoted += scheduler.promote_due()
        time.sleep(0.05)


def crawl_twice(
    redis_conn: Redis, settings: Settings, spider: type[DemoShop], between: Any = None
) -> tuple[ShopSite, Store]:
    """Crawl a shop with ETags, then run every product's refresh once; ``between(shop)`` runs in between."""
    spiders = SpiderSet({"demo": spider}, [])
    with (
        ShopSite(products=PRODUCTS, per_page=PRODUCTS, faults=False, etags=True) as shop,
        installed_runtime(redis_conn, settings, spider_set=spiders) as rt,
    ):
        seed(rt.frontier("demo"), [shop.url + "/"])
        run_in_threads(rt)
        if between is not None:
            between(shop)
        promote_all(redis_conn, PRODUCTS)
        run_in_threads(rt)
    shop.base = f"http://{shop.host}:{shop.port}"  # type: ignore[attr-defined]  # url is gone once stopped
    return shop, Store(settings.database_url)


def downloads(store: Store, url: str) -> list[tuple[str, int | None]]:
    rows = store.fetch_rows("demo")
    return [(r["outcome"], r["status"]) for r in rows if r["url"] == url and r["kind"] == "download"]


def parses(store: Store, url: str) -> list[str]:
    return [r["outcome"] for r in store.fetch_rows("demo") if r["url"] == url and r["kind"] == "parse"]


def test_a_recrawl_of_unchanged_pages_gets_304s_and_parses_only_the_changed_one(
    redis_conn: Redis, settings: Settings
) -> None:
    firsts: dict[str, Any] = {}

    def between(shop: ShopSite) -> None:
        store = Store(settings.database_url)
        firsts.update({row["key"]: row for row in store.item_rows("demo")})
        store.close()
        # Every product's refresh carries the ETag its page was served with.
        pending = pending_refreshes(redis_conn)
        assert len(pending) == PRODUCTS and all(t.validators and t.validators[0] for t in pending)
        shop.reprice(2, "1.23")

    shop, store = crawl_twice(redis_conn, settings, ConditionalShop, between)
    try:
        for i in range(1, PRODUCTS + 1):
            url = f"{shop.base}/product/{i}"
            first, again = shop.requests_for(f"/product/{i}")
            assert "if-none-match" not in first.headers and again.headers["if-none-match"].startswith('"')
            if i == 2:  # changed: sent whole, parsed again
                assert (again.status, downloads(store, url), parses(store, url)) == (200, [(OK, 200)] * 2, [OK] * 2)
            else:  # unchanged: 304, no body on the wire, no parse
                assert (again.status, again.sent) == (304, 0)
                assert downloads(store, url) == [(OK, 200), (UNCHANGED, 304)] and parses(store, url) == [OK]
        items = {row["key"]: row for row in store.item_rows("demo")}
        same, changed = items["SKU-00001"], items["SKU-00002"]
        assert same["last_seen"] > firsts["SKU-00001"]["last_seen"] and same["changed"] == same["first_seen"]
        assert same["data"] == firsts["SKU-00001"]["data"]
        assert changed["data"]["price"] == 1.23 and changed["changed"] > changed["first_seen"]
        unchanged = [r for r in store.fetch_rows("demo", UNCHANGED)]
        assert all(r["bytes"] == 0 and r["error"] == "not modified; 1 item(s) seen again" for r in unchanged)
    finally:
        store.close()
    assert redis_conn.hget(keys.stats("demo"), "unchanged") == str(PRODUCTS - 1).encode()
    assert redis_conn.xlen(keys.pages()) == 0  # no page waiting for a parser: 304s hand nothing on
    # One next refresh per page, with the validators of the last answer (the 304's or the new 200's).
    pending = pending_refreshes(redis_conn)
    assert sorted(t.url for t in pending) == sorted(f"{shop.base}/product/{i}" for i in range(1, PRODUCTS + 1))
    assert all(t.validators for t in pending)


def test_a_page_whose_parse_failed_is_refreshed_whole(redis_conn: Redis, settings: Settings) -> None:
    FlakyShop.failures = set()
    shop, store = crawl_twice(redis_conn, settings, FlakyShop)
    try:
        url = f"{shop.base}/product/1"
        first, again = shop.requests_for("/product/1")
        assert "if-none-match" not in again.headers and again.status == 200
        assert parses(store, url) == ["failed", OK] and downloads(store, url) == [(OK, 200)] * 2
        assert [r.status for r in shop.requests_for("/product/3")] == [200, 304]
        assert store.item_rows("demo") and "SKU-00001" in {row["key"] for row in store.item_rows("demo")}
    finally:
        store.close()
    assert redis_conn.scard(keys.parse_failed("demo")) == 0  # parsed since: its validators hold again


def test_conditional_refresh_can_be_turned_off(redis_conn: Redis, settings: Settings) -> None:
    shop, store = crawl_twice(redis_conn, settings, UnconditionalShop)
    store.close()
    for i in range(1, PRODUCTS + 1):
        assert [(r.status, "if-none-match" in r.headers) for r in shop.requests_for(f"/product/{i}")] == [
            (200, False),
            (200, False),
        ]


class _DatedPage(BaseHTTPRequestHandler):
    """One page with a Last-Modified date and no ETag; If-Modified-Since at or after it gets a 304."""

    protocol_version = "HTTP/1.1"
    modified = email.utils.formatdate(1_700_000_000, usegmt=True)
    seen: list[str | None] = []

    def do_GET(self) -> None:
        asked = self.headers.get("If-Modified-Since")
        self.seen.append(asked)
        since = email.utils.parsedate_to_datetime(asked).timestamp() if asked else None
        if since is not None and since >= 1_700_000_000:
            self.send_response(304)
            self.end_headers()
            return
        body = b"<html><h1>Product 1</h1><span class=sku>SKU-1</span><span class=price>2.50</span></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Last-Modified", self.modified)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def dated_page() -> Iterator[str]:
    _DatedPage.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DatedPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/product/1"
    finally:
        server.shutdown()
        server.server_close()


def test_last_modified_alone_makes_the_refresh_ask_if_modified_since(redis_conn: Redis, settings: Settings) -> None:
    spiders = SpiderSet({"demo": ConditionalShop}, [])
    with dated_page() as url, installed_runtime(redis_conn, settings, spider_set=spiders) as rt:
        jobs.download(DownloadTask("demo", url, "parse_product", refresh=60).to_json(), rt=rt)
        (refresh,) = pending_refreshes(redis_conn)
        assert refresh.validators == (None, 1_700_000_000)
        jobs.download(refresh.to_json(), rt=rt)
        records = rt.store.fetch_rows("demo")
    assert _DatedPage.seen == [None, "Tue, 14 Nov 2023 22:13:20 GMT"]
    assert [(r["outcome"], r["status"]) for r in records] == [(OK, 200), (UNCHANGED, 304)]
    (again,) = pending_refreshes(redis_conn)  # the 304 sent no date: the one known is kept
    assert again.validators == (None, 1_700_000_000)


class _CafePage(BaseHTTPRequestHandler):
    """One product page whose ETag is ``"café"`` as raw bytes (``encoding`` of them), never a 304."""

    protocol_version = "HTTP/1.1"
    encoding = "utf-8"
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = b"<html><h1>Product 1</h1><span class=sku>SKU-1</span><span class=price>2.50</span></html>"
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
            + b'ETag: "' + "café".encode(self.encoding) + b'"\r\n'
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )  # fmt: skip
        self.wfile.write(head + body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def cafe_page(encoding: str) -> Iterator[str]:
    _CafePage.seen, _CafePage.encoding = [], encoding
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CafePage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/product/1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("encoding", ["latin-1", "utf-8"])
def test_a_non_ascii_etag_is_not_kept_and_the_refresh_is_sent_without_it(
    redis_conn: Redis, settings: Settings, encoding: str
) -> None:
    """Kept, ``"café"`` went back as If-None-Match: httpx refused it, the refresh job raised
    before sending, no fetch record was written and the page's refreshes ended."""
    spiders = SpiderSet({"demo": ConditionalShop}, [])
    with cafe_page(encoding) as url, installed_runtime(redis_conn, settings, spider_set=spiders) as rt:
        jobs.download(DownloadTask("demo", url, "parse_product", refresh=60).to_json(), rt=rt)
        (refresh,) = pending_refreshes(redis_conn)
        assert refresh.validators is None  # nothing that could be sent back
        jobs.download(refresh.to_json(), rt=rt)
        records = rt.store.fetch_rows("demo")
    assert len(_CafePage.seen) == 2 and "if-none-match" not in _CafePage.seen[1]
    assert [(r["outcome"], r["status"], r["url"]) for r in records] == [(OK, 200, url)] * 2
    (again,) = pending_refreshes(redis_conn)  # its refreshes go on
    assert again.url == url


def test_a_refresh_holding_a_non_ascii_etag_from_before_is_sent_without_it(
    redis_conn: Redis, settings: Settings
) -> None:
    """A refresh entry written by an older version (or by hand) with ``"café"``: the refresh still goes."""
    spiders = SpiderSet({"demo": ConditionalShop}, [])
    with dated_page() as url, installed_runtime(redis_conn, settings, spider_set=spiders) as rt:
        old = DownloadTask("demo", url, "parse_product", refresh=60, validators=('"café"', 1_700_000_000))
        jobs.download(DownloadTask.from_entry("demo", old.to_entry()).to_json(), rt=rt)
        records = rt.store.fetch_rows("demo")
    assert _DatedPage.seen == ["Tue, 14 Nov 2023 22:13:20 GMT"]  # the date alone
    assert [(r["outcome"], r["status"]) for r in records] == [(UNCHANGED, 304)]


class _NonAsciiAgent(ConditionalShop):
    user_agent = "crawlér/1.0"


def test_a_request_that_cannot_be_built_is_a_recorded_failure_not_a_lost_page(
    redis_conn: Redis, settings: Settings
) -> None:
    """Any error building the request (here a User-Agent httpx refuses) is written as the page's failure."""
    spiders = SpiderSet({"demo": _NonAsciiAgent}, [])
    with dated_page() as url, installed_runtime(redis_conn, settings, spider_set=spiders) as rt:
        jobs.download(DownloadTask("demo", url, "parse_product", refresh=60, validators=(None, 5)).to_json(), rt=rt)
        (record,) = rt.store.fetch_rows("demo")
        failed = failed_pages(rt.store, "demo")
    assert _DatedPage.seen == []  # nothing was sent
    assert (record["outcome"], record["status"]) == (FAILED, None)
    assert record["error"].startswith("request cannot be built: UnicodeEncodeError")
    assert [page.url for page in failed] == [url]  # listed by `crawler failed`, for `crawler retry`
    (again,) = pending_refreshes(redis_conn)  # and its refreshes go on, asking for the whole page
    assert (again.url, again.validators) == (url, None)


def test_validators_are_read_from_headers_and_sent_back() -> None:
    headers = {"etag": 'W/"abc"', "last-modified": "Tue, 14 Nov 2023 22:13:20 GMT"}
    assert validators_of(headers) == ('W/"abc"', 1_700_000_000)
    assert request_headers(validators_of(headers)) == {
        "if-none-match": 'W/"abc"',
        "if-modified-since": "Tue, 14 Nov 2023 22:13:20 GMT",
    }
    assert validators_of({}) is None and request_headers(None) == {}
    assert validators_of({"last-modified": "yesterday"}) is None
    assert validators_of({"etag": '"new"'}, previous=('"old"', 5)) == ('"new"', 5)
    assert validators_of({"etag": "x" * 1000}) is None
    assert validators_of({"etag": '"café"'}) is None and validators_of({"etag": '"a b"'}) is None
    assert validators_of({"etag": '"café"'}, previous=('"old"', None)) == ('"old"', None)
    assert validators_of({"last-modified": "Tue, 14 Nov 2023 22:13:20 GMTé"}) is None
    assert request_headers(('"café"', None)) == {}


@pytest.mark.parametrize("bad", [["a"], ["", None], [None, -1], [None, "soon"], ["x\ny", None], "etag"])
def test_malformed_validators_make_a_malformed_task(bad: Any) -> None:
    with pytest.raises(ValueError):
        check_validators(bad)
    with pytest.raises(ValueError):
        DownloadTask.from_json({"site": "s", "url": "http://x.example/", "validators": bad})


def test_validators_ride_in_the_refresh_entry_compactly() -> None:
    task = DownloadTask("s", "http://x.example/p", refresh=60, validators=('"e1"', 1_700_000_000))
    entry = task.to_entry()
    assert entry == '["http://x.example/p","parse",0,0,1,{},60,["\\"e1\\"",1700000000]]'
    assert decode_entry(entry)["validators"] == ['"e1"', 1_700_000_000]
    assert DownloadTask.from_entry("s", entry) == task
    assert DownloadTask("s", "http://x.example/p").to_entry() == '["http://x.example/p"]'


def test_a_database_from_before_gets_the_page_index(sqlite_url: str) -> None:
    from sqlalchemy import text

    Store(sqlite_url).close()
    store = Store(sqlite_url)
    with store.engine.begin() as conn:  # as version 3 left it (the page index is on the URL's hash since 5)
        conn.execute(text("DROP INDEX items_site_url_hash"))
        conn.execute(text("DELETE FROM crawler_schema WHERE version >= 4"))
    store.close()
    store = Store(sqlite_url)
    try:
        assert "items_site_url_hash" in {i["name"] for i in inspect(store.engine).get_indexes("items")}
    finally:
        store.close()
