"""Batch jobs: a fast site's URLs ride several to an RQ job, each still through the gate, none lost or fetched twice."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from crawling import items_by_key
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from crawler.coord import joblife, keys
from crawler.coord.frontier import DownloadTask, Frontier, seed
from crawler.coord.policy import set_live
from crawler.coord.scheduler import JOBS_AHEAD
from crawler.coord.vetting import MAX_BATCH, CrawlerJob
from crawler.demo import ShopSite
from crawler.settings import Settings
from crawler.spiders.spider import Request
from crawler.work import jobs
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.work.runtime import BATCH_BELOW, Runtime, install

SITE = "demo"
#: An interval under BATCH_BELOW: the site gets batch jobs.
FAST = 0.01
#: An interval that, with the default gate margin, is still within BATCH_BELOW.
FAST_WITH_MARGIN = 0.004


def fast(settings: Settings, interval: float = FAST) -> Settings:
    return dataclasses.replace(settings, sites={SITE: {"interval": interval}}, gate_margin=0.0)


def queued_jobs(connection: Redis) -> list[CrawlerJob]:
    queue = Queue(keys.download_queue(SITE), connection=connection, serializer=JSONSerializer, job_class=CrawlerJob)
    return queue.get_jobs()


def test_a_fast_sites_urls_go_in_batches_of_one_priority_a_slow_sites_one_a_job(
    redis_conn: Redis, settings: Settings
) -> None:
    assert FAST + 0.0 <= BATCH_BELOW
    count = 2 * MAX_BATCH + 4
    urls = [f"http://127.0.0.1:9/p/{i}" for i in range(count)]
    for interval, sizes in ((FAST, [MAX_BATCH, MAX_BATCH, 3, 1]), (1.0, [1, 1, 1, 1])):
        redis_conn.flushdb()
        rt = Runtime(redis_conn, fast(settings, interval))
        try:
            frontier = rt.frontier(SITE)
            frontier.add([Request(u) for u in urls[: count - 1]])
            frontier.add([Request(urls[-1], priority=-1)])  # of another priority: a job of its own
            assert frontier.refill(JOBS_AHEAD) == 4
        finally:
            rt.close()
        made = queued_jobs(redis_conn)
        assert [len(job.args) for job in made] == sizes
        assert [p["url"] for job in made for p in job.args] == urls[: sum(sizes)]  # in frontier order
        assert made[0].timeout == sizes[0] * made[-1].timeout // sizes[-1]  # the timeout is per URL
    # A job carrying a batch describes itself by its first URL.
    assert queued_jobs(redis_conn)[0].description == urls[0]


def test_a_batch_crawl_stores_everything_keeps_the_interval_and_fetches_each_page_once(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    # A fast site as users run one, with the default margin (which absorbs the jitter between a
    # request's send and its arrival at the server): 4 ms + 10 ms is still within BATCH_BELOW.
    settings = dataclasses.replace(settings, sites={SITE: {"interval": FAST_WITH_MARGIN}})
    probe = Runtime(redis_conn, settings)
    try:
        assert probe.batch_size(SITE) == MAX_BATCH
    finally:
        probe.close()
    # With faults: /product/3's 503 (Retry-After: 1) closes the gate in the middle of batches,
    # whose remaining URLs go back to the frontier and are fetched later.
    with ShopSite(products=80) as shop:
        rt = Runtime(redis_conn, settings)
        try:
            seed(rt.frontier(SITE), [shop.url + "/"])
        finally:
            rt.close()
        specs = [WorkerSpec("download", (SITE,), threads=2, burst=True)] * 2
        specs += [WorkerSpec("parse", (SITE,), burst=True)]
        processes = start_workers(specs, settings, redis_url)
        done = threading.Event()
        threading.Thread(target=lambda: done.wait(120) or stop_workers(processes, timeout=10), daemon=True).start()
        try:
            assert wait_for(processes) == 0
        finally:
            done.set()
        assert items_by_key(settings.database_url) == shop.expected_items()
        paths = [entry.path for entry in shop.requests]
        twice = {p for p in paths if paths.count(p) > 1}
        assert twice == {"/product/3", "/product/7"}, "only the 503 and the 500 are asked again"
        gap = shop.min_gap()
        interval = FAST_WITH_MARGIN
        assert gap is not None and gap >= interval, f"two requests {gap * 1000:.1f} ms apart for {interval * 1000} ms"


def test_a_retried_batch_skips_the_urls_it_had_done(
    redis_url: str, redis_conn: Redis, settings: Settings, shop: ShopSite
) -> None:
    settings = fast(settings)
    urls = [f"{shop.url}/product/{i}" for i in (10, 11, 12, 13, 14)]
    rt = Runtime(redis_conn, settings)
    try:
        frontier = rt.frontier(SITE)
        frontier.add([Request(u, callback="parse_product") for u in urls])
        frontier.refill(1)
    finally:
        rt.close()
    (job,) = queued_jobs(redis_conn)
    assert len(job.args) == 5
    joblife.save_batch_done(job, 3)  # as a worker that died after its third URL left it
    # No parse worker: the crawl goes no further than the batch (its pages stay in the stream).
    processes = start_workers([WorkerSpec("download", (SITE,))], settings, redis_url)
    try:
        deadline = time.monotonic() + 30
        while redis_conn.exists(job.key):  # deleted once the batch is finished
            assert time.monotonic() < deadline, "the batch never finished"
            time.sleep(0.05)
    finally:
        stop_workers(processes, timeout=10)
    asked = [entry.path for entry in shop.requests if entry.path.startswith("/product/")]
    assert asked == ["/product/13", "/product/14"]
    assert redis_conn.xlen(keys.pages()) == 2


def test_the_rest_of_a_batch_goes_back_to_the_front_when_the_site_closes_meanwhile(
    redis_conn: Redis, settings: Settings, shop: ShopSite
) -> None:
    rt = Runtime(redis_conn, fast(settings))
    install(rt)
    try:
        rt.frontier(SITE).add([Request(f"{shop.url}/product/20")])  # already waiting: the rest goes before it
        batch = [
            DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json()
            for i in (3, 1, 2)  # /product/3 answers 503 with Retry-After: 1, closing the site's gate
        ]
        jobs.download(*batch)
        waiting = [task.url for task in Frontier(redis_conn, SITE, [], 0, 0).waiting()]
    finally:
        rt.close()
    assert [entry.path for entry in shop.requests if entry.path.startswith("/product/")] == ["/product/3"]
    assert waiting == [f"{shop.url}/product/{i}" for i in (1, 2, 20)]
    assert redis_conn.zscore(keys.ready(), SITE) is not None


def test_a_queued_batch_evicted_by_a_higher_priority_goes_back_whole_and_in_order(
    redis_conn: Redis, settings: Settings
) -> None:
    urls = [f"http://127.0.0.1:9/p/{i}" for i in range(MAX_BATCH + 2)]
    rt = Runtime(redis_conn, fast(settings))
    try:
        frontier = rt.frontier(SITE)
        frontier.add([Request(u) for u in urls])
        frontier.refill(1)
        (job,) = queued_jobs(redis_conn)
        assert len(job.args) == MAX_BATCH
        frontier.add([Request("http://127.0.0.1:9/urgent", priority=5)])  # preempts the queued batch
        made = queued_jobs(redis_conn)
        waiting = [task.url for task in Frontier(redis_conn, SITE, [], 0, 0).waiting()]
    finally:
        rt.close()
    assert [p["url"] for p in made[0].args] == ["http://127.0.0.1:9/urgent"]
    queued = [p["url"] for job in made[1:] for p in job.args]
    assert queued + waiting == urls  # nothing lost, nothing twice, still in order
    assert not redis_conn.exists(job.key)


def test_batch_done_reads_only_a_sane_count(redis_conn: Redis, tmp_path: Path) -> None:
    payloads = [DownloadTask(SITE, f"http://127.0.0.1:9/p/{i}").to_json() for i in range(3)]
    queue = Queue(keys.download_queue(SITE), connection=redis_conn, serializer=JSONSerializer, job_class=CrawlerJob)
    job = queue.enqueue(jobs.download, *payloads)
    for written, read in ((2, 2), (3, 3), (4, 0), (-1, 0), ("2", 0), (True, 0), (None, 0)):
        job.meta[joblife.BATCH_DONE] = written
        job.save_meta()
        again = queue.fetch_job(job.id)
        assert again is not None and joblife.batch_done(again) == read
        assert joblife.tasks_left(again) == payloads[read:]


def test_a_pause_sends_the_rest_of_a_batch_back(redis_conn: Redis, settings: Settings, shop: ShopSite) -> None:
    set_live(redis_conn, SITE, paused=True)  # after the job was handed out for its first URL
    rt = Runtime(redis_conn, fast(settings))
    install(rt)
    try:
        batch = [DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json() for i in (1, 2, 4)]
        jobs.download(*batch)
        waiting = [task.url for task in Frontier(redis_conn, SITE, [], 0, 0).waiting()]
    finally:
        rt.close()
    assert [entry.path for entry in shop.requests if entry.path.startswith("/product/")] == ["/product/1"]
    assert waiting == [f"{shop.url}/product/{i}" for i in (2, 4)]


def test_a_batch_that_raises_midway_writes_what_it_fetched_and_its_retry_starts_after_it(
    redis_conn: Redis, settings: Settings, shop: ShopSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = Runtime(redis_conn, fast(settings))
    install(rt)
    try:
        urls = [f"{shop.url}/product/{i}" for i in (10, 11, 12, 13, 14)]
        robots = f"{shop.url}/robots.txt"
        frontier = rt.frontier(SITE)
        frontier.add([Request(u, callback="parse_product") for u in urls])
        frontier.refill(1)
        (job,) = queued_jobs(redis_conn)
        real, failed = jobs._download_one, []

        def database_gone_at_13(*args: Any) -> bool:
            if args[1]["url"].endswith("/product/13") and not failed:
                failed.append(True)
                raise RuntimeError("the 4th URL raised")
            return real(*args)

        monkeypatch.setattr(jobs, "_download_one", database_gone_at_13)
        with pytest.raises(RuntimeError):
            job.perform()  # as a worker runs it
        # The three pages fetched before it are recorded and with the parse workers, and counted done.
        recorded = {r["url"] for r in rt.store.fetch_rows(SITE) if r["kind"] == "download"} - {robots}
        assert recorded == set(urls[:3]) and redis_conn.xlen(keys.pages()) == 3
        again = queued_jobs_by_id(redis_conn, job.id)
        assert joblife.batch_done(again) == 3
        again.perform()  # the retry
        recorded = [r["url"] for r in rt.store.fetch_rows(SITE) if r["kind"] == "download" and r["url"] != robots]
    finally:
        rt.close()
    assert sorted(recorded) == sorted(urls) and redis_conn.xlen(keys.pages()) == 5
    asked = [entry.path for entry in shop.requests if entry.path.startswith("/product/")]
    assert asked == ["/product/10", "/product/11", "/product/12", "/product/13", "/product/14"]


def queued_jobs_by_id(connection: Redis, job_id: str) -> CrawlerJob:
    return CrawlerJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
