"""Adaptive politeness: the Auto interval, its pace in Redis, and backoff after 429/503.

The crawls run real worker processes against a loopback shop whose latency changes
while they run; spacing is measured at the shop (arrival times), against the pace a
poller reads from Redis meanwhile.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from redis import Redis

from crawler import Auto
from crawler.cli.app import cli
from crawler.coord import keys
from crawler.coord.connection import connect
from crawler.coord.frontier import seed
from crawler.coord.gate import SEND_GRACE, site_gate
from crawler.coord.pacing import Pace, Pacer, classify, throttle_pause
from crawler.coord.policy import SitePolicy, effective_interval, resolve_policy
from crawler.coord.scheduler import Scheduler, publish_conf
from crawler.demo import ShopSite
from crawler.ops.status import politeness
from crawler.settings import Settings
from crawler.spiders.spider import Spider
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.work.runtime import Runtime

AUTO = Auto(min=0.05, max=1.0)  # factor 5, ease 10%


class Site(Spider):
    name = "site"
    interval = AUTO


def pace_of(connection: Redis, site: str = "site") -> int | None:
    value = connection.hget(keys.conf(site), "pace_ms")
    return None if value is None else int(value)


# -- the rule ---------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [{"min": 0}, {"min": 2, "max": 1}, {"factor": 0}, {"ease": 1}, {"min": "1"}])
def test_auto_refuses_bounds_that_make_no_sense(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Auto(**fields)


def test_pace_follows_response_time_up_at_once_and_down_by_a_tenth(redis_conn: Redis) -> None:
    pacer = Pacer(redis_conn)

    def observe(elapsed: float, status: int | None = 200, error: str | None = None) -> Pace:
        return pacer.observe(
            keys.conf("site"),
            keys.gate("site"),
            AUTO,
            elapsed=elapsed,
            status=status,
            error=error,
            margin=0.0,
            since_send=elapsed,
        )

    assert observe(0.001).seconds == 0.05  # 5 ms: at min
    assert observe(0.08) == Pace(0.4, "last 80 ms × 5")  # up at once to factor × elapsed
    eased = observe(0.002)
    assert eased.seconds == 0.36 and eased.why.startswith("easing off")  # down 10% per healthy answer
    assert observe(0.002).seconds == 0.324
    assert observe(0.01, status=503) == Pace(0.648, "doubled after 503")
    assert observe(0.0, status=None, error="timeout").seconds == 1.0  # doubled, held at max
    assert observe(0.01, status=500).why == "held after 500, at max"  # unhealthy: never eases
    assert observe(0.3, status=404).why == "last 300 ms × 5, at max"  # a 404 is an answer: its time counts


def test_a_pace_that_grows_keeps_the_gate_closed_from_the_send(redis_conn: Redis) -> None:
    gate = site_gate(redis_conn, "site", AUTO.min, 0.01, pace_key=keys.conf("site"))
    gate.acquire()
    gate.rearm()  # sent: closed for min + margin
    assert redis_conn.pttl(gate.key) <= 60
    Pacer(redis_conn).observe(
        keys.conf("site"), gate.key, AUTO, elapsed=0.1, status=200, error=None, margin=0.01, since_send=0.1
    )
    assert 300 < redis_conn.pttl(gate.key) <= 410  # 0.5 s pace + margin, 0.1 s of it gone


def test_the_gate_reads_the_pace_when_it_is_taken_and_when_it_is_rearmed(redis_conn: Redis) -> None:
    redis_conn.hset(keys.conf("site"), "pace_ms", 800)
    gate = site_gate(redis_conn, "site", AUTO.min, 0.01, pace_key=keys.conf("site"))
    gate.acquire()
    assert 800 + 10 < redis_conn.pttl(gate.key) <= 810 + SEND_GRACE * 1000
    redis_conn.hset(keys.conf("site"), "pace_ms", 300)  # eased meanwhile by another host's answer
    gate.rearm()
    assert 250 < redis_conn.pttl(gate.key) <= 310
    fixed = site_gate(redis_conn, "other", 0.05, 0.01)  # a fixed interval ignores any pace
    fixed.acquire()
    fixed.rearm()
    assert redis_conn.pttl(fixed.key) <= 60


def test_throttle_pauses_double_per_error_with_jitter_within_half() -> None:
    rng = random.Random(1)
    for n in range(1, 8):
        step = min(2.0 * 2 ** (n - 1), 60.0)
        pauses = [throttle_pause(2.0, n, 60.0, rng) for _ in range(200)]
        assert step / 2 <= min(pauses) and max(pauses) <= step
        assert max(pauses) - min(pauses) > step / 4  # jittered, not one value


def test_events_by_outcome() -> None:
    assert [classify(s, None) for s in (200, 304, 404, 429, 503, 504, 500, 502)] == [
        "ok",
        "ok",
        "ok",
        "throttle",
        "throttle",
        "throttle",
        "error",
        "error",
    ]
    assert classify(None, "timeout") == classify(None, "no connection") == "throttle"


# -- where the interval comes from --------------------------------------------------------


def test_auto_from_the_spider_or_the_config_file_and_a_live_interval_replaces_it(settings: Settings) -> None:
    policy = resolve_policy(Site, settings, {})
    assert (policy.interval, policy.auto, policy.interval_text) == (0.05, AUTO, "auto 0.05-1s")
    configured = dataclasses.replace(settings, sites={"site": {"interval": {"min": 0.2, "max": 5, "factor": 3}}})
    assert resolve_policy(Site, configured, {}).auto == Auto(min=0.2, max=5, factor=3)
    live = resolve_policy(Site, configured, {"interval": "2.0"})
    assert (live.interval, live.auto, live.sources["interval"]) == (2.0, None, "live")


def test_config_file_refuses_a_malformed_auto_interval(settings: Settings) -> None:
    from crawler.errors import ConfigError

    with pytest.raises(ConfigError, match="sites.site.interval.maxx is not a field"):
        dataclasses.replace(settings, sites={"site": {"interval": {"maxx": 3}}})
    with pytest.raises(ConfigError, match="min <= max"):
        dataclasses.replace(settings, sites={"site": {"interval": {"min": 3, "max": 1}}})


def test_effective_interval_says_why() -> None:
    auto = SitePolicy(interval=0.5, auto=Auto(min=0.5), sources={"interval": "spider"})
    assert effective_interval(auto) == (0.5, "auto 0.5s (min)")
    assert effective_interval(auto, pace=Pace(2.4, "last 480 ms × 5")) == (2.4, "auto 2.4s (last 480 ms × 5)")
    assert effective_interval(auto, crawl_delay=3, pace=Pace(2.4, "x")) == (3, "robots.txt Crawl-delay")
    fixed = SitePolicy(interval=1.0, sources={"interval": "config"})
    assert effective_interval(fixed, pace=Pace(9, "left over")) == (1.0, "config")


def test_scheduler_spaces_handouts_by_the_pace(redis_conn: Redis) -> None:
    from crawler.coord.frontier import Frontier
    from crawler.spiders.spider import Request

    publish_conf(redis_conn, "a", 0.05, 0.01, auto=True)
    redis_conn.hset(keys.conf("a"), "pace_ms", 400)
    front = Frontier(redis_conn, "a", ["example.com"], 60, 60)
    front.add([Request(f"http://example.com/{i}") for i in range(3)])
    scheduler = Scheduler(redis_conn)

    def take() -> Any:
        step = scheduler.next()
        if step.job_id is None and step.refill:
            front.refill(2, due_now=True)  # as a worker does
            step = scheduler.next()
        return step

    assert take().job_id is not None
    step = take()
    assert step.job_id is None and step.wait is not None and 0.3 < step.wait <= 0.41  # pace + margin
    publish_conf(redis_conn, "a", 0.05, 0.01, auto=False)  # the spider went back to a fixed interval
    assert pace_of(redis_conn, "a") is None


def test_status_shows_the_pace_and_a_backoff_with_their_reasons(redis_conn: Redis) -> None:
    policy = SitePolicy(interval=0.5, auto=Auto(min=0.5), sources={"interval": "spider"})
    redis_conn.hset(keys.conf("site"), mapping={"pace_ms": 2400, "pace_why": "last 480 ms × 5"})
    now = politeness(redis_conn, "site", policy)
    assert (now.interval, now.why, now.closed_for) == (2.4, "auto 2.4s (last 480 ms × 5)", None)
    Scheduler(redis_conn).close_gate("site", 12, "backoff after 503")
    now = politeness(redis_conn, "site", policy)
    assert now.closed_why == "backoff after 503" and now.closed_for is not None and 11 < now.closed_for <= 12


# -- whole crawls, measured at the site ---------------------------------------------------


class PacePoller:
    """Reads the site's pace from Redis every few ms (a thread), on the shop's clock."""

    def __init__(self, redis_url: str, site: str):
        self.connection = connect(redis_url)
        self.site = site
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PacePoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.connection.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            before = time.time()
            value = pace_of(self.connection, self.site)
            self.samples.append((before, (value or 0) / 1000.0))
            time.sleep(0.003)

    def lowest_around(self, moment: float) -> float:
        """The lowest pace read from shortly before ``moment`` to just after (0 if none)."""
        near = [p for t, p in self.samples if moment - 0.03 <= t <= moment + 0.006]
        earlier = [p for t, p in self.samples if t < moment]
        return min(near + earlier[-1:], default=0.0)


def crawl_with_processes(
    redis_url: str, settings: Settings, site: str, processes: int = 2, threads: int = 2, timeout: float = 120
) -> None:
    workers = start_workers(
        [WorkerSpec("download", (site,), threads=threads, burst=True)] * processes
        + [WorkerSpec("parse", (site,), burst=True)],
        settings,
        redis_url,
    )
    done = threading.Event()

    def watchdog() -> None:
        if not done.wait(timeout):
            stop_workers(workers, timeout=10)

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        assert wait_for(workers) == 0
    finally:
        done.set()


def wait_for_requests(shop: ShopSite, count: int, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while len(shop.requests) < count:
        assert time.monotonic() < deadline, f"the shop saw {len(shop.requests)} of {count} requests"
        time.sleep(0.005)
    return time.time()


def test_an_auto_interval_follows_the_sites_latency_up_and_back_down_for_the_whole_fleet(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    settings = dataclasses.replace(settings, sites={"demo": {"interval": {"min": AUTO.min, "max": AUTO.max}}})
    with ShopSite(products=80, faults=False) as shop, PacePoller(redis_url, "demo") as poller:
        rt = Runtime(redis_conn, settings)
        seed(rt.frontier("demo"), [shop.url + "/"])
        rt.close()
        changes: dict[str, float] = {}

        def change_latency() -> None:  # slow after 15 requests, fast again after 8 slow ones
            wait_for_requests(shop, 15)
            shop.latency, changes["slow"] = 0.1, time.time()
            wait_for_requests(shop, len(shop.requests) + 8)
            shop.latency, changes["fast"] = 0.0, time.time()

        changer = threading.Thread(target=change_latency, daemon=True)
        changer.start()
        crawl_with_processes(redis_url, settings, "demo", processes=2, threads=2)
        changer.join(5)
        arrivals = [e.time for e in shop.requests]

    assert {"slow", "fast"} <= set(changes), "the crawl ended before the latency changed twice"
    gaps = [(a, b - a) for a, b in zip(arrivals, arrivals[1:])]
    # No gap under the pace in force when its first request was sent (nor under min).
    short = [
        (round(g * 1000, 1), round(poller.lowest_around(a) * 1000))
        for a, g in gaps
        if g < max(poller.lowest_around(a), AUTO.min)
    ]
    assert not short, f"gaps (ms) under the pace in force (ms): {short}"
    # Slow: once the first slow answers are in (a few were sent before), gaps follow 5 × 100 ms.
    slow = [g for a, g in gaps if changes["slow"] <= a < changes["fast"]][3:]
    assert slow and min(slow) >= 0.5, f"slow-phase gaps (s): {slow}"
    fast = [g for a, g in gaps if a >= changes["fast"]]
    # Back down slowly (10% per answer: about 15 steps from 0.5 s to 0.1 s), then to min.
    assert fast[0] >= 0.4, f"the pace fell at once: {fast[:5]}"
    assert sum(1 for g in fast if g >= 0.1) >= 10, f"the pace fell too fast: {fast[:20]}"
    # Down to 5 × the answers' time: near min on a quiet machine, 0.1 s or so when a loaded one answers in 20 ms.
    assert statistics.median(fast[-10:]) < min(slow) / 2, f"the pace did not come back down: {fast[-10:]}"


def test_a_503_without_retry_after_closes_the_gate_for_every_worker(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    settings = dataclasses.replace(settings, backoff=0.6, sites={"demo": {"interval": 0.1}})
    with ShopSite(products=30, faults=True, retry_after=None) as shop:
        rt = Runtime(redis_conn, settings)
        seed(rt.frontier("demo"), [shop.url + "/"])
        rt.close()
        crawl_with_processes(redis_url, settings, "demo", processes=2, threads=2)
        log = list(shop.requests)
    (throttled,) = [i for i, e in enumerate(log) if e.status == 503]
    after = log[throttled + 1].time - log[throttled].time
    usual = statistics.median(b.time - a.time for a, b in zip(log, log[1:]))
    # backoff × 2^0 with jitter: at least half of 0.6 s, for the next request from any worker.
    assert after >= 0.3, f"next request {after * 1000:.0f} ms after the 503 (usual gap {usual * 1000:.0f} ms)"
    assert usual < 0.2
    assert redis_conn.hget(keys.conf("demo"), "closed_why") == b"backoff after 503"
    assert len(shop.requests_for("/product/3")) == 2  # and the page itself was retried


def test_crawler_status_shows_the_interval_in_force_and_a_closure_with_their_reasons(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    sites = tmp_path / "spiders"
    sites.mkdir()
    (sites / "adaptive.py").write_text(
        "from crawler import Auto, Spider\n\n\n"
        "class Adaptive(Spider):\n"
        "    name = 'adaptive'\n"
        "    start_urls = ['http://adaptive.example/']\n"
        "    interval = Auto(min=0.5, max=30)\n"
    )
    redis_conn.hset(keys.conf("adaptive"), mapping={"pace_ms": 2400, "pace_why": "last 480 ms × 5"})
    Scheduler(redis_conn).close_gate("adaptive", 30, "backoff after 503")

    def run(*args: str) -> str:
        base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(sites)]
        result = CliRunner().invoke(cli, [*base, *args], env={"COLUMNS": "250"})
        assert result.exit_code == 0, result.output
        return result.stdout

    (status,) = json.loads(run("status", "adaptive", "--json"))["sites"]
    assert (status["interval"], status["interval_why"]) == (2.4, "auto 2.4s (last 480 ms × 5)")
    assert status["closed_why"] == "backoff after 503" and 29 < status["closed_for"] <= 30
    table = run("status", "adaptive")
    assert "auto 2.4s (last 480 ms × 5)" in table and "closed 30s: backoff after 503" in table
    assert "auto 0.5-30s" in run("sites")
