"""Seen URLs that expire (``Spider.revisit_after``): time-bucketed seen tables on the Redis clock."""

from __future__ import annotations

import re
import time

import pytest
from crawling import installed_runtime, run_in_threads
from redis import Redis

from crawler.coord import keys, redisclock
from crawler.coord.frontier import Frontier, seed
from crawler.coord.seen import SEEN_BUCKETS, stored
from crawler.coord.task import fingerprint
from crawler.demo import ShopSite
from crawler.demo.spider import DemoShop
from crawler.settings import Settings
from crawler.spiders.loading import SpiderSet
from crawler.spiders.spider import Request
from crawler.store.database import Store

URL = "http://example.com/a"


def frontier(connection: Redis, revisit_after: float | None, site: str = "shop") -> Frontier:
    return Frontier(connection, site, ["example.com"], 60, 60, revisit_after=revisit_after)


def bucket_keys(connection: Redis, site: str = "shop") -> list[bytes]:
    """The seen tables of the time buckets (not their sub-sets)."""
    table = re.compile(re.escape(keys.seen_window(site, 0)[:-1].encode()) + rb"\d+")
    return sorted(k for k in connection.scan_iter(match=keys.seen_window(site, 0)[:-1] + "*") if table.fullmatch(k))


def held(connection: Redis, table: bytes) -> int:
    """URLs a seen table holds."""
    return int(connection.hget(table, "n") or 0)


def test_a_seen_url_stays_seen_for_revisit_after_then_is_queued_again(redis_conn: Redis) -> None:
    front = frontier(redis_conn, revisit_after=1.0)
    assert front.add([Request(URL)]).enqueued == [URL]
    added = time.monotonic()
    assert front.add([Request(URL), Request(URL + "#x")]).duplicates == 2
    time.sleep(max(0.0, added + 0.9 - time.monotonic()))
    assert front.add([Request(URL)]).duplicates == 1  # still seen just before revisit_after
    time.sleep(max(0.0, added + 1.0 * (1 + 1 / SEEN_BUCKETS) + 0.05 - time.monotonic()))
    assert front.add([Request(URL)]).enqueued == [URL]  # seen no more: queued again
    assert front.add([Request(URL)]).duplicates == 1  # and seen again from now
    assert not redis_conn.exists(keys.seen_table("shop"), keys.seen("shop"))  # nothing in the plain table


def test_buckets_expire_once_no_lookup_can_reach_them(redis_conn: Redis) -> None:
    front = frontier(redis_conn, revisit_after=2.0)
    front.add([Request(f"{URL}/{i}") for i in range(10)])
    (bucket,) = bucket_keys(redis_conn)
    width_ms = 2000 / SEEN_BUCKETS
    assert held(redis_conn, bucket) == 10
    # Looked up until the end of the bucket SEEN_BUCKETS after it, plus a second: the table and its sub-sets.
    (subset,) = redis_conn.keys(bucket + b":*")
    assert redis_conn.scard(subset) == 10
    for key in (bucket, subset):
        assert 2000 + 1000 < redis_conn.pttl(key) <= 2000 + width_ms + 1000
    front.forget(f"{URL}/3")
    assert held(redis_conn, bucket) == 9 and front.add([Request(f"{URL}/3")]).enqueued


@pytest.mark.parametrize("value", [0, -5])
def test_revisit_after_must_be_positive(fake_redis: Redis, value: float) -> None:
    with pytest.raises(ValueError, match="revisit_after"):
        frontier(fake_redis, revisit_after=value)


def test_a_seen_url_costs_no_more_memory_in_buckets_than_in_the_plain_set(redis_conn: Redis) -> None:
    urls = [f"{URL}/{i:08d}" for i in range(20_000)]
    frontier(redis_conn, None, "plain").add([Request(u) for u in urls])
    frontier(redis_conn, 3600, "bucketed").add([Request(u) for u in urls])
    plain = sum(redis_conn.memory_usage(k, samples=0) or 0 for k in stored(redis_conn, "plain")[0])
    buckets = sum(redis_conn.memory_usage(k, samples=0) or 0 for k in stored(redis_conn, "bucketed")[0])
    assert stored(redis_conn, "bucketed")[1] == stored(redis_conn, "plain")[1] == len(urls)
    assert buckets <= plain * 1.02, f"{buckets / len(urls):.1f} B per URL in buckets, {plain / len(urls):.1f} plain"
    zset_key = "zset-for-contrast"  # what a sorted set of fingerprint -> time would cost
    for start in range(0, len(urls), 5000):
        redis_conn.zadd(zset_key, {fingerprint(u): time.time() for u in urls[start : start + 5000]})
    assert redis_conn.memory_usage(zset_key, samples=0) > plain * 1.3


class RevisitedShop(DemoShop):
    """The demo spider, its seen URLs kept 2 s, without robots.txt."""

    obey_robots = False
    revisit_after = 2.0


def test_a_periodic_recrawl_finds_new_and_changed_pages_without_a_reset(redis_conn: Redis, settings: Settings) -> None:
    spiders = SpiderSet({"demo": RevisitedShop}, [])
    with (
        ShopSite(products=5, per_page=10, faults=False) as shop,
        installed_runtime(redis_conn, settings, spider_set=spiders) as rt,
    ):
        seed(rt.frontier("demo"), [shop.url + "/"])
        run_in_threads(rt)
        crawled = time.monotonic()  # every URL of the first crawl was seen by now
        assert seed(rt.frontier("demo"), [shop.url + "/"]).duplicates == 1  # seen: a re-seed does nothing yet
        shop.reprice(2, "1.23")
        shop.products = 6  # a new product appears on the listing
        time.sleep(max(0.0, crawled + RevisitedShop.revisit_after * (1 + 1 / SEEN_BUCKETS) + 0.1 - time.monotonic()))
        assert seed(rt.frontier("demo"), [shop.url + "/"]).enqueued == [shop.url + "/"]
        run_in_threads(rt)
        store = Store(settings.database_url)
        try:
            items = {row["key"]: row["data"] for row in store.item_rows("demo")}
        finally:
            store.close()

    for i in range(1, 6):
        assert len(shop.requests_for(f"/product/{i}")) == 2, f"product {i} was not fetched again"
    assert len(shop.requests_for("/product/6")) == 1
    assert items["SKU-00002"]["price"] == 1.23 and "SKU-00006" in items


@pytest.mark.parametrize("off_ms", [-600_000, -700, 700, 600_000])
def test_buckets_are_named_from_the_redis_clock_even_when_this_process_misjudges_it(
    redis_conn: Redis, off_ms: float
) -> None:
    """The caller names the buckets (every key in KEYS) from its estimate of the Redis clock;
    an estimate off by more than its slack is read again, and the right bucket is used."""
    front = frontier(redis_conn, revisit_after=2.0)
    front.add([Request(f"{URL}/first")])  # the estimate, read once
    offset, generation = redisclock._offsets[redis_conn]
    redisclock._offsets[redis_conn] = (offset + off_ms, generation)  # as if the local clock stepped by off_ms
    assert front.add([Request(f"{URL}/a"), Request(f"{URL}/first")]).enqueued == [f"{URL}/a"]
    seconds, micros = redis_conn.time()
    current = (int(seconds) * 1000 + int(micros) // 1000) // (2000 // SEEN_BUCKETS)
    tables = {key: held(redis_conn, key) for key in bucket_keys(redis_conn)}
    # Every URL in the bucket of the Redis clock's time (or the one before, at a boundary).
    assert set(tables) <= {keys.seen_window("shop", current).encode(), keys.seen_window("shop", current - 1).encode()}
    assert sum(tables.values()) == 2
    error = abs(redisclock.now_ms(redis_conn) - (int(seconds) * 1000 + int(micros) / 1000))
    if abs(off_ms) > 1000:  # beyond the slack: the clock was read again
        assert error < 100
    else:  # within it (at least a bucket each side): used as it was
        assert abs(error - abs(off_ms)) < 100
