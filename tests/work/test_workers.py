"""End to end: real Redis, real loopback HTTP (the demo shop), real worker threads and processes.

Each test crawls a small ``ShopSite`` and checks what reached the database and what the
shop's server-side request log saw: every page fetched once, every item stored once
with the right values, robots.txt obeyed, retries bounded, politeness held.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from crawling import count_round_trips, installed_runtime, items_by_key, join_all, start_in_threads
from redis import Redis
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from crawler.coord import keys, pages
from crawler.coord.connection import EmbeddedRedis
from crawler.coord.frontier import SEED_PRIORITY, Frontier, seed
from crawler.coord.policy import set_live
from crawler.coord.scheduler import frontier_sizes
from crawler.demo import ShopSite
from crawler.demo.shop import BROKEN_ID, MOVED_ID, TRANSIENT_ID
from crawler.settings import Settings
from crawler.store.database import FAILED, Store
from crawler.work.download_worker import DownloadWorker
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.work.parse_worker import ParseWorker
from crawler.work.runtime import Runtime

#: Longest an in-process crawl of a small shop may take before the test gives up.


# -- helpers ------------------------------------------------------------------------


def crawl_in_threads(connection: Redis, rt: Runtime, shop: ShopSite, downloads: int = 2, parsers: int = 1) -> None:
    """Seed the shop's home page and crawl it to the end with in-process burst workers."""
    seed(rt.frontier("demo"), [shop.url + "/"])
    threads, stop = start_in_threads(rt, downloads, parsers)
    join_all(threads, stop)


def items_by_sku(database_url: str) -> dict[str, dict]:
    return items_by_key(database_url)


def request_counts(shop: ShopSite) -> Counter[str]:
    return Counter(entry.path for entry in shop.requests)


def expected_paths(shop: ShopSite) -> set[str]:
    """Every path a polite, complete crawl of a faulty shop requests (not /catalogue.pdf: ``deny_extensions``)."""
    paths = {"/robots.txt", "/", "/missing", f"/old/product/{MOVED_ID}"}
    paths |= {f"/products?page={n}" for n in range(1, shop.pages + 1)}
    paths |= {f"/product/{i}" for i in range(1, shop.products + 1)}
    return paths


def assert_no_page_left(connection: Redis) -> None:
    """Every page entry parsed and deleted, none held by a parse worker."""
    assert connection.xlen(keys.pages()) == 0
    assert connection.xpending(keys.pages(), keys.PARSERS)["pending"] == 0


def assert_each_page_fetched_once(shop: ShopSite, max_retries: int) -> None:
    counts = request_counts(shop)
    assert set(counts) == expected_paths(shop)
    assert counts[f"/product/{TRANSIENT_ID}"] == 2  # 503, then 200
    assert [e.status for e in shop.requests_for(f"/product/{TRANSIENT_ID}")] == [503, 200]
    assert counts[f"/product/{BROKEN_ID}"] == 1 + max_retries
    others = {
        path: n for path, n in counts.items() if path not in (f"/product/{TRANSIENT_ID}", f"/product/{BROKEN_ID}")
    }
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
    # The PDF: a link to a file the spider does not take, never requested; its page's record counts it.
    assert f"{shop.url}/catalogue.pdf" not in by_url
    (home,) = [r for r in by_url[f"{shop.url}/products?page=1"] if r["kind"] == "parse"]
    assert "1 links to files by their extension (.pdf): not queued (deny_extensions)" in home["error"]
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

    # Nothing left behind: pages deleted once parsed, none held, finished jobs gone, no failed jobs.
    assert_no_page_left(redis_conn)
    assert redis_conn.keys(Job.redis_job_namespace_prefix + "*") == []
    queue = keys.download_queue("demo")
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


def test_workers_given_their_runtime_crawl_the_shop(redis_conn: Redis, settings: Settings, shop: ShopSite) -> None:
    """The download and parse paths use the runtime their worker is given (its Redis, store, fetcher,
    policy), the one thing a process-wide lookup could hand them otherwise: the crawl completes."""
    rt = Runtime(redis_conn, settings)
    try:
        seed(rt.frontier("demo"), [shop.url + "/"])
        stop = threading.Event()
        workers = [DownloadWorker(redis_conn, ["demo"], stop_event=stop, rt=rt) for _ in range(2)]
        workers += [ParseWorker(redis_conn, ["demo"], stop_event=stop, rt=rt)]
        threads = [threading.Thread(target=w.work, kwargs={"burst": True}, daemon=True) for w in workers]
        for thread in threads:
            thread.start()
        join_all(threads, stop)
        assert items_by_sku(settings.database_url) == shop.expected_items()
        assert {r["outcome"] for r in rt.store.fetch_rows("demo") if r["kind"] == "parse"} == {"ok"}
    finally:
        rt.close()


def test_callback_that_raises_fails_that_page_with_traceback_and_crawl_goes_on(
    redis_conn: Redis, settings: Settings
) -> None:
    bad = 4
    Path(settings.sites_dir, "flaky.py").write_text(FLAKY_SPIDER.format(bad=bad))
    with ShopSite(products=30) as shop, installed_runtime(redis_conn, settings) as rt:
        seed(rt.frontier("flaky"), [shop.url + "/"])
        threads, stop = start_in_threads(rt, sites=("flaky",))
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
        assert_no_page_left(redis_conn)


SLOW_SPIDER = """
import time
from crawler.demo.spider import DemoShop


class Slow(DemoShop):
    name = "slow"

    def parse_product(self, page):
        if page.url.endswith("/product/{slow}"):
            while True:  # a parse that never ends (a pathological page), in Python bytecode
                time.sleep(0.01)
        yield from super().parse_product(page)
"""


def test_a_parse_that_times_out_fails_that_page_visibly_and_it_can_be_retried(
    redis_conn: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crawler.ops.failures import failed_pages
    from crawler.work import parse_job

    monkeypatch.setattr(parse_job, "DEFAULT_PARSE_TIMEOUT", 2)
    slow = 3
    Path(settings.sites_dir, "slow.py").write_text(SLOW_SPIDER.format(slow=slow))
    with ShopSite(products=12) as shop, installed_runtime(redis_conn, settings) as rt:
        seed(rt.frontier("slow"), [shop.url + "/"])
        threads, stop = start_in_threads(rt, sites=("slow",))
        join_all(threads, stop)
        pages = [p for p in failed_pages(rt.store, "slow") if p.kind == "parse"]
        assert len(pages) == 1, [(p.url, p.reason) for p in pages]
        (page,) = pages
        assert (page.url, page.kind) == (f"{shop.url}/product/{slow}", "parse")
        assert page.error is not None and page.error.startswith("parse timed out after 2s")
        assert "JobTimeoutException" in page.error
        assert len(list(rt.store.items("slow"))) == len(shop.expected_items()) - 1
        assert_no_page_left(redis_conn)


def test_a_site_s_policy_is_written_when_it_changes_not_every_second(
    runtime: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime.publish("demo", force=True)
    written: list[tuple[object, ...]] = []
    monkeypatch.setattr("crawler.work.runtime.publish_conf", lambda *args, **kwargs: written.append(args))
    monkeypatch.setattr("crawler.work.runtime.LIVE_REFRESH", 0.0)  # every call looks, as one a second would
    monkeypatch.setattr("crawler.work.site_reads.LIVE_REFRESH", 0.0)
    monkeypatch.setattr("crawler.coord.policy.LIVE_REFRESH", 0.0)
    for _ in range(3):
        runtime.publish("demo")  # each parse of the site's pages asks, before adding its links
    assert written == []
    set_live(redis_conn, "demo", paused=True)  # `crawler pause demo` from another host
    runtime.publish("demo")
    runtime.publish("demo")
    assert len(written) == 1 and written[0][4] is True  # (connection, site, interval, margin, paused, …)
    monkeypatch.setattr("crawler.work.runtime.REPUBLISH_EVERY", 0.0)
    runtime.publish("demo")
    assert len(written) == 2  # unchanged, but written again now and then, in case it was lost
    runtime.frontier("demo")
    assert len(written) == 2  # the frontier's getter writes nothing


def test_paused_site_is_not_downloaded_until_resumed(runtime: Runtime, redis_conn: Redis) -> None:
    with ShopSite(products=10) as shop:
        set_live(redis_conn, "demo", paused=True)
        runtime.publish("demo", force=True)  # as `crawler pause demo` does
        seed(runtime.frontier("demo"), [shop.url + "/"])
        queue_key = keys.frontier("demo", SEED_PRIORITY)
        assert redis_conn.llen(queue_key) == 1

        threads, stop = start_in_threads(runtime)
        time.sleep(1.5)
        assert redis_conn.llen(queue_key) == 1, "a worker took a job of a paused site"
        assert shop.requests == []
        assert all(t.is_alive() for t in threads), "burst workers quit while paused work was queued"

        set_live(redis_conn, "demo", paused=False)
        runtime.publish("demo", force=True)
        join_all(threads, stop, timeout=30)
        assert redis_conn.llen(queue_key) == 0
        assert items_by_sku(runtime.settings.database_url) == shop.expected_items()


def test_a_download_process_of_many_threads_sends_nothing_while_suspended_and_crawls_after_resume(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    """``rq suspend`` holds every thread of a download process: one of them looks once a second and
    the others read what it saw (``Suspension``); ``rq resume`` lets them all go on."""
    from rq.suspension import resume, suspend

    from crawler.work.crawl_worker import SUSPENSION_CHECK_EVERY

    settings = dataclasses.replace(settings, sites={"demo": {"interval": 0.05}})
    with ShopSite(products=6) as shop:
        processes = start_workers([WorkerSpec("download", ("demo",), threads=8)], settings, redis_url)
        try:
            time.sleep(1.0)  # started, looking for work
            suspend(redis_conn)
            time.sleep(2 * SUSPENSION_CHECK_EVERY)  # past every thread's look
            with installed_runtime(redis_conn, settings) as rt:
                seed(rt.frontier("demo"), [shop.url + "/"])
            time.sleep(3 * SUSPENSION_CHECK_EVERY)
            assert shop.requests == [], "a suspended download worker sent a request"
            assert all(p.is_alive() for p in processes)  # suspended, not ended

            resume(redis_conn)
            deadline = time.monotonic() + 20
            while not any(e.path == "/" for e in shop.requests):
                assert time.monotonic() < deadline, "nothing downloaded after rq resume"
                time.sleep(0.05)
        finally:
            resume(redis_conn)
            stop_workers(processes)


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
    assert_no_page_left(redis_conn)


@pytest.mark.integration  # starts the demo's embedded Redis and workers, with no server fixture
def test_demo_command_crawls_on_an_embedded_redis_and_stops_it(tmp_path: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and not k.startswith("CRAWLER_")
    }
    crawler = Path(sys.executable).with_name("crawler")
    command = [str(crawler)] if crawler.exists() else [sys.executable, "-c", "from crawler.cli.app import main; main()"]
    result = subprocess.run(
        [*command, "demo", "--products", "40"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
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

    from crawler.ops.status import workers_by_host

    stop = threading.Event()
    worker = ParseWorker(redis_conn, ["demo"], stop_event=stop, rt=runtime)
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


def test_a_page_of_a_site_without_a_spider_here_is_left_to_other_workers(
    runtime: Runtime, redis_conn: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    import zlib

    pages.add(redis_conn, {"site": "ghost", "url": "http://127.0.0.1:9/"}, zlib.compress(b"<p>boo</p>"))
    pages.add(redis_conn, {"site": "demo", "url": "http://127.0.0.1:9/known"}, zlib.compress(b"<p>hi</p>"))
    stop = threading.Event()
    worker = ParseWorker(redis_conn, ("demo",), stop_event=stop, rt=runtime)
    thread = threading.Thread(target=worker.work, daemon=True)
    with caplog.at_level("WARNING", logger="crawler.parsing"):
        thread.start()
        deadline = time.monotonic() + 10
        while not runtime.store.fetch_rows("demo"):  # the known site's page is parsed
            assert time.monotonic() < deadline, "the page of a known site was not parsed"
            time.sleep(0.05)
        time.sleep(2.5)  # the ghost page comes round again meanwhile
        stop.set()
        thread.join(10)
    ((_, fields),) = redis_conn.xrange(keys.pages())  # back in the stream for a worker that has the spider
    assert json.loads(fields[b"task"])["site"] == "ghost" and zlib.decompress(fields[b"body"]) == b"<p>boo</p>"
    assert redis_conn.xpending(keys.pages(), keys.PARSERS)["pending"] == 0  # held by no one: any worker may read it
    (record,) = runtime.store.fetch_rows("demo")
    assert (record["kind"], record["url"], record["outcome"]) == ("parse", "http://127.0.0.1:9/known", "ok")
    assert runtime.store.fetch_rows("ghost") == []
    assert caplog.text.count("no spider for site 'ghost'") == 1


def _redis_calls(connection: Redis) -> int:
    return sum(int(stat["calls"]) for stat in connection.info("commandstats").values())


def test_a_site_whose_spider_failed_to_load_does_not_stall_workers_started_without_sites(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    """Work queued for a site whose module is broken on this host: skipped (said once), the rest crawled.

    The workers are started as the Procfile and the systemd units start them: the CLI, no ``--sites``.
    """
    broken = "from crawler import Spider\nclass Broken(Spider):\n    name = \n"
    (Path(settings.sites_dir) / "broken.py").write_text(broken)
    redis_conn.sadd(keys.sites(), "broken")  # work for "broken", queued from a host where its module loaded
    redis_conn.rpush(keys.frontier("broken"), *[f'["http://127.0.0.1:9/{n}"]' for n in range(50)])
    redis_conn.zadd(keys.levels("broken"), {"0": 0})
    redis_conn.zadd(keys.ready(), {"broken": 0})
    settings = dataclasses.replace(settings, sites={"demo": {"interval": 0.02}})
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "DATABASE_URL": settings.database_url,
        "CRAWLER_SITES_DIR": settings.sites_dir,
        "CRAWLER_STATE_DIR": settings.state_dir,
    }
    crawler = str(Path(sys.executable).parent / "crawler")
    with ShopSite(products=40) as shop:
        rt = Runtime(redis_conn, settings)
        try:
            seed(rt.frontier("demo"), [shop.url + "/"])
            redis_conn.hset(keys.live_settings("demo"), "interval", 0.02)
        finally:
            rt.close()
        before = _redis_calls(redis_conn)
        workers = [
            subprocess.Popen(
                [crawler, "worker", kind, "--burst", "--threads", threads], env=env, stderr=subprocess.PIPE, text=True
            )
            for kind, threads in (("download", "2"), ("parse", "1"))
        ]
        try:
            outputs = [w.communicate(timeout=120)[1] for w in workers]
        finally:
            for w in workers:
                w.kill()
        calls = _redis_calls(redis_conn) - before
        assert [w.returncode for w in workers] == [0, 0], outputs
        assert items_by_sku(settings.database_url) == shop.expected_items()
        pages = len(shop.requests)
    assert calls / pages < 400, f"{calls} Redis calls for {pages} pages: a worker spun on the broken site"
    assert frontier_sizes(redis_conn, ["broken"]) == [50]  # untouched, for a worker that has its spider
    warnings = [line for line in outputs[0].splitlines() if "'broken' has work but no spider" in line]
    assert len(warnings) == 2, outputs[0]  # once per download worker (two threads)


# -- RQ through its front door --------------------------------------------------------


def crawler_command(redis_url: str, sqlite_url: str, sites_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", "from crawler.cli.app import main; main()", "--redis-url", redis_url,
            "--database-url", sqlite_url, "--sites", str(sites_dir), *args]  # fmt: skip


def test_a_crawl_with_rq_key_prefix_set_keeps_rq_keys_under_it_and_rq_info_reads_it_while_it_runs(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    """RQ names its keys from ``RQ_KEY_PREFIX``: the crawl must use RQ's names, never spell its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLER_") and k != "REDIS_URL"}
    env["RQ_KEY_PREFIX"] = "crawlrq"
    (tmp_path / "sites").mkdir()
    with ShopSite(products=12, faults=False, latency=0.05) as shop:
        crawl = subprocess.Popen(
            crawler_command(redis_url, sqlite_url, tmp_path / "sites", "crawl", "demo", shop.url + "/", "-n", "1"),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not redis_conn.smembers("crawlrq:workers"):  # RQ's own registry of workers, under the prefix
                assert crawl.poll() is None, crawl.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "no worker registered with RQ"
                time.sleep(0.05)
            info = subprocess.run(
                [sys.executable, "-c", "from rq.cli import main; main()", "info", "--url", redis_url],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            during = sorted({k.decode().split(":", 1)[0] for k in redis_conn.keys("*")})
            out, err = crawl.communicate(timeout=120)
        finally:
            if crawl.poll() is None:
                crawl.kill()
    assert info.returncode == 0, info.stderr
    assert keys.download_queue("demo") in info.stdout  # the site's queue, as RQ lists it
    assert "workers" in info.stdout and " 0 workers" not in info.stdout
    assert crawl.returncode == 0, err[-2000:]
    assert "rq" not in during and "crawlrq" in during, during
    assert set(items_by_key(sqlite_url)) == {f"SKU-{i:05d}" for i in range(1, 13)}
    assert not redis_conn.keys("rq:*")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux: /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_fleet(
    redis_url: str, redis_conn: Redis, settings: Settings, threads: int, count: int = 200
) -> tuple[float, float]:
    """Redis commands a second, and the busiest process's CPU share, of 2 idle download processes of ``threads``."""
    sites = tuple(f"idle{i:04d}" for i in range(count))
    processes = start_workers([WorkerSpec("download", sites, threads=threads)] * 2, settings, redis_url)
    try:
        # Started (a process's imports take seconds on a busy machine), registered with RQ, then
        # settled: the first pass of the reaper and repair reads every site, hundreds of commands.
        deadline = time.monotonic() + 60
        while redis_conn.scard("rq:workers") < len(processes):  # RQ's registry of workers
            assert all(p.is_alive() for p in processes), "an idle worker process exited"
            assert time.monotonic() < deadline, "the worker processes never registered with RQ"
            time.sleep(0.05)
        time.sleep(4 + count / 200)
        before = int(redis_conn.info("stats")["total_commands_processed"])
        cpu_before = [_cpu_seconds(p.pid) for p in processes]
        started = time.monotonic()
        time.sleep(4)
        took = time.monotonic() - started
        rate = (int(redis_conn.info("stats")["total_commands_processed"]) - before - 1) / took
        cpu = max(_cpu_seconds(p.pid) - c for p, c in zip(processes, cpu_before, strict=True)) / took
    finally:
        stop_workers(processes, timeout=20)
    return rate, cpu


def test_idle_download_workers_cost_redis_the_same_whatever_their_thread_count(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    """With nothing to do, one thread of a process looks for work; the others sleep until it finds
    some, and the periodic looks (due retries, reaper, repair) run once per process (issue 21: every
    thread polled, ~120,000 commands/s for an idle fleet of 2 x 64 threads)."""
    one, _ = _idle_fleet(redis_url, redis_conn, settings, threads=1)
    many, cpu = _idle_fleet(redis_url, redis_conn, settings, threads=32)
    print(f"idle, 2 processes x 1 thread: {one:.0f} commands/s; x 32 threads: {many:.0f} commands/s, cpu {cpu:.1%}")
    assert many <= 1.5 * one + 50, f"32 threads a process: {many:.0f} Redis commands/s, 1 thread: {one:.0f}"
    # One look a second a process (new work is announced: ``listener``), the ready-set repair in
    # slices: some 20 commands a second a process at 200 sites, not hundreds.
    assert many <= 60, f"2 idle processes sent Redis {many:.0f} commands/s"
    assert cpu < 0.02, f"an idle process of 32 threads used {cpu:.1%} of a core"
    # Whatever the sites: the reaper reads every queue only while some process holds jobs.
    thousand, cpu = _idle_fleet(redis_url, redis_conn, settings, threads=32, count=1000)
    print(f"idle, 2 processes, 1,000 sites: {thousand:.0f} commands/s, cpu {cpu:.1%}")
    assert thousand <= 60, f"2 idle processes of 1,000 sites sent Redis {thousand:.0f} commands/s"
    assert cpu < 0.02, f"an idle process of 1,000 sites used {cpu:.1%} of a core"


def test_a_worker_of_many_sites_is_listed_by_rq_without_joining_each_queues_worker_set(
    redis_conn: Redis, runtime: Runtime
) -> None:
    """RQ lists a worker in a set per queue it serves: 1,000 commands at each thread's start and end
    for a worker of 1,000 sites. One of a few sites is listed per queue as RQ does; one of many in
    RQ's set of all workers only."""
    from rq import Worker

    from crawler.work.crawl_worker import MOST_QUEUES_LISTED

    few = DownloadWorker(redis_conn, ["f1", "f2"], rt=runtime)
    many = DownloadWorker(redis_conn, [f"m{i}" for i in range(MOST_QUEUES_LISTED + 1)], rt=runtime)
    for worker in (few, many):
        worker.register_birth()
    try:
        listed = {w.name for w in Worker.all(connection=redis_conn, serializer=few.serializer)}
        assert {few.name, many.name} <= listed
        assert redis_conn.smembers(f"rq:workers:{keys.download_queue('f1')}") == {few.key.encode()}
        assert not redis_conn.exists(f"rq:workers:{keys.download_queue('m0')}")
        # Its hash lists MOST_QUEUES_LISTED queues and a count of the rest, not every name (20 KB a
        # thread at 1,000 sites, with a thread a slow site); a few are listed whole.
        listed_queues = {
            w.name: [q.name for q in w.queues] for w in Worker.all(connection=redis_conn, serializer=few.serializer)
        }
        assert listed_queues[few.name] == [keys.download_queue("f1"), keys.download_queue("f2")]
        assert listed_queues[many.name] == [keys.download_queue(f"m{i}") for i in range(MOST_QUEUES_LISTED)] + [
            "(and 1 more)"
        ]
    finally:
        for worker in (few, many):
            worker.register_death()
    listed = {w.name for w in Worker.all(connection=redis_conn, serializer=few.serializer)}
    assert not {few.name, many.name} & listed
    assert not redis_conn.exists(f"rq:workers:{keys.download_queue('f1')}")


def test_a_processs_next_worker_threads_make_no_round_trip_to_learn_their_address(
    redis_conn: Redis, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ names the connection and reads its address as each worker is made (two round trips): the
    threads of a process share its connection, so the first worker's address serves the next ones,
    which a busy process makes by the hundred. ``rq info`` still shows each one's address."""
    from rq import Worker

    first = DownloadWorker(redis_conn, ["f1"], rt=runtime)
    trips = count_round_trips(monkeypatch)
    later = [DownloadWorker(redis_conn, ["f1"], rt=runtime) for _ in range(3)]
    assert not trips
    assert first.ip_address not in ("", "unknown", None)
    later[0].register_birth()
    try:
        listed = {w.name: w.ip_address for w in Worker.all(connection=redis_conn, serializer=first.serializer)}
        assert listed[later[0].name] == first.ip_address
    finally:
        later[0].register_death()


def test_a_drain_look_while_work_is_queued_costs_the_same_few_commands_at_20_or_2000_sites(
    redis_conn: Redis,
) -> None:
    """Idle burst workers ask often whether the crawl is drained: while any site has work queued the
    answer costs a constant number of commands (issue 21: five a site, 1,002 at 200 sites, from every
    idle thread); when it says 0 it is still exact."""
    from crawler.work.drain import QUICK_SITES, crawl_drained, pending_work

    def look_cost(sites: list[str]) -> tuple[int, int]:
        before = int(redis_conn.info("stats")["total_commands_processed"])
        pending = pending_work(redis_conn, sites)
        return pending, int(redis_conn.info("stats")["total_commands_processed"]) - before - 1

    assert crawl_drained(redis_conn, [f"s{i}" for i in range(50)])
    costs = {}
    for count in (20, 2000):
        sites = [f"s{i}" for i in range(count)]
        site = sites[count // 2]  # one site with a job queued, listed ready, as the frontier leaves it
        redis_conn.rpush(f"rq:queue:{keys.download_queue(site)}", f"job-{count}")
        redis_conn.zadd(keys.ready(), {site: 0})
        pending, costs[count] = look_cost(sites)
        assert pending >= 1
    assert max(costs.values()) <= 5 + 2 * QUICK_SITES, f"commands a look: {costs}"


def test_a_drain_look_says_what_work_it_saw_first_jobs_in_hand_pages_or_sites_waiting(redis_conn: Redis) -> None:
    """What a burst process paces its next look by: sites' work waiting for its turn (the look may wait),
    against jobs in hand or pages to parse (the crawl's end may come any moment)."""
    from crawler.coord import inflight
    from crawler.work.drain import BUSY, PAGES, SITES, crawl_drained

    redis_conn.delete(keys.ready(), keys.busy(), keys.pages(), keys.outbox(), keys.delayed())
    sites = ["w0", "w1"]

    def saw() -> list[str]:
        seen: list[str] = []
        assert not crawl_drained(redis_conn, sites, lambda: True, seen)
        return seen

    redis_conn.rpush(f"rq:queue:{keys.download_queue('w1')}", "job-w1")
    redis_conn.zadd(keys.ready(), {"w1": 0})
    assert saw() == [SITES]
    redis_conn.xadd(keys.pages(), {"p": "1"})
    assert saw() == [PAGES]
    inflight.note_busy(redis_conn, "host:1:a", job_lease=10)
    assert saw() == [BUSY]
    inflight.note_idle(redis_conn, "host:1:a")
    redis_conn.delete(keys.ready(), keys.pages(), f"rq:queue:{keys.download_queue('w1')}")
    seen: list[str] = []
    assert crawl_drained(redis_conn, sites, lambda: True, seen) and seen == []


def test_a_drain_look_while_downloads_run_and_nothing_is_queued_costs_the_same_at_20_or_2000_sites(
    redis_conn: Redis,
) -> None:
    """The tail of a crawl: nothing queued, the last downloads in flight. A process with jobs in hand
    notes itself busy (``inflight``), so an idle process's drain look answers in a constant number of
    commands (issue 21: five a site); once the note is taken back, or lapses, the exact count runs."""
    from crawler.coord import inflight
    from crawler.work.drain import QUICK_SITES, pending_work

    redis_conn.delete(keys.ready(), keys.busy(), keys.pages(), keys.outbox())
    costs = {}
    for count in (20, 2000):
        sites = [f"t{i}" for i in range(count)]
        inflight.note_busy(redis_conn, "host:1:a", job_lease=10)
        before = int(redis_conn.info("stats")["total_commands_processed"])
        assert pending_work(redis_conn, sites) == 1
        costs[count] = int(redis_conn.info("stats")["total_commands_processed"]) - before - 1
        inflight.note_idle(redis_conn, "host:1:a")
        assert pending_work(redis_conn, sites) == 0
    assert max(costs.values()) <= 5 + 2 * QUICK_SITES, f"commands a look: {costs}"
    # A process that died holding jobs: its note lapses (here at once) and the exact count answers.
    lua_ttl_ms = 1
    from crawler.coord import lua

    lua.script(redis_conn, "mark_busy")(keys=[keys.busy()], args=["host:2:b", lua_ttl_ms])
    time.sleep(0.01)
    assert inflight.busy_processes(redis_conn) == 0


def test_a_drain_look_while_only_retries_wait_costs_the_same_few_commands_at_20_or_2000_sites(
    redis_conn: Redis,
) -> None:
    """A crawl's tail whose sites all answered 503: nothing queued or running, retries waiting for
    their time. The look finds them among the retries due soonest, in the same few commands at any
    number of sites, where it counted every site's work (five commands a site, every 0.25 s in each
    burst process). Retries of other crawls' sites only are not this crawl's work: the exact count
    then answers 0."""
    from crawler.coord.scheduler import Scheduler
    from crawler.work.drain import QUICK_SITES, pending_work

    redis_conn.delete(keys.ready(), keys.busy(), keys.pages(), keys.outbox(), keys.delayed())
    Scheduler(redis_conn).schedule("other-crawl", "entry", delay=60)
    assert pending_work(redis_conn, [f"r{i}" for i in range(20)]) == 0
    costs = {}
    for count in (20, 2000):
        sites = [f"r{i}" for i in range(count)]
        Scheduler(redis_conn).schedule(sites[count // 2], f"entry-{count}", delay=60)
        before = int(redis_conn.info("stats")["total_commands_processed"])
        assert pending_work(redis_conn, sites) >= 1
        costs[count] = int(redis_conn.info("stats")["total_commands_processed"]) - before - 1
    assert max(costs.values()) <= 5 + 2 * QUICK_SITES, f"commands a look: {costs}"
    redis_conn.delete(keys.delayed(), *(keys.stats(f"r{i}") for i in (10, 1000)))  # the retries, as promoted
    assert pending_work(redis_conn, [f"r{i}" for i in range(2000)]) == 0


def test_an_exact_count_of_every_sites_work_costs_the_same_few_commands_at_20_or_2000_sites(
    redis_conn: Redis,
) -> None:
    """The count that makes a burst's "drained" exact read five to ten keys a site (some 24 commands a
    site as a crawl of 2,000 sites ended, 6 of its 80 commands a request): now an EXISTS names
    SITES_AT_ONCE sites' keys at once, and only the sites of a batch that named one are read alone.
    Still exact, whichever key holds a site's work; the first site found is named."""
    from rq import Queue

    from crawler.coord.scheduler import Scheduler
    from crawler.work.drain import pending_work

    def queue_key(site: str, which: str) -> str:
        queue = Queue(keys.download_queue(site), connection=redis_conn)
        return {
            "queued": queue.key,
            "moving": queue.intermediate_queue_key,
            "started": queue.started_job_registry.key,
            "scheduled": queue.scheduled_job_registry.key,
        }[which]

    def counted(sites: list[str]) -> tuple[int, list[str], int]:
        found: list[str] = []
        before = int(redis_conn.info("stats")["total_commands_processed"])
        work = pending_work(redis_conn, sites, looked=True, found=found)
        return work, found, int(redis_conn.info("stats")["total_commands_processed"]) - before - 1

    redis_conn.delete(keys.ready(), keys.busy(), keys.pages(), keys.outbox(), keys.delayed(), keys.moving())
    costs = {}
    for count in (20, 2000):
        sites = [f"ex{count}-{i}" for i in range(count)]
        redis_conn.sadd(keys.sites(), *sites)
        work, found, costs[count] = counted(sites)
        assert (work, found) == (0, [])
        site = sites[count // 2 + 1]
        for which in ("queued", "moving", "scheduled"):
            redis_conn.rpush(queue_key(site, which), "job") if which != "scheduled" else redis_conn.zadd(
                queue_key(site, which), {"job": 1}
            )
            work, found, spent = counted(sites)
            assert work >= 1 and found == [site], which
            assert spent < 30 + 200, f"{which}: {spent} commands, more than one batch read alone"
            redis_conn.delete(queue_key(site, which))
        redis_conn.zadd(queue_key(site, "started"), {"job:exec": 1})
        assert counted(sites)[:2] == (1, [site])
        redis_conn.delete(queue_key(site, "started"))
        seed(Frontier(redis_conn, site, ["127.0.0.1"], 60, 60), ["http://127.0.0.1:9/a"])
        assert counted(sites)[:2] == (1, [site])
        redis_conn.delete(keys.levels(site), keys.frontier(site, 0), keys.frontier_extra(site))
        Scheduler(redis_conn).schedule(site, "a-retry", delay=60)
        assert counted(sites)[:2] == (1, [site])
        redis_conn.delete(keys.delayed(), keys.stats(site))
        Scheduler(redis_conn).schedule("another-crawl", "its-retry", delay=60)
        assert counted(sites)[:2] == (0, [])  # another crawl's retry is not this one's work
        redis_conn.delete(keys.delayed(), keys.stats("another-crawl"))
        assert counted(sites)[:2] == (0, [])
    assert costs[2000] <= costs[20] + 2000 // 200, f"commands a count of nothing left: {costs}"


def test_a_burst_looks_for_the_drain_often_and_counts_every_sites_work_at_its_own_pace(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst ended up to 0.25 s after its last page in each worker kind (their drain looks came
    that far apart), 0.3-0.6 s of a 38 s crawl of 200 sites. Its looks now come every 50 ms; the
    count of every site's work (once five commands a site) only when ``count_all`` says it is due. The
    few commands that look first are not made again before that count: once, then once more a
    moment later (the second of the two passes that make a drained answer exact)."""
    from crawler.work import drain
    from crawler.work.drain import QUICK_SITES, crawl_drained

    busy_asked: list[int] = []
    busy = drain.busy_processes
    monkeypatch.setattr(drain, "busy_processes", lambda connection: busy_asked.append(1) or busy(connection))

    redis_conn.delete(keys.ready(), keys.busy(), keys.pages(), keys.outbox())
    sites = [f"t{i}" for i in range(500)]
    redis_conn.sadd(keys.sites(), *sites)  # given work here once: each is counted (``drain.held_here``)
    asked: list[bool] = []

    def commands(due: bool) -> int:
        before = int(redis_conn.info("stats")["total_commands_processed"])
        drained = crawl_drained(redis_conn, sites, lambda: asked.append(due) or due)
        assert drained is due  # nothing is left: drained once counted
        return int(redis_conn.info("stats")["total_commands_processed"]) - before - 1

    assert commands(due=False) <= 5 + 2 * QUICK_SITES, "a look not due to count read every site"
    busy_asked.clear()
    assert commands(due=True) > 5 + 2 * QUICK_SITES, "a look due to count every site did not"
    assert asked == [False, True]
    assert len(busy_asked) == 2, "the busy processes were asked again before the count"


def test_one_burst_process_s_exact_drained_count_spares_the_others_theirs_but_not_their_cheap_looks(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a crawl of many sites ended, each burst process counted every site's work twice itself (some
    ten counts of ten commands a site at 2,000 sites: a third of the crawl's Redis commands). The first
    exact "drained" stands for the others for DRAINED_WORD_FOR seconds; new work is still seen by
    their cheap looks, verdict or not."""
    from crawler.coord.scheduler import Scheduler, publish_conf
    from crawler.work import drain
    from crawler.work.drain import QUICK_SITES, crawl_drained

    redis_conn.delete(keys.ready(), keys.busy(), keys.pages(), keys.outbox())
    sites = [f"v{i}" for i in range(500)]
    redis_conn.sadd(keys.sites(), *sites)  # given work here once: each is counted (``drain.held_here``)
    publish_conf(redis_conn, "v7", 0.0, 0.0)

    def commands() -> tuple[bool, int]:
        before = int(redis_conn.info("stats")["total_commands_processed"])
        drained = crawl_drained(redis_conn, sites, lambda: True)
        return drained, int(redis_conn.info("stats")["total_commands_processed"]) - before - 1

    counts: list[int] = []
    count = drain.pending_work
    monkeypatch.setattr(drain, "pending_work", lambda *a, **k: counts.append(1) or count(*a, **k))
    first, counted = commands()
    assert first and len(counts) == 2  # the first process counts every site, twice
    second, spent = commands()
    assert second and len(counts) == 2, "another process's look counted again"
    assert spent <= 7 + 2 * QUICK_SITES, f"another process's look: {spent} commands"
    redis_conn.rpush(f"rq:queue:{keys.download_queue('v7')}", "job")  # a site seeded again
    redis_conn.zadd(keys.ready(), {"v7": 0})
    assert not crawl_drained(redis_conn, sites, lambda: True)
    assert redis_conn.get(keys.drained()) == keys.group(sites).encode()
    # A job handed out (in an intermediate list: not seen by the cheap looks) voids the word.
    step = Scheduler(redis_conn, ["v7"]).next()
    assert step.job_id == "job" and not redis_conn.exists(keys.drained())
    assert not crawl_drained(redis_conn, sites, lambda: True)  # counted: the job handed out is work
    # Work the cheap looks miss (a job handed out, its worker not noted busy yet): found by one count,
    # whose word names its site; the other looks read that site alone while it has work.
    redis_conn.delete(keys.ready(), f"rq:queue:{keys.download_queue('v7')}:intermediate")
    redis_conn.rpush(f"rq:queue:{keys.download_queue('v300')}:intermediate", "in-hand")
    assert not crawl_drained(redis_conn, sites, lambda: True)
    assert redis_conn.get(keys.drained()) == b"work at v300"
    hinted, spent = commands()
    assert not hinted and spent <= 20 + 2 * QUICK_SITES, f"a look with a site named counted every site: {spent}"


def test_a_drained_word_taken_again_and_again_stands_until_work_voids_it_not_its_first_life(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process of several shards begins a drained shard's burst run again every half second while the
    other shards finish: each run taking the word let it lapse all the same, and each lapse cost two
    counts of every site of the shard. Taken, it stands DRAINED_WORD_FOR more; a job handed out still
    voids it."""
    from crawler.coord.scheduler import Scheduler
    from crawler.work import drain
    from crawler.work.drain import crawl_drained

    monkeypatch.setattr(drain, "DRAINED_WORD_FOR", 1.0)  # a loaded machine's look can take 0.3 s
    redis_conn.delete(keys.ready(), keys.busy(), keys.pages(), keys.outbox(), keys.drained())
    sites = [f"x{i}" for i in range(100)]
    redis_conn.sadd(keys.sites(), *sites)
    counts: list[int] = []
    count = drain.pending_work
    monkeypatch.setattr(drain, "pending_work", lambda *a, **k: counts.append(1) or count(*a, **k))
    assert crawl_drained(redis_conn, sites, lambda: True) and len(counts) == 2
    for _ in range(6):  # 3 s: three of the word's lives
        time.sleep(0.5)
        assert crawl_drained(redis_conn, sites, lambda: True)
    assert len(counts) == 2, "the word lapsed though taken within its life"
    redis_conn.rpush(f"rq:queue:{keys.download_queue('x7')}", "job")
    redis_conn.zadd(keys.ready(), {"x7": 0})
    assert Scheduler(redis_conn, ["x7"]).next().job_id == "job" and not redis_conn.exists(keys.drained())
    time.sleep(0.5)  # and once no look takes it, it lapses
    redis_conn.delete(f"rq:queue:{keys.download_queue('x7')}:intermediate", keys.ready())
    assert crawl_drained(redis_conn, sites, lambda: True) and len(counts) == 4
    time.sleep(1.1)
    assert not redis_conn.exists(keys.drained())


def test_an_exact_drain_count_reads_only_the_sites_this_redis_holds_not_those_of_other_shards(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker of several shards serves every site on each; a shard's count of every site's work
    reads only its own, in one command more."""
    from crawler.work import drain
    from crawler.work.drain import pending_work

    redis_conn.delete(keys.ready(), keys.busy(), keys.pages(), keys.outbox(), keys.sites())
    sites = [f"w{i}" for i in range(300)]
    redis_conn.sadd(keys.sites(), *sites[:10])
    counted: list[list[str]] = []
    count = drain._count_every_site
    monkeypatch.setattr(
        drain, "_count_every_site", lambda conn, held, found: counted.append(held) or count(conn, held, found)
    )
    assert pending_work(redis_conn, sites, looked=True) == 0
    assert counted == [sites[:10]]  # the ten held here, not the 290 of elsewhere
    seed(Frontier(redis_conn, "w3", ["127.0.0.1"], 60, 60), ["http://127.0.0.1:9/a"])
    assert pending_work(redis_conn, sites, looked=True) == 1  # the work of one held here is found


def test_an_idle_look_for_work_missing_from_the_ready_set_reads_only_the_sites_this_redis_holds(
    redis_conn: Redis, runtime: Runtime
) -> None:
    """A job put straight into a site's RQ queue is found by an idle process's repair look; on one of
    several shards the first such look read every site of the fleet, two commands each."""
    from rq import Queue

    sites = [f"rep{i}" for i in range(300)]
    queue = Queue(keys.download_queue("rep7"), connection=redis_conn, serializer=JSONSerializer)
    redis_conn.delete(keys.ready(), keys.sites())
    redis_conn.rpush(queue.key, "job-put-straight")
    redis_conn.sadd(Queue.redis_queues_keys, queue.key)  # what RQ's enqueue registers
    worker = DownloadWorker(redis_conn, sites, rt=runtime)
    before = int(redis_conn.info("stats")["total_commands_processed"])
    worker.when_idle()
    spent = int(redis_conn.info("stats")["total_commands_processed"]) - before - 1
    assert redis_conn.zscore(keys.ready(), "rep7") is not None, "the job's site was not marked ready"
    assert spent < 20, f"{spent} commands: the look read sites never given work here"


def test_a_burst_process_with_a_job_in_hand_asks_nothing_of_the_drain_and_looks_at_its_usual_pace(
    redis_conn: Redis, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own job in hand, the crawl is not drained: looks every 50 ms, each with a drain look, were
    a fifth of a download process's round trips at 200 slow sites. Once it holds none, they come."""
    from crawler.work import crawl_worker
    from crawler.work.crawl_worker import DRAIN_EVERY, DRAIN_LOOK_EVERY

    looks: list[bool] = []
    monkeypatch.setattr(crawl_worker, "crawl_drained", lambda *args: looks.append(True) or False)
    worker = DownloadWorker(redis_conn, ["quiet"], rt=runtime)
    worker._burst = True
    other = DownloadWorker(redis_conn, ["quiet"], rt=runtime)  # another thread of the process
    worker._leases.hold(other, None, None)  # type: ignore[arg-type]  # took a job (never renewed here)
    try:
        assert not worker._drained() and looks == []
        assert worker._drain_wait() == DRAIN_EVERY
    finally:
        worker._leases.release(other)
        worker._leases.close()
    assert not worker._drained() and looks == [True]
    assert worker._drain_wait() == DRAIN_LOOK_EVERY


def test_a_burst_process_whose_drain_look_saw_sites_waiting_for_their_turn_looks_again_less_often(
    redis_conn: Redis, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tail of a crawl of slow sites: no process holds a job, each site's work waits for its gate.
    Looks every 50 ms, each with a drain look of some ten commands, were a fixed cost of every Redis
    (of every shard) whatever its pages; the crawl cannot end before a job is handed out. Pages to
    parse (the crawl's very end) bring back the 50 ms looks."""
    from crawler.work import crawl_worker, drain
    from crawler.work.crawl_worker import DRAIN_LOOK_EVERY, DRAIN_WAITING_EVERY

    saw: list[str] = [drain.SITES]
    looks: list[float] = []

    def look(connection: Redis, sites: object, count_all: object, seen: list[str]) -> bool:
        looks.append(time.monotonic())
        seen.append(saw[0])
        return False

    monkeypatch.setattr(crawl_worker, "crawl_drained", look)
    worker = DownloadWorker(redis_conn, ["quiet"], rt=runtime)
    worker._burst = True
    try:
        assert not worker._drained() and len(looks) == 1
        assert worker._drain_wait() == DRAIN_WAITING_EVERY
        time.sleep(DRAIN_LOOK_EVERY * 1.5)
        assert not worker._drained() and len(looks) == 1, "looked again 50 ms on while sites wait"
        time.sleep(DRAIN_WAITING_EVERY)
        saw[0] = drain.PAGES
        assert not worker._drained() and len(looks) == 2
        assert worker._drain_wait() == DRAIN_LOOK_EVERY
        time.sleep(DRAIN_LOOK_EVERY * 1.5)
        assert not worker._drained() and len(looks) == 3
    finally:
        worker._leases.close()


def test_burst_workers_end_once_the_crawl_drains_not_when_the_sites_next_turn_comes(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    """A site that was served stays in the ready set until its next turn, an interval on, shows it has
    no work left: a burst download process, told to wait for that turn, ended only then (5 s of a 78 s
    crawl of 1,000 sites at 5 s). It looks for the drain after every look that finds no job."""
    # Long, so that half of it holds a parse and two process exits on a busy machine (4 s seen)
    # while waiting for the next turn still fails; a burst that ends as it should takes no longer.
    interval = 20.0
    settings = dataclasses.replace(settings, sites={"demo": {"interval": interval, "obey_robots": False}})
    with ShopSite(products=1, faults=False) as shop:
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("demo"), [shop.url + "/catalogue.pdf"])  # not HTML: no links to follow
        specs = [WorkerSpec("download", ("demo",), burst=True), WorkerSpec("parse", ("demo",), burst=True)]
        processes = start_workers(specs, settings, redis_url)
        try:
            deadline = time.monotonic() + 60
            for process in processes:
                process.join(max(0.0, deadline - time.monotonic()))
            ended = time.time()  # the wire's clock (``RequestLogEntry.time``)
            assert not any(p.is_alive() for p in processes), "the burst did not end"
        finally:
            stop_workers(processes)
        assert [p.exitcode for p in processes] == [0, 0]
        assert [e.path for e in shop.requests] == ["/catalogue.pdf"]
        after = ended - shop.requests[-1].time
    assert after < interval / 2, f"the burst ended {after:.1f} s after its last request (interval {interval} s)"


def test_a_busy_download_process_notes_itself_and_takes_the_note_back(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    """While its worker holds a job the process is noted busy; once the job is done, it is not."""
    from crawler.coord import inflight

    redis_conn.delete(keys.busy())
    with ShopSite(products=2, latency=2.0, faults=False) as shop:
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("demo"), [shop.url + "/product/1"])
        (process,) = start_workers([WorkerSpec("download", ("demo",))], settings, redis_url)
        try:
            deadline = time.monotonic() + 30
            while not inflight.busy_processes(redis_conn) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert inflight.busy_processes(redis_conn) == 1, "a process with a job in hand was not noted busy"
            while inflight.busy_processes(redis_conn) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert inflight.busy_processes(redis_conn) == 0, "the note outlived the job"
            assert [entry.path for entry in shop.requests if entry.path != "/robots.txt"] == ["/product/1"]
        finally:
            stop_workers([process])


def test_one_default_download_process_keeps_many_slow_sites_in_flight_at_once(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    """No thread count to give: a download process grows its threads while every one is busy and
    work is found, so 16 slow sites (0.6 s a response, one request every 0.2 s each) are fetched
    side by side, each at its own interval (issue 21: one thread by default, 64 at most)."""
    latency, interval, count = 0.6, 0.2, 16
    names = [f"slow{i:02d}" for i in range(count)]
    shops = [ShopSite(products=5, per_page=20, latency=latency, faults=False).start() for _ in names]
    try:
        for name in names:
            (Path(settings.sites_dir) / f"{name}.py").write_text(
                f"from crawler.demo.spider import DemoShop\n\nclass Slow(DemoShop):\n    name = {name!r}\n"
            )
        settings = dataclasses.replace(settings, sites={name: {"interval": interval} for name in names})
        with installed_runtime(redis_conn, settings) as rt:
            for name, shop in zip(names, shops, strict=True):
                seed(rt.frontier(name), [shop.url + "/"])
        processes = start_workers(
            [WorkerSpec("download", tuple(names), burst=True), WorkerSpec("parse", tuple(names), burst=True)],
            settings,
            redis_url,
        )
        try:
            for process in processes:
                process.join(120)
            assert not any(p.is_alive() for p in processes), "the burst did not end"
        finally:
            stop_workers(processes)
        arrivals = sorted(entry.time for shop in shops for entry in shop.requests)
        # Requests the shops were answering at once: those that arrived within one latency.
        at_once = max(bisect.bisect_left(arrivals, t + latency) - i for i, t in enumerate(arrivals))
        gaps = [shop.min_gap() for shop in shops]
        for name, shop in zip(names, shops, strict=True):
            assert items_by_key(settings.database_url, name).keys() == shop.expected_items().keys()
    finally:
        for shop in shops:
            shop.stop()
    print(f"{len(arrivals)} requests, at most {at_once} in flight at once, closest gap {min(filter(None, gaps)):.3f} s")
    assert at_once >= count, f"one process kept at most {at_once} requests in flight for {count} slow sites"
    assert all(gap is None or gap >= interval for gap in gaps), f"two requests closer than {interval}: {gaps}"


def test_a_jobs_claim_reads_its_sites_live_settings_along_when_they_are_due_for_a_re_read(
    redis_conn: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site's live settings and spider arguments, due for their once-a-second re-read, ride in the
    transaction that claims its job (``SiteReads.read_site_along``): at 1,000 sites, each site's job
    came every few seconds and paid a round trip of its own for them. A change made meanwhile is
    in force for the job all the same."""
    from rq import Queue

    from crawler.coord.frontier import DownloadTask
    from crawler.coord.vetting import CrawlerJob
    from crawler.work import jobs
    from crawler.work.site_reads import READ_ALONG_AHEAD, SiteReads

    rt = Runtime(redis_conn, dataclasses.replace(settings, sites={"demo": {"interval": 0.05}}))
    queue = Queue(keys.download_queue("demo"), connection=redis_conn, serializer=JSONSerializer, job_class=CrawlerJob)
    reads_alone: list[str] = []
    read_site = SiteReads._read_site
    monkeypatch.setattr(
        SiteReads, "_read_site", lambda self, site, *fresh: reads_alone.append(site) or read_site(self, site, *fresh)
    )
    try:
        with ShopSite(products=1) as shop:
            worker = DownloadWorker(redis_conn, ["demo"], rt=rt)
            for path, interval in (("/", 0.25), ("/products?page=1", 0.5)):
                assert rt.policy("demo").interval != interval
                set_live(redis_conn, "demo", interval=interval)  # as `crawler set demo interval=...`
                time.sleep(1.0 - READ_ALONG_AHEAD + 0.05)  # what this process holds is now due for a re-read
                reads_alone.clear()
                job = queue.enqueue(jobs.download, DownloadTask("demo", shop.url + path).to_json())
                redis_conn.lrem(queue.key, 1, job.id)  # handed out, as NEXT_JOB does
                redis_conn.delete(keys.gate("demo"))
                worker.execute_job(job, queue)
                assert reads_alone == [], "the job read its site's settings in a round trip of its own"
                assert rt.policy("demo").interval == interval  # in force: read along with the claim
                assert path in [e.path for e in shop.requests]
    finally:
        rt.close()


def test_a_parse_batchs_sites_are_re_read_in_one_round_trip_before_its_pages_are_parsed(
    redis_conn: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SiteReads.read_sites_due``: the live settings and spider arguments of a batch's sites that are due
    for a re-read, in one pipeline; a site without a spider here is not read, and one read a moment ago
    is not read again. At 1,000 sites a parse worker read each page's site in a round trip of its own."""
    from crawler.work.site_reads import READ_ALONG_AHEAD, SiteReads

    rt = Runtime(redis_conn, settings)
    reads_alone: list[str] = []
    read_site = SiteReads._read_site
    monkeypatch.setattr(
        SiteReads, "_read_site", lambda self, site, *fresh: reads_alone.append(site) or read_site(self, site, *fresh)
    )
    try:
        assert rt.policy("demo").interval != 0.75
        set_live(redis_conn, "demo", interval=0.75)
        time.sleep(1.0 - READ_ALONG_AHEAD + 0.05)
        reads_alone.clear()
        rt.sites.read_sites_due(["demo", "demo", "no-spider-here"])
        assert rt.policy("demo").interval == 0.75 and rt.spider("demo") is not None
        assert reads_alone == []
        read_at = rt.policies.read_at("demo")
        rt.sites.read_sites_due(["demo"])  # fresh: nothing read
        assert rt.policies.read_at("demo") == read_at
        assert not rt.sites.has_spider("no-spider-here") and rt.sites.has_spider("demo")
    finally:
        rt.close()


def test_a_look_that_meets_a_dry_queue_hands_the_refill_to_its_thread_outside_the_lookers_room(
    runtime: Runtime, redis_conn: Redis
) -> None:
    """A refill is some ten round trips: done in the look, it held one of the process's two looks,
    and at 1,000 sites on a loaded machine new sites started a few a second. The look ends at
    once, naming the site; its thread refills and takes the job (``follow``), counted busy, while
    another thread looks."""
    from crawler.coord.frontier import DownloadTask
    from crawler.coord.scheduler import publish_conf

    site = "demo"
    runtime.frontier(site).push([DownloadTask(site, "http://127.0.0.1:9/first")])
    publish_conf(redis_conn, site, 0.0, 0.0)
    redis_conn.zadd(keys.ready(), {site: 0})
    worker = DownloadWorker(redis_conn, [site], rt=runtime)
    room = worker._idle.room
    found, wait = worker.next_job()
    assert found is None and wait == 0.0
    queue = worker._by_site[site]
    assert queue.key == f"rq:queue:{keys.download_queue(site)}"
    assert redis_conn.llen(queue.key) == 0, "the look refilled the queue itself"
    room.found_work()  # as the look's end counts its thread busy (``dequeue_job_and_maintain_ttl``)
    taken = worker.follow()
    assert taken is not None and taken[0].args[0]["url"] == "http://127.0.0.1:9/first"
    assert worker.follow() is None  # handed once


def test_rq_maintenance_runs_first_a_while_after_the_process_starts_then_once_a_period(
    redis_conn: Redis, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ cleans every queue's registries as its worker starts: each download process of a fleet
    did, some ten round trips a site (4,000 at 200 sites) while the crawl started, for nothing the
    reaper does not do from its first pass."""
    from crawler.work import idle
    from crawler.work.crawl_worker import FIRST_MAINTENANCE_AFTER

    started = time.monotonic()
    worker = DownloadWorker(redis_conn, [f"s{i}" for i in range(200)], rt=runtime)
    other = DownloadWorker(redis_conn, [f"s{i}" for i in range(200)], rt=runtime)  # a thread of the process
    assert not worker.should_run_maintenance_tasks and not other.should_run_maintenance_tasks
    monkeypatch.setattr(idle.time, "monotonic", lambda: started + FIRST_MAINTENANCE_AFTER + 1)
    assert worker.should_run_maintenance_tasks, "never due"
    assert not other.should_run_maintenance_tasks, "due for each thread of the process"
    monkeypatch.setattr(idle.time, "monotonic", lambda: started + FIRST_MAINTENANCE_AFTER + 2)
    assert not worker.should_run_maintenance_tasks, "due again within a period"
