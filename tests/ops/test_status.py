"""Every site's status and politeness read in a few round trips a chunk of sites, none a site, as read one by one."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest
from crawling import count_round_trips
from redis import Redis
from rq import Queue

from crawler.coord import keys
from crawler.coord.frontier import Frontier
from crawler.coord.policy import resolve_policy, set_live
from crawler.coord.scheduler import frontier_sizes, publish_conf
from crawler.ops.status import (
    STATUS_CHUNK,
    ParseBacklog,
    SiteStatus,
    politeness,
    queue_keys,
    read_politeness,
    site_status,
    state,
    status_json,
)
from crawler.settings import Settings
from crawler.spiders.spider import Request, Spider

#: Sites of the every-site reads: two chunks and a part.
SITES = [f"s{i:04d}" for i in range(2 * STATUS_CHUNK + 1)]


def commands_processed(connection: Redis) -> int:
    return int(connection.info("stats")["total_commands_processed"])


def spider_of(site: str, interval: float = 1.0) -> type[Spider]:
    return type(site, (Spider,), {"name": site, "start_urls": [f"http://{site}.example/"], "interval": interval})


def test_the_queue_keys_are_rqs() -> None:
    queue = Queue(keys.download_queue("shop"), connection=Redis())
    assert queue_keys("shop") == (
        queue.key,
        queue.intermediate_queue_key,
        queue.started_job_registry.key,
        queue.scheduled_job_registry.key,
    )


def test_site_status_of_2001_sites_is_a_round_trip_a_chunk_and_five_commands_a_site(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counts of a chunk in one round trip, then every frontier holding entries at once
    (``frontier_sizes``: its priorities, its script loaded, FRONTIER_SIZE): at 10,000 sites the
    pipelined reads were 0.8 s, a site's RQ queue a ``Queue`` object made each."""
    busy = SITES[:: STATUS_CHUNK // 2]  # a few sites of each chunk with work, the others have none
    for i, site in enumerate(busy):
        Frontier(redis_conn, site, [f"{site}.example"], 60, 60).add(
            [Request(f"http://{site}.example/{n}", priority=n % 3) for n in range(i + 1)]
        )
        redis_conn.rpush(queue_keys(site)[0], "job")
        redis_conn.zadd(queue_keys(site)[2], {"a:1": 1, "b:2": 2})
        redis_conn.hset(keys.stats(site), mapping={"fetched": 7 + i, "delayed": 2, "recrawls": 1, "other": "x"})
    sizes = dict(zip(busy, frontier_sizes(redis_conn, busy), strict=True))  # its script loaded, as in a crawl
    trips = count_round_trips(monkeypatch)
    frontier_sizes(redis_conn, busy)
    of_frontiers = len(trips)
    before = commands_processed(redis_conn)
    trips.clear()
    statuses = site_status(redis_conn, SITES)
    assert of_frontiers <= 3 and len(trips) == 3 + of_frontiers  # a chunk's counts each, then the frontiers
    commands = commands_processed(redis_conn) - before - 1
    assert commands <= 5 * len(SITES) + 10 * len(busy) + 3  # a frontier with entries: read, then FRONTIER_SIZE's own
    assert [s.site for s in statuses] == SITES
    for i, site in enumerate(busy):
        s = statuses[SITES.index(site)]
        assert (s.queued, s.in_flight, s.scheduled, s.fetched, s.refreshes) == (sizes[site] + 1, 2, 2, 7 + i, 1)
        assert sizes[site] == i + 1
    idle = statuses[1]
    assert (idle.queued, idle.in_flight, idle.fetched, idle.items) == (0, 0, 0, 0)


def test_read_politeness_of_2001_sites_is_a_round_trip_a_chunk_and_the_same_as_site_by_site(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each site's live settings and conf in one round trip a chunk (and its closed gates' PTTLs in one
    more), what ``resolve_policy`` and ``politeness`` make of them site by site (three round trips a
    site: 30,000 at 10,000 sites, 8 s of ``crawler status``)."""
    settings = Settings()
    spiders = {site: spider_of(site, 1.0 + i % 3) for i, site in enumerate(SITES)}
    for site in SITES[:30]:
        publish_conf(redis_conn, site, 1.0, 0.005)
    set_live(redis_conn, SITES[1], interval=4.5)
    set_live(redis_conn, SITES[2], paused=True)
    redis_conn.hset(keys.conf(SITES[3]), "robots_delay_ms", 7000)
    now_ms = int(redis_conn.time()[0]) * 1000
    redis_conn.hset(keys.conf(SITES[4]), mapping={"closed_until": now_ms + 60_000, "closed_why": "backoff after 503"})
    redis_conn.set(keys.gate(SITES[4]), 1, px=50_000)
    redis_conn.hset(keys.conf(SITES[5]), mapping={"closed_until": now_ms - 1000})  # a closure over
    trips = count_round_trips(monkeypatch)
    found = read_politeness(redis_conn, spiders, settings)
    assert len(trips) == 3 + 1  # a chunk each, and the one closed gate's PTTL
    monkeypatch.undo()
    for site in SITES[:40] + SITES[-3:]:
        live = {k.decode(): v.decode() for k, v in redis_conn.hgetall(keys.live_settings(site)).items()}
        policy = resolve_policy(spiders[site], settings, live)
        one = politeness(redis_conn, site, policy)
        policy_found, now = found[site]
        assert policy_found == policy
        assert (now.interval, now.why, now.closed_why) == (one.interval, one.why, one.closed_why)
        assert (now.closed_for is None) == (one.closed_for is None)
    assert found[SITES[1]][1].interval == 4.5 and found[SITES[2]][0].paused
    assert found[SITES[3]][1].why == "robots.txt Crawl-delay"
    closed = found[SITES[4]][1]
    assert closed.closed_why == "backoff after 503" and closed.closed_for is not None and 45 < closed.closed_for <= 50
    assert found[SITES[5]][1].closed_for is None


def test_status_json_is_json_dumps_of_the_sites_to_the_character() -> None:
    class Half(float):
        pass

    statuses = [
        SiteStatus(name, i, 0, 1, 2, 3, 4, 5, 10**i, rate=rate, interval=interval, closed_for=closed, closed_why="x\n")
        for i, (name, rate, interval, closed) in enumerate(
            [
                ("shop", None, 1.0, None),
                ("é-site", 0.0, 0.1, 3.5),
                ('q"uote', math.nan, None, None),
                ("😀", math.inf, 1e-7, None),
                ("neg", -math.inf, 2.0, None),
                ("sub", Half(0.5), 2.0, None),  # a float of another type: written by json itself
            ]
        )
    ]
    statuses[1].paused, statuses[2].interval_source = True, "live"
    for sites in (statuses, statuses[:1], []):
        for hosts in ({}, {"host-a": {"busy": 2, "idle": 1}}):
            for suspended in (False, True):
                expected = {
                    "sites": [{**asdict(s), "state": state(s, suspended)} for s in sites],
                    "parse": asdict(ParseBacklog(3, 4)),
                    "workers": hosts,
                    "suspended": suspended,
                }
                assert status_json(sites, ParseBacklog(3, 4), hosts, suspended) == json.dumps(expected, indent=2)
