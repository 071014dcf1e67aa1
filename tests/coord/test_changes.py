"""The announced changes of live settings and spider arguments (``coord.changes``): a process re-reads
a site's hashes only when a write was announced, or past ``RECHECK`` for one written by hand."""

from __future__ import annotations

import time

import pytest
from redis import Redis

from crawler.coord import keys
from crawler.coord.changes import ChangeWatch, announce
from crawler.coord.policy import LIVE_REFRESH, set_live
from crawler.coord.spiderargs import store_args
from crawler.demo.spider import DemoShop
from crawler.work.runtime import Runtime

SITE = "demo"


def hgetall_calls(connection: Redis) -> int:
    return int(connection.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))


def past_refresh() -> None:
    time.sleep(LIVE_REFRESH + 0.05)


def test_nothing_announced_nothing_read_again(runtime: Runtime, redis_conn: Redis) -> None:
    assert runtime.policy(SITE).interval == DemoShop.interval and runtime.spider(SITE) is not None  # the first read
    first = hgetall_calls(redis_conn)
    past_refresh()
    assert runtime.policy(SITE).interval == DemoShop.interval and runtime.spider(SITE) is not None
    assert hgetall_calls(redis_conn) == first, "read again though nothing was announced"


def test_an_announced_change_is_read_within_the_refresh(runtime: Runtime, redis_conn: Redis) -> None:
    assert runtime.policy(SITE).interval == DemoShop.interval
    spider = runtime.spider(SITE)
    set_live(redis_conn, SITE, interval=2.5)  # as ``crawler set`` writes it: announced
    store_args(redis_conn, SITE, {"note": "x"})
    past_refresh()
    assert runtime.policy(SITE).interval == 2.5
    assert runtime.spider(SITE) is not spider and runtime.spider(SITE).note == "x"  # type: ignore[attr-defined]


def test_a_change_written_by_hand_is_read_at_the_recheck(runtime: Runtime, redis_conn: Redis) -> None:
    runtime.sites.changes.recheck = 2 * LIVE_REFRESH + 0.5
    assert runtime.policy(SITE).interval == DemoShop.interval
    redis_conn.hset(keys.live_settings(SITE), "interval", "2.5")  # announced by no one
    past_refresh()
    assert runtime.policy(SITE).interval == DemoShop.interval  # the change is not known yet
    deadline = time.monotonic() + runtime.sites.changes.recheck + LIVE_REFRESH + 1
    while runtime.policy(SITE).interval != 2.5:
        assert time.monotonic() < deadline, "a change written by hand was never read"
        time.sleep(0.1)


@pytest.mark.parametrize("junk", ["hash", "string"])
def test_junk_in_the_token_key_makes_every_due_read_happen(runtime: Runtime, redis_conn: Redis, junk: str) -> None:
    if junk == "hash":
        redis_conn.hset(keys.settings_changes(), "a", "b")  # GET answers WRONGTYPE
    else:
        redis_conn.set(keys.settings_changes(), b"\xff" * 100)
    assert runtime.policy(SITE).interval == DemoShop.interval
    redis_conn.hset(keys.live_settings(SITE), "interval", "2.5")  # announced by no one, and cannot be
    past_refresh()
    if junk == "hash":  # no token can be read: the reads are made as often as before there was one
        assert runtime.policy(SITE).interval == 2.5
    else:  # a token like any other: written by hand, so read at the recheck
        assert runtime.policy(SITE).interval == DemoShop.interval


def test_the_watch_reads_the_token_at_most_once_per_period(fake_redis: Redis) -> None:
    watch = ChangeWatch(fake_redis)
    assert watch.token(max_age=60.0)[0] is None  # none written yet
    announce(fake_redis)
    assert watch.token(max_age=60.0)[0] is None  # read less than max_age ago: not read again
    seen, read_at = watch.token(max_age=0.0)
    assert seen is not None and read_at <= time.monotonic()
    first_read = time.monotonic()
    confirmed = watch.confirms(seen, first_read, max_age=0.0)
    assert confirmed is not None and confirmed >= first_read  # as of a token read since
    announce(fake_redis)
    assert watch.confirms(seen, first_read, max_age=10.0) == confirmed  # the token held, read before the change
    assert watch.confirms(seen, first_read, max_age=0.0) is None  # a fresh one does not
    assert watch.confirms(seen, time.monotonic() - watch.recheck, max_age=10.0) is None  # too old, whatever the token


def test_a_read_asked_fresh_is_made_whatever_the_token_says(runtime: Runtime, redis_conn: Redis) -> None:
    assert runtime.policy(SITE).interval == DemoShop.interval
    redis_conn.hset(keys.live_settings(SITE), "paused", "1")  # announced by no one
    assert runtime.policies.get(SITE, fresh=True).paused  # as ``crawler pause``'s own publish asks
