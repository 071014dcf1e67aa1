"""The job functions, called directly (no worker) on single URLs of a real loopback shop.

Each test pins one outcome of ``crawler.work.jobs.download`` / ``crawler.work.parse_job.parse``: what
is recorded in the database and what is left in Redis (pages to parse, retries).
"""

from __future__ import annotations

import pickle
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from crawler.coord import keys, pages, quarantine
from crawler.coord.frontier import DownloadTask, Frontier
from crawler.coord.gate import EXPIRY_TICK, Gate
from crawler.coord.policy import set_live
from crawler.coord.task import fingerprint
from crawler.coord.vetting import DOWNLOAD_FUNC, page_entry
from crawler.demo import ShopSite
from crawler.http.addresses import is_public_address, redirects_inward
from crawler.http.fetch import Fetcher
from crawler.spiders.spider import Request
from crawler.store.database import FAILED, OK, REDIRECT, RETRY, SKIPPED
from crawler.work import gated_fetch, jobs, parse_job
from crawler.work.download_worker import DownloadWorker
from crawler.work.jobs import outcomes, state
from crawler.work.robots import origin_of
from crawler.work.runtime import Runtime

SITE = "demo"


# -- helpers ------------------------------------------------------------------------


def payload(url: str, callback: str = "parse", **fields: Any) -> dict[str, Any]:
    return DownloadTask(SITE, url, callback, **fields).to_json()


class Backlog:
    """Everything queued for the site: compact frontier entries, then RQ download jobs."""

    def __init__(self, connection: Redis):
        self.connection = connection
        self.queue = Queue(keys.download_queue(SITE), connection=connection, serializer=JSONSerializer)

    def payloads(self) -> list[dict[str, Any]]:
        waiting = Frontier(self.connection, SITE, [], 0, 0).waiting()
        return [task.to_json() for task in waiting] + queued_payloads(self.queue)

    @property
    def count(self) -> int:
        return len(self.payloads())

    def take_only(self) -> dict[str, Any]:
        (only,) = self.payloads()
        for priority in self.connection.zrange(keys.levels(SITE), 0, -1):
            self.connection.delete(keys.frontier(SITE, int(priority)))
        self.connection.delete(keys.levels(SITE))
        self.queue.empty()
        return only


def download_queue(connection: Redis) -> Backlog:
    return Backlog(connection)


def download_past_robots(rt: Runtime, task: dict[str, Any]) -> None:
    """``jobs.download(task)``, and once more if robots.txt took the site's turn and the page went back to
    its frontier for the next (``Attempt.next_turn_near``: the Redirector's Crawl-delay of 2 s)."""
    jobs.download(task, rt=rt)
    backlog = Backlog(rt.connection)
    if [p["url"] for p in backlog.payloads()] == [task["url"]]:
        jobs.download(backlog.take_only(), rt=rt)  # waits here for the gate, as a job handed out at its turn would not


def pages_waiting(connection: Redis) -> int:
    """Entries in the pages stream: pages waiting for a parse worker or being parsed."""
    return int(connection.xlen(keys.pages()))


def read_page(connection: Redis) -> tuple[str, dict[str, Any], bytes]:
    """Read the only page entry as a parse worker does: its id, its parse task, its compressed body."""
    pages.ensure_group(connection)
    ((_, ((entry_id, fields),)),) = connection.xreadgroup(keys.PARSERS, "test", {keys.pages(): ">"}, count=10)
    task, body = page_entry(fields)
    return entry_id.decode(), task, body


def queued_payloads(queue: Queue | Backlog) -> list[dict[str, Any]]:
    if isinstance(queue, Backlog):
        return queue.payloads()
    return [p for job in queue.get_jobs() for p in job.args]


def records(rt: Runtime, url: str, kind: str = "download") -> list[dict[str, Any]]:
    return [r for r in rt.store.fetch_rows(SITE) if r["url"] == url and r["kind"] == kind]


def stats(rt: Runtime) -> dict[str, int]:
    """The site's stats hash once ``rt``'s counts are written (``counters``)."""
    rt.counters.flush()
    return {k.decode(): int(v) for k, v in rt.connection.hgetall(keys.stats(SITE)).items()}


def take_next(queue: Queue | Backlog) -> dict[str, Any]:
    """Remove the only job from ``queue`` and return its payload."""
    if isinstance(queue, Backlog):
        return queue.take_only()
    (job,) = queue.get_jobs()
    job.delete()
    return job.args[0]


class Redirector:
    """A loopback server of redirects: /away and /offdomain leave the allowed domains, /inside goes
    to the name inside.test, /hop/N goes to /hop/N+1; /stub is a page whose meta refresh goes to
    /landing at once, /stub-away one whose goes off the allowed domains, /reload one that
    refreshes itself every 300 s."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        #: Status of /robots.txt (200: a Crawl-delay of 2 s).
        self.robots_status = 200
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner.paths.append(self.path)
                if self.path == "/robots.txt" and owner.robots_status != 200:
                    self._send(owner.robots_status)
                elif self.path == "/robots.txt":
                    body = b"User-agent: *\nCrawl-delay: 2\n"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path == "/down":
                    self._send(500)
                elif self.path == "/drip":
                    self._drip()
                elif self.path == "/away":
                    self._send(301, "http://offsite.invalid/landing")
                elif self.path == "/offdomain":
                    self._send(302, "http://some-name.invalid-offdomain.example/")
                elif self.path == "/inside":
                    self._send(302, f"http://inside.test:{self.server.server_address[1]}/landing")
                elif self.path.startswith("/hop/"):
                    self._send(302, f"/hop/{int(self.path.rsplit('/', 1)[1]) + 1}")
                elif self.path in ("/stub", "/reload", "/stub-away"):
                    refresh = {
                        "/stub": "0;URL=landing",
                        "/reload": "300",
                        "/stub-away": "0;URL=http://offsite.invalid/",
                    }
                    refresh = refresh[self.path]
                    self._page(f'<html><head><meta http-equiv="refresh" content="{refresh}"></head></html>')
                else:
                    self._send(404)

            def _drip(self) -> None:
                """The status line and headers one byte every 0.2 s (25 s in all, unless the client hangs up)."""
                try:
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Pad: " + b"p" * 80:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.2)
                except OSError:
                    self.close_connection = True

            def _page(self, html: str) -> None:
                body = html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _send(self, status: int, location: str | None = None) -> None:
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> Redirector:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def redirector() -> Iterator[Redirector]:
    with Redirector() as server:
        yield server


# -- download -------------------------------------------------------------------------


def test_html_page_adds_one_page_entry_with_its_task_and_compressed_body(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    url = f"{shop.url}/product/1"
    jobs.download(payload(url, "parse_product", meta={"from": "test"}, depth=2), rt=runtime)

    ((_, fields),) = redis_conn.xrange(keys.pages())
    assert set(fields) == {b"task", b"body"}  # the body travels with its task: no key of its own, no RQ job
    task, compressed = page_entry(fields)
    assert (task["site"], task["url"], task["callback"], task["meta"], task["depth"], task["status"]) == (
        SITE,
        url,
        "parse_product",
        {"from": "test"},
        2,
        200,
    )
    assert task["headers"]["content-type"].startswith("text/html")
    body = zlib.decompress(compressed)
    assert b'<span class="sku">SKU-00001</span>' in body
    assert (
        redis_conn.keys(Queue.redis_queue_namespace_prefix + "parse*") == [] and redis_conn.keys("crawler:body:*") == []
    )

    (record,) = records(runtime, url)
    assert (record["outcome"], record["status"], record["bytes"], record["attempt"]) == (OK, 200, len(body), 1)
    assert [e.path for e in shop.requests] == ["/robots.txt", "/product/1"]
    assert stats(runtime)["fetched"] == 1


def test_only_a_page_that_is_refreshed_clears_its_parse_failure_mark(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    # The mark is read only for refreshes (``attempt._conditional_headers``): other pages spare the SREM.
    for refresh, left in ((None, 1), (3600.0, 0)):
        url = f"{shop.url}/product/1"
        redis_conn.sadd(keys.parse_failed(SITE), fingerprint(url))
        jobs.download(payload(url, "parse_product", refresh=refresh), rt=runtime)
        entry_id, task, body = read_page(redis_conn)
        assert task.get("refresh") == refresh
        parse_job.parse(task, body, "w1", partial(pages.ack, entry_id=entry_id), rt=runtime)
        assert redis_conn.scard(keys.parse_failed(SITE)) == left
        redis_conn.delete(keys.parse_failed(SITE), keys.seen(SITE))


def test_parse_stores_items_enqueues_new_links_and_acknowledges_and_deletes_the_entry(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    url = f"{shop.url}/product/1"
    jobs.download(payload(url, "parse_product"), rt=runtime)
    entry_id, task, body = read_page(redis_conn)
    assert redis_conn.xpending(keys.pages(), keys.PARSERS)["pending"] == 1

    parse_job.parse(task, body, "w1", partial(pages.ack, entry_id=entry_id), rt=runtime)

    assert pages_waiting(redis_conn) == 0 and redis_conn.xpending(keys.pages(), keys.PARSERS)["pending"] == 0
    assert list(runtime.store.items(SITE)) == [shop.expected_items()["SKU-00001"]]
    related = queued_payloads(download_queue(redis_conn))
    assert [(p["url"], p["callback"], p["depth"]) for p in related] == [(f"{shop.url}/product/2", "parse_product", 1)]
    assert [(r["outcome"], r["worker"]) for r in records(runtime, url, kind="parse")] == [(OK, "w1")]
    assert stats(runtime)["items"] == 1
    # The item was seen when its page was fetched, however late the parse ran.
    (item,) = runtime.store.item_rows(SITE)
    (fetch,) = records(runtime, url)
    assert _utc(item["first_seen"]) == _utc(fetch["started"]) == _utc(item["last_seen"])


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)  # SQLite hands back naive UTC


def test_non_html_body_is_recorded_skipped_and_not_handed_to_a_callback(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    url = f"{shop.url}/catalogue.pdf"
    jobs.download(payload(url), rt=runtime)

    assert pages_waiting(redis_conn) == 0
    (record,) = records(runtime, url)
    assert (record["outcome"], record["status"]) == (SKIPPED, 200)
    assert "application/pdf" in record["error"]


def delayed(redis_conn: Redis) -> list[tuple[str, float]]:
    """The delayed retries: (member, due time in seconds on the Redis clock)."""
    return [(m.decode(), score / 1000) for m, score in redis_conn.zrange(keys.delayed(), 0, -1, withscores=True)]


def test_503_schedules_one_retry_delayed_by_retry_after(runtime: Runtime, redis_conn: Redis, shop: ShopSite) -> None:
    url = f"{shop.url}/product/3"
    assert runtime.settings.backoff < 1  # so only Retry-After: 1 can make the delay 1 s
    before = float(redis_conn.time()[0]) + redis_conn.time()[1] / 1e6
    jobs.download(payload(url, "parse_product"), rt=runtime)

    ((member, due),) = delayed(redis_conn)
    site, priority, _nonce, entry = member.split("\t", 3)
    assert site == "demo"
    retry = DownloadTask.from_entry(site, entry, int(priority))
    assert retry.to_json() == payload(url, "parse_product", attempt=2)
    assert due >= before + 1.0
    assert download_queue(redis_conn).count == 0 and pages_waiting(redis_conn) == 0
    assert Frontier(redis_conn, "demo", [], 0, 0).waiting() == []
    assert stats(runtime)["delayed"] == 1
    # Retry-After closes the site's gate for every worker, not just this URL.
    assert redis_conn.pttl(keys.gate("demo")) > 900

    (record,) = records(runtime, url)
    assert (record["outcome"], record["status"], record["attempt"]) == (RETRY, 503, 1)
    assert "retry in 1s" in record["error"]


def test_retry_is_not_released_before_retry_after_has_passed(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    jobs.download(payload(f"{shop.url}/product/3", "parse_product"), rt=runtime)
    (arrival,) = [e.time for e in shop.requests_for("/product/3")]

    deadline = arrival + 3
    while not runtime.scheduler.promote_due():
        assert time.time() < deadline, "the retry was never released"
        time.sleep(0.01)
    released = time.time()
    assert len(Frontier(redis_conn, "demo", [], 0, 0).waiting()) == 1
    assert delayed(redis_conn) == [] and stats(runtime)["delayed"] == 0
    assert redis_conn.zscore(keys.ready(), "demo") is not None
    assert released - arrival >= 1.0, f"released {released - arrival:.2f}s after a 503 with Retry-After: 1"


def test_404_is_recorded_failed_and_not_retried(runtime: Runtime, redis_conn: Redis, shop: ShopSite) -> None:
    url = f"{shop.url}/missing"
    jobs.download(payload(url, meta={"from": "listing"}), rt=runtime)

    (record,) = records(runtime, url)
    assert (record["outcome"], record["status"], record["error"]) == (FAILED, 404, "HTTP 404")
    assert record["meta"] == {"from": "listing"}  # so `crawler retry` hands it to the callback again
    assert record["bytes"] > 0  # the error page's own size and timing are kept
    queue = download_queue(redis_conn)
    assert queue.count == 0
    assert delayed(redis_conn) == []
    assert pages_waiting(redis_conn) == 0
    assert stats(runtime)["failed"] == 1


def test_redirect_enqueues_its_target_once_and_a_seen_target_not_again(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    old, new = f"{shop.url}/old/product/5", f"{shop.url}/product/5"
    queue = download_queue(redis_conn)

    jobs.download(payload(old, "parse_product"), rt=runtime)
    assert queued_payloads(queue) == [payload(new, "parse_product", hops=1)]

    jobs.download(payload(old, "parse_product"), rt=runtime)  # the target is in the seen set now
    assert queue.count == 1
    first, second = records(runtime, old)
    assert (first["outcome"], first["status"], second["outcome"]) == (REDIRECT, 301, REDIRECT)
    assert "already seen" in second["error"]
    assert len(shop.requests_for("/product/5")) == 0  # a redirect is a job of its own, not followed inline


def test_a_page_whose_meta_refresh_sends_on_at_once_is_a_redirect_to_its_target(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector
) -> None:
    download_past_robots(runtime, payload(f"{redirector.url}/stub", "parse_product"))

    (record,) = records(runtime, f"{redirector.url}/stub")
    assert (record["outcome"], record["status"]) == (REDIRECT, 200)
    assert record["error"] == f"meta refresh to {redirector.url}/landing"
    assert queued_payloads(Backlog(redis_conn)) == [payload(f"{redirector.url}/landing", "parse_product", hops=1)]
    assert pages_waiting(redis_conn) == 0  # the stub never reaches the callback


def test_a_meta_refresh_off_the_allowed_domains_is_refused_as_a_redirect_is(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector
) -> None:
    download_past_robots(runtime, payload(f"{redirector.url}/stub-away"))

    (record,) = records(runtime, f"{redirector.url}/stub-away")
    assert (record["outcome"], record["status"]) == (FAILED, 200)
    assert record["error"].startswith("meta refresh refused") and "offsite.invalid" in record["error"]
    assert Backlog(redis_conn).count == 0 and pages_waiting(redis_conn) == 0
    assert not redis_conn.sismember(keys.seen(SITE), fingerprint("http://offsite.invalid/"))


def test_a_page_that_only_reloads_itself_later_goes_to_its_callback(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector
) -> None:
    download_past_robots(runtime, payload(f"{redirector.url}/reload"))

    (record,) = records(runtime, f"{redirector.url}/reload")
    assert record["outcome"] == OK
    assert pages_waiting(redis_conn) == 1 and Backlog(redis_conn).count == 0


def test_redirect_off_the_allowed_domains_is_refused_and_recorded(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector
) -> None:
    url = f"{redirector.url}/away"
    download_past_robots(runtime, payload(url))

    (record,) = records(runtime, url)
    assert (record["outcome"], record["status"]) == (FAILED, 301)
    assert record["error"].startswith("redirect refused")
    assert "offsite.invalid" in record["error"]
    assert download_queue(redis_conn).count == 0
    assert not redis_conn.sismember(keys.seen(SITE), fingerprint("http://offsite.invalid/landing"))


def test_redirect_chain_longer_than_max_redirects_fails(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime.robots, "crawl_delay", lambda site: 0.0)  # hops at the interval, not 2 s apart
    limit = runtime.settings.max_redirects
    queue = download_queue(redis_conn)
    task = payload(f"{redirector.url}/hop/0")
    for hop in range(limit):
        download_past_robots(runtime, task)
        task = take_next(queue)
        assert (task["url"], task["hops"]) == (f"{redirector.url}/hop/{hop + 1}", hop + 1)
    jobs.download(task, rt=runtime)  # one hop too many

    assert queue.count == 0
    assert [p for p in redirector.paths if p.startswith("/hop/")] == [f"/hop/{n}" for n in range(limit + 1)]
    (last,) = records(runtime, f"{redirector.url}/hop/{limit}")
    assert (last["outcome"], last["status"]) == (FAILED, 302)
    assert f"more than {limit} redirects" in last["error"]
    assert [r["outcome"] for r in runtime.store.fetch_rows(SITE) if "/hop/" in r["url"]] == (
        [REDIRECT] * limit + [FAILED]
    )


def test_a_stored_body_that_is_a_zlib_bomb_fails_its_page_within_the_cap(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    url = f"{shop.url}/product/2"
    jobs.download(payload(url, "parse_product"), rt=runtime)
    entry_id, task, _ = read_page(redis_conn)
    bomb = zlib.compress(b"<p>" + b"a" * (runtime.settings.max_body_bytes * 4), 9)  # written by someone else

    parse_job.parse(task, bomb, "w1", partial(pages.ack, entry_id=entry_id), rt=runtime)

    (record,) = records(runtime, url, kind="parse")
    assert record["outcome"] == FAILED and "BodyTooLarge" in record["error"]
    assert list(runtime.store.items(SITE)) == [] and pages_waiting(redis_conn) == 0
    assert stats(runtime)["failed"] == 1


# -- serialization --------------------------------------------------------------------


class _Canary:
    """Unpickling this creates a file: proof that a pickle ran code."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))


def test_pickled_job_in_a_download_queue_is_quarantined_without_running_code(
    runtime: Runtime, redis_conn: Redis, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    # A writer to Redis enqueues a job the way a pickle-serializing RQ client would.
    evil = Queue(keys.download_queue(SITE), connection=redis_conn).enqueue(DOWNLOAD_FUNC, _Canary(canary))
    raw = redis_conn.hget(evil.key, "data")
    assert b"canary" in zlib.decompress(raw)  # pickle bytes, not JSON

    DownloadWorker(redis_conn, [SITE], rt=runtime).work(burst=True)

    assert not canary.exists(), "the worker unpickled a job argument"
    (refused,) = quarantine.entries(redis_conn)
    assert refused.job_id == evil.id and "not a JSON job" in refused.reason
    assert refused.source == keys.download_queue(SITE)
    assert not redis_conn.exists(evil.key)  # out of the queue, its registries and its hash
    assert redis_conn.llen(Queue(keys.download_queue(SITE), connection=redis_conn).key) == 0
    assert runtime.store.fetch_rows(SITE) == []  # the download function never ran
    # Control: the same bytes, unpickled, do run code.
    pickle.loads(zlib.decompress(raw))
    assert canary.exists()


def test_download_rejects_a_payload_that_is_not_a_download_task(runtime: Runtime) -> None:
    with pytest.raises(ValueError, match="not a download task"):
        jobs.download(["demo", "http://127.0.0.1/"], rt=runtime)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a parse task"):
        parse_job.parse("crawler:body:x", b"", rt=runtime)  # type: ignore[arg-type]
    assert runtime.store.fetch_rows(SITE) == []


def test_seeded_request_and_redirect_target_share_one_seen_entry(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    frontier = runtime.frontier(SITE)
    added = frontier.add([Request(f"{shop.url}/product/5#reviews", callback="parse_product")])
    assert added.enqueued == [f"{shop.url}/product/5"]

    jobs.download(payload(f"{shop.url}/old/product/5", "parse_product"), rt=runtime)

    assert [p["url"] for p in queued_payloads(download_queue(redis_conn))] == [f"{shop.url}/product/5"]


def test_a_redirect_from_a_public_host_to_a_private_address_is_refused() -> None:
    assert redirects_inward("http://93.184.216.34/a", "http://127.0.0.1/admin")
    assert redirects_inward("http://93.184.216.34/a", "http://10.1.2.3/")
    assert redirects_inward("http://93.184.216.34/a", "http://169.254.169.254/latest/meta-data")
    assert redirects_inward("http://93.184.216.34/a", "http://[::1]/")
    assert not redirects_inward("http://93.184.216.34/a", "http://93.184.216.35/b")
    assert not redirects_inward("http://127.0.0.1:8000/a", "http://127.0.0.1:8000/b")  # a local site


@pytest.mark.parametrize(
    "target",
    ["http://100.64.0.1/", "http://224.0.0.1/", "http://[::ffff:127.0.0.1]/", "http://192.0.2.1/"],
    ids=["shared (carrier NAT)", "multicast", "IPv4-mapped loopback", "documentation"],
)
def test_a_redirect_is_inward_by_the_one_definition_of_a_private_address_the_fetcher_uses(target: str) -> None:
    """Redirects, robots.txt and the fetcher's address cap agree: not public (``is_public_address``) is private."""
    host = urlsplit(target).hostname or ""
    assert not is_public_address(host)
    assert redirects_inward("http://93.184.216.34/a", target)


def test_robots_crawl_delay_longer_than_the_interval_becomes_the_interval(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector
) -> None:
    jobs.download(payload(f"{redirector.url}/hop/0"), rt=runtime)  # robots.txt takes the turn: the page goes back
    assert redis_conn.hget(keys.conf(SITE), "robots_delay_ms") == b"2000"
    started = time.monotonic()
    download_past_robots(runtime, Backlog(redis_conn).take_only())
    # Not only the scheduler's hand-outs: the gate itself now closes for the Crawl-delay, from the
    # send (some of the time the job took since, on a loaded machine, has run off the gate's life).
    took_ms = (time.monotonic() - started) * 1000
    assert 2000 - took_ms < redis_conn.pttl(keys.gate(SITE)) <= 2000 + runtime.settings.gate_margin * 1000


def test_a_run_of_errors_closes_the_sites_gate_for_everyone_until_a_success(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector, monkeypatch: pytest.MonkeyPatch
) -> None:
    # About the error pause: keep the gate to the interval, not the redirector's robots.txt Crawl-delay.
    monkeypatch.setattr(runtime.robots, "crawl_delay", lambda site: 0.0)
    for _ in range(outcomes.ERRORS_BEFORE_PAUSE - 1):
        jobs.download(payload(f"{redirector.url}/down"), rt=runtime)
    interval_ms = (runtime.policy(SITE).interval + runtime.settings.gate_margin) * 1000
    assert redis_conn.pttl(keys.gate(SITE)) <= interval_ms  # a couple of errors: no pause yet
    jobs.download(payload(f"{redirector.url}/down"), rt=runtime)
    assert redis_conn.get(keys.errors(SITE)) == str(outcomes.ERRORS_BEFORE_PAUSE).encode()
    pause_ms = runtime.settings.backoff * 1000
    assert interval_ms < redis_conn.pttl(keys.gate(SITE)) <= pause_ms  # closed for the backoff
    redis_conn.delete(keys.gate(SITE))
    jobs.download(payload(f"{redirector.url}/hop/0"), rt=runtime)  # the site answers again
    assert redis_conn.get(keys.errors(SITE)) is None


def test_a_request_answered_well_within_its_interval_is_rearmed_with_its_record_and_spacing_holds(
    runtime: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime.robots, "crawl_delay", lambda site: 0.0)
    set_live(redis_conn, SITE, interval=0.4)
    rearm_ms = (0.4 + runtime.settings.gate_margin) * 1000
    at_the_send: list[str] = []
    rearm = Gate.rearm
    monkeypatch.setattr(Gate, "rearm", lambda gate: at_the_send.append(gate.key) or rearm(gate))
    with ShopSite(products=5, faults=False) as shop:
        jobs.download(payload(f"{shop.url}/product/1", "parse_product"), rt=runtime)  # robots.txt, then the page
        assert len(at_the_send) == 2  # the site's answer time unknown: rearmed at the send
        for n in (2, 3):
            before = time.monotonic()
            jobs.download(payload(f"{shop.url}/product/{n}", "parse_product"), rt=runtime)
            pttl, now = redis_conn.pttl(keys.gate(SITE)), time.monotonic()
            # Rearmed with the record: the take's send grace is gone, the lock ends an interval after the send.
            assert rearm_ms - (now - before) * 1000 - 5 <= pttl <= rearm_ms
            # The process's next turn waits until then, not less: it asks Redis once.
            assert runtime.gate_opens_at(SITE) - now >= pttl / 1000 - 0.002
        assert len(at_the_send) == 2  # no call of its own
        assert [r["outcome"] for r in records(runtime, f"{shop.url}/product/3")] == [OK]
    assert [e.path for e in shop.requests][1:] == [f"/product/{n}" for n in (1, 2, 3)]
    assert shop.min_gap() is not None and shop.min_gap() >= 0.4  # as the site saw them


def test_when_the_gate_opens_is_known_from_the_send_before_the_record_that_rearms_it_is_written(
    runtime: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A paced batch's record waits to be written with others' until shortly before the gate opens
    # (``batch._soon_records``): timed by the last send's opening, long past, each was written alone.
    monkeypatch.setattr(runtime.robots, "crawl_delay", lambda site: 0.0)
    set_live(redis_conn, SITE, interval=0.4)
    seen: dict[str, tuple[float, float]] = {}  # URL: (the gate opens in, seconds since the send)
    write = state.write_now  # a job of one URL: its record is written by the process's writer

    def write_now(rt: Runtime, done: Any) -> None:
        seen[done.record.url] = (runtime.gate_opens_at(SITE) - time.monotonic(), done.record.elapsed)
        write(rt, done)

    monkeypatch.setattr(state, "write_now", write_now)
    with ShopSite(products=5, faults=False) as shop:
        for n in (1, 2):
            jobs.download(payload(f"{shop.url}/product/{n}", "parse_product"), rt=runtime)
        opens_in, since_send = seen[f"{shop.url}/product/2"]
    # An interval after product 2's send, which came after product 1's opening: not already open.
    assert 0.4 - since_send - 0.05 <= opens_in <= 0.4 + runtime.settings.gate_margin + EXPIRY_TICK


def test_a_site_answering_late_in_its_interval_is_rearmed_at_the_send(
    runtime: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime.robots, "crawl_delay", lambda site: 0.0)
    set_live(redis_conn, SITE, interval=0.4)
    at_the_send: list[str] = []
    rearm = Gate.rearm
    monkeypatch.setattr(Gate, "rearm", lambda gate: at_the_send.append(gate.key) or rearm(gate))
    with ShopSite(products=3, latency=0.35, faults=False) as slow:
        for n in (1, 2):
            jobs.download(payload(f"{slow.url}/product/{n}", "parse_product"), rt=runtime)
    assert at_the_send.count(keys.gate(SITE)) == 3  # robots.txt and both pages: 0.35 s is late in 0.4 s
    assert slow.min_gap() is not None and slow.min_gap() >= 0.4


def test_a_send_after_the_gate_was_lost_is_warned_about(
    runtime: Runtime, redis_conn: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    task = DownloadTask(SITE, "http://127.0.0.1:9/slow")
    gate = runtime.take_gate(SITE)
    redis_conn.delete(keys.gate(SITE))  # its send grace ran out and another worker took it
    redis_conn.set(keys.gate(SITE), "someone-else", px=5000)
    with caplog.at_level("WARNING", logger="crawler.jobs"):
        gated_fetch.rearm(gate, task.site, task.url)
    assert "spacing may be short" in caplog.text and task.url in caplog.text
    assert redis_conn.get(keys.gate(SITE)) == b"someone-else"  # never taken over


def test_unreadable_robots_txt_puts_the_page_back_without_spending_an_attempt(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector
) -> None:
    redirector.robots_status = 503
    url = f"{redirector.url}/hop/0"
    before = float(redis_conn.time()[0])
    jobs.download(payload(url, attempt=2), rt=runtime)

    assert redirector.paths == ["/robots.txt"]  # the page itself was not requested
    (robots,) = records(runtime, f"{redirector.url}/robots.txt")
    assert (robots["outcome"], robots["status"]) == (FAILED, 503)
    (record,) = records(runtime, url)
    assert (record["outcome"], record["attempt"]) == (RETRY, 2)
    assert "robots.txt" in record["error"] and "retry in 60s" in record["error"]
    ((member, due),) = delayed(redis_conn)
    site, priority, _nonce, entry = member.split("\t", 3)
    assert DownloadTask.from_entry(site, entry, int(priority)).to_json() == payload(url, attempt=2)  # same attempt
    assert before + 59 <= due <= before + 62
    # The whole site waits for robots.txt, and the wait is not one of its errors.
    assert 58_000 < redis_conn.pttl(keys.gate(SITE)) <= 60_000
    assert redis_conn.get(keys.errors(SITE)) is None
    assert stats(runtime).get("failed", 0) == 0


def test_headers_dripped_past_the_timeout_are_recorded_and_retried(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(runtime.__dict__, "fetcher", Fetcher(timeout=1.0, max_body_bytes=1 << 20, user_agent="t"))
    monkeypatch.setattr(runtime.robots, "crawl_delay", lambda site: 0.0)  # not the redirector's 2 s Crawl-delay
    url = f"{redirector.url}/drip"
    started = time.monotonic()
    jobs.download(payload(url), rt=runtime)

    assert time.monotonic() - started < 3  # not the 300 s job timeout
    (record,) = records(runtime, url)
    assert (record["outcome"], record["attempt"]) == (RETRY, 1)
    assert "timed out" in record["error"] and "whole request" in record["error"]
    ((member, _due),) = delayed(redis_conn)
    site, priority, _nonce, entry = member.split("\t", 3)
    assert DownloadTask.from_entry(site, entry, int(priority)).attempt == 2


def test_a_host_name_resolving_to_a_private_address_is_recorded_failed_unrequested(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = socket.getaddrinfo
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, *args, **kwargs: real("127.0.0.1" if host == "rebind.test" else host, *args, **kwargs),
    )  # what a rebinding DNS answers
    url = shop.url.replace("127.0.0.1", "rebind.test") + "/product/1"
    # A spider that lists rebind.test (its public name) among its domains.
    monkeypatch.setattr(runtime.spider(SITE), "allowed_domains", ["rebind.test"])
    jobs.download(payload(url, "parse_product"), rt=runtime)

    assert shop.requests == []  # neither robots.txt nor the page: refused before a byte was sent
    (record,) = records(runtime, url)
    assert (record["outcome"], record["status"]) == (FAILED, None)
    assert "rebind.test resolves to 127.0.0.1" in record["error"]
    assert delayed(redis_conn) == [] and pages_waiting(redis_conn) == 0  # permanent: not retried


def test_a_redirect_off_the_allowed_domains_is_refused_before_its_name_is_looked_up(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    real = socket.getaddrinfo

    def recording(host: str, port: Any = None, *args: Any, **kwargs: Any) -> Any:
        asked.append(host)
        if host == "127.0.0.1" and port is None:
            # The redirect check's lookup (no port) sees the source as a public host, as a real
            # site's would be; the connection (with its port) still goes to the loopback server.
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("93.184.216.34", 0))]
        return real("127.0.0.1" if host == "inside.test" else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    monkeypatch.setattr(runtime.spider(SITE), "allowed_domains", ["127.0.0.1", "inside.test"])
    monkeypatch.setattr(runtime.robots, "crawl_delay", lambda site: 0.0)  # not the redirector's 2 s Crawl-delay
    away, inside = f"{redirector.url}/offdomain", f"{redirector.url}/inside"
    jobs.download(payload(away), rt=runtime)
    jobs.download(payload(inside), rt=runtime)

    assert not [host for host in asked if "offdomain" in host]  # no lookup a hostile page could choose
    (record,) = records(runtime, away)
    assert (record["outcome"], record["status"]) == (FAILED, 302)
    assert record["error"].startswith("redirect refused") and "some-name.invalid-offdomain.example" in record["error"]
    # A name in the allowed domains is looked up, and refused when it leads inward.
    assert "inside.test" in asked
    (record,) = records(runtime, inside)
    assert (record["outcome"], record["status"]) == (FAILED, 302)
    assert "inside.test" in record["error"] and "private or loopback" in record["error"]
    assert download_queue(redis_conn).count == 0


def test_a_name_server_that_never_answers_costs_a_fetch_its_deadline_and_a_retry(
    runtime: Runtime, redis_conn: Redis, redirector: Redirector, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = socket.getaddrinfo

    def hanging(host: str, *args: Any, **kwargs: Any) -> Any:
        if host.endswith(".hang.test"):
            release.wait(30)  # a name server that never answers (until the test ends)
            raise socket.gaierror(socket.EAI_AGAIN, "no answer")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    monkeypatch.setitem(runtime.__dict__, "fetcher", Fetcher(timeout=1.0, max_body_bytes=1 << 20, user_agent="t"))
    monkeypatch.setattr(runtime.spider(SITE), "allowed_domains", ["hang.test"])
    url = redirector.url.replace("127.0.0.1", "www.hang.test") + "/hop/0"
    redis_conn.set(keys.robots(SITE, origin_of(url)), "")  # robots.txt read already: the page itself is fetched
    try:
        started = time.monotonic()
        jobs.download(payload(url), rt=runtime)
        took = time.monotonic() - started
    finally:
        release.set()

    assert took < 1.5  # the 1 s deadline, lookup included
    assert redirector.paths == []
    (record,) = records(runtime, url)
    assert (record["outcome"], record["attempt"]) == (RETRY, 1)
    assert "timed out" in record["error"] and "whole request" in record["error"]
    ((member, _due),) = delayed(redis_conn)
    site, priority, _nonce, entry = member.split("\t", 3)
    assert DownloadTask.from_entry(site, entry, int(priority)).attempt == 2
