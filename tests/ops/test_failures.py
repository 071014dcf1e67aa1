"""Failed pages are visible (``crawler failed``) and retryable (``crawler retry``).

The store query on SQLite and PostgreSQL; the commands in-process with CliRunner
against the session's Redis; and end to end, a real crawl of the demo shop with worker
threads, its failures listed, fixed, retried and gone, each item stored once.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error, installed_runtime, run_in_threads
from redis import Redis

from crawler.cli.app import cli
from crawler.coord import keys
from crawler.coord.frontier import DownloadTask, Frontier, seed
from crawler.coord.task import fingerprint
from crawler.demo import ShopSite
from crawler.demo.shop import BROKEN_ID
from crawler.errors import ConfigError
from crawler.ops.failures import FailedPage, failed_pages, retry_pages
from crawler.settings import Settings
from crawler.store.database import FAILED, OK, REDIRECT, REFUSED, RETRY, SKIPPED, FetchRecord, Store
from crawler.work import jobs
from crawler.work.runtime import Runtime

SHOP = "http://127.0.0.1:9"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/work/crawler/jobs.py", line 210, in parse\n'
    "    for output in callback(page) or ():\n"
    '  File "sites/shop.py", line 12, in parse_product\n'
    "    price = float(page.text('.price'))\n"
    "ValueError: could not convert string to float: ''\n"
)

Invoke = Callable[..., Result]


# -- helpers ------------------------------------------------------------------------


class Records:
    """Writes fetch records in order, one second apart, as workers would."""

    def __init__(self, store: Store, site: str = "demo"):
        self.store = store
        self.site = site
        self.clock = datetime(2025, 1, 1, tzinfo=UTC)

    def add(
        self,
        path: str,
        outcome: str,
        kind: str = "download",
        status: int | None = None,
        error: str | None = None,
        callback: str | None = "parse_product",
        attempt: int = 1,
        meta: dict | None = None,
        request: dict | None = None,
    ) -> None:
        self.clock += timedelta(seconds=1)
        self.store.record_fetches(
            [
                FetchRecord(
                    site=self.site,
                    url=SHOP + path,
                    outcome=outcome,
                    kind=kind,
                    status=status,
                    error=error,
                    callback=callback,
                    attempt=attempt,
                    started=self.clock,
                    finished=self.clock,
                    meta=meta,
                    request=request,
                )
            ]
        )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url")
    store = Store(url)
    yield store
    store.close()


@pytest.fixture
def invoke(redis_url: str, redis_conn: Redis, settings: Settings) -> Invoke:
    """Runs a command on this test's Redis, database (``settings``') and sites directory."""
    base = ["--redis-url", redis_url, "--database-url", settings.database_url, "--sites", settings.sites_dir]
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(cli, [*base, *args], env={"COLUMNS": "250"})

    return run


def failed_json(invoke: Invoke, *args: str) -> list[dict]:
    result = invoke("failed", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def queued_tasks(connection: Redis, site: str = "demo") -> list[DownloadTask]:
    return Frontier(connection, site, [], 0, 0).waiting()


def stored_items(store: Store, site: str) -> dict[str, dict]:
    rows = list(store.items(site))
    by_sku = {row["sku"]: row for row in rows}
    assert len(by_sku) == len(rows), "an item was stored twice"
    return by_sku


# -- the store query, on SQLite and PostgreSQL --------------------------------------------


def test_download_that_failed_then_succeeded_is_not_listed(store: Store) -> None:
    records = Records(store)
    records.add("/product/1", FAILED, status=500, error="HTTP 500 (gave up after 4 attempts)", attempt=4)
    records.add("/product/1", OK, status=200)
    records.add("/product/1", OK, kind="parse", status=200)
    records.add("/product/2", RETRY, status=503, error="HTTP 503; retry in 1s")
    records.add("/product/2", FAILED, status=503, error="HTTP 503 (gave up after 4 attempts)", attempt=4)

    (row,) = store.failed_pages("demo")
    assert (row["url"], row["kind"], row["status"], row["attempt"]) == (SHOP + "/product/2", "download", 503, 4)


def test_parse_failure_is_listed_with_its_traceback_and_the_exception_as_reason(store: Store) -> None:
    records = Records(store)
    records.add("/product/3", OK, status=200)
    records.add("/product/3", FAILED, kind="parse", status=200, error=TRACEBACK)

    (page,) = failed_pages(store, "demo")
    assert (page.url, page.kind, page.callback) == (SHOP + "/product/3", "parse", "parse_product")
    assert page.error == TRACEBACK
    assert page.reason == "ValueError: could not convert string to float: ''"


def test_refused_and_skipped_pages_are_not_failures(store: Store) -> None:
    records = Records(store)
    records.add("/private/admin", REFUSED, error="disallowed by robots.txt")
    records.add("/catalogue.pdf", SKIPPED, status=200, error="not HTML (application/pdf)")
    records.add("/old/product/5", REDIRECT, status=301, error="redirect to /product/5")
    assert store.failed_pages("demo") == []


def test_latest_record_wins_across_download_and_parse(store: Store) -> None:
    records = Records(store)
    # Parse failed, then a retry's download failed for good: listed, as the download.
    records.add("/product/4", OK, status=200)
    records.add("/product/4", FAILED, kind="parse", error=TRACEBACK)
    records.add("/product/4", FAILED, status=500, error="HTTP 500 (gave up after 4 attempts)")
    # Parse failed, then a retry downloaded the page again: not failed (its parse is pending).
    records.add("/product/5", OK, status=200)
    records.add("/product/5", FAILED, kind="parse", error=TRACEBACK)
    records.add("/product/5", OK, status=200)
    # Download failed, then a later parse (of an earlier download) failed: listed, as the parse.
    records.add("/product/6", FAILED, status=404, error="HTTP 404")
    records.add("/product/6", FAILED, kind="parse", error=TRACEBACK)

    rows = store.failed_pages("demo")
    assert [(r["url"], r["kind"], r["status"]) for r in rows] == [
        (SHOP + "/product/4", "download", 500),
        (SHOP + "/product/6", "parse", None),
    ]


def test_failed_pages_of_one_site_or_all_with_a_limit_and_by_url(store: Store) -> None:
    Records(store, "demo").add("/product/1", FAILED, status=404)
    Records(store, "other").add("/a", FAILED, status=500)
    Records(store, "demo").add("/product/2", FAILED, status=404)

    assert [(r["site"], r["url"]) for r in store.failed_pages()] == [
        ("demo", SHOP + "/product/1"),
        ("demo", SHOP + "/product/2"),
        ("other", SHOP + "/a"),
    ]
    assert [r["url"] for r in store.failed_pages("demo", limit=1)] == [SHOP + "/product/1"]
    assert [r["url"] for r in store.failed_pages("demo", urls=[SHOP + "/product/2", SHOP + "/a"])] == [
        SHOP + "/product/2"
    ]


def test_reason_of_a_failure_without_error_text_is_its_status() -> None:
    page = FailedPage("demo", SHOP, "download", 500, 1, datetime.now(UTC), None, None)
    assert page.reason == "HTTP 500"
    assert (
        FailedPage("demo", SHOP, "download", None, 1, datetime.now(UTC), "timed out\nmore", None).reason == "timed out"
    )


# -- the commands ---------------------------------------------------------------------------


@pytest.fixture
def records(settings: Settings) -> Iterator[Records]:
    store = Store(settings.database_url)
    yield Records(store)
    store.close()


def test_failed_lists_each_failed_page_with_its_reason(invoke: Invoke, records: Records) -> None:
    records.add("/product/7", FAILED, status=500, error="HTTP 500 (gave up after 4 attempts)", attempt=4)
    records.add("/product/8", OK, status=200)
    records.add("/product/8", FAILED, kind="parse", status=200, error=TRACEBACK)
    records.add("/private/admin", REFUSED, error="disallowed by robots.txt")

    result = invoke("failed", "demo")

    assert result.exit_code == 0, result.output
    (row7,) = [line for line in result.stdout.splitlines() if "/product/7" in line]
    assert "download" in row7 and "500" in row7 and "HTTP 500 (gave up after 4 attempts)" in row7
    (row8,) = [line for line in result.stdout.splitlines() if "/product/8" in line]
    assert "parse" in row8 and "ValueError: could not convert string to float" in row8
    assert "admin" not in result.stdout and "Traceback" not in result.stdout

    full = invoke("failed", "--traceback")
    assert full.exit_code == 0, full.output
    assert TRACEBACK.strip() in full.stdout


def test_failed_json_has_every_field_and_the_full_error(invoke: Invoke, records: Records) -> None:
    records.add("/product/8", FAILED, kind="parse", status=200, error=TRACEBACK)
    (page,) = failed_json(invoke, "demo")
    assert page["url"] == SHOP + "/product/8"
    assert (page["kind"], page["status"], page["attempt"], page["callback"]) == ("parse", 200, 1, "parse_product")
    assert page["error"] == TRACEBACK
    assert page["reason"] == "ValueError: could not convert string to float: ''"
    assert datetime.fromisoformat(page["finished"]) == records.clock  # UTC, zone included


def test_failed_with_no_failures_says_so(invoke: Invoke, records: Records) -> None:
    records.add("/product/1", OK, status=200)
    result = invoke("failed")
    assert (result.exit_code, result.stdout.strip()) == (0, "no failed pages")
    assert failed_json(invoke) == []


def test_failed_limit_shows_the_first_pages_and_says_there_may_be_more(invoke: Invoke, records: Records) -> None:
    for n in range(1, 4):
        records.add(f"/product/{n}", FAILED, status=404)
    result = invoke("failed", "demo", "--limit", "2", "--json")
    assert [p["url"] for p in json.loads(result.stdout)] == [SHOP + "/product/1", SHOP + "/product/2"]
    assert "--limit" in result.stderr


def test_failed_for_an_unknown_site_is_one_line_error(invoke: Invoke) -> None:
    assert_one_line_error(invoke("failed", "nosuch"), "unknown site 'nosuch'")


def test_retry_all_requeues_failed_pages_with_their_callback_past_the_seen_set(
    invoke: Invoke, records: Records, redis_conn: Redis
) -> None:
    records.add(
        "/product/7", FAILED, status=500, error="HTTP 500 (gave up after 4 attempts)", meta={"category": "books"}
    )
    records.add("/", FAILED, kind="parse", error=TRACEBACK, callback=None)  # an old record: no callback
    records.add("/product/8", OK, status=200)
    for path in ("/product/7", "/", "/product/8"):  # as the crawl left them: seen
        redis_conn.sadd(keys.seen("demo"), fingerprint(SHOP + path))

    result = invoke("retry", "demo", "--all")

    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "demo: 2 failed pages requeued"
    assert sorted((t.url, t.callback, t.attempt, t.meta) for t in queued_tasks(redis_conn)) == [
        (SHOP + "/", "parse", 1, {}),
        (SHOP + "/product/7", "parse_product", 1, {"category": "books"}),
    ]


def test_retry_twice_queues_each_page_once_until_it_fails_again(
    invoke: Invoke, records: Records, redis_conn: Redis
) -> None:
    records.add("/product/7", FAILED, status=500)
    records.add("/product/9", FAILED, status=500)
    assert invoke("retry", "demo", "--all").stdout.strip() == "demo: 2 failed pages requeued"

    again = invoke("retry", "demo", "--all")
    named = invoke("retry", "demo", SHOP + "/product/7")  # requeued already: not an error, not queued again

    assert again.exit_code == 0 and again.stdout.strip() == "demo: 0 failed pages requeued", again.output
    assert named.exit_code == 0 and named.stdout.strip() == "demo: 0 failed pages requeued", named.output
    assert sorted(t.url for t in queued_tasks(redis_conn)) == [SHOP + "/product/7", SHOP + "/product/9"]
    assert invoke("failed", "demo").stdout.strip() == "no failed pages"  # requeued, not failed
    records.add("/product/9", FAILED, status=500)  # fetched again, failed again: listed and retryable again
    assert [p["url"] for p in failed_json(invoke, "demo")] == [SHOP + "/product/9"]
    assert invoke("retry", "demo", "--all").stdout.strip() == "demo: 1 failed page requeued"


def test_retry_of_named_urls_requeues_only_those(invoke: Invoke, records: Records, redis_conn: Redis) -> None:
    records.add("/product/7", FAILED, status=500)
    records.add("/product/9", FAILED, status=500)
    # Spelled differently from the record: looked up by its canonical form.
    result = invoke("retry", "demo", SHOP + "/product/9#reviews")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "demo: 1 failed page requeued"
    assert [(t.url, t.callback) for t in queued_tasks(redis_conn)] == [(SHOP + "/product/9", "parse_product")]


def test_retry_of_a_url_that_did_not_fail_is_one_line_error_and_queues_nothing(
    invoke: Invoke, records: Records, redis_conn: Redis
) -> None:
    records.add("/product/7", FAILED, status=500)
    records.add("/product/8", FAILED, status=500)
    records.add("/product/8", OK, status=200)

    result = invoke("retry", "demo", SHOP + "/product/7", SHOP + "/product/8")

    assert_one_line_error(result, "not a failed page", SHOP + "/product/8")
    assert not queued_tasks(redis_conn)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["retry", "demo"], "--all"),
        (["retry", "demo", "--all", SHOP + "/product/7"], "not both"),
        (["retry", "nosuch", "--all"], "unknown site 'nosuch'"),
    ],
    ids=["neither", "both", "unknown-site"],
)
def test_retry_without_a_clear_choice_is_one_line_error(
    invoke: Invoke, records: Records, redis_conn: Redis, args: list[str], fragment: str
) -> None:
    records.add("/product/7", FAILED, status=500)
    assert_one_line_error(invoke(*args), fragment)
    assert not queued_tasks(redis_conn)


def test_retry_pages_refuses_a_page_now_outside_the_allowed_domains(runtime: Runtime) -> None:
    runtime.store.record_fetches(
        [
            FetchRecord(
                site="demo",
                url="http://elsewhere.example/",
                outcome=FAILED,
                started=datetime.now(UTC),
                finished=datetime.now(UTC),
            )
        ]
    )
    with pytest.raises(ConfigError, match="cannot requeue http://elsewhere.example/"):
        retry_pages(runtime.store, runtime.frontier("demo"))
    assert not queued_tasks(runtime.connection)


def test_retry_sends_a_failed_post_again_as_that_post_and_refuses_a_recorded_request_that_does_not_hold(
    invoke: Invoke, records: Records, redis_conn: Redis
) -> None:
    post = {"method": "POST", "headers": {"X-Api-Key": "k"}, "body": '{"page":2}'}
    records.add("/api/items", FAILED, status=500, callback="parse_items", request=post)
    records.add("/api/binary", FAILED, status=500, request={"method": "PUT", "body64": "AAEC"})

    assert invoke("retry", "demo", "--all").stdout.strip() == "demo: 2 failed pages requeued"

    queued = {t.url: (t.method, t.headers, t.body, t.callback) for t in queued_tasks(redis_conn)}
    assert queued == {
        SHOP + "/api/items": ("POST", {"X-Api-Key": "k"}, b'{"page":2}', "parse_items"),
        SHOP + "/api/binary": ("PUT", {}, b"\x00\x01\x02", "parse_product"),
    }
    records.add("/api/odd", FAILED, status=500, request={"method": "PO ST"})  # written by someone else
    result = invoke("retry", "demo", "--all")
    assert_one_line_error(result, "cannot requeue " + SHOP + "/api/odd: its recorded request does not hold")
    assert len(queued_tasks(redis_conn)) == 2


def test_a_post_that_failed_is_recorded_with_its_request_but_not_its_credentials(
    runtime: Runtime, redis_conn: Redis, invoke: Invoke
) -> None:
    """The fetch record keeps what ``crawler retry`` needs to send the request again, as it was;
    Authorization, Proxy-Authorization and Cookie stay out of the database."""
    bodies: list[bytes] = []

    class Refusing(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # robots.txt: none
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.do_GET()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api/items"
        headers = {"X-Api-Key": "k", "Authorization": "Bearer secret", "Cookie": "session=secret"}
        task = DownloadTask("demo", url, "parse_items", method="POST", headers=headers, body=b'{"page":3}')
        for _ in range(2):  # robots.txt may take the site's turn first, the page put back for the next
            jobs.download(task.to_json(), rt=runtime)
            if bodies:
                break
        assert bodies == [b'{"page":3}']
    finally:
        server.shutdown()
        server.server_close()

    (page,) = failed_json(invoke, "demo")
    assert (page["url"], page["status"]) == (url, 404)
    assert page["request"] == {"method": "POST", "headers": {"X-Api-Key": "k"}, "body": '{"page":3}'}
    assert "secret" not in json.dumps(page)
    assert invoke("retry", "demo", "--all").exit_code == 0
    (again,) = [t for t in queued_tasks(redis_conn) if t.url == url]
    assert (again.method, again.body, again.headers) == ("POST", b'{"page":3}', {"X-Api-Key": "k"})


# -- end to end: a real crawl, its failures fixed and retried -------------------------------


def test_server_error_page_is_listed_then_retried_once_fixed_and_stored_once(
    runtime: Runtime, redis_conn: Redis, invoke: Invoke
) -> None:
    with ShopSite(products=20) as shop:
        seed(runtime.frontier("demo"), [shop.url + "/"])
        run_in_threads(runtime, ("demo",))

        broken = f"{shop.url}/product/{BROKEN_ID}"
        pages = {p["url"]: p for p in failed_json(invoke, "demo")}
        assert set(pages) == {broken, f"{shop.url}/missing"}
        assert (pages[broken]["kind"], pages[broken]["status"]) == ("download", 500)
        assert pages[broken]["attempt"] == runtime.settings.max_retries + 1
        listing = invoke("failed", "demo")
        (row,) = [line for line in listing.stdout.splitlines() if f"/product/{BROKEN_ID}" in line]
        assert "500" in row and "HTTP 500" in row

        shop.faults = False  # the shop is fixed: product 7 answers now (/missing stays a 404)
        result = invoke("retry", "demo", "--all")
        assert result.stdout.strip() == "demo: 2 failed pages requeued"
        run_in_threads(runtime, ("demo",))

        assert stored_items(runtime.store, "demo") == shop.expected_items()  # product 7 included, once
        assert len(shop.expected_items()) == 20
        assert [p["url"] for p in failed_json(invoke, "demo")] == [f"{shop.url}/missing"]
        assert [e.status for e in shop.requests_for(f"/product/{BROKEN_ID}")][-1] == 200
        (status,) = json.loads(invoke("status", "demo", "--json").stdout)["sites"]
        assert status["failed"] == 1  # /missing failed again; product 7 no longer counts


FLAKY_SPIDER = '''
from pathlib import Path

from crawler.demo.spider import DemoShop

BUG = Path({flag!r})


class FlakyShop(DemoShop):
    """The demo spider with a bug on one product page, while the flag file exists."""

    name = "flaky"

    def parse_product(self, page):
        if BUG.exists() and page.url.endswith("/product/{bad}"):
            raise ValueError("flaky spider cannot parse this product")
        yield from super().parse_product(page)
'''


def test_callback_that_raised_is_listed_with_its_exception_then_retried_and_gone(
    redis_conn: Redis, invoke: Invoke, settings: Settings, tmp_path: Path
) -> None:
    bad, flag = 4, tmp_path / "bug"
    flag.touch()
    Path(settings.sites_dir, "flaky.py").write_text(FLAKY_SPIDER.format(flag=str(flag), bad=bad))
    with ShopSite(products=20, faults=False) as shop, installed_runtime(redis_conn, settings) as runtime:
        seed(runtime.frontier("flaky"), [shop.url + "/"])
        run_in_threads(runtime, ("flaky",))

        assert len(stored_items(runtime.store, "flaky")) == 19  # the crawl went on past the bug
        (page,) = failed_json(invoke, "flaky")
        assert (page["url"], page["kind"], page["callback"]) == (f"{shop.url}/product/{bad}", "parse", "parse_product")
        assert page["reason"] == "ValueError: flaky spider cannot parse this product"
        assert page["error"].startswith("Traceback") and "parse_product" in page["error"]

        flag.unlink()  # the spider is fixed
        result = invoke("retry", "flaky", f"{shop.url}/product/{bad}")
        assert result.stdout.strip() == "flaky: 1 failed page requeued"
        run_in_threads(runtime, ("flaky",))

        assert stored_items(runtime.store, "flaky") == shop.expected_items()
        assert invoke("failed", "flaky").stdout.strip() == "no failed pages"
        assert invoke("failed").stdout.strip() == "no failed pages"
        assert len(shop.requests_for(f"/product/{bad}")) == 2  # fetched again once, by the retry


POSTER_SPIDER = '''
from pathlib import Path

from crawler import Request, Spider

BUG = Path({flag!r})


class Poster(Spider):
    """POSTs a JSON query; its callback has a bug while the flag file exists."""

    name = "poster"
    allowed_domains = ["127.0.0.1"]
    interval = 0.01
    content_types = ["application/json"]
    item_key = "query"

    def start_requests(self):
        yield Request({base!r} + "/api/search", callback="parse_api", method="POST",
                      json={{"query": "café", "page": 2}}, headers={{"X-Api-Key": "k"}}, meta={{"page": 2}})
        yield Request({base!r} + "/api/form", callback="parse_api", method="POST",
                      form={{"query": "tea", "page": "3"}}, meta={{"page": 3}})

    def parse_api(self, page):
        if BUG.exists():
            raise ValueError("parse_api cannot read this answer")
        yield {{"query": page.json()["query"], "page": page.meta["page"], "method": page.request.method}}
'''


class _Api(BaseHTTPRequestHandler):
    """POST /api/*: answers the query it was sent (as JSON) once ``failing`` is off, a 500 before."""

    failing = True
    arrived: list[tuple[str, str, str | None, str | None, bytes]] = []

    def do_GET(self) -> None:  # noqa: N802  # http.server's name; robots.txt: none
        self._answer(404, b"")

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        kind = self.headers.get("Content-Type")
        _Api.arrived.append((self.command, self.path, kind, self.headers.get("X-Api-Key"), body))
        if _Api.failing:
            self._answer(500, b"down")
            return
        query = json.loads(body)["query"] if kind == "application/json" else body.decode().split("&")[0][6:]
        self._answer(200, json.dumps({"query": query}).encode(), "application/json")

    def _answer(self, status: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_failed_post_is_retried_and_arrives_as_the_same_post_with_its_meta(
    redis_conn: Redis, invoke: Invoke, settings: Settings, tmp_path: Path
) -> None:
    _Api.failing, _Api.arrived = True, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base, flag = f"http://127.0.0.1:{server.server_address[1]}", tmp_path / "bug"
    flag.touch()
    Path(settings.sites_dir, "poster.py").write_text(POSTER_SPIDER.format(base=base, flag=str(flag)))
    json_post = ("POST", "/api/search", "application/json", "k", '{"query":"café","page":2}'.encode())
    form_post = ("POST", "/api/form", "application/x-www-form-urlencoded", None, b"query=tea&page=3")
    try:  # one automatic retry (the same POST again too), not three backoffs
        with installed_runtime(redis_conn, dataclasses.replace(settings, max_retries=1)) as runtime:
            assert invoke("seed", "poster").exit_code == 0
            run_in_threads(runtime, ("poster",))
            assert {(p["url"], p["kind"], p["status"]) for p in failed_json(invoke, "poster")} == {
                (base + "/api/search", "download", 500),
                (base + "/api/form", "download", 500),
            }
            assert set(_Api.arrived) == {json_post, form_post}

            _Api.failing, _Api.arrived = False, []  # the server is fixed; the spider is not yet
            assert invoke("retry", "poster", "--all").stdout.strip() == "poster: 2 failed pages requeued"
            run_in_threads(runtime, ("poster",))
            assert sorted(_Api.arrived) == sorted([json_post, form_post])  # the same POSTs, not GETs
            assert {(p["url"], p["kind"]) for p in failed_json(invoke, "poster")} == {
                (base + "/api/search", "parse"),
                (base + "/api/form", "parse"),
            }

            flag.unlink()  # the spider is fixed: a retry of a failed parse is the same POST again
            _Api.arrived = []
            assert invoke("retry", "poster", "--all").exit_code == 0
            run_in_threads(runtime, ("poster",))
            assert sorted(_Api.arrived) == sorted([json_post, form_post])
            assert {row["query"]: row for row in runtime.store.items("poster")} == {
                "café": {"query": "café", "page": 2, "method": "POST"},
                "tea": {"query": "tea", "page": 3, "method": "POST"},
            }
            assert invoke("failed", "poster").stdout.strip() == "no failed pages"
    finally:
        server.shutdown()
        server.server_close()
