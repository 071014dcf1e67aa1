"""End to end: real Redis, real loopback HTTP (the demo shop), real worker threads and processes.

Each test crawls a small ``ShopSite`` and checks what reached the database and what the
shop's server-side request log saw: every page fetched once, every item stored once
with the right values, robots.txt obeyed, retries bounded, politeness held.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from crawling import installed_runtime, items_by_key, join_all, start_in_threads
from redis import Redis
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from crawler import keys
from crawler.connection import EmbeddedRedis
from crawler.demo import ShopSite
from crawler.demo.shop import BROKEN_ID, MOVED_ID, TRANSIENT_ID
from crawler.frontier import SEED_PRIORITY, seed
from crawler.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.policy import set_live
from crawler.runtime import Runtime
from crawler.settings import Settings
from crawler.store import FAILED, SKIPPED, Store
from crawler.workers import ParseWorker

#: Longest an in-process crawl of a small shop may take before the test gives up.


# -- helpers ------------------------------------------------------------------------


def crawl_in_threads(connection: Redis, rt: Runtime, shop: ShopSite, downloads: int = 2, parsers: int = 1) -> None:
    """Seed the shop's home page and crawl it to the end with in-process burst workers."""
    seed(rt.frontier("demo"), [shop.url + "/"])
    threads, stop = start_in_threads(connection, downloads, parsers)
    join_all(threads, stop)


def items_by_sku(database_url: str) -> dict[str, dict]:
    return items_by_key(database_url)


def request_counts(shop: ShopSite) -> Counter[str]:
    return Counter(entry.path for entry in shop.requests)


def expected_paths(shop: ShopSite) -> set[str]:
    """Every path a polite, complete crawl of a faulty shop requests."""
    paths = {"/robots.txt", "/", "/catalogue.pdf", "/missing", f"/old/product/{MOVED_ID}"}
    paths |= {f"/products?page={n}" for n in range(1, shop.pages + 1)}
    paths |= {f"/product/{i}" for i in range(1, shop.products + 1)}
    return paths


def assert_each_page_fetched_once(shop: ShopSite, max_retries: int) -> None:
    counts = request_counts(shop)
    assert set(counts) == expected_paths(shop)
    assert counts[f"/product/{TRANSIENT_ID}"] == 2  # 503, then 200
    assert [e.status for e in shop.requests_for(f"/product/{TRANSIENT_ID}")] == [503, 200]
    assert counts[f"/product/{BROKEN_ID}"] == 1 + max_retries
    others = {path: n for path, n in counts.items()
              if path not in (f"/product/{TRANSIENT_ID}", f"/product/{BROKEN_ID}")}
    assert {path: n for path, n in others.items() if n != 1} == {}
    assert not [e for e in shop.requests if e.path.startswith("/private/")]


# -- one process, worker threads ------------------------------------------------------


def test_in_process_crawl_stores_every_item_once_and_fetches_every_page_once(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    crawl_in_threads(redis_conn, runtime, shop)

    assert items_by_sku(runtime.settings.database_url) == shop.expected_items()
    assert_each_page_fetched_once(shop, runtime.settings.max_retries)

    rows = runtime.store.fetch_rows("demo")
    by_url: dict[str, list[dict]] = {}
    for row in rows:
        by_url.setdefault(row["url"], []).append(row)
    # The moved product came through its redirect or its own link, and was fetched once.
    assert len(shop.requests_for(f"/product/{MOVED_ID}")) == 1
    assert [r["outcome"] for r in by_url[f"{shop.url}/old/product/{MOVED_ID}"]] == ["redirect"]
    # The PDF: downloaded once, recorded as skipped, never handed to a callback.
    pdf = by_url[f"{shop.url}/catalogue.pdf"]
    assert [(r["kind"], r["outcome"], r["status"]) for r in pdf] == [("download", SKIPPED, 200)]
    # /missing: a 404, recorded failed once, not retried.
    missing = by_url[f"{shop.url}/missing"]
    assert [(r["kind"], r["outcome"], r["status"], r["attempt"]) for r in missing] == [("download", FAILED, 404, 1)]
    # The broken product: failed after 1 + max_retries attempts, each recorded.
    broken = [r for r in by_url[f"{shop.url}/product/{BROKEN_ID}"] if r["kind"] == "download"]
    attempts = runtime.settings.max_retries + 1
    assert [r["attempt"] for r in broken] == list(range(1, attempts + 1))
    assert [r["outcome"] for r in broken] == ["retry"] * (attempts - 1) + [FAILED]
    # robots.txt refused the admin page without requesting it.
    admin = by_url[f"{shop.url}/private/admin"]
    assert [r["outcome"] for r in admin] == ["refused"]
    # Every parse succeeded.
    assert {r["outcome"] for r in rows if r["kind"] == "parse"} == {"ok"}

    # Nothing left behind: bodies deleted once parsed, finished jobs gone, no failed jobs.
    assert redis_conn.keys(keys.body("*")) == []
    assert redis_conn.keys("rq:job:*") == []
    for queue in (keys.download_queue("demo"), keys.PARSE_QUEUE):
        assert FailedJobRegistry(queue, connection=redis_conn, serializer=JSONSerializer).count == 0
        assert StartedJobRegistry(queue, connection=redis_conn, serializer=JSONSerializer).count == 0


FLAKY_SPIDER = '''
from crawler.demo.spider import DemoShop


class FlakyShop(DemoShop):
    """The demo spider with a bug: it raises on one product page."""

    name = "flaky"

    def parse_product(self, page):
        if page.url.endswith("/product/{bad}"):
            raise ValueError("flaky spider cannot parse this product")
        yield from super().parse_product(page)
'''


def test_callback_that_raises_fails_that_page_with_traceback_and_crawl_goes_on(
    redis_conn: Redis, settings: Settings
) -> None:
    bad = 4
    Path(settings.sites_dir, "flaky.py").write_text(FLAKY_SPIDER.format(bad=bad))
    with ShopSite(products=30) as shop, installed_runtime(redis_conn, settings) as rt:
        seed(rt.frontier("flaky"), [shop.url + "/"])
        threads, stop = start_in_threads(redis_conn, sites=("flaky",))
        join_all(threads, stop)

        store = Store(settings.database_url)
        try:
            got = {row["sku"]: row for row in store.items("flaky")}
            parse_failures = [r for r in store.fetch_rows("flaky", FAILED) if r["kind"] == "parse"]
        finally:
            store.close()
        expected = shop.expected_items()
        del expected[f"SKU-{bad:05d}"]
        assert got == expected
        assert [r["url"] for r in parse_failures] == [f"{shop.url}/product/{bad}"]
        error = parse_failures[0]["error"]
        assert error.startswith("Traceback")
        assert "ValueError: flaky spider cannot parse this product" in error
        assert "parse_product" in error
        assert redis_conn.keys(keys.body("*")) == []
        assert FailedJobRegistry(keys.PARSE_QUEUE, connection=redis_conn, serializer=JSONSerializer).count == 0


def test_paused_site_is_not_downloaded_until_resumed(runtime: Runtime, redis_conn: Redis) -> None:
    with ShopSite(products=10) as shop:
        set_live(redis_conn, "demo", paused=True)
        runtime.publish("demo", force=True)  # as `crawler pause demo` does
        seed(runtime.frontier("demo"), [shop.url + "/"])
        queue_key = keys.frontier("demo", SEED_PRIORITY)
        assert redis_conn.llen(queue_key) == 1

        threads, stop = start_in_threads(redis_conn)
        time.sleep(1.5)
        assert redis_conn.llen(queue_key) == 1, "a worker took a job of a paused site"
        assert shop.requests == []
        assert all(t.is_alive() for t in threads), "burst workers quit while paused work was queued"

        set_live(redis_conn, "demo", paused=False)
        runtime.publish("demo", force=True)
        join_all(threads, stop, timeout=30)
        assert redis_conn.llen(queue_key) == 0
        assert items_by_sku(runtime.settings.database_url) == shop.expected_items()


def test_items_are_identical_on_sqlite_and_postgresql(
    redis_conn: Redis, settings: Settings, sqlite_url: str, postgres_url: str
) -> None:
    results = {}
    with ShopSite(products=25) as shop:
        for url in (sqlite_url, postgres_url):
            redis_conn.flushdb()
            with installed_runtime(redis_conn, dataclasses.replace(settings, database_url=url)) as rt:
                crawl_in_threads(redis_conn, rt, shop)
            store = Store(url)
            try:
                results[url] = list(store.items("demo"))
                assert store.count_items("demo") == len(results[url])
            finally:
                store.close()
        expected = [item for _, item in sorted(shop.expected_items().items())]
    assert results[sqlite_url] == expected
    assert results[postgres_url] == results[sqlite_url]


# -- several processes ---------------------------------------------------------------


def test_two_processes_of_download_workers_fetch_each_page_once_and_keep_the_interval(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    interval = 0.05
    settings = dataclasses.replace(settings, sites={"demo": {"interval": interval}})
    specs = [WorkerSpec("download", ("demo",), threads=2, burst=True)] * 2
    specs += [WorkerSpec("parse", ("demo",), threads=1, burst=True)]
    with ShopSite(products=200, faults=True) as shop:
        rt = Runtime(redis_conn, settings)
        try:
            assert rt.policy("demo").interval == interval
            seed(rt.frontier("demo"), [shop.url + "/"])
        finally:
            rt.close()

        processes = start_workers(specs, settings, redis_url)
        timed_out, done = threading.Event(), threading.Event()

        def watchdog() -> None:
            if not done.wait(120):
                timed_out.set()
                stop_workers(processes, timeout=10)

        threading.Thread(target=watchdog, daemon=True).start()
        try:
            code = wait_for(processes)
        finally:
            done.set()
        assert not timed_out.is_set(), "worker processes did not drain the crawl within 120 s"
        assert code == 0

        assert items_by_sku(settings.database_url) == shop.expected_items()
        assert_each_page_fetched_once(shop, settings.max_retries)
        gap = shop.min_gap()
        assert gap is not None and gap >= interval, f"two requests {gap * 1000:.1f} ms apart"

    store = Store(settings.database_url)
    try:
        workers = {r["worker"] for r in store.fetch_rows("demo") if r["kind"] == "download"}
    finally:
        store.close()
    assert len(workers) >= 2, "the downloads were not shared between workers"
    assert redis_conn.keys(keys.body("*")) == []


def test_demo_command_crawls_on_an_embedded_redis_and_stops_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "DATABASE_URL") and not k.startswith("CRAWLER_")}
    crawler = Path(sys.executable).with_name("crawler")
    command = [str(crawler)] if crawler.exists() else [sys.executable, "-c", "from crawler.cli import main; main()"]
    result = subprocess.run([*command, "demo", "--products", "40"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output
    assert "items: 39 stored, 39 expected, 0 missing or wrong" in result.stdout, output
    state = tmp_path / ".crawler"
    assert f"Redis {EmbeddedRedis(state).url}" in result.stderr  # the private server, not one from outside
    assert not EmbeddedRedis(state).socket.exists(), "the embedded Redis socket is still there"
    assert not (state / "redis.sock").exists()
    log = (state / "redis.log").read_text()
    assert "ready to exit" in log, textwrap.shorten(log, 500)


def test_status_counts_live_workers_per_host(runtime: Runtime, redis_conn: Redis) -> None:
    import socket

    from crawler.status import workers_by_host

    stop = threading.Event()
    worker = ParseWorker(redis_conn, ["demo"], stop_event=stop)
    thread = threading.Thread(target=worker.work, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while "idle" not in str(workers_by_host(redis_conn)) and time.monotonic() < deadline:
        time.sleep(0.05)
    hosts = workers_by_host(redis_conn)
    stop.set()
    thread.join(10)
    assert hosts == {socket.gethostname(): {"idle": 1}}
    assert workers_by_host(redis_conn) == {}  # a stopped worker leaves the registry


def test_a_parse_job_of_a_site_without_a_spider_here_is_left_to_other_workers(
        runtime: Runtime, redis_conn: Redis, caplog: pytest.LogCaptureFixture) -> None:
    from crawler.jobs import PARSE_FUNC, parse_queue

    queue = parse_queue(redis_conn)
    ghost = queue.enqueue(PARSE_FUNC, {"site": "ghost", "url": "http://127.0.0.1:9/", "body": "x"}, result_ttl=0)
    known = queue.enqueue(PARSE_FUNC, {"site": "demo", "url": "http://127.0.0.1:9/", "body": "gone"}, result_ttl=0)
    stop = threading.Event()
    worker = ParseWorker(redis_conn, ("demo",), stop_event=stop)
    thread = threading.Thread(target=worker.work, daemon=True)
    with caplog.at_level("WARNING", logger="crawler.workers"):
        thread.start()
        deadline = time.monotonic() + 10
        while queue.fetch_job(known.id) is not None:  # run (its body expired: recorded failed) and deleted
            assert time.monotonic() < deadline, "the parse job of a known site was not run"
            time.sleep(0.05)
        time.sleep(1.5)  # the ghost job comes round again meanwhile
        stop.set()
        thread.join(10)
    assert queue.get_job_ids() == [ghost.id]  # back in the queue for a worker that has the spider
    assert FailedJobRegistry(keys.PARSE_QUEUE, connection=redis_conn, serializer=JSONSerializer).count == 0
    assert caplog.text.count("no spider for site 'ghost'") == 1
