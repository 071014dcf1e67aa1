"""robots.txt per RFC 9309, against a real loopback server and a real Redis.

Each test pins one rule of ``crawler.work.robots``: what a 2xx, 3xx, 4xx, 5xx or no answer
means, how much is read, how an outage is shared, retried and, after 30 days, outlived.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from crawling import count_round_trips, installed_runtime, join_all, start_in_threads
from redis import Redis

from crawler.coord import keys
from crawler.coord.frontier import seed
from crawler.coord.gate import Gate
from crawler.errors import RobotsUnavailable
from crawler.http.fetch import Fetcher
from crawler.ops.failures import failed_pages, retry_pages
from crawler.settings import Settings
from crawler.work import robots
from crawler.work.robots import (
    ROBOTS_MAX_BYTES,
    ROBOTS_MAX_REDIRECTS,
    ROBOTS_OUTAGE_GRACE,
    ROBOTS_RETRY_FIRST,
    Outage,
    RobotsCache,
    _unfollowable,
)
from crawler.work.runtime import Runtime

SITE = "demo"
AGENT = "test-agent"
RULES = b"User-agent: *\nDisallow: /private/\n"


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that stopped reading on purpose
            super().handle_error(request, client_address)


class RobotsServer:
    """A loopback server answering each path with what ``answers`` says; logs the paths asked for."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, bytes, dict[str, str]]] = {}
        self.paths: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                owner.paths.append(self.path)
                status, body, headers = owner.answers.get(self.path, (404, b"", {}))
                self.send_response(status)
                for name, value in {"Content-Type": "text/plain", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def answer(self, path: str, status: int, body: bytes = b"", **headers: str) -> None:
        self.answers[path] = (status, body, {name.replace("_", "-"): value for name, value in headers.items()})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site() -> Iterator[RobotsServer]:
    server = RobotsServer()
    yield server
    server.close()


class Turns:
    """``take_turn`` for the robots cache: the site's real gate, counted."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.count = 0

    def __call__(self) -> Gate:
        self.count += 1
        return self.runtime.take_gate(SITE)


def allowed(robots: RobotsCache, runtime: Runtime, url: str, turns: Turns | None = None) -> bool:
    return robots.allowed(SITE, url, AGENT, turns or Turns(runtime))


def fresh_cache(runtime: Runtime, max_body_bytes: int = 10 * 1024 * 1024) -> RobotsCache:
    """A robots cache as another worker process has it: same Redis, nothing parsed yet."""
    return RobotsCache(runtime.connection, Fetcher(timeout=2.0, max_body_bytes=max_body_bytes, user_agent=AGENT))


def test_robots_txt_larger_than_the_body_cap_is_read_up_to_500_kib_and_obeyed(
    runtime: Runtime, site: RobotsServer
) -> None:
    padding = b"# " + b"x" * 1000 + b"\n"
    body = RULES + padding * (ROBOTS_MAX_BYTES // len(padding) + 1) + b"Disallow: /late/\n" + padding * 100
    assert len(body) > ROBOTS_MAX_BYTES
    site.answer("/robots.txt", 200, body)
    robots = fresh_cache(runtime, max_body_bytes=64 * 1024)  # far less than robots.txt: it is cut, not refused

    assert not allowed(robots, runtime, f"{site.origin}/private/page")
    assert allowed(robots, runtime, f"{site.origin}/public")
    assert allowed(robots, runtime, f"{site.origin}/late/page")  # its rule lies past the first 500 KiB
    assert len(runtime.connection.get(keys.robots(SITE, site.origin))) == ROBOTS_MAX_BYTES


@pytest.mark.parametrize("status", [401, 403, 404, 410])
def test_4xx_means_no_rules(runtime: Runtime, site: RobotsServer, status: int) -> None:
    site.answer("/robots.txt", status, b"User-agent: *\nDisallow: /\n")  # a 4xx body is not rules
    assert allowed(fresh_cache(runtime), runtime, f"{site.origin}/private/page")
    assert allowed(fresh_cache(runtime), runtime, f"{site.origin}/other")  # cached: asked once
    assert site.paths == ["/robots.txt"]
    assert runtime.connection.ttl(keys.robots(SITE, site.origin)) > 23 * 3600


@pytest.mark.parametrize("answer", [500, 503, 429, "refused"])
def test_5xx_429_or_no_answer_disallows_the_origin_until_robots_txt_can_be_read(
    runtime: Runtime, site: RobotsServer, answer: int | str
) -> None:
    if answer == "refused":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            origin = f"http://127.0.0.1:{probe.getsockname()[1]}"  # nothing listens there once closed
    else:
        origin = site.origin
        site.answer("/robots.txt", int(answer), b"User-agent: *\nAllow: /\n", Retry_After="1")
    connection = runtime.connection

    with pytest.raises(RobotsUnavailable) as first:
        allowed(fresh_cache(runtime), runtime, f"{origin}/page")
    assert ROBOTS_RETRY_FIRST - 2 < first.value.retry_after <= ROBOTS_RETRY_FIRST
    # Another worker does not ask again: the outage is in Redis, with its wait.
    with pytest.raises(RobotsUnavailable):
        allowed(fresh_cache(runtime), runtime, f"{origin}/other")
    assert len(site.paths) == (0 if answer == "refused" else 1)
    outage = Outage.load(connection, SITE, origin)
    assert outage is not None and outage.failures == 1

    # Its wait over, robots.txt is asked again; failing again doubles the wait.
    connection.hset(keys.robots_outage(SITE, origin), "retry_at", time.time() - 1)
    with pytest.raises(RobotsUnavailable) as second:
        allowed(fresh_cache(runtime), runtime, f"{origin}/page")
    assert 2 * ROBOTS_RETRY_FIRST - 2 < second.value.retry_after <= 2 * ROBOTS_RETRY_FIRST
    again = Outage.load(connection, SITE, origin)
    assert again is not None and (again.failures, again.since) == (2, outage.since)


def test_a_process_finds_robots_txt_in_redis_or_its_outage_running_in_one_round_trip_of_two_commands(
    runtime: Runtime, site: RobotsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every download process reads each site's robots.txt once: on a broad crawl, two commands a site."""
    site.answer("/robots.txt", 200, RULES)
    assert allowed(fresh_cache(runtime), runtime, f"{site.origin}/page")  # read, and cached in Redis
    before = runtime.connection.info("commandstats")
    trips = count_round_trips(monkeypatch)
    assert not allowed(fresh_cache(runtime), runtime, f"{site.origin}/private/x")
    assert len(trips) == 1, "the copy cached in Redis took more than one round trip"
    after = runtime.connection.info("commandstats")
    made = {name: n["calls"] - before.get(name, {}).get("calls", 0) for name, n in after.items()}
    made.pop("cmdstat_info")
    assert {name: n for name, n in made.items() if n} == {"cmdstat_get": 1, "cmdstat_hgetall": 1}, "its TTL read"

    runtime.connection.delete(keys.robots(SITE, site.origin))
    Outage(time.time(), 1, time.time() + 60, "HTTP 503").save(runtime.connection, SITE, site.origin)
    trips.clear()
    with pytest.raises(RobotsUnavailable):
        allowed(fresh_cache(runtime), runtime, f"{site.origin}/page")
    assert len(trips) == 1, "an outage whose wait runs took more than the round trip of the cached copy's read"
    assert site.paths == ["/robots.txt"]


def test_many_workers_at_once_fetch_robots_txt_once_and_the_fetch_leaves_its_lock_to_expire(
    runtime: Runtime, site: RobotsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight processes' first pages of a site at once: one fetch, every verdict right. The fetch takes
    the lock in the round trip of its second look (a ``SET NX`` and the two reads) and does not release
    it: the others find the copy first. Besides the gate's, 7 commands a site and no script."""
    site.answer("/robots.txt", 200, RULES)
    slow = site.server.RequestHandlerClass.do_GET
    monkeypatch.setattr(site.server.RequestHandlerClass, "do_GET", lambda h: (time.sleep(0.3), slow(h)))
    caches = [fresh_cache(runtime) for _ in range(8)]
    verdicts: list[bool] = []
    threads = [
        threading.Thread(target=lambda c=c: verdicts.append(allowed(c, runtime, f"{site.origin}/private/x")))
        for c in caches
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert (site.paths, verdicts) == (["/robots.txt"], [False] * 8)
    assert 0 < runtime.connection.ttl(keys.robots_lock(SITE, site.origin)) <= robots.ROBOTS_LOCK_FOR

    runtime.connection.delete(keys.robots(SITE, site.origin), keys.robots_lock(SITE, site.origin))
    cache = fresh_cache(runtime)
    monkeypatch.setattr(cache, "_download", lambda *args: robots._Answer(RULES.decode()))  # no gate, no HTTP
    before = runtime.connection.info("commandstats")
    assert allowed(cache, runtime, f"{site.origin}/page")
    after = runtime.connection.info("commandstats")
    made = {name: n["calls"] - before.get(name, {}).get("calls", 0) for name, n in after.items()}
    # the first look, then the lock and a second look, then the copy and the last copy kept
    assert {name: n for name, n in made.items() if n and name != "cmdstat_info"} == {
        "cmdstat_get": 2,
        "cmdstat_hgetall": 2,
        "cmdstat_set": 3,
    }


def test_a_fetch_that_fails_lets_the_lock_go_and_a_frozen_holder_s_lock_holds_until_it_expires(
    runtime: Runtime, site: RobotsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    site.answer("/robots.txt", 200, RULES)
    cache = fresh_cache(runtime)
    download = cache._download

    def proxy_down(*args: Any) -> robots._Answer:
        raise robots.ProxyError("proxy down")

    monkeypatch.setattr(cache, "_download", proxy_down)
    with pytest.raises(robots.ProxyError):
        allowed(cache, runtime, f"{site.origin}/page")
    assert runtime.connection.exists(keys.robots_lock(SITE, site.origin)) == 0  # the next one does not wait
    monkeypatch.setattr(cache, "_download", download)

    runtime.connection.set(keys.robots_lock(SITE, site.origin), "frozen worker", px=600)
    started = time.monotonic()
    assert allowed(cache, runtime, f"{site.origin}/page")
    assert time.monotonic() - started >= 0.5
    assert site.paths == ["/robots.txt"]


def test_robots_txt_read_again_ends_the_outage_and_its_rules_apply(runtime: Runtime, site: RobotsServer) -> None:
    site.answer("/robots.txt", 503)
    with pytest.raises(RobotsUnavailable):
        allowed(fresh_cache(runtime), runtime, f"{site.origin}/page")
    site.answer("/robots.txt", 200, RULES)
    runtime.connection.hset(keys.robots_outage(SITE, site.origin), "retry_at", time.time() - 1)

    robots = fresh_cache(runtime)
    assert allowed(robots, runtime, f"{site.origin}/page")
    assert not allowed(robots, runtime, f"{site.origin}/private/x")
    assert runtime.connection.exists(keys.robots_outage(SITE, site.origin)) == 0
    assert runtime.connection.get(keys.robots_copy(SITE, site.origin)) == RULES
    assert runtime.connection.ttl(keys.robots_copy(SITE, site.origin)) > 59 * 24 * 3600


def start_long_outage(connection: Redis, origin: str) -> None:
    """An outage that began 31 days ago and whose wait is over."""
    now = time.time()
    Outage(now - ROBOTS_OUTAGE_GRACE - 24 * 3600, 40, now - 1, "HTTP 503").save(connection, SITE, origin)


def test_after_30_days_of_outage_the_last_copy_read_is_used(runtime: Runtime, site: RobotsServer) -> None:
    site.answer("/robots.txt", 200, RULES)
    assert allowed(fresh_cache(runtime), runtime, f"{site.origin}/page")
    runtime.connection.delete(keys.robots(SITE, site.origin))  # the 24 h copy expired; the last copy is kept
    site.answer("/robots.txt", 503)
    start_long_outage(runtime.connection, site.origin)

    robots = fresh_cache(runtime)
    assert not allowed(robots, runtime, f"{site.origin}/private/x")
    assert allowed(robots, runtime, f"{site.origin}/page")
    assert site.paths == ["/robots.txt", "/robots.txt"]  # still asked for, and the outage goes on
    outage = Outage.load(runtime.connection, SITE, site.origin)
    assert outage is not None and outage.failures == 41


def test_after_30_days_of_outage_with_no_copy_everything_is_allowed(runtime: Runtime, site: RobotsServer) -> None:
    site.answer("/robots.txt", 503)
    start_long_outage(runtime.connection, site.origin)
    assert allowed(fresh_cache(runtime), runtime, f"{site.origin}/private/x")


def redirect_chain(site: RobotsServer, hops: int) -> None:
    """/robots.txt → /hop/1 → … → /hop/HOPS, which has the rules."""
    names = ["/robots.txt"] + [f"/hop/{n}" for n in range(1, hops + 1)]
    for source, target in zip(names, names[1:], strict=False):
        site.answer(source, 301, Location=target)
    site.answer(names[-1], 200, RULES)


def test_robots_txt_redirects_are_followed_up_to_five_hops_each_through_the_gate(
    runtime: Runtime, site: RobotsServer
) -> None:
    redirect_chain(site, ROBOTS_MAX_REDIRECTS)
    turns = Turns(runtime)
    assert not allowed(fresh_cache(runtime), runtime, f"{site.origin}/private/x", turns)
    assert site.paths == ["/robots.txt"] + [f"/hop/{n}" for n in range(1, ROBOTS_MAX_REDIRECTS + 1)]
    assert turns.count == ROBOTS_MAX_REDIRECTS + 1
    # The rules found are the first origin's.
    assert runtime.connection.get(keys.robots(SITE, site.origin)) == RULES


def test_robots_txt_more_than_five_redirects_away_counts_as_no_rules(runtime: Runtime, site: RobotsServer) -> None:
    redirect_chain(site, ROBOTS_MAX_REDIRECTS + 1)
    assert allowed(fresh_cache(runtime), runtime, f"{site.origin}/private/x")
    assert f"/hop/{ROBOTS_MAX_REDIRECTS + 1}" not in site.paths


def test_robots_txt_redirects_off_http_or_from_a_public_host_inward_are_not_followed() -> None:
    public = "http://93.184.216.34/robots.txt"
    assert _unfollowable(public, "ftp://93.184.216.34/robots.txt", False) is not None
    assert _unfollowable(public, "http://127.0.0.1/robots.txt", False) is not None
    assert _unfollowable(public, "http://[::1]/robots.txt", False) is not None
    assert _unfollowable(public, "http://localhost/robots.txt", False) is not None
    assert _unfollowable(public, "http://127.0.0.1/robots.txt", True) is None  # the spider allows it
    assert _unfollowable(public, "https://93.184.216.35/robots.txt", False) is None
    assert _unfollowable("http://127.0.0.1:8000/robots.txt", "http://127.0.0.1:8001/robots.txt", False) is None


def test_a_retry_after_longer_than_the_backoff_is_honoured(runtime: Runtime, site: RobotsServer) -> None:
    site.answer("/robots.txt", 503, Retry_After="600")
    with pytest.raises(RobotsUnavailable) as caught:
        allowed(fresh_cache(runtime), runtime, f"{site.origin}/page")
    assert 598 < caught.value.retry_after <= 600


HANGING_SPIDER = """
from crawler import Spider


class Hang(Spider):
    name = "hang"
    start_urls = ["http://127.0.0.1:9/"]
    allowed_domains = ["127.0.0.1"]
    interval = 0.05

    def parse(self, page):
        yield {"url": page.url}
"""


class UnreachableRobots:
    """A loopback site of three pages whose /robots.txt, while ``down`` is set, is accepted and
    never answered (``hang``) or answered 503; readable (no rules) once ``down`` is cleared."""

    def __init__(self, how: str) -> None:
        self.down = threading.Event()
        self.down.set()
        self.release = threading.Event()
        self.paths: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                owner.paths.append(self.path)
                if self.path == "/robots.txt" and owner.down.is_set():
                    if how == "hang":
                        owner.release.wait(30)
                        self.close_connection = True
                        return
                    self._send(503, b"")
                    return
                body = b"User-agent: *\nAllow: /\n" if self.path == "/robots.txt" else b"<p>page</p>"
                self._send(200, body)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if self.path == "/robots.txt" else "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.urls = [f"http://127.0.0.1:{self.server.server_address[1]}/{name}" for name in ("", "a", "b")]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("how", ["hang", "503"])
def test_a_burst_crawl_ends_on_a_site_whose_robots_txt_cannot_be_read_and_its_pages_are_retried_once_it_can(
    redis_conn: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setattr(robots, "ROBOTS_RETRY_FIRST", 1.0)  # robots.txt asked again after 1 s, 2 s, 4 s
    (Path(settings.sites_dir) / "hang.py").write_text(HANGING_SPIDER)
    settings = dataclasses.replace(settings, timeout=0.5, max_retries=2)
    server = UnreachableRobots(how)
    try:
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("hang"), server.urls)
            started = time.monotonic()
            threads, stop = start_in_threads(rt, sites=("hang",))
            join_all(threads, stop, timeout=30)  # drained: not held for the 30 days of RFC 9309's grace
            took = time.monotonic() - started

            # robots.txt asked 1 + max_retries times; the pages never; each recorded failed, retryable.
            assert server.paths == ["/robots.txt"] * 3, server.paths
            robots_url = server.urls[0] + "robots.txt"  # its own record: failed until read
            failed = [page for page in failed_pages(rt.store, "hang") if page.url != robots_url]
            assert sorted(page.url for page in failed) == sorted(rt.frontier("hang").check(u) for u in server.urls)
            assert all(page.reason.startswith("robots.txt unreachable") for page in failed), failed[0].reason
            assert all("gave up after 3 attempts" in page.reason for page in failed)
            assert took < 15

            server.down.clear()  # robots.txt readable again, before its next attempt is due (4 s)
            assert len(retry_pages(rt.store, rt.frontier("hang"), [page.url for page in failed])) == 3
            threads, stop = start_in_threads(rt, sites=("hang",))
            join_all(threads, stop, timeout=30)

            assert sorted(item["url"] for item in rt.store.items("hang")) == sorted(p.url for p in failed)
            assert failed_pages(rt.store, "hang") == []
            assert server.paths.count("/robots.txt") == 4  # asked again at once, read once
    finally:
        server.close()


def test_a_process_holds_the_rules_of_the_origins_met_lately_not_of_every_one_it_met(
    runtime: Runtime, site: RobotsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broad crawl meets each host once: rules past their LOCAL_TTL are dropped once the rules held
    have doubled, so a process holds those of the last few minutes' origins, whatever it met before."""
    monkeypatch.setattr(robots, "FORGET_EXPIRED_AT", 4)
    monkeypatch.setattr(robots, "LOCAL_TTL", 20)
    cache = fresh_cache(runtime)
    monkeypatch.setattr(cache, "_download", lambda *args: robots._Answer(RULES.decode()))  # no gate, no HTTP
    clock = [1000.0]
    now = types.SimpleNamespace(**{name: getattr(time, name) for name in ("time", "sleep", "strftime", "gmtime")})
    monkeypatch.setattr(robots, "time", now)  # the module's clock only, not every thread's
    now.monotonic = lambda: clock[0]
    for n in range(3):
        cache._rules(f"early{n}", site.origin, Turns(runtime), None, True)
    clock[0] += robots.LOCAL_TTL + 1
    cache._rules("late", site.origin, Turns(runtime), None, True)  # the fourth: the expired three dropped
    assert list(cache._parsed) == [("late", site.origin)]
    held = []
    for n in range(200):  # one new site a second, for longer than LOCAL_TTL
        clock[0] += 1.0
        cache._rules(f"site{n}", site.origin, Turns(runtime), None, True)
        held.append(len(cache._parsed))
    assert max(held) <= 2 * (robots.LOCAL_TTL + 1), max(held)
    assert held[-1] > robots.LOCAL_TTL  # the last LOCAL_TTL's sites are all held
    assert not cache._rules("site199", site.origin, Turns(runtime), None, True).can_fetch("/private/x", AGENT)
