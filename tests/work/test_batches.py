"""Batch jobs: a site's URLs ride several to an RQ job, each still through the gate, none lost or fetched twice.

A fast site's batch holds its records back and writes them together; a slow site's (paced) one
is fetched in turn by one thread waiting on the gate between URLs, each record written before the
next URL (with other threads' records: ``events.RecordWriter``).
"""

from __future__ import annotations

import dataclasses
import functools
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
from crawler.coord.policy import LIVE_REFRESH, set_live
from crawler.coord.scheduler import FOLLOW_AHEAD, JOBS_AHEAD, Scheduler, publish_conf
from crawler.coord.spiderargs import ARGS_REFRESH
from crawler.coord.vetting import MAX_BATCH, CrawlerJob
from crawler.demo import ShopSite
from crawler.settings import Settings
from crawler.spiders.spider import Request
from crawler.store import outbox
from crawler.work import jobs
from crawler.work.batching import (
    BATCH_BELOW,
    LATE_SPACING,
    PACED_BATCH_SPAN,
    PACED_MAX_INTERVAL,
    PACED_MIN_INTERVAL,
    SLOW_ANSWER,
    UNBATCHED_FOR,
)
from crawler.work.jobs import batch as batches
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.work.runtime import Runtime

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


def test_a_sites_urls_go_in_batches_of_one_priority_a_fast_sites_of_16_a_slow_sites_of_a_spans_worth(
    redis_conn: Redis, settings: Settings
) -> None:
    assert FAST + 0.0 <= BATCH_BELOW
    count = 2 * MAX_BATCH + 4
    urls = [f"http://127.0.0.1:9/p/{i}" for i in range(count)]
    slow = 5.0  # the 1,000 sites of issue 21
    per_span = int(PACED_BATCH_SPAN // slow)
    assert 1 < per_span < MAX_BATCH and 4 * per_span < count - 1 and PACED_MIN_INTERVAL <= 1.0
    assert slow < PACED_MAX_INTERVAL and int(PACED_BATCH_SPAN // PACED_MAX_INTERVAL) > 1
    cases: list[tuple[dict[str, Any], list[int]]] = [
        ({"interval": FAST}, [MAX_BATCH, MAX_BATCH, 3, 1]),
        ({"interval": 1.0}, [MAX_BATCH, MAX_BATCH, 3, 1]),  # 20 URLs fit in the span: MAX_BATCH
        ({"interval": slow}, [per_span] * 4),
        ({"interval": PACED_MAX_INTERVAL}, [int(PACED_BATCH_SPAN // PACED_MAX_INTERVAL)] * 4),
        ({"interval": 2 * PACED_MAX_INTERVAL}, [1, 1, 1, 1]),  # a thread held that long for each request
        ({"interval": 0.1}, [1, 1, 1, 1]),  # responses often slower than that: one thread could not keep up
        ({"interval": 1.0, "concurrency": 2}, [1, 1, 1, 1]),  # requests that overlap: a batch's would not
        ({"interval": {"min": 1.0, "max": 5.0}}, [1, 1, 1, 1]),  # adaptive: it may grow at any time
    ]
    for site, sizes in cases:
        redis_conn.flushdb()
        rt = Runtime(redis_conn, dataclasses.replace(settings, sites={SITE: site}, gate_margin=0.0))
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
    try:
        rt.frontier(SITE).add([Request(f"{shop.url}/product/20")])  # already waiting: the rest goes before it
        batch = [
            DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json()
            for i in (3, 1, 2)  # /product/3 answers 503 with Retry-After: 1, closing the site's gate
        ]
        jobs.download(*batch, rt=rt)
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


def test_batch_done_reads_only_a_sane_count(fake_redis: Redis, tmp_path: Path) -> None:
    payloads = [DownloadTask(SITE, f"http://127.0.0.1:9/p/{i}").to_json() for i in range(3)]
    queue = Queue(keys.download_queue(SITE), connection=fake_redis, serializer=JSONSerializer, job_class=CrawlerJob)
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
    try:
        batch = [DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json() for i in (1, 2, 4)]
        jobs.download(*batch, rt=rt)
        waiting = [task.url for task in Frontier(redis_conn, SITE, [], 0, 0).waiting()]
    finally:
        rt.close()
    assert [entry.path for entry in shop.requests if entry.path.startswith("/product/")] == ["/product/1"]
    assert waiting == [f"{shop.url}/product/{i}" for i in (2, 4)]


def test_a_batch_that_raises_midway_writes_what_it_fetched_and_its_retry_starts_after_it(
    redis_conn: Redis, settings: Settings, shop: ShopSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = Runtime(redis_conn, fast(settings))
    try:
        urls = [f"{shop.url}/product/{i}" for i in (10, 11, 12, 13, 14)]
        robots = f"{shop.url}/robots.txt"
        frontier = rt.frontier(SITE)
        frontier.add([Request(u, callback="parse_product") for u in urls])
        frontier.refill(1)
        (job,) = queued_jobs(redis_conn)
        real, failed = batches.download_one, []

        def database_gone_at_13(*args: Any) -> bool:
            if args[2]["url"].endswith("/product/13") and not failed:
                failed.append(True)
                raise RuntimeError("the 4th URL raised")
            return real(*args)

        monkeypatch.setattr(batches, "download_one", database_gone_at_13)
        with pytest.raises(RuntimeError):
            job.bound = {"rt": rt}  # as a download worker gives it
            job.perform()  # as a worker runs it
        # The three pages fetched before it are recorded and with the parse workers, and counted done.
        recorded = {r["url"] for r in rt.store.fetch_rows(SITE) if r["kind"] == "download"} - {robots}
        assert recorded == set(urls[:3]) and redis_conn.xlen(keys.pages()) == 3
        again = queued_jobs_by_id(redis_conn, job.id)
        assert joblife.batch_done(again) == 3
        again.bound = {"rt": rt}  # as a download worker gives it
        again.perform()  # the retry
        recorded = [r["url"] for r in rt.store.fetch_rows(SITE) if r["kind"] == "download" and r["url"] != robots]
    finally:
        rt.close()
    assert sorted(recorded) == sorted(urls) and redis_conn.xlen(keys.pages()) == 5
    asked = [entry.path for entry in shop.requests if entry.path.startswith("/product/")]
    assert asked == ["/product/10", "/product/11", "/product/12", "/product/13", "/product/14"]


def queued_jobs_by_id(connection: Redis, job_id: str) -> CrawlerJob:
    return CrawlerJob.fetch(job_id, connection=connection, serializer=JSONSerializer)


# -- a slow site's paced batches -----------------------------------------------------------

#: A slow site's interval in these tests (margin 0): from PACED_MIN_INTERVAL, so its batches are paced.
SLOW = PACED_MIN_INTERVAL


def redis_ms(connection: Redis) -> int:
    seconds, micros = connection.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_next_job_holds_a_paced_sites_turns_for_its_batch_and_batch_over_gives_them_back(redis_conn: Redis) -> None:
    site = "slow"
    queue = Queue(keys.download_queue(site), connection=redis_conn, serializer=JSONSerializer, job_class=CrawlerJob)
    for i in range(3):
        queue.enqueue(jobs.download, DownloadTask(site, f"http://127.0.0.1:9/{i}").to_json())
    redis_conn.zadd(keys.ready(), {site: 0})
    scheduler = Scheduler(redis_conn, [site])
    publish_conf(redis_conn, site, 1.0, 0.0, batch=4)
    assert redis_conn.hget(keys.conf(site), "batch") == b"4"
    before = redis_ms(redis_conn)
    step = scheduler.next()
    assert step.job_id is not None
    held = redis_conn.zscore(keys.ready(), site)
    assert held is not None and before + 4000 <= held <= redis_ms(redis_conn) + 4000  # four turns, not one
    assert scheduler.next().job_id is None  # nobody else is handed the site meanwhile
    # The batch ends early: the site is due as soon as its own gate opens.
    redis_conn.set(keys.gate(site), "x", px=300)
    scheduler.batch_over(site)
    again = redis_conn.zscore(keys.ready(), site)
    assert again is not None and redis_ms(redis_conn) <= again <= redis_ms(redis_conn) + 300
    # Never later than NEXT_JOB had it, and a site that left the ready set is left out of it.
    redis_conn.set(keys.gate(site), "x", px=60_000)
    scheduler.batch_over(site)
    assert redis_conn.zscore(keys.ready(), site) == again
    redis_conn.zrem(keys.ready(), site)
    scheduler.batch_over(site)
    assert redis_conn.zscore(keys.ready(), site) is None
    # Published without a batch (or with one of 1): one turn, as before.
    publish_conf(redis_conn, site, 1.0, 0.0)
    assert not redis_conn.hexists(keys.conf(site), "batch")
    redis_conn.delete(keys.gate(site))
    redis_conn.zadd(keys.ready(), {site: 0})
    before = redis_ms(redis_conn)
    assert scheduler.next().job_id is not None
    score = redis_conn.zscore(keys.ready(), site)
    assert score is not None and before + 1000 <= score <= redis_ms(redis_conn) + 1000


def test_a_paced_batch_writes_each_record_and_saves_its_progress_before_each_wait(
    redis_conn: Redis, settings: Settings, shop: ShopSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = Runtime(redis_conn, fast(settings, SLOW))
    try:
        batching = rt.batching(SITE)
        assert batching.paced and batching.size == MAX_BATCH and batching.gate_wait > 2 * SLOW
        frontier = rt.frontier(SITE)
        assert redis_conn.hget(keys.conf(SITE), "batch") is None  # published before the site's work is added
        rt.publish(SITE)
        assert redis_conn.hget(keys.conf(SITE), "batch") == str(MAX_BATCH).encode()
        urls = [f"{shop.url}/product/{i}" for i in (10, 11, 12, 13)]
        frontier.add([Request(u, callback="parse_product") for u in urls])
        frontier.refill(1)
        (job,) = queued_jobs(redis_conn)
        assert len(job.args) == 4
        real, seen = batches.download_one, []

        def watched(*args: Any) -> bool:  # what the parse workers and a retry would see before each URL
            again = queued_jobs_by_id(redis_conn, job.id)
            seen.append((redis_conn.xlen(keys.pages()), joblife.batch_done(again)))
            return real(*args)

        monkeypatch.setattr(batches, "download_one", watched)
        redis_conn.zadd(keys.ready(), {SITE: redis_ms(redis_conn) + 60_000})  # as NEXT_JOB held it
        job.bound = {"rt": rt}  # as a download worker gives it
        job.perform()  # as a worker runs it
        # Done in full, its finish deletes it: no round trip to save that the fourth is done too.
        after = joblife.batch_done(queued_jobs_by_id(redis_conn, job.id))
    finally:
        rt.close()
    assert seen == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert after == 3
    arrivals = [e.time for e in shop.requests if e.path.startswith("/product/")]
    assert len(arrivals) == 4
    assert min(b - a for a, b in zip(arrivals, arrivals[1:], strict=False)) >= SLOW
    # Over: the site is due again when its gate opens, not in a minute.
    score = redis_conn.zscore(keys.ready(), SITE)
    assert score is not None and score <= redis_ms(redis_conn) + SLOW * 1000


def test_a_paced_batch_whose_record_is_not_written_counts_the_url_undone_and_its_retry_fetches_it(
    redis_conn: Redis, settings: Settings, shop: ShopSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paced batch hands its records to the process's writer (``SoonRecords``) and waits for each
    before the URL counts as done: one whose write failed is fetched again by the retry."""
    rt = Runtime(redis_conn, fast(settings, SLOW))
    try:
        urls = [f"{shop.url}/product/{i}" for i in (10, 11, 12)]
        frontier = rt.frontier(SITE)
        frontier.add([Request(u, callback="parse_product") for u in urls])
        frontier.refill(1)
        (job,) = queued_jobs(redis_conn)
        real, failed = outbox.write_all, []

        def gone_at_11(connection: Any, store: Any, records: Any) -> list[str]:
            if any(r.url.endswith("/product/11") for r in records) and not failed:
                failed.append(True)
                raise RuntimeError("the write of /product/11 broke")
            return real(connection, store, records)

        monkeypatch.setattr(outbox, "write_all", gone_at_11)
        with pytest.raises(RuntimeError, match="/product/11"):
            job.bound = {"rt": rt}  # as a download worker gives it
            job.perform()  # as a worker runs it
        again = queued_jobs_by_id(redis_conn, job.id)
        assert joblife.batch_done(again) == 1 and redis_conn.xlen(keys.pages()) == 1
        again.bound = {"rt": rt}  # as a download worker gives it
        again.perform()  # the retry
        recorded = [r["url"] for r in rt.store.fetch_rows(SITE) if r["kind"] == "download" and "product" in r["url"]]
    finally:
        rt.close()
    assert sorted(recorded) == urls and redis_conn.xlen(keys.pages()) == 3
    asked = [entry.path for entry in shop.requests if entry.path.startswith("/product/")]
    assert asked == ["/product/10", "/product/11", "/product/11", "/product/12"]


@pytest.mark.parametrize("why", ["stopping", "crowded"])
def test_a_stopping_worker_or_a_crowded_process_hands_the_rest_of_a_paced_batch_back(
    redis_conn: Redis, settings: Settings, shop: ShopSite, why: str
) -> None:
    rt = Runtime(redis_conn, fast(settings, SLOW))
    try:
        batch = [DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json() for i in (1, 2, 4)]
        asked = iter([False, True])
        jobs.download(*batch, rt=rt, **{why: lambda: next(asked)})
        waiting = [task.url for task in Frontier(redis_conn, SITE, [], 0, 0).waiting()]
    finally:
        rt.close()
    assert [entry.path for entry in shop.requests if entry.path.startswith("/product/")] == ["/product/1", "/product/2"]
    assert waiting == [f"{shop.url}/product/4"]


def test_a_graceful_stop_ends_a_paced_batchs_wait_for_its_next_turn_at_once(
    redis_conn: Redis, settings: Settings, shop: ShopSite
) -> None:
    """A paced batch at 5 s (issue 21's 1,000 sites) rests between its URLs on the worker's stop
    event, not in the gate's sleep: a graceful stop hands the rest back at once, not a turn later."""
    interval = 5.0
    no_robots = {SITE: {"interval": interval, "obey_robots": False}}  # the first URL goes at once
    rt = Runtime(redis_conn, dataclasses.replace(settings, sites=no_robots, gate_margin=0.0))
    stop = threading.Event()
    try:
        assert rt.batching(SITE).paced
        batch = [DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json() for i in (1, 2, 4)]
        threading.Timer(1.0, stop.set).start()
        started = time.monotonic()
        jobs.download(*batch, stopping=stop.is_set, rest=stop.wait, rt=rt)
        took = time.monotonic() - started
        waiting = [task.url for task in Frontier(redis_conn, SITE, [], 0, 0).waiting()]
    finally:
        rt.close()
    assert [entry.path for entry in shop.requests if entry.path.startswith("/product/")] == ["/product/1"]
    assert waiting == [f"{shop.url}/product/2", f"{shop.url}/product/4"]
    assert took < interval / 2, f"the stop ended the batch {took:.1f} s after it began (interval {interval} s)"


def test_a_paced_batch_does_not_rest_for_a_url_robots_txt_refuses(
    redis_conn: Redis, settings: Settings, shop: ShopSite
) -> None:
    """A link robots.txt disallows is recorded refused without a request: a paced batch does not rest
    until the next turn for it. Last in its batch, it held the job's end, and the site's next job,
    that long (at 200 slow sites: the listing page's batch ended with its disallowed link)."""
    interval = 1.5
    rt = Runtime(redis_conn, dataclasses.replace(settings, sites={SITE: {"interval": interval}}, gate_margin=0.0))
    stop = threading.Event()
    try:
        assert rt.batching(SITE).paced
        urls = [f"{shop.url}/product/1", f"{shop.url}/private/admin"]
        batch = [DownloadTask(SITE, url, "parse_product").to_json() for url in urls]
        started = time.monotonic()
        jobs.download(*batch, stopping=stop.is_set, rest=stop.wait, rt=rt)
        took = time.monotonic() - started
        refused = [r["url"] for r in rt.store.fetch_rows(SITE) if r["outcome"] == "refused"]
    finally:
        rt.close()
    # robots.txt took the first turn, /product/1 the next; the refused URL none, nor the wait for one.
    assert [entry.path for entry in shop.requests] == ["/robots.txt", "/product/1"]
    assert refused == [f"{shop.url}/private/admin"]
    assert took < 2 * interval - FOLLOW_AHEAD - 0.2, f"the batch took {took:.1f} s: it rested for the refused URL"


def test_a_paced_batch_reads_its_sites_settings_in_its_look_between_urls_not_in_a_round_trip_of_their_own(
    redis_conn: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live settings and spider arguments are re-read once a second: at an interval of a second or more,
    before each of a paced batch's URLs. They ride in the write of the record before
    (``SoonRecords.ride``), read along, not in round trips of their own: for the pause check, the
    URL's steps, or the robots pre-check before the rest, which uses them as last read (with
    responses of 0.9 s, what the look before a URL read is over a second old at the next URL's)."""
    interval = 2.0
    assert interval > max(LIVE_REFRESH, ARGS_REFRESH)
    sites = {SITE: {"interval": interval}}
    rt = Runtime(redis_conn, dataclasses.replace(settings, sites=sites, gate_margin=0.0))
    stop = threading.Event()
    alone, along = [], []
    real_read, real_along = rt.sites._read_site, rt.sites.read_site_along
    monkeypatch.setattr(rt.sites, "_read_site", lambda site, *fresh: (alone.append(site), real_read(site, *fresh))[1])
    monkeypatch.setattr(rt.policies, "refresh", rt.sites._read_site)  # the policy's reads are the same
    monkeypatch.setattr(
        rt.sites, "read_site_along", lambda pipe, site, *rest: (along.append(site), real_along(pipe, site, *rest))[1]
    )
    with ShopSite(products=10, latency=0.9, faults=False) as shop:
        try:
            assert rt.batching(SITE).paced
            # robots.txt held already, as after a site's first page (it took the gate's first turn)
            rt.robots.allowed(SITE, shop.url, "x", functools.partial(rt.take_gate, SITE, shop.url), allow_private=True)
            batch = [DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json() for i in (1, 2, 3)]
            jobs.download(*batch, stopping=stop.is_set, rest=stop.wait, rt=rt)
            read_alone, read_along = len(alone), list(along)
            set_live(redis_conn, SITE, paused=True)  # read along too: the next look sees the pause
            jobs.download(*batch[:2], stopping=stop.is_set, rest=stop.wait, rt=rt)
            waiting = [task.url for task in Frontier(redis_conn, SITE, [], 0, 0).waiting()]
        finally:
            rt.close()
        asked = [e.path for e in shop.requests if e.path.startswith("/product/")]
        handed_back = f"{shop.url}/product/2"
    assert asked == ["/product/1", "/product/2", "/product/3", "/product/1"]
    assert read_alone <= 2  # rt.batching above and the first URL's, before any look (the same one, soon enough)
    assert read_along == [SITE] * 2  # each look between two URLs
    assert waiting == [handed_back]  # the site was paused


def test_a_slow_site_answering_slower_than_its_interval_goes_back_to_one_url_a_job(
    redis_conn: Redis, settings: Settings
) -> None:
    with ShopSite(products=10, latency=2 * SLOW, faults=False) as shop:
        rt = Runtime(redis_conn, fast(settings, SLOW))
        try:
            assert rt.batching(SITE).paced
            batch = [DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json() for i in (1, 2, 3)]
            jobs.download(*batch, rt=rt)
            assert rt.batch_size(SITE) == 1 and not rt.batching(SITE).paced
            rt.publish(SITE, force=True)
            assert not redis_conn.hexists(keys.conf(SITE), "batch")
        finally:
            rt.close()
    assert UNBATCHED_FOR >= 60  # for a while: not batch after batch cut short


def test_a_late_batch_of_a_site_answering_fast_stays_batched_the_lateness_being_the_workers_own(
    redis_conn: Redis, settings: Settings
) -> None:
    """On a loaded machine a batch comes late though the site answers fast: one URL a job would add
    RQ's bookkeeping, a look and a claim to every request, and the load with them."""
    rt = Runtime(redis_conn, fast(settings, SLOW))
    try:
        batching = rt.batching(SITE)
        assert batching.paced
        late = 3 * LATE_SPACING * batching.interval  # for each of two URLs
        rt.answered(SITE, 0.1 * batching.interval)
        rt.batch_paced(SITE, 2, 2 * late, batching)
        assert rt.batching(SITE).paced
        rt.answered(SITE, SLOW_ANSWER * batching.interval)
        rt.batch_paced(SITE, 2, 2 * late, batching)
        assert not rt.batching(SITE).paced  # the site's own slowness: several threads keep up, one cannot
    finally:
        rt.close()


def test_the_thread_that_ran_a_slow_sites_job_takes_its_next_one_ahead_of_its_gate(
    redis_conn: Redis, settings: Settings
) -> None:
    from crawler.work.download_worker import DownloadWorker

    rt = Runtime(redis_conn, fast(settings, SLOW))
    try:
        frontier = rt.frontier(SITE)
        frontier.add([Request(f"http://127.0.0.1:9/p/{i}") for i in range(3)])
        frontier.refill(1)
        (queued,) = queued_jobs(redis_conn)
        worker = DownloadWorker(redis_conn, [SITE], rt=rt)
        room = worker._idle.room
        # The site is held out of the lookers' picks for a minute (as after its last batch's
        # hand-out); its gate, rearmed here by the last send, opens in 0.3 s + FOLLOW_AHEAD.
        redis_conn.zadd(keys.ready(), {SITE: redis_ms(redis_conn) + 60_000})
        scheduler = Scheduler(redis_conn, [SITE])
        assert scheduler.next().job_id is None  # not due for the lookers
        redis_conn.set(keys.gate(SITE), "x", px=int((0.3 + FOLLOW_AHEAD) * 1000))
        scheduler.batch_over(SITE)
        worker._follow = (SITE, time.monotonic() + 0.3 + FOLLOW_AHEAD, False)
        started = time.monotonic()
        found = worker.follow()
        waited = time.monotonic() - started
        assert found is not None and found[0].id == queued.id
        # Slept until FOLLOW_AHEAD before the gate opens (the job's own gate wait does the rest), not
        # a looker's second, nor until the gate opened.
        assert 0.25 <= waited < 0.3 + FOLLOW_AHEAD - 0.05
        assert redis_conn.pttl(keys.gate(SITE)) > 0  # taken while the gate was still closed
        assert room._busy == 1  # counted busy: the room grows another thread if work comes meanwhile
        room.done_work()
        # Too far ahead: left to the ready set.
        worker._follow = (SITE, time.monotonic() + 60, False)
        started = time.monotonic()
        assert worker.follow() is None and time.monotonic() - started < 0.1
        assert room._busy == 0
    finally:
        rt.close()


def test_a_thread_following_its_site_waits_for_work_announced_for_it_and_takes_it(
    redis_conn: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site crawled by following its links has no work when its batch ends: its last page's links
    are with a parse worker. The thread that ran the batch waits for work of that site to be announced,
    and takes it, rather than leaving it to the lookers' next look."""
    from crawler.work import download_worker
    from crawler.work.download_worker import DownloadWorker
    from crawler.work.listener import of as listener_of

    monkeypatch.setattr(download_worker, "WORK_WAIT", 3.0)
    rt = Runtime(redis_conn, fast(settings, SLOW))
    try:
        worker = DownloadWorker(redis_conn, [SITE], rt=rt)
        room = worker._idle.room
        listener = listener_of(redis_conn)
        listener.register(worker, room)
        try:
            # Nothing queued: the thread waits for work of its site, and a page's links come 0.5 s later.
            redis_conn.zadd(keys.ready(), {SITE: 0})
            worker._follow = (SITE, time.monotonic(), False)
            threading.Timer(0.5, lambda: rt.frontier(SITE).add([Request("http://127.0.0.1:9/p/new")])).start()
            started = time.monotonic()
            found = worker.follow()
            waited = time.monotonic() - started
            assert found is not None and joblife.tasks_left(found[0])[0]["url"] == "http://127.0.0.1:9/p/new"
            assert 0.4 <= waited < 1.5  # woken by the announcement, not at the end of WORK_WAIT
            room.done_work()
            Scheduler(redis_conn, [SITE]).batch_over(SITE)  # as the job's end does: due again as its gate opens
            # No work comes: the thread is free again after WORK_WAIT, and looks as usual.
            monkeypatch.setattr(download_worker, "WORK_WAIT", 0.3)
            worker._follow = (SITE, time.monotonic(), False)
            started = time.monotonic()
            assert worker.follow() is None
            assert 0.25 <= time.monotonic() - started < 1.0 and room._busy == 0
            # A burst that drains meanwhile ends the wait at once.
            monkeypatch.setattr(download_worker, "WORK_WAIT", 30.0)
            worker._follow = (SITE, time.monotonic(), False)
            threading.Timer(0.2, room.end_all).start()
            started = time.monotonic()
            assert worker.follow() is None and time.monotonic() - started < 1.0
        finally:
            listener.unregister(worker)
    finally:
        rt.close()


def test_work_of_a_higher_priority_cuts_a_paced_batch_short(
    redis_conn: Redis, settings: Settings, shop: ShopSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = Runtime(redis_conn, fast(settings, SLOW))
    try:
        frontier = rt.frontier(SITE)
        real = batches.download_one

        def seeded_after_the_first(*args: Any) -> bool:
            done = real(*args)
            if args[2]["url"].endswith("/product/1"):
                frontier.add([Request(f"{shop.url}/product/9", callback="parse_product", priority=10)])
            return done

        monkeypatch.setattr(batches, "download_one", seeded_after_the_first)
        batch = [DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json() for i in (1, 2, 4)]
        jobs.download(*batch, rt=rt)
        waiting = [(task.url, task.priority) for task in Frontier(redis_conn, SITE, [], 0, 0).waiting()]
    finally:
        rt.close()
    assert [entry.path for entry in shop.requests if entry.path.startswith("/product/")] == ["/product/1"]
    assert waiting == [(f"{shop.url}/product/9", 10), (f"{shop.url}/product/2", 0), (f"{shop.url}/product/4", 0)]


def test_a_paced_batch_saves_its_progress_with_its_records_and_looks_for_higher_work_with_its_takes(
    redis_conn: Redis, settings: Settings, shop: ShopSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two URLs a paced batch saved its progress, read its site's settings and looked for
    work of a higher priority in a round trip of its own: a sixth of a download process's round trips
    at 200 slow sites. The first two ride in the write of the record before, the look in the take."""
    from crawler.coord import priorities as frontier_module

    rt = Runtime(redis_conn, fast(settings, SLOW))
    looks_alone: list[str] = []
    monkeypatch.setattr(batches, "outranked", lambda *args, **kwargs: looks_alone.append(args[1]) or False)
    asked_along: list[str] = []
    look = frontier_module.look_for_higher
    monkeypatch.setattr(batches, "look_for_higher", lambda pipe, site: (asked_along.append(site), look(pipe, site)))
    try:
        batch = [DownloadTask(SITE, f"{shop.url}/product/{i}", "parse_product").to_json() for i in (1, 2, 3)]
        jobs.download(*batch, rt=rt)
    finally:
        rt.close()
    assert [entry.path for entry in shop.requests if entry.path.startswith("/product/")] == [
        "/product/1",
        "/product/2",
        "/product/3",
    ]
    assert looks_alone == [], "a look of its own between two URLs"
    assert asked_along == [SITE, SITE], "the takes of the 2nd and 3rd URLs did not look"


@pytest.mark.parametrize("scripts_flushed", [False, True])
def test_a_slow_sites_job_gives_its_turns_back_in_the_transaction_that_finishes_it(
    redis_conn: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, scripts_flushed: bool
) -> None:
    """A job of a site slower than BATCH_BELOW ends with ``batch_over`` (NEXT_JOB may have held the site
    for a batch's span), carried by ``joblife.finish``'s transaction, not a round trip of its own; a
    Redis that lost its scripts meanwhile gets it on its own. A job that raised gets it too."""
    from crawler.work.download_worker import DownloadWorker

    interval = 2 * PACED_MAX_INTERVAL  # one URL a job: each turn of the loop below takes one
    rt = Runtime(redis_conn, dataclasses.replace(settings, sites={SITE: {"interval": interval}}))
    alone: list[str] = []
    batch_over = Scheduler.batch_over
    monkeypatch.setattr(Scheduler, "batch_over", lambda self, site: alone.append(site) or batch_over(self, site))
    try:
        with ShopSite(products=1) as shop:
            rt.frontier(SITE).add([Request(shop.url + "/robots.txt"), Request(shop.url + "/nothing-here")])
            worker = DownloadWorker(redis_conn, [SITE], rt=rt)
            rt.scheduler.batch_over("elsewhere")  # loaded, as after a process's first job
            alone.clear()
            for raised in (False, True):
                redis_conn.zadd(keys.ready(), {SITE: 0})  # due now
                found, _ = worker.next_job()
                if found is None:  # its queue was empty: refilled first, as a worker does
                    rt.frontier(SITE).refill(JOBS_AHEAD, due_now=True)
                    redis_conn.delete(keys.gate(SITE))
                    found, _ = worker.next_job()
                assert found is not None
                job, queue = found
                # Held out of other workers' picks for a minute, as for a batch's span.
                redis_conn.zadd(keys.ready(), {SITE: redis_ms(redis_conn) + 60_000})
                if scripts_flushed:
                    redis_conn.script_flush()
                if raised:
                    monkeypatch.setattr(batches, "download_one", lambda *args, **kwargs: 1 / 0)
                worker.execute_job(job, queue)
                due = redis_conn.zscore(keys.ready(), SITE)
                assert due is not None and due <= redis_ms(redis_conn) + interval * 1000 + 1000, "still held"
                expected = [SITE] if scripts_flushed else []  # a failed job's goes in a pipeline after it
                assert alone == expected, f"raised={raised}: batch_over called on its own {alone}"
                alone.clear()
                redis_conn.delete(keys.gate(SITE))
    finally:
        rt.close()
