"""Jobs and entries written into Redis by someone else: refused before anything runs.

A hostile or broken writer puts jobs straight into the crawler's RQ queues, junk into
its frontier and retry set, and malformed pages into its pages stream; real worker
processes then crawl a real loopback shop. Nothing of the hostile jobs runs, each is
quarantined with its reason, and the workers go on to crawl the whole shop and exit 0.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from crawling import items_by_key
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from crawler.cli.app import cli
from crawler.coord import keys, quarantine
from crawler.coord.frontier import DownloadTask, seed
from crawler.coord.scheduler import Scheduler, publish_conf
from crawler.coord.vetting import DOWNLOAD_FUNC, MAX_BATCH
from crawler.demo import ShopSite
from crawler.settings import Settings
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.work.runtime import Runtime

PARSE_FUNC = "crawler.work.jobs.parse"  # a job function no longer: pages reach parse workers through a stream

SITE = "demo"


def _queue(connection: Redis, name: str) -> Queue:
    return Queue(name, connection=connection, serializer=JSONSerializer)


class _Canary:
    """Unpickling this creates a file: proof that a pickle ran code."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))


def write_hostile_pages(connection: Redis, canary: Path, shop_url: str) -> dict[str, str]:
    """Malformed entries in the pages stream; returns {entry id: what it is}."""
    task = {"site": SITE, "url": shop_url + "/product/1", "callback": "parse_product"}
    hostile: dict[str, dict[str, Any]] = {
        "page pickled": {"task": pickle.dumps(_Canary(canary)), "body": b"x"},
        "page without body": {"task": json.dumps(task)},
        "page without task": {"body": b"x"},
        "page task a string": {"task": json.dumps("just a string"), "body": b"x"},
        "page without site": {"task": json.dumps({"url": shop_url}), "body": b"x"},
        "page headers": {"task": json.dumps({**task, "headers": {"a": 1}}), "body": b"x"},
        "page depth a bool": {"task": json.dumps({**task, "depth": True}), "body": b"x"},
    }
    return {connection.xadd(keys.pages(), fields).decode(): what for what, fields in hostile.items()}


def write_hostile_jobs(connection: Redis, canary: Path, shop_url: str) -> dict[str, str]:
    """Hostile and malformed jobs in the download queue; returns {job id: what it is}."""
    downloads = _queue(connection, keys.download_queue(SITE))
    made: dict[str, str] = {}

    def enqueue(queue: Queue, what: str, func: str, *args: Any, **kwargs: Any) -> Any:
        job = queue.enqueue(func, *args, **kwargs)
        made[job.id] = what
        return job

    enqueue(downloads, "os.system", "os.system", f"touch {canary}")
    good = DownloadTask(SITE, shop_url + "/nothing-here").to_json()
    broken = enqueue(downloads, "data not JSON", DOWNLOAD_FUNC, good)
    connection.hset(broken.key, "data", b"{not json")
    broken = enqueue(downloads, "created_at garbage", DOWNLOAD_FUNC, good)
    connection.hset(broken.key, "created_at", "yesterday-ish")
    broken = enqueue(downloads, "no data", DOWNLOAD_FUNC, good)
    connection.hdel(broken.key, "data")
    broken = enqueue(downloads, "timeout garbage", DOWNLOAD_FUNC, good)
    connection.hset(broken.key, "timeout", "forever")
    broken = enqueue(downloads, "failure callback", DOWNLOAD_FUNC, good)
    connection.hset(broken.key, "failure_callback_name", "os.system")
    broken = enqueue(downloads, "webhook", DOWNLOAD_FUNC, good)
    connection.hset(broken.key, "webhooks", json.dumps([{"url": "http://127.0.0.1:9/hook"}]))
    enqueue(downloads, "other site", DOWNLOAD_FUNC, DownloadTask("other", shop_url + "/x").to_json())
    enqueue(downloads, "parse on download", PARSE_FUNC, {"site": SITE, "url": shop_url, "body": "x"})
    enqueue(downloads, "kwargs", DOWNLOAD_FUNC, good, extra=1)
    enqueue(downloads, "args not an object", DOWNLOAD_FUNC, "just a string")
    enqueue(downloads, "batch too long", DOWNLOAD_FUNC, *[good] * (MAX_BATCH + 1))
    enqueue(downloads, "batch of two sites", DOWNLOAD_FUNC, good, DownloadTask("other", shop_url + "/x").to_json())
    enqueue(downloads, "batch with a string", DOWNLOAD_FUNC, good, "just a string")
    enqueue(downloads, "file URL", DOWNLOAD_FUNC, DownloadTask(SITE, "file:///etc/passwd").to_json())
    enqueue(downloads, "off-domain URL", DOWNLOAD_FUNC, DownloadTask(SITE, "http://evil.example/steal").to_json())
    connection.sadd(keys.sites(), SITE)
    connection.zadd(keys.ready(), {SITE: 0}, nx=True)
    return made


def test_hostile_jobs_are_quarantined_and_real_workers_crawl_on(
    redis_url: str, redis_conn: Redis, settings: Settings, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    settings = dataclasses.replace(settings, sites={SITE: {"interval": 0.02}})
    with ShopSite(products=30) as shop:
        made = write_hostile_jobs(redis_conn, canary, shop.url)
        junk = write_hostile_pages(redis_conn, canary, shop.url)
        # Junk in the compact frontier and the retry set, next to real work.
        redis_conn.rpush(keys.frontier(SITE), "not an entry", '{"url": 1}')
        redis_conn.zadd(keys.levels(SITE), {"0": 0})
        redis_conn.zadd(keys.delayed(), {"no tabs at all": 0, 'demo\tten\tx\t["u"]': 0})
        rt = Runtime(redis_conn, settings)
        try:
            seed(rt.frontier(SITE), [shop.url + "/"])
        finally:
            rt.close()

        specs = [WorkerSpec("download", (SITE,), threads=2, burst=True), WorkerSpec("parse", (SITE,), burst=True)]
        processes = start_workers(specs, settings, redis_url)
        done = threading.Event()
        threading.Thread(target=lambda: done.wait(120) or stop_workers(processes, timeout=10), daemon=True).start()
        try:
            code = wait_for(processes)
        finally:
            done.set()

        assert code == 0, "a worker died on a hostile job"
        assert not canary.exists(), "a job ran code named in Redis"
        assert items_by_key(settings.database_url) == shop.expected_items()
        assert not [e for e in shop.requests if "nothing-here" in e.path or e.path.startswith("/x")]

    by_job = {q.job_id: q for q in quarantine.entries(redis_conn) if q.job_id}
    assert set(made) <= set(by_job), f"not quarantined: {[made[j] for j in set(made) - set(by_job)]}"
    reasons = {made[job_id]: by_job[job_id].reason for job_id in made}
    assert "'os.system'" in reasons["os.system"] and "not a crawler job function" in reasons["os.system"]
    assert "not a JSON job" in reasons["data not JSON"]
    assert "malformed job hash" in reasons["created_at garbage"]
    assert "malformed job hash" in reasons["no data"]
    assert "failure_callback_name" in reasons["failure callback"]
    assert "webhooks" in reasons["webhook"]
    assert "on the queue of 'demo'" in reasons["other site"]
    assert "'crawler.work.jobs.parse'" in reasons["parse on download"]
    assert "not a crawler job function" in reasons["parse on download"]
    expected = f"not 1 to {MAX_BATCH} JSON objects"
    assert expected in reasons["kwargs"] and expected in reasons["args not an object"]
    assert f"not 1 to {MAX_BATCH} JSON objects" in reasons["batch too long"]
    assert f"not 1 to {MAX_BATCH} JSON objects" in reasons["batch with a string"]
    assert "on the queue of 'demo'" in reasons["batch of two sites"]
    assert "not an http(s) URL" in reasons["file URL"]
    assert "outside the allowed domains" in reasons["off-domain URL"]
    for job_id in made:
        assert not redis_conn.exists(Job.key_for(job_id)) or "URL" in made[job_id]  # run-time refusals finish

    refused_pages = {q.job_id: q for q in quarantine.entries(redis_conn) if q.source == keys.pages()}
    assert set(refused_pages) == set(junk), f"pages not quarantined: {set(junk) - set(refused_pages)}"
    why = {what: refused_pages[entry_id].reason for entry_id, what in junk.items()}
    assert "task is not JSON" in why["page pickled"]
    assert "without 'body'" in why["page without body"] and "without 'task'" in why["page without task"]
    assert "not a JSON object" in why["page task a string"] and "without 'site'" in why["page without site"]
    assert "headers are not strings" in why["page headers"] and "'depth' has the wrong type" in why["page depth a bool"]
    assert all(why[what].startswith("malformed page entry") for what in junk.values())
    assert redis_conn.xlen(keys.pages()) == 0  # out of the stream, none left pending
    assert redis_conn.xpending(keys.pages(), keys.PARSERS)["pending"] == 0

    entries = [q for q in quarantine.entries(redis_conn) if q.job_id is None]
    sources = sorted(q.source for q in entries)
    assert sources == sorted([keys.frontier(SITE)] * 2 + [keys.delayed()] * 2), sources

    # The operator sees them.
    result = CliRunner().invoke(
        cli,
        ["failed", "--quarantined"],
        env={"REDIS_URL": redis_url, "DATABASE_URL": settings.database_url, "CRAWLER_SITES_DIR": settings.sites_dir},
    )
    assert result.exit_code == 0, result.output
    assert "not a crawler job function" in result.output and "download refused when taken" in result.output


def test_a_refill_interleaved_with_a_retry_promotion_loses_and_doubles_nothing(
    runtime: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A due retry pushed onto a frontier list while a refill is reading it is neither trimmed nor fetched twice."""
    from crawler.coord import frontier as frontier_module

    frontier = runtime.frontier(SITE)
    urls = [f"http://127.0.0.1:9/p{n}" for n in range(12)]
    frontier.push([DownloadTask(SITE, url) for url in urls])
    Scheduler(redis_conn).schedule(SITE, DownloadTask(SITE, "http://127.0.0.1:9/retried").to_entry(), 0)

    promoted = []
    real_read = frontier_module.read_many  # the refill's reads: the promotion lands between them and the trim

    def read_then_promote(connection: Redis, commands: list[tuple[Any, ...]]) -> list[Any]:
        replies = real_read(connection, commands)
        if not promoted and ("LRANGE", keys.frontier(SITE), 0, 3) in commands:
            promoted.append(runtime.scheduler.promote_due())
        return replies

    monkeypatch.setattr(frontier_module, "read_many", read_then_promote)
    made = frontier.refill(4)
    monkeypatch.undo()
    assert promoted == [1]
    assert made == 4

    queue = _queue(redis_conn, keys.download_queue(SITE))
    queued = [queue.fetch_job(job_id).args[0]["url"] for job_id in queue.job_ids]
    waiting = [task.url for task in frontier.waiting()]
    everything = queued + waiting
    assert sorted(everything) == sorted(urls + ["http://127.0.0.1:9/retried"]), "an entry was lost or doubled"
    assert queued[0] == "http://127.0.0.1:9/retried"  # the retry went to the head, and is made first


def test_rq_maintenance_meeting_a_hostile_job_quarantines_it_instead_of_dying(
    runtime: Runtime, redis_conn: Redis
) -> None:
    """RQ's own registry and intermediate-list cleanup reads jobs too: a refused one is quarantined there."""
    from crawler.work.download_worker import DownloadWorker

    downloads = _queue(redis_conn, keys.download_queue(SITE))
    evil = downloads.enqueue("os.system", "true")
    redis_conn.lmove(downloads.key, downloads.intermediate_queue_key, "LEFT", "RIGHT")  # as a dequeue leaves it
    worker = DownloadWorker(redis_conn, [SITE], rt=runtime)

    worker.clean_registries()  # raised RefusedJob out of RQ's maintenance, killing the worker

    (refused,) = quarantine.entries(redis_conn)
    assert refused.job_id == evil.id and "'os.system'" in refused.reason
    assert not redis_conn.exists(evil.key) and redis_conn.llen(downloads.intermediate_queue_key) == 0


def test_a_job_queued_under_the_download_job_name_of_before_the_move_still_runs(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    """A job queued before the modules moved names ``crawler.jobs.download``: it is vetted and runs, not refused."""
    from crawler.work.download_worker import DownloadWorker

    downloads = _queue(redis_conn, keys.download_queue(SITE))
    queued = downloads.enqueue("crawler.jobs.download", DownloadTask(SITE, shop.url + "/product/1").to_json())
    publish_conf(redis_conn, SITE, 0.0, 0.0)
    redis_conn.sadd(keys.sites(), SITE)
    redis_conn.zadd(keys.ready(), {SITE: 0})
    worker = DownloadWorker(redis_conn, [SITE], rt=runtime)
    found, _ = worker.next_job()

    assert found is not None and found[0].id == queued.id
    job = found[0]
    assert job.func_name == DOWNLOAD_FUNC and job.func.__module__ == "crawler.work.jobs"
    job.bound = {"rt": runtime}  # as a download worker gives it
    job.perform()
    assert quarantine.entries(redis_conn) == []
    assert (shop.url + "/product/1", 200) in [(r["url"], r["status"]) for r in runtime.store.fetch_rows(SITE)]


def test_a_job_handed_out_after_many_hostile_ones_is_served_not_left_behind(
    runtime: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More refused jobs than one look tries (MAX_TAKES), then a real one: no look leaves a job it was handed."""
    from crawler.work import download_worker
    from crawler.work.download_worker import DownloadWorker

    monkeypatch.setattr(download_worker, "MAX_TAKES", 3)
    downloads = _queue(redis_conn, keys.download_queue(SITE))
    for _ in range(7):
        downloads.enqueue("os.system", "true")
    runtime.frontier(SITE).push([DownloadTask(SITE, "http://127.0.0.1:9/real")])
    publish_conf(redis_conn, SITE, 0.0, 0.0)  # due again at once after each job: one look meets them all
    redis_conn.zadd(keys.ready(), {SITE: 0})
    worker = DownloadWorker(redis_conn, [SITE], rt=runtime)
    for _ in range(50):
        found, wait = worker.next_job()
        found = found or worker.follow()  # a dry queue is refilled by the looking thread after its look
        if found is not None:
            break
        assert redis_conn.llen(downloads.intermediate_queue_key) == 0, "a look left a handed-out job behind"
        time.sleep(wait or 0)
    assert found is not None and found[0].args[0]["url"] == "http://127.0.0.1:9/real"
    assert len(quarantine.entries(redis_conn)) == 7


def test_a_priority_written_by_hand_into_a_levels_set_is_quarantined_by_the_refill(
    runtime: Runtime, redis_conn: Redis
) -> None:
    """It names no frontier list: the refill sets it aside and goes on with the real ones."""
    frontier = runtime.frontier(SITE)
    frontier.push([DownloadTask(SITE, "http://127.0.0.1:9/real")])
    redis_conn.zadd(keys.levels(SITE), {"x": 5, "1e3": 6})
    assert [task.url for task in frontier.waiting()] == ["http://127.0.0.1:9/real"]
    assert frontier.refill(2) == 1  # raised ValueError out of the worker's dequeue
    assert redis_conn.zrange(keys.levels(SITE), 0, -1) == []
    reasons = sorted((q.source, q.reason) for q in quarantine.entries(redis_conn))
    assert reasons == [(keys.levels(SITE), "malformed priority in a levels set")] * 2
