"""Counters: counted in memory by many threads, written once a second and on the way out, exact, reset-proof.

Against the session's real Redis: the increments' sums, the writing thread's timing,
the reset count checked in the same Lua call that adds, and crawls by in-process workers.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally

import pytest
import redis
from crawling import join_all, start_in_threads
from redis import Redis

from crawler.coord import counters, keys
from crawler.coord.counters import Counters
from crawler.coord.frontier import seed
from crawler.demo import ShopSite
from crawler.ops.reset import reset_site
from crawler.ops.status import site_status
from crawler.store.database import OK
from crawler.work.download_worker import DownloadWorker
from crawler.work.drain import crawl_drained
from crawler.work.parse_worker import ParseWorker
from crawler.work.runtime import Runtime

SITE = "shop"
#: A write interval no test waits for: what is written comes from an explicit write.
NEVER = 3600.0


def stats(connection: Redis, site: str = SITE) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in connection.hgetall(keys.stats(site)).items()}


def metrics(connection: Redis, site: str = SITE) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in connection.hgetall(keys.metrics(site)).items()}


def test_counts_from_many_threads_are_written_once_each_whatever_the_writes_in_between(redis_conn: Redis) -> None:
    tally = Counters(redis_conn, flush_every=0.005)  # its thread writes every few ms while they count
    threads, rounds = 8, 2000
    start = threading.Barrier(threads + 1)

    def count(n: int) -> None:
        start.wait()
        for i in range(rounds):
            tally.add(SITE, {"fetched": 1, "items": n}, {"req:download:ok:200": 1, "dur:download:sum": 0.25})
            if i % 500 == 0:
                tally.flush()  # writes from the workers' threads too, racing the writing thread

    workers = [threading.Thread(target=count, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    for worker in workers:
        worker.join()
    tally.close()

    assert stats(redis_conn) == {"fetched": threads * rounds, "items": rounds * sum(range(threads))}
    written = metrics(redis_conn)
    assert written["req:download:ok:200"] == threads * rounds
    assert written["dur:download:sum"] == pytest.approx(0.25 * threads * rounds)
    assert tally.pending() == 0


def test_a_write_is_one_script_call_whatever_its_sites_and_fields(redis_conn: Redis) -> None:
    tally = Counters(redis_conn, flush_every=NEVER)
    tally.add(SITE, {"fetched": 1}, {"req:download:ok:200": 1, "bytes:download": 300, "dur:download:0.5": 1})
    tally.add(SITE, {"fetched": 1, "items": 0}, {"dur:download:sum": 0.25, "gate:sum": 0.0})
    tally.add("other", None, {"req:parse:ok:200": 2})  # metrics alone: written too
    before = redis_conn.info("commandstats")
    assert tally.flush()
    after = redis_conn.info("commandstats")
    sent = {name: after[name]["calls"] - before.get(name, {}).get("calls", 0) for name in after}
    assert sent.get("cmdstat_evalsha", 0) + sent.get("cmdstat_eval", 0) == 1  # for both sites
    assert sent.get("cmdstat_multi", 0) == 0  # one call is atomic by itself
    assert stats(redis_conn) == {"fetched": 2}
    assert metrics(redis_conn) == {
        "req:download:ok:200": 1,
        "bytes:download": 300,
        "dur:download:0.5": 1,
        "dur:download:sum": 0.25,
        "gate:sum": 0.0,
    }
    assert metrics(redis_conn, "other") == {"req:parse:ok:200": 2}


def test_a_write_of_many_sites_is_one_transaction_of_a_call_a_hundred_sites(redis_conn: Redis) -> None:
    """More sites than SITES_A_CALL: a call each SITES_A_CALL sites, in one transaction (a write that fails
    is kept whole for the next, never half written); a site reset since its counts keeps its metrics only."""
    sites = [f"many{i}" for i in range(counters.SITES_A_CALL * 2 + 50)]
    tally = Counters(redis_conn, flush_every=NEVER)
    for site in sites:
        tally.add(site, {"fetched": 1}, {"req:download:ok:200": 1, "dur:download:sum": 0.5})
    reset_site(redis_conn, sites[150])  # after its counts were made: they would undo the reset
    before = redis_conn.info("commandstats")
    assert tally.flush()
    after = redis_conn.info("commandstats")
    sent = {name: after[name]["calls"] - before.get(name, {}).get("calls", 0) for name in after}
    assert sent.get("cmdstat_evalsha", 0) + sent.get("cmdstat_eval", 0) == 3
    assert sent.get("cmdstat_multi") == 1 and sent.get("cmdstat_exec") == 1
    expected = [{} if site == sites[150] else {"fetched": 1} for site in sites]
    assert [stats(redis_conn, site) for site in sites] == expected
    assert all(metrics(redis_conn, site) == {"req:download:ok:200": 1, "dur:download:sum": 0.5} for site in sites)


def test_counts_wait_in_memory_then_the_writing_thread_writes_them_within_the_interval(redis_conn: Redis) -> None:
    tally = Counters(redis_conn, flush_every=0.3)
    try:
        counted = time.monotonic()
        tally.add(SITE, {"fetched": 2})
        assert stats(redis_conn) == {}  # not one command per count
        while not stats(redis_conn):
            assert time.monotonic() - counted < 2.0, "the counts were never written"
            time.sleep(0.01)
        assert time.monotonic() - counted >= 0.3 and stats(redis_conn) == {"fetched": 2}
    finally:
        tally.close()


def test_the_writing_thread_writes_metrics_a_few_periods_after_the_stats_counted_with_them(redis_conn: Redis) -> None:
    """Most of a slow site's fields are metrics, for a scrape: they wait METRICS_PERIODS periods, the
    stats one; a flush (a worker at rest, or closing) writes both at once."""
    tally = Counters(redis_conn, flush_every=0.4)
    try:
        counted = time.monotonic()
        tally.add(SITE, {"fetched": 1}, {"bytes:download": 100})
        while not stats(redis_conn):
            assert time.monotonic() - counted < 3.0, "the stats were never written"
            time.sleep(0.01)
        assert not redis_conn.exists(keys.metrics(SITE)), "the metrics went with the stats"
        while not redis_conn.exists(keys.metrics(SITE)):
            assert time.monotonic() - counted < 6.0, "the metrics were never written"
            time.sleep(0.01)
        assert time.monotonic() - counted >= counters.METRICS_PERIODS * 0.4
        tally.add(SITE, {"fetched": 1}, {"bytes:download": 50})
        assert tally.flush()
        assert stats(redis_conn) == {"fetched": 2} and redis_conn.hget(keys.metrics(SITE), "bytes:download") == b"150"
    finally:
        tally.close()


def test_a_worker_with_no_work_writes_the_counts_once_its_process_has_stopped_counting(redis_conn: Redis) -> None:
    tally = Counters(redis_conn, flush_every=NEVER)
    tally.add(SITE, {"fetched": 1})
    tally.flush_if_quiet(quiet=0.2)  # another thread may still be counting: left to the timer
    assert stats(redis_conn) == {}
    time.sleep(0.25)
    tally.flush_if_quiet(quiet=0.2)
    assert stats(redis_conn) == {"fetched": 1}
    tally.close()


def test_close_writes_what_is_left_and_stops_the_writing_thread(redis_conn: Redis) -> None:
    tally = Counters(redis_conn, flush_every=NEVER)
    tally.add(SITE, {"parsed": 3}, {"req:parse:ok:200": 3})
    assert [t for t in threading.enumerate() if t.name == "counters"]
    tally.close()
    assert stats(redis_conn) == {"parsed": 3} and metrics(redis_conn) == {"req:parse:ok:200": 3}
    assert tally._thread is not None and not tally._thread.is_alive()


def test_a_write_that_fails_keeps_the_counts_for_the_next_without_counting_twice(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tally = Counters(redis_conn, flush_every=NEVER)
    tally.add(SITE, {"fetched": 1}, {"bytes:download": 100, "gate:sum": 0.5})
    write = tally._write

    def down(*args: object) -> dict[str, int]:
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(tally, "_write", down)
    assert tally.flush() is False and tally.flush() is False
    assert "counters not written (Redis: Connection refused): kept for the next try" in caplog.text
    assert caplog.text.count("counters not written") == 1  # once per outage
    tally.add(SITE, {"fetched": 1}, {"bytes:download": 50, "gate:sum": 0.25})
    monkeypatch.setattr(tally, "_write", write)
    tally.close()
    assert stats(redis_conn) == {"fetched": 2}
    assert metrics(redis_conn) == {"bytes:download": 150, "gate:sum": 0.75}
    assert "counters written again" in caplog.text


def test_counts_made_before_a_reset_are_dropped_and_those_after_the_next_write_are_kept(redis_conn: Redis) -> None:
    worker = Counters(redis_conn, flush_every=NEVER)  # one worker process's counters
    worker.add(SITE, {"fetched": 100}, {"req:download:ok:200": 100})
    worker.flush()
    worker.add(SITE, {"fetched": 50}, {"req:download:ok:200": 50})  # not yet written when...

    reset_site(redis_conn, SITE)  # ...the site is reset
    assert stats(redis_conn) == {}

    worker.add(SITE, {"fetched": 30}, {"req:download:ok:200": 30})  # after the reset, in the same batch
    worker.flush()
    assert stats(redis_conn) == {}  # the batch that straddles the reset is dropped whole: it would undo it
    worker.add(SITE, {"fetched": 20}, {"req:download:ok:200": 20})
    worker.close()
    assert stats(redis_conn) == {"fetched": 20}
    assert metrics(redis_conn) == {"req:download:ok:200": 200}  # Prometheus counters are never reset

    started_after = Counters(redis_conn, flush_every=NEVER)  # a process that first counts after the reset
    started_after.add(SITE, {"fetched": 7})
    started_after.close()
    assert stats(redis_conn) == {"fetched": 27}


def test_a_reset_drops_a_site_s_counts_only_and_keeps_the_immediate_ones_exact(redis_conn: Redis) -> None:
    tally = Counters(redis_conn, flush_every=NEVER)
    tally.add(SITE, {"fetched": 5})
    tally.add("other", {"fetched": 5})
    reset_site(redis_conn, SITE)
    redis_conn.hincrby(keys.stats(SITE), "delayed", 1)  # a retry scheduled after the reset (the scheduler's script)
    tally.close()
    assert stats(redis_conn) == {"delayed": 1}
    assert stats(redis_conn, "other") == {"fetched": 5}


def test_counters_logic_reads_cannot_be_deferred(fake_redis: Redis) -> None:
    with pytest.raises(ValueError, match="delayed"):
        Counters(fake_redis).add(SITE, {"delayed": 1})


def test_uncount_takes_away_at_once_and_never_below_zero(fake_redis: Redis) -> None:
    fake_redis.hset(keys.stats(SITE), "failed", 3)
    counters.uncount(fake_redis, SITE, "failed", 2)
    assert stats(fake_redis) == {"failed": 1}
    counters.uncount(fake_redis, SITE, "failed", 5)  # failures recorded before a reset
    assert stats(fake_redis) == {"failed": 0}


def test_a_burst_crawl_shows_exact_totals_when_its_workers_are_done(
    redis_conn: Redis, runtime: Runtime, shop: ShopSite
) -> None:
    runtime.counters.flush_every = NEVER  # only the workers' own writes (idle, stop) can show the totals
    seed(runtime.frontier("demo"), [shop.url + "/"])
    threads, stop = start_in_threads(runtime)
    join_all(threads, stop)

    records = runtime.store.fetch_rows("demo")
    downloads = Tally(r["outcome"] for r in records if r["kind"] == "download" and not r["url"].endswith("robots.txt"))
    parses = Tally(r["outcome"] for r in records if r["kind"] == "parse")
    (status,) = site_status(redis_conn, ["demo"])
    assert runtime.counters.pending() == 0
    assert status.fetched == downloads[OK] + downloads["redirect"] + downloads["unchanged"]
    assert (status.failed, status.parsed) == (downloads["failed"] + parses["failed"], parses[OK])
    assert status.items == len(list(runtime.store.items("demo"))) == len(shop.expected_items())
    requests = {name: int(n) for name, n in metrics(redis_conn, "demo").items() if name.startswith("req:")}
    assert sum(requests.values()) == len(records)


def test_workers_at_rest_have_written_every_count_without_stopping(redis_conn: Redis, runtime: Runtime) -> None:
    runtime.counters.flush_every = NEVER  # only the workers' writes when idle can show the totals
    stop = threading.Event()
    workers = [
        DownloadWorker(redis_conn, ("demo",), stop_event=stop, rt=runtime),
        ParseWorker(redis_conn, ("demo",), stop, rt=runtime),
    ]
    threads = [threading.Thread(target=w.work, daemon=True) for w in workers]  # not burst: they stay
    with ShopSite(products=10, faults=False) as shop:
        seed(runtime.frontier("demo"), [shop.url + "/"])
        for thread in threads:
            thread.start()
        try:
            deadline = time.monotonic() + 60
            while not crawl_drained(redis_conn, ["demo"]):
                assert time.monotonic() < deadline, "the crawl did not drain"
                time.sleep(0.1)
            parsed = sum(1 for r in runtime.store.fetch_rows("demo") if r["kind"] == "parse" and r["outcome"] == OK)
            while stats(redis_conn, "demo").get("parsed") != parsed:
                assert time.monotonic() < deadline, f"counts not written at rest: {stats(redis_conn, 'demo')}"
                time.sleep(0.05)
            assert stats(redis_conn, "demo")["items"] == 10 and all(t.is_alive() for t in threads)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)


def test_counts_of_many_sites_are_written_less_often_so_a_page_costs_fewer_commands(redis_conn: Redis) -> None:
    """200 sites at a page a second each: one write a second would carry one page's counts a site,
    a field at a time; the period grows with the sites waiting (five times at most)."""
    few, many = Counters(redis_conn, flush_every=0.2), Counters(redis_conn, flush_every=0.2)
    try:
        started = time.monotonic()  # the period runs from the first count of each
        for i in range(10):
            few.add(f"few{i}", {"fetched": 1})
        for i in range(1000):
            many.add(f"many{i}", {"fetched": 1})
        while few.pending() and time.monotonic() - started < 5:
            time.sleep(0.01)
        assert few.pending() == 0 and time.monotonic() - started < 0.2 * 2 + 1.0
        assert many.pending() == 1000 or time.monotonic() - started >= 0.2 * counters.MOST_PERIODS, (
            "counts of 1,000 sites written after one period"
        )
        while many.pending() and time.monotonic() - started < 5:
            time.sleep(0.01)
        assert many.pending() == 0 and time.monotonic() - started >= 0.2 * counters.MOST_PERIODS - 0.1
    finally:
        few.close()
        many.close()
    assert redis_conn.hget(keys.stats("many999"), "fetched") == b"1"


def test_counters_of_one_process_s_shards_are_written_at_the_pace_of_all_their_sites(redis_conn: Redis) -> None:
    """A process serving three shards has one ``Counters`` a shard: with a ``FlushPace`` shared, a
    shard whose own sites are few still waits as long as the process's sites together make it (what
    one Redis's counters would wait), so its writes a page are not those of a small crawl."""
    pace = counters.FlushPace()
    alone = Counters(redis_conn, flush_every=0.2)
    shared = [Counters(redis_conn, flush_every=0.2, pace=pace) for _ in range(3)]
    try:
        started = time.monotonic()
        for n, each in enumerate([alone, *shared]):
            for i in range(100):  # 100 sites each: alone, one period; together, 300 sites, longer
                each.add(f"s{n}-{i}", {"fetched": 1})
        assert pace.sites_waiting() == 300
        while alone.pending() and time.monotonic() - started < 5:
            time.sleep(0.01)
        alone_took = time.monotonic() - started
        while any(each.pending() for each in shared) and time.monotonic() - started < 5:
            time.sleep(0.01)
        shared_took = time.monotonic() - started
        assert alone_took < 0.2 * 100 / counters.SITES_PER_PERIOD + 0.3
        assert shared_took >= 0.2 * counters.MOST_PERIODS - 0.1, "each shard waited for its own 100 sites only"
        assert pace.sites_waiting() == 0
    finally:
        for each in [alone, *shared]:
            each.close()
    assert redis_conn.hget(keys.stats("s3-99"), "fetched") == b"1"


def test_a_shard_s_counters_are_quiet_only_once_the_whole_process_has_stopped_counting(redis_conn: Redis) -> None:
    """A worker of one shard with nothing to do writes its counts at once if its process is at rest; while
    the process counts on another shard it is not, so those writes wait for the period."""
    pace = counters.FlushPace()
    idle, busy = (Counters(redis_conn, flush_every=NEVER, pace=pace) for _ in range(2))
    try:
        idle.add("quiet-shard", {"fetched": 1})
        busy.add("busy-shard", {"fetched": 1})
        time.sleep(counters.QUIET)
        busy.add("busy-shard", {"fetched": 1})  # the process still counts, on the other shard
        idle.flush_if_quiet()
        assert idle.pending() == 1, "written while the process was counting"
        time.sleep(counters.QUIET)
        idle.flush_if_quiet()
        assert idle.pending() == 0 and stats(redis_conn, "quiet-shard") == {"fetched": 1}
    finally:
        idle.close()
        busy.close()


def test_a_write_reads_the_reset_epoch_once_and_a_sites_own_reset_only_once_some_site_was_reset(
    redis_conn: Redis,
) -> None:
    """One read a write stands for every site's reset (``crawler:reset-epoch``); another site's reset moves
    it, and that write reads each site's own to tell: their counts are kept, the reset site's dropped."""
    sites = [f"s{i}" for i in range(50)]

    def gets() -> int:
        return int(redis_conn.info("commandstats").get("cmdstat_get", {}).get("calls", 0))

    worker = Counters(redis_conn, flush_every=NEVER)
    before = gets()
    for site in sites:
        worker.add(site, {"fetched": 1})
    worker.flush()
    assert gets() - before == 2, "the epoch read before the first count and in the write, no site's own"
    for site in sites:
        worker.add(site, {"fetched": 1})
    reset_site(redis_conn, "s7")
    before = gets()
    worker.flush()
    assert gets() - before == 1 + len(sites), "after a reset, the write reads each site's own"
    assert stats(redis_conn, "s3") == {"fetched": 2} and stats(redis_conn, "s7") == {}
    for site in sites:  # counted at the epoch the last write said
        worker.add(site, {"fetched": 1})
    before = gets()
    worker.close()
    assert gets() - before == 1
    assert stats(redis_conn, "s3") == {"fetched": 3} and stats(redis_conn, "s7") == {"fetched": 1}
