"""The development HTTP cache: pages replayed from disk, no request sent and no gate taken on a hit."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from redis import Redis

from crawler.cli.app import cli
from crawler.coord import keys
from crawler.demo import ShopSite
from crawler.demo.spider import DemoShop
from crawler.http.cache import CACHE_FILE, CachingFetcher
from crawler.ops.devtools import fetch_as_worker
from crawler.settings import Settings
from crawler.spiders.loading import SpiderSet
from crawler.work.runtime import Runtime


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)


def paths(shop: ShopSite) -> list[str]:
    return [entry.path for entry in shop.requests]


def test_a_hit_sends_no_request_and_takes_no_gate(redis_conn: Redis, settings: Settings, shop: ShopSite) -> None:
    cached = dataclasses.replace(settings, http_cache=True, sites={"demo": {"interval": 1.0}})
    rt = Runtime(redis_conn, cached)
    try:
        assert isinstance(rt.fetcher, CachingFetcher)
        first = fetch_as_worker(rt, "demo", f"{shop.url}/product/1")
        assert first.extra["cache"] == "miss"
        started = time.monotonic()
        again = fetch_as_worker(rt, "demo", f"{shop.url}/product/1")
        took = time.monotonic() - started
    finally:
        rt.close()
    assert (again.status, again.body, again.extra["cache"]) == (200, first.body, "hit")
    # The gate closed for 1 s by the first fetch was not waited for: the hit sent nothing.
    assert took < 0.5, took
    assert paths(shop) == ["/robots.txt", "/product/1"]
    # Misses: robots.txt and the page's first fetch; hits: the page's second.
    assert redis_conn.hmget(keys.stats("demo"), "cache_hits", "cache_misses") == [b"1", b"2"]
    assert (Path(cached.state_dir) / CACHE_FILE).exists()


class Hooked(DemoShop):
    """The demo shop, each request marked as it is sent."""

    def before_send(self, request: Any) -> None:
        request.headers["X-Sent-At"] = f"{time.time():.3f}"


def test_a_spiders_before_send_runs_with_the_cache_a_hit_still_taking_no_gate(
    redis_conn: Redis, settings: Settings, shop: ShopSite
) -> None:
    """With the cache the gate is taken at a miss's first byte: the hook's check of the send grace
    (``lapsed``) asks the stand-in, which takes nothing for it."""
    cached = dataclasses.replace(settings, http_cache=True, sites={"demo": {"interval": 1.0}})
    rt = Runtime(redis_conn, cached, SpiderSet({"demo": Hooked}, []))
    try:
        first = fetch_as_worker(rt, "demo", f"{shop.url}/product/1")
        started = time.monotonic()
        again = fetch_as_worker(rt, "demo", f"{shop.url}/product/1")
        took = time.monotonic() - started
    finally:
        rt.close()
    assert (first.extra["cache"], again.extra["cache"]) == ("miss", "hit")
    assert took < 0.5, took  # the gate closed for 1 s by the miss was not waited for
    assert paths(shop) == ["/robots.txt", "/product/1"]


def test_a_miss_still_takes_the_gate(redis_conn: Redis, settings: Settings, shop: ShopSite) -> None:
    cached = dataclasses.replace(settings, http_cache=True, sites={"demo": {"interval": 0.4}})
    rt = Runtime(redis_conn, cached)
    try:
        for n in (1, 2):
            fetch_as_worker(rt, "demo", f"{shop.url}/product/{n}")
    finally:
        rt.close()
    times = [entry.time for entry in shop.requests]
    assert paths(shop) == ["/robots.txt", "/product/1", "/product/2"]
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= 0.4


def test_errors_are_not_stored_and_without_the_setting_nothing_is(
    redis_conn: Redis, settings: Settings, shop: ShopSite
) -> None:
    cached = dataclasses.replace(settings, http_cache=True, sites={"demo": {"interval": 0.01}})
    rt = Runtime(redis_conn, cached)
    try:
        for _ in range(2):
            assert fetch_as_worker(rt, "demo", f"{shop.url}/missing").status == 404
    finally:
        rt.close()
    assert paths(shop).count("/missing") == 2
    plain = Runtime(redis_conn, dataclasses.replace(settings, state_dir=settings.state_dir + "-plain"))
    try:
        assert not isinstance(plain.fetcher, CachingFetcher)
    finally:
        plain.close()
    assert not (Path(settings.state_dir + "-plain") / CACHE_FILE).exists()


SUMMARY = re.compile(r"^demo: (\d+) fetched, .*$", re.MULTILINE)


def test_a_second_crawl_with_the_cache_does_not_hit_the_site(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "sites").mkdir()
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites"), "--http-cache"]
    env = {"CRAWLER_STATE_DIR": str(tmp_path / "state")}
    runner = CliRunner()
    with ShopSite(products=6, faults=False) as shop:
        args = ["crawl", "demo", shop.url + "/", "-n", "1", "--threads", "1"]
        first = runner.invoke(cli, [*base, *args], env=env)
        assert first.exit_code == 0, first.output
        sent = len(shop.requests)
        pages = int(SUMMARY.search(first.stdout).group(1))
        assert pages == 1 + 1 + 6 and "from the development cache" not in first.stdout

        again = runner.invoke(cli, [*base, *args, "--fresh"], env=env)
        assert again.exit_code == 0, again.output
        # Every page replayed from disk; robots.txt is still cached in Redis.
        assert len(shop.requests) == sent
        assert SUMMARY.search(again.stdout).group(0).endswith(f"; {pages} from the development cache")

    status = runner.invoke(cli, [*base, "status", "demo"], env=env)
    assert f"development cache: demo {pages} hits, 0 misses" in status.stdout
    stats = runner.invoke(cli, [*base, "stats", "demo"], env=env)
    assert stats.exit_code == 0, stats.output
    assert stats.stdout.startswith(f"development cache: {pages} hits (no request sent; in the counts below)")


@pytest.mark.integration
def test_a_miss_is_sent_as_the_fetcher_sends_it_and_a_hit_comes_back_the_same(tmp_path: Path) -> None:
    """Through the cache's two adapters (httpcore to hishel's httpx transport and back): the request's
    headers as without the cache (no Content-Length on a GET), the answer's status, headers and body."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from crawler.http.fetch import Fetcher

    seen: list[dict[str, str]] = []

    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = b"<p>cached</p>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("X-Twice", "a")
            self.send_header("X-Twice", "b")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/page"
    fetcher = CachingFetcher(Fetcher(timeout=5, max_body_bytes=1 << 20, user_agent="cache-test"), tmp_path)
    try:
        first = fetcher.get(url, headers={"x-mine": "1"})
        again = fetcher.get(url, headers={"x-mine": "1"})
    finally:
        fetcher.close()
        server.shutdown()
        server.server_close()
    (sent,) = seen  # the second came from the cache
    assert "content-length" not in sent and sent["user-agent"] == "cache-test" and sent["x-mine"] == "1"
    assert sent["host"] == url.split("/")[2]
    assert (first.extra["cache"], again.extra["cache"]) == ("miss", "hit")
    for response in (first, again):
        assert (response.status, response.body, response.encoding) == (200, b"<p>cached</p>", "utf-8")
        assert response.headers["x-twice"] == "a, b"
