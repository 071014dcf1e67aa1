"""Re-running a crawl: ``crawler reset`` forgets a site's progress, ``crawl --fresh`` starts over,
and each run's summary counts that run only (real worker processes against the demo shop)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error
from redis import Redis
from rq import Queue
from rq.job import Job

from crawler.cli.app import cli
from crawler.coord import keys
from crawler.coord.frontier import Frontier, seed
from crawler.coord.scheduler import Scheduler
from crawler.coord.seen import stored
from crawler.demo import ShopSite
from crawler.ops.reset import reset_site
from crawler.store.database import OK, FetchRecord, Item, Store, utcnow


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)


@pytest.fixture
def base(redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path) -> list[str]:
    (tmp_path / "sites").mkdir(exist_ok=True)
    return ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]


def invoke(base: list[str], *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, [*base, *args], input=input)


def progress_of(connection: Redis, site: str) -> dict[str, int]:
    return {
        "seen": stored(connection, site)[1],
        "stats": connection.exists(keys.stats(site)),
        "frontier": connection.exists(keys.frontier(site), keys.frontier(site, 50)),
        "levels": connection.exists(keys.levels(site)),
        "jobs": Queue(keys.download_queue(site), connection=connection).count,
        "ready": int(connection.zscore(keys.ready(), site) is not None),
        "sitemap lastmods": connection.exists(keys.lastmod(site)),
        "waiting": sum(
            1
            for m in connection.zrange(keys.delayed(), 0, -1) + connection.zrange(keys.recrawls(), 0, -1)
            if m.decode().startswith(f"{site}\t")
        ),
    }


def fill(connection: Redis, site: str) -> None:
    frontier = Frontier(connection, site, ["127.0.0.1"], 60, 60)
    seed(frontier, [f"http://127.0.0.1:9/{site}/{i}" for i in range(10)])
    seed(frontier, [f"http://127.0.0.1:9/{site}/urgent"], priority=50)
    frontier.refill(4)
    connection.hset(keys.stats(site), mapping={"fetched": 5, "parsed": 4, "items": 9})
    connection.hset(keys.lastmod(site), b"\x01" * 8, 1_700_000_000)  # a sitemap URL's <lastmod>, as read
    scheduler = Scheduler(connection)
    scheduler.schedule(site, f'["http://127.0.0.1:9/{site}/retry"]', 60)
    scheduler.schedule_refresh(site, f'["http://127.0.0.1:9/{site}/again"]', 3600, -10)


def test_reset_forgets_one_site_s_queue_seen_set_and_counters_and_nothing_else(redis_conn: Redis) -> None:
    fill(redis_conn, "demo")
    fill(redis_conn, "other")
    redis_conn.hset(keys.live_settings("demo"), "interval", "2.5")
    before = progress_of(redis_conn, "other")
    assert progress_of(redis_conn, "demo") == before and before["seen"] == 11 and before["jobs"] == 4

    result = reset_site(redis_conn, "demo")

    assert (result.queued, result.seen, result.in_flight) == (12, 11, 0)  # 11 queued + 1 retry waiting
    assert progress_of(redis_conn, "demo") == dict.fromkeys(before, 0)
    assert progress_of(redis_conn, "other") == before
    assert redis_conn.hget(keys.live_settings("demo"), "interval") == b"2.5"  # how the site is crawled stays
    assert not redis_conn.keys(Job.redis_job_namespace_prefix + "*") or all(  # the dropped jobs' hashes went with them
        b"demo" not in (redis_conn.hget(k, "description") or b"")
        for k in redis_conn.keys(Job.redis_job_namespace_prefix + "*")
    )


def test_reset_asks_first_and_keeps_items_and_fetch_records(
    base: list[str], redis_conn: Redis, sqlite_url: str
) -> None:
    fill(redis_conn, "demo")
    store = Store(sqlite_url)
    store.upsert_items("demo", [Item("A", "http://127.0.0.1:9/a", {"sku": "A"})])
    store.record_fetches([FetchRecord("demo", "http://127.0.0.1:9/a", OK, utcnow(), utcnow())])
    store.close()

    declined = invoke(base, "reset", "demo", input="n\n")
    assert declined.exit_code == 1 and declined.stderr.splitlines()[-1] == (
        "Error: demo not reset (give --yes to skip the question)"
    )
    assert stored(redis_conn, "demo")[1] == 11

    result = invoke(base, "reset", "demo", input="y\n")
    assert result.exit_code == 0, result.output
    assert "Forget demo's queued URLs, its 11 seen URLs and its counters?" in result.stderr
    assert "demo: forgot 12 queued and 11 seen URLs and the counters (items and fetch records kept)" in result.stderr
    assert stored(redis_conn, "demo") == ([keys.seen("demo")], 0)  # no key left
    store = Store(sqlite_url)
    assert [row["sku"] for row in store.items("demo")] == ["A"] and len(store.fetch_rows("demo")) == 1
    store.close()

    assert invoke(base, "reset", "demo", "--yes").exit_code == 0
    assert_one_line_error(invoke(base, "reset", "nosuch", "--yes"), "unknown site 'nosuch'")


SUMMARY = re.compile(
    r"^demo: (\d+) fetched, (\d+) parsed, (\d+) items, (\d+) failed, (\d+) refused "
    r"in [\d.]+s \(([\d.]+) pages/s\)$",
    re.MULTILINE,
)


def test_each_run_s_summary_counts_that_run_and_fresh_starts_over(base: list[str], redis_conn: Redis) -> None:
    with ShopSite(products=8, faults=False) as shop:
        args = ["crawl", "demo", shop.url + "/", "-n", "1", "--threads", "1"]
        first = invoke(base, *args)
        assert first.exit_code == 0, first.output
        fetched, parsed, items, failed, refused, _ = SUMMARY.search(first.stdout).groups()
        pages = 1 + 1 + 8  # home, one listing page, 8 products (+ robots.txt, not counted)
        assert (int(fetched), int(parsed), int(items), int(failed), int(refused)) == (pages, pages, 8, 0, 1)

        again = invoke(base, *args)
        assert again.exit_code == 0, again.output
        assert SUMMARY.search(again.stdout).groups()[:5] == ("0", "0", "0", "0", "0")
        assert SUMMARY.search(again.stdout).group(6) == "0.0"
        assert (
            "demo: nothing new to crawl: every URL seeded was seen before (`crawler crawl --fresh` starts over)"
            in again.stderr
        )
        # Nothing fetched twice (robots.txt is the one more; the catalogue PDF is a link not followed).
        assert len(shop.requests) == pages + 1, " ".join(e.path for e in shop.requests)

        fresh = invoke(base, *args, "--fresh")
        assert fresh.exit_code == 0, fresh.output
        assert "demo: forgot 0 queued and 11 seen URLs and the counters" in fresh.stderr  # the pages
        assert SUMMARY.search(fresh.stdout).groups()[:2] == (str(pages), str(pages))
        assert redis_conn.hget(keys.stats("demo"), "fetched") == str(pages).encode()  # counted from zero again


def test_reset_clears_a_site_whose_levels_set_holds_a_priority_written_by_hand(redis_conn: Redis) -> None:
    fill(redis_conn, "demo")
    redis_conn.zadd(keys.levels("demo"), {"not-a-priority": 3})
    reset_site(redis_conn, "demo")  # raised ValueError: the one command meant to clear such a site
    assert progress_of(redis_conn, "demo")["seen"] == 0
    assert not redis_conn.exists(keys.levels("demo"))
