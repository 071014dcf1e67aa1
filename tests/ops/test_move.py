"""``move_site``: a site's keys, RQ jobs and shared-set members carried from one Redis to another, or none."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from crawler.coord import keys
from crawler.coord.connection import EmbeddedRedis, connect
from crawler.coord.frontier import seed
from crawler.coord.policy import read_live, set_live
from crawler.errors import ConfigError
from crawler.ops.move import move_site
from crawler.work.runtime import Runtime

pytestmark = pytest.mark.integration


@pytest.fixture
def other(tmp_path: Path) -> Iterator[Redis]:
    """A second private Redis: the shard a site moves to."""
    server = EmbeddedRedis(tmp_path / "other")
    server.start()
    client = connect(server.url)
    try:
        yield client
    finally:
        client.close()
        server.stop()


def site_keys(client: Redis, site: str) -> dict[str, bytes]:
    return {name.decode(): client.dump(name) for name in client.scan_iter(match=f"*{{{site}}}*")}


def test_a_site_moves_whole_with_its_jobs_retries_and_turn_and_nothing_of_it_is_left_behind(
    runtime: Runtime, redis_conn: Redis, other: Redis
) -> None:
    frontier = runtime.frontier("demo")
    seed(frontier, [f"http://127.0.0.1:9/{n}" for n in range(30)])
    frontier.refill(4)
    redis_conn.zadd(keys.delayed(), {"demo\tretry-1": 1e15, "other\tretry-2": 1e15})
    redis_conn.set(keys.gate("demo"), "token", px=60_000)
    before = site_keys(redis_conn, "demo")
    queued_jobs = redis_conn.lrange(f"rq:queue:{keys.download_queue('demo')}", 0, -1)
    assert before and queued_jobs
    published: list[Redis] = []

    moved = move_site(redis_conn, other, "demo", published.append, quiet_wait=5, settle=0)

    live = keys.live_settings("demo")  # the move's pause writes it
    assert site_keys(other, "demo").keys() == before.keys() | {live}
    assert site_keys(redis_conn, "demo") == {}
    assert moved.keys == len(before) + 1 and moved.jobs == len(queued_jobs)
    for job in queued_jobs:
        assert other.exists(f"rq:job:{job.decode()}") and not redis_conn.exists(f"rq:job:{job.decode()}")
    assert 55_000 < other.pttl(keys.gate("demo")) <= 60_000  # the gate keeps its time left
    assert other.sismember(keys.sites(), "demo") and not redis_conn.sismember(keys.sites(), "demo")
    assert other.zscore(keys.ready(), "demo") is not None and redis_conn.zscore(keys.ready(), "demo") is None
    assert other.zrange(keys.delayed(), 0, -1) == [b"demo\tretry-1"]
    assert redis_conn.zrange(keys.delayed(), 0, -1) == [b"other\tretry-2"]  # another site's stays
    assert read_live(other, "demo").get("paused") == "0"  # resumed there
    assert published == [redis_conn, other]


def test_a_site_paused_before_its_move_stays_paused_after_it(runtime: Runtime, redis_conn: Redis, other: Redis) -> None:
    seed(runtime.frontier("demo"), ["http://127.0.0.1:9/a"])
    set_live(redis_conn, "demo", paused=True)
    move_site(redis_conn, other, "demo", lambda connection: None, quiet_wait=5, settle=0)
    assert read_live(other, "demo").get("paused") == "1"


def test_a_copy_the_other_shard_refuses_leaves_the_site_where_it_was_running_and_nothing_there(
    runtime: Runtime, redis_conn: Redis, other: Redis
) -> None:
    seed(runtime.frontier("demo"), [f"http://127.0.0.1:9/{n}" for n in range(10)])
    before = site_keys(redis_conn, "demo")
    other.config_set("maxmemory", 1)  # every write that may grow memory is refused (OOM)
    try:
        with pytest.raises(ConfigError, match="demo: the other shard refused the (move|copy) .*: not moved"):
            move_site(redis_conn, other, "demo", lambda connection: None, quiet_wait=5, settle=0)
    finally:
        other.config_set("maxmemory", 0)
    assert site_keys(other, "demo") == {} and not other.sismember(keys.sites(), "demo")
    assert not redis_conn.sismember(keys.moving(), "demo")  # no burst held back by a move that is not
    after = site_keys(redis_conn, "demo")
    assert after.keys() - {keys.live_settings("demo")} == before.keys()  # refused before or after its pause
    assert read_live(redis_conn, "demo").get("paused", "0") == "0"  # running where it was


def test_a_site_still_busy_is_not_moved_and_is_resumed(runtime: Runtime, redis_conn: Redis, other: Redis) -> None:
    seed(runtime.frontier("demo"), ["http://127.0.0.1:9/a"])
    redis_conn.zadd(f"rq:wip:{keys.download_queue('demo')}", {"a-job": 1e12})  # a download in flight
    with pytest.raises(ConfigError, match="demo: still busy after 0.3s"):
        move_site(redis_conn, other, "demo", lambda connection: None, quiet_wait=0.3, settle=0)
    assert read_live(redis_conn, "demo").get("paused") == "0"
    assert site_keys(other, "demo") == {}


def test_a_site_in_transit_is_work_left_on_both_shards_for_burst_workers(
    runtime: Runtime, redis_conn: Redis, other: Redis
) -> None:
    from crawler.work.drain import pending_work

    seed(runtime.frontier("demo"), ["http://127.0.0.1:9/a"])
    seen: list[tuple[int, int]] = []

    def publish(connection: Redis) -> None:  # called as the site pauses here, then as it resumes there
        seen.append((pending_work(redis_conn, ["demo"], looked=True), pending_work(other, ["demo"], looked=True)))

    move_site(redis_conn, other, "demo", publish, quiet_wait=5, settle=0)
    assert all(here > 0 and there > 0 for here, there in seen), seen  # the note counts on the empty side too
    assert not redis_conn.exists(keys.moving()) and not other.exists(keys.moving())
    assert pending_work(redis_conn, ["demo"], looked=True) == 0 and pending_work(other, ["demo"], looked=True) > 0


def test_a_move_waits_for_the_pages_before_the_sites_last_download_then_reads_only_what_came_after(
    runtime: Runtime, redis_conn: Redis, other: Redis
) -> None:
    import threading

    from crawler.coord import pages

    seed(runtime.frontier("demo"), ["http://127.0.0.1:9/a"])
    pages.add(redis_conn, {"site": "demo", "url": "http://127.0.0.1:9/x"}, b"body")  # a page of it to parse
    with pytest.raises(ConfigError, match="demo: still busy"):
        move_site(redis_conn, other, "demo", lambda connection: None, quiet_wait=0.3, settle=0)
    redis_conn.delete(keys.pages())
    pages.add(redis_conn, {"site": "elsewhere", "url": "http://127.0.0.1:9/y"}, b"body")  # another site's, before
    ((entry_id, _),) = redis_conn.xrange(keys.pages())

    def parsed_later() -> None:
        time.sleep(0.5)
        pages.add(redis_conn, {"site": "third", "url": "http://127.0.0.1:9/z"}, b"body")  # after: not waited for
        redis_conn.xdel(keys.pages(), entry_id)

    parser = threading.Thread(target=parsed_later)
    started = time.monotonic()
    parser.start()
    move_site(redis_conn, other, "demo", lambda connection: None, quiet_wait=5, settle=0)
    parser.join()
    assert time.monotonic() - started >= 0.5  # it waited for the page before, parsed at 0.5 s
    assert other.sismember(keys.sites(), "demo") and redis_conn.xlen(keys.pages()) == 1


def test_a_restore_the_other_shard_refuses_midway_is_undone_there_and_the_site_stays_where_it_was(
    runtime: Runtime, redis_conn: Redis, other: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.client import Pipeline

    seed(runtime.frontier("demo"), [f"http://127.0.0.1:9/{n}" for n in range(10)])
    before = site_keys(redis_conn, "demo")
    restore = Pipeline.restore

    def corrupted(self: Pipeline, name: str, ttl: int, value: bytes, *args: object, **kwargs: object) -> object:
        return restore(self, name, ttl, b"not a dump", *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Pipeline, "restore", corrupted)  # RESTORE fails at EXEC; the rest of the transaction runs
    with pytest.raises(ConfigError, match="demo: the other shard refused the copy .*: not moved"):
        move_site(redis_conn, other, "demo", lambda connection: None, quiet_wait=5, settle=0)
    assert not other.sismember(keys.sites(), "demo") and other.zscore(keys.ready(), "demo") is None  # undone
    assert site_keys(other, "demo") == {}
    assert site_keys(redis_conn, "demo").keys() - {keys.live_settings("demo")} == before.keys()
    assert read_live(redis_conn, "demo").get("paused") == "0" and not other.smembers(keys.moving())


def test_a_sites_counts_move_and_its_last_resets_epoch_stays_behind_so_no_count_is_dropped_there(
    runtime: Runtime, redis_conn: Redis, other: Redis
) -> None:
    """The epoch of a site's last reset counts on its shard's reset epoch: carried to a shard of a lower one,
    it would drop every count made there once another site of that shard was reset."""
    from crawler.coord import counters
    from crawler.coord.counters import Counters
    from crawler.ops.reset import reset_site

    for n in range(5):  # this shard has seen more resets than the other
        reset_site(redis_conn, f"gone{n}")
    seed(runtime.frontier("demo"), ["http://127.0.0.1:9/a"])
    reset_site(redis_conn, "demo")
    here = Counters(redis_conn, flush_every=3600)
    here.add("demo", {"fetched": 4})
    here.close()

    move_site(redis_conn, other, "demo", lambda _: None, quiet_wait=5, settle=0)

    assert other.hgetall(keys.stats("demo")) == {b"fetched": b"4"} and not other.exists(keys.reset_at("demo"))
    there = Counters(other, flush_every=3600)
    there.add("demo", {"fetched": 1})
    with other.pipeline(transaction=True) as pipe:
        counters.forget(pipe, "another")  # the epoch there moves: the write reads the site's own
        pipe.execute()
    there.close()
    assert other.hgetall(keys.stats("demo")) == {b"fetched": b"5"}
