"""Many sites' frontiers at once (``coord.together``): the same writes as a site at a time, in a few round trips."""

from __future__ import annotations

from typing import Any

import pytest
from crawling import count_round_trips
from redis import Redis

from crawler.coord import keys
from crawler.coord.frontier import PUSH_CHUNK, Frontier
from crawler.coord.task import DownloadTask
from crawler.coord.together import PUSH_SITES, admit_together, enqueue_together, push_together, refill_together
from crawler.spiders.spider import Request

FAILURE_TTL = 3600
JOB_TIMEOUT = 60


def frontier(connection: Redis, site: str, **options: Any) -> Frontier:
    return Frontier(connection, site, ["example.com"], FAILURE_TTL, JOB_TIMEOUT, **options)


def entries(site: str, count: int, priority: int = 0) -> dict[int, list[str]]:
    return {
        priority: [DownloadTask(site, f"http://example.com/{n}", priority=priority).to_entry() for n in range(count)]
    }


def site_state(connection: Redis, site: str, priorities: tuple[int, ...] = (0,)) -> tuple[Any, ...]:
    """What a push leaves of ``site``: its lists, its levels, its packs' extra counts, whether it is ready and known."""
    return (
        [connection.lrange(keys.frontier(site, p), 0, -1) for p in priorities],
        connection.zrange(keys.levels(site), 0, -1, withscores=True),
        connection.hgetall(keys.frontier_extra(site)),
        connection.zscore(keys.ready(), site),
        connection.sismember(keys.sites(), site),
    )


def test_pushes_of_many_sites_go_in_few_transactions_and_leave_what_a_push_a_site_leaves(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their last pieces together, PUSH_SITES sites a transaction at most; a push bigger than PUSH_CHUNK
    sends its first pieces as its own push does; the sites new to the ready set announced at once."""
    counts = [1, 3, 9, PUSH_CHUNK + 2, *([1] * (PUSH_SITES + 5))]
    alone = [frontier(redis_conn, f"alone{n}") for n in range(len(counts))]
    together = [frontier(redis_conn, f"together{n}") for n in range(len(counts))]
    woken = redis_conn.pubsub()
    woken.subscribe(keys.wake())
    woken.get_message(timeout=1)
    for site, count in zip(alone, counts, strict=True):
        assert site._push_entries(entries(site.site, count)) is True  # no job queued: dry
    assert {woken.get_message(timeout=1)["data"] for _ in alone} == {site.site.encode() for site in alone}
    trips = count_round_trips(monkeypatch)
    dry = push_together([(site, entries(site.site, count)) for site, count in zip(together, counts, strict=True)])
    monkeypatch.undo()
    assert dry == [True] * len(counts)
    # the big push's first piece; the last pieces, PUSH_SITES sites at most a transaction; the announcements
    assert len(trips) == 1 + 2 + 1
    for mine, theirs in zip(together, alone, strict=True):
        assert site_state(redis_conn, mine.site) == site_state(redis_conn, theirs.site)
    announced = {woken.get_message(timeout=1)["data"] for _ in together}
    assert announced == {site.site.encode() for site in together}
    assert push_together([(together[0], {})]) == [False]  # nothing to push: not dry, nothing sent


def test_a_push_of_several_sites_hands_back_the_lower_jobs_of_the_one_it_outranks(redis_conn: Redis) -> None:
    low, other = frontier(redis_conn, "low"), frontier(redis_conn, "other")
    low.push([DownloadTask("low", "http://example.com/low")])
    assert low.refill(4) == 1
    assert push_together([(other, entries("other", 1)), (low, entries("low", 1, priority=5))]) == [True, False]
    # its job handed back, then made again behind the higher one's
    assert [job.args[0]["url"] for job in low.queue.jobs] == ["http://example.com/0", "http://example.com/low"]


def test_new_pages_of_sites_with_max_pages_are_admitted_in_one_round_trip_each_within_its_limit(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    capped = [frontier(redis_conn, f"capped{n}", max_pages=5) for n in range(3)]
    free = frontier(redis_conn, "free")
    assert capped[0]._admit(4) == 4  # one before: one page left of its five
    trips = count_round_trips(monkeypatch)
    rooms = admit_together([(capped[0], 3), (capped[1], 7), (capped[2], 0), (free, 9)])
    assert len(trips) == 1
    assert rooms == [1, 5, 0, 9]
    assert [int(redis_conn.get(keys.admitted(site.site)) or 0) for site in capped] == [7, 7, 0]


def test_enqueueing_pages_of_several_sites_admits_and_pushes_as_enqueue_does_a_site_at_a_time(
    redis_conn: Redis,
) -> None:
    def pages(site: Frontier) -> list[tuple[Any, int]]:
        urls = ["http://example.com/a", "http://example.com/b", "http://example.com/a"]
        return [(site.vet([Request(url) for url in urls])[0], 1), (site.vet([Request("http://example.com/c")])[0], 2)]

    mine = [frontier(redis_conn, "m0"), frontier(redis_conn, "m1", max_pages=2)]
    theirs = [frontier(redis_conn, "t0"), frontier(redis_conn, "t1", max_pages=2)]
    done = enqueue_together([(site, pages(site)) for site in mine])
    alone = [site.enqueue(pages(site)) for site in theirs]
    as_seen = [[(r.enqueued, r.duplicates, r.over_max_pages, r.queue_dry) for r in site] for site in done]
    assert as_seen == [[(r.enqueued, r.duplicates, r.over_max_pages, r.queue_dry) for r in site] for site in alone]
    assert as_seen[1] == [(["http://example.com/a", "http://example.com/b"], 1, 0, True), ([], 0, 1, True)]
    for m, t in zip(mine, theirs, strict=True):
        assert [task.url for task in m.waiting()] == [task.url for task in t.waiting()]


def test_a_seeds_refill_reads_its_priority_along_and_loads_the_move_script_once_for_all(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seed's entries wait at its priority (10): read with the first look, no second one. On a Redis
    that has not loaded MOVE_TO_QUEUE, one move loads it and the others are made together."""
    sites = [frontier(redis_conn, f"seeded{n}") for n in range(5)]
    for site in sites:
        site.push([DownloadTask(site.site, f"http://example.com/{n}", priority=10) for n in range(2)])
    warm = frontier(redis_conn, "warm")
    warm.push([DownloadTask("warm", "http://example.com/")])
    assert warm.refill(4) == 1  # the process's first: RQ asks the server's version
    redis_conn.script_flush()
    trips = count_round_trips(monkeypatch)
    assert refill_together(sites, jobs_ahead=4, also=(10,)) == 5 * 2
    monkeypatch.undo()
    # the reads; the moves, refused; one again (EVALSHA refused, SCRIPT LOAD, EVALSHA); the others together
    assert len(trips) == 1 + 1 + 3 + 1
    for site in sites:
        assert [job.args[0]["url"] for job in site.queue.jobs] == ["http://example.com/0", "http://example.com/1"]
        assert site.waiting() == [] and not redis_conn.exists(keys.levels(site.site))
