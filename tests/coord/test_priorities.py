"""Priorities: a site's highest-priority request is always the next one handed out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from crawling import installed_runtime, join_all, start_in_threads
from redis import Redis
from rq.job import Job

from crawler.coord import keys
from crawler.coord.frontier import SEED_PRIORITY, DownloadTask, Frontier, seed
from crawler.coord.policy import set_live
from crawler.coord.scheduler import JOBS_AHEAD, Scheduler, publish_conf
from crawler.demo import ShopSite
from crawler.demo.spider import DemoShop
from crawler.settings import Settings
from crawler.spiders.loading import SpiderSet
from crawler.spiders.spider import Page, Request

SITE = "prio"


@pytest.fixture
def frontier(redis_conn: Redis) -> Frontier:
    return Frontier(redis_conn, SITE, ["example.com"], failure_ttl=60, job_timeout=60)


def queued_jobs(frontier: Frontier) -> list[tuple[str, int]]:
    """(path, priority) of the RQ jobs queued for the site, in queue order."""
    tasks = [DownloadTask.from_json(job.args[0]) for job in frontier.queue.get_jobs()]
    return [(t.url.removeprefix("http://example.com"), t.priority) for t in tasks]


def waiting(frontier: Frontier) -> list[tuple[str, int]]:
    return [(t.url.removeprefix("http://example.com"), t.priority) for t in frontier.waiting()]


def requests(paths: list[str], priority: int) -> list[Request]:
    return [Request(f"http://example.com{p}", priority=priority) for p in paths]


def test_refills_take_the_highest_priority_first_and_keep_order_within_one(frontier: Frontier) -> None:
    frontier.add(requests(["/a1", "/a2"], 0))
    frontier.add(requests(["/b1", "/b2"], 5))
    frontier.add(requests(["/c1"], -3))
    frontier.add(requests(["/b3"], 5))
    assert frontier.refill(4) == 4
    assert queued_jobs(frontier) == [("/b1", 5), ("/b2", 5), ("/b3", 5), ("/a1", 0)]
    assert waiting(frontier) == [("/a2", 0), ("/c1", -3)]


def test_a_higher_priority_push_hands_queued_lower_jobs_back_in_order(frontier: Frontier) -> None:
    frontier.add(requests([f"/low{i}" for i in range(6)], 0))
    frontier.refill(4)
    assert [p for p, _ in queued_jobs(frontier)] == ["/low0", "/low1", "/low2", "/low3"]

    frontier.add(requests(["/seed"], SEED_PRIORITY))

    assert queued_jobs(frontier)[0] == ("/seed", SEED_PRIORITY)
    everything = queued_jobs(frontier) + waiting(frontier)
    # Nothing lost or doubled, and the low-priority requests keep their order.
    assert everything == [("/seed", SEED_PRIORITY)] + [(f"/low{i}", 0) for i in range(6)]
    # The handed-back jobs are gone from RQ, not left behind as orphan hashes.
    job_keys = frontier.connection.keys(Job.redis_job_namespace_prefix + "*")
    assert len(job_keys) == len(frontier.queue.get_job_ids())


def test_a_push_of_equal_priority_hands_nothing_back(frontier: Frontier) -> None:
    frontier.add(requests([f"/p{i}" for i in range(6)], 0))
    frontier.refill(4)
    ids = frontier.queue.get_job_ids()
    frontier.add(requests(["/later"], 0))
    assert frontier.queue.get_job_ids() == ids


def test_a_job_a_worker_already_took_is_not_handed_back(frontier: Frontier, redis_conn: Redis) -> None:
    publish_conf(redis_conn, SITE, 0.001, 0)
    frontier.add(requests([f"/low{i}" for i in range(6)], 0))
    frontier.refill(4)
    step = Scheduler(redis_conn).next()
    assert step.site == SITE and step.job_id
    frontier.add(requests(["/seed"], SEED_PRIORITY))
    assert step.job_id not in frontier.queue.get_job_ids()
    assert frontier.queue.fetch_job(step.job_id) is not None, "the taken job must stay intact"
    assert queued_jobs(frontier)[0] == ("/seed", SEED_PRIORITY)
    assert len(queued_jobs(frontier) + waiting(frontier)) == 6  # 7 pushed, one taken


def test_out_of_range_priorities_are_refused_not_queued(frontier: Frontier) -> None:
    result = frontier.add(
        [
            Request("http://example.com/x", priority=5000),
            Request("http://example.com/y", priority="high"),  # type: ignore[arg-type]
            Request("http://example.com/z", priority=-7),
        ]
    )
    assert result.enqueued == ["http://example.com/z"]
    assert result.refused is not None and len(result.refused) == 2
    assert "between -1000 and 1000" in result.refused[0][1]


def test_a_retry_comes_back_at_its_own_priority(frontier: Frontier, redis_conn: Redis) -> None:
    scheduler = Scheduler(redis_conn)
    retry = DownloadTask(SITE, "http://example.com/r", attempt=2, priority=7)
    scheduler.schedule(SITE, retry.to_entry(), 0, retry.priority)
    assert scheduler.promote_due() == 1
    assert frontier.waiting() == [retry]
    assert redis_conn.zscore(keys.levels(SITE), "7") == 7


class ProductsOnly(DemoShop):
    """The demo spider without robots.txt (its fetch would hold the first job back) and
    without following links: the queue holds exactly what the test put there, so a seed
    is never a page the crawl found first (a duplicate, queued at its own priority)."""

    obey_robots = False

    def parse_product(self, page: Page) -> Iterator[dict[str, Any]]:
        for output in super().parse_product(page):
            if isinstance(output, dict):
                yield output


def test_a_seed_overtakes_a_flood_of_background_work(redis_conn: Redis, settings: Settings) -> None:
    """Server side: a high-priority page waits only for requests a worker had already taken."""
    # One download worker: with two, the order in which their first requests reach the
    # server also depends on which thread gets a CPU first, not only on the hand-outs.
    downloads = 1
    spiders = SpiderSet({"demo": ProductsOnly}, [])
    with (
        ShopSite(products=300, faults=False) as shop,
        installed_runtime(redis_conn, settings, spider_set=spiders) as rt,
    ):
        set_live(redis_conn, "demo", paused=True)
        rt.publish("demo", force=True)
        front = rt.frontier("demo")
        front.add([Request(f"{shop.url}/product/{i}", callback="parse_product", priority=-10) for i in range(1, 121)])
        front.refill(JOBS_AHEAD)  # background jobs already made, as in a running crawl
        seed(front, [f"{shop.url}/product/201"])
        threads, stop = start_in_threads(rt, downloads=downloads)
        set_live(redis_conn, "demo", paused=False)
        rt.publish("demo", force=True)

        deadline = time.monotonic() + 30
        while len(shop.requests) < 15:  # the first seed, then the flood
            assert time.monotonic() < deadline, "the crawl never started"
            time.sleep(0.01)
        seed(front, [f"{shop.url}/product/250"])
        # Stamped once the seed is in Redis: stamped before the call, a request the worker took
        # while the call was under way (tens of ms on a loaded machine) counted as overtaking it.
        pushed = time.time()
        while not shop.requests_for("/product/250"):
            assert time.monotonic() < deadline, "the second seed was never fetched"
            time.sleep(0.01)
        (arrival,) = [e.time for e in shop.requests_for("/product/250")]
        ahead = [e.path for e in shop.requests if pushed < e.time < arrival]
        left_behind = 120 - sum(1 for e in shop.requests if e.path.startswith("/product/") and e.time < arrival)
        first_product = next(e.path for e in shop.requests if e.path.startswith("/product/"))
        stop.set()
        join_all(threads, stop)
    # Seeded while the flood's jobs were queued: fetched before any of them.
    assert first_product == "/product/201"
    # Seeded during the flood: only the request the worker had already taken may arrive first.
    assert len(ahead) <= downloads, f"{len(ahead)} requests overtook the seed: {ahead}"
    assert left_behind > 50, "the flood was nearly done: the test proves nothing"


def test_a_push_of_a_higher_priority_during_a_refill_is_next_not_behind_the_jobs_it_makes(
    frontier: Frontier, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refill has read the priorities and lists when a seed of a new, higher one is pushed, before
    its move: the move is not made, the refill reads again, and the seed still goes first."""
    frontier.add(requests([f"/low{i}" for i in range(6)], 0))
    other = Frontier(redis_conn, SITE, ["example.com"], failure_ttl=60, job_timeout=60)  # another worker's
    real_move, pushed = Frontier.move_to_queue, []

    def push_once_read(self: Frontier, read: Any, due_now: bool) -> bool:
        if not pushed:  # between the refill's read and its move
            pushed.append(True)
            other.add(requests(["/seed"], SEED_PRIORITY))
        return real_move(self, read, due_now)

    monkeypatch.setattr(Frontier, "move_to_queue", push_once_read)
    assert frontier.refill(JOBS_AHEAD) == JOBS_AHEAD
    assert pushed
    assert queued_jobs(frontier) == [("/seed", SEED_PRIORITY)] + [(f"/low{i}", 0) for i in range(JOBS_AHEAD - 1)]
