"""Scheduled refreshes: pages fetched again on a schedule, past the seen set, history kept."""

from __future__ import annotations

import time
from typing import Any

import pytest
from crawling import installed_runtime, run_in_threads
from redis import Redis

from crawler.coord import keys
from crawler.coord.frontier import DownloadTask, seed
from crawler.coord.scheduler import Scheduler
from crawler.demo import ShopSite
from crawler.demo.spider import DemoShop
from crawler.settings import Settings
from crawler.spiders.loading import SpiderSet
from crawler.spiders.spider import Request
from crawler.store.database import Store
from crawler.work import jobs
from crawler.work.drain import crawl_drained

REFRESH = 1.0


class RefreshedShop(DemoShop):
    """The demo spider, with product pages refreshed every second and no robots.txt."""

    obey_robots = False
    refresh = {"parse_product": REFRESH}


def refreshes(connection: Redis) -> list[tuple[str, int, DownloadTask, float]]:
    """Pending refreshes: (site, priority, task, due in seconds on the Redis clock)."""
    pending = []
    for member, score in connection.zrange(keys.recrawls(), 0, -1, withscores=True):
        site, priority, _nonce, entry = member.decode().split("\t", 3)
        pending.append((site, int(priority), DownloadTask.from_entry(site, entry, int(priority)), score / 1000))
    return pending


def item_rows(database_url: str) -> dict[str, dict[str, Any]]:
    """The demo site's items with their history columns, by key."""
    store = Store(database_url)
    try:
        return {row["key"]: row for row in store.item_rows("demo")}
    finally:
        store.close()


def test_refresh_rules_by_callback_by_default_and_per_request() -> None:
    spider = RefreshedShop()
    assert spider.refresh_for(Request("http://x/p", callback="parse_product")) == REFRESH
    assert spider.refresh_for(Request("http://x/", callback="parse")) is None
    assert spider.refresh_for(Request("http://x/", refresh=30)) == 30
    every_page = type("Daily", (DemoShop,), {"refresh": 86400})()
    assert every_page.refresh_for(Request("http://x/")) == 86400
    assert DemoShop().refresh_for(Request("http://x/")) is None


def test_bad_refresh_values_are_refused(redis_conn: Redis, settings: Settings) -> None:
    with installed_runtime(redis_conn, settings) as rt:
        result = rt.frontier("demo").add(
            [Request("http://127.0.0.1/a", refresh=-1), Request("http://127.0.0.1/b", refresh="daily")]
        )  # type: ignore[arg-type]
    assert result.enqueued == [] and result.refused is not None and len(result.refused) == 2
    assert "positive number of seconds" in result.refused[0][1]


def test_refreshed_pages_are_fetched_again_and_their_changes_recorded(redis_conn: Redis, settings: Settings) -> None:
    spiders = SpiderSet({"demo": RefreshedShop}, [])
    with (
        ShopSite(products=5, per_page=5, faults=False) as shop,
        installed_runtime(redis_conn, settings, spider_set=spiders) as rt,
    ):
        seed(rt.frontier("demo"), [shop.url + "/"])
        run_in_threads(rt)
        # A burst crawl drains although refreshes are pending: they are not left-over work.
        assert crawl_drained(redis_conn, ["demo"])
        pending = refreshes(redis_conn)
        assert sorted(t.url for _, _, t, _ in pending) == [f"{shop.url}/product/{i}" for i in range(1, 6)]
        assert {p for _, p, _, _ in pending} == {RefreshedShop.refresh_priority}
        assert redis_conn.hget(keys.stats("demo"), "recrawls") == b"5"
        first = item_rows(settings.database_url)

        shop.reprice(2, "1.23")
        scheduler = Scheduler(redis_conn)
        deadline, promoted = time.monotonic() + 10, 0
        while promoted < 5:  # what every worker does five times a second
            assert time.monotonic() < deadline, "the refreshes never came due"
            promoted += scheduler.promote_due()
            time.sleep(0.05)
        run_in_threads(rt)
        second = item_rows(settings.database_url)

    for i in range(1, 6):
        fetches = [e.time for e in shop.requests_for(f"/product/{i}")]
        assert len(fetches) == 2, f"product {i} fetched {len(fetches)} times"
        assert fetches[1] - fetches[0] >= REFRESH
    # Only the refreshed pages came back; links found again on them stay deduplicated.
    assert len(shop.requests_for("/")) == 1
    assert len([e for e in shop.requests if e.path.startswith("/products")]) == 1

    assert len(second) == 5
    changed, same = second["SKU-00002"], second["SKU-00001"]
    assert changed["data"]["price"] == 1.23 and first["SKU-00002"]["data"]["price"] != 1.23
    assert changed["changed"] > changed["first_seen"] and changed["last_seen"] >= changed["changed"]
    assert same["changed"] == same["first_seen"] and same["last_seen"] > same["first_seen"]
    # Each page has exactly one next refresh pending, not one per fetch.
    assert len(refreshes(redis_conn)) == 5 and redis_conn.hget(keys.stats("demo"), "recrawls") == b"5"


def test_scheduling_a_pending_refresh_again_only_moves_it(redis_conn: Redis) -> None:
    scheduler = Scheduler(redis_conn)
    entry = DownloadTask("s", "http://example.com/p", refresh=60).to_entry()
    scheduler.schedule_refresh("s", entry, 60, -10)
    scheduler.schedule_refresh("s", entry, 5, -10)
    ((_, _, task, due),) = refreshes(redis_conn)
    assert task.refresh == 60
    now = float(redis_conn.time()[0])
    assert due < now + 10
    assert redis_conn.hget(keys.stats("s"), "recrawls") == b"1"


@pytest.mark.parametrize(("path", "refreshed"), [("/product/1", True), ("/missing", False)])
def test_a_page_gone_for_good_is_not_refreshed(
    redis_conn: Redis, settings: Settings, path: str, refreshed: bool
) -> None:
    spiders = SpiderSet({"demo": RefreshedShop}, [])
    with ShopSite(products=5) as shop, installed_runtime(redis_conn, settings, spider_set=spiders) as rt:
        url = shop.url + path
        payload: dict[str, Any] = DownloadTask("demo", url, "parse_product", refresh=REFRESH).to_json()
        jobs.download(payload, rt=rt)
    assert [t.url for _, _, t, _ in refreshes(redis_conn)] == ([url] if refreshed else [])
