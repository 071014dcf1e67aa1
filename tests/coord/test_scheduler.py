"""The scheduler's Lua scripts against a real Redis: ready set, refill, pause, cap, retries."""

from __future__ import annotations

import time

import pytest
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from crawler.coord import keys, lua
from crawler.coord.frontier import DownloadTask, Frontier
from crawler.coord.scheduler import (
    Next,
    Scheduler,
    decode_entry,
    encode_entry,
    entry_encoder,
    frontier_sizes,
    parse_member,
    publish_conf,
)
from crawler.spiders.spider import Request


def frontier(connection: Redis, site: str) -> Frontier:
    return Frontier(connection, site, ["example.com"], failure_ttl=60, job_timeout=60)


def fill(connection: Redis, site: str, count: int, interval: float = 0.05) -> Frontier:
    front = frontier(connection, site)
    publish_conf(connection, site, interval, 0.0)
    front.add([Request(f"http://example.com/{site}/{i}") for i in range(count)])
    return front


def take(scheduler: Scheduler, attempts: int = 4):  # type: ignore[no-untyped-def]
    """The next job handed out, refilling RQ queues when asked, as a worker does."""
    step = scheduler.next()
    for _ in range(attempts):
        if step.job_id is None and step.site is not None and step.refill:
            frontier(scheduler.connection, step.site).refill(2, due_now=True)
            step = scheduler.take(step.site) or scheduler.next()
            continue
        return step
    return step


def test_entries_round_trip_and_leave_out_defaults() -> None:
    assert encode_entry("http://a/") == '["http://a/"]'
    assert encode_entry("http://a/", "parse_item") == '["http://a/","parse_item"]'
    full = encode_entry("http://a/", "cb", 2, 1, 3, {"k": "v"})
    assert decode_entry(full) == {
        "url": "http://a/",
        "callback": "cb",
        "depth": 2,
        "hops": 1,
        "attempt": 3,
        "meta": {"k": "v"},
        "refresh": None,
    }
    for bad in ("{}", "[]", "[1]", '["a",1,2,3,4,5,6,7,8]', "nope"):
        with pytest.raises(ValueError):
            decode_entry(bad)


@pytest.mark.parametrize(
    "fields",
    [
        (),
        ("parse_item",),
        ("parse", 2, 1),
        ("cb", 0, 0, 1, {"k": ["é", 1]}),
        ("parse", 0, 0, 1, {}, 60.0),
        ("cb", 3, 2, 4, {"q": '"'}, 0.5),
    ],
)
def test_an_entry_encoder_writes_what_encode_entry_writes(fields: tuple) -> None:  # type: ignore[type-arg]
    encode = entry_encoder(*fields)
    for url in ("http://a/", 'http://a/"quoted"\\', "http://a/é?x=1&y=ü", "http://a/\n\u2028", ""):
        assert encode(url) == encode_entry(url, *fields)


def test_a_site_with_work_is_handed_out_once_per_interval(redis_conn: Redis) -> None:
    fill(redis_conn, "a", 5, interval=0.2)
    scheduler = Scheduler(redis_conn)
    first = take(scheduler)
    assert first.site == "a" and first.job_id is not None
    second = take(scheduler)
    assert second.job_id is None
    assert second.wait is not None and 0.1 < second.wait <= 0.2  # the site is due again one interval later
    time.sleep(second.wait)
    assert take(scheduler).site == "a"


def test_a_site_being_refilled_is_left_out_of_other_workers_picks_until_its_jobs_are_made(redis_conn: Redis) -> None:
    """A dry RQ queue is refilled by the worker that found it; the others, which all picked that site
    (the first due) and found its refill lock taken, spun on it: 28 NEXT_JOB calls a job at 200 sites."""
    for site in ("a", "b"):
        fill(redis_conn, site, 3, interval=10)
        redis_conn.zadd(keys.ready(), {site: 0 if site == "a" else 1})
    scheduler = Scheduler(redis_conn)
    first = scheduler.next()
    assert (first.site, first.job_id, first.refill) == ("a", None, True)
    other = scheduler.next()  # another worker, meanwhile
    assert other.site == "b", "a site being refilled was handed to another worker"
    assert frontier(redis_conn, "a").refill(2, due_now=True) == 2
    step = scheduler.take("a")
    assert step is not None and step.job_id is not None


def test_workers_are_handed_other_sites_while_one_site_waits(redis_conn: Redis) -> None:
    for site in ("a", "b", "c"):
        fill(redis_conn, site, 3, interval=10)
    scheduler = Scheduler(redis_conn)
    handed = {take(scheduler).site for _ in range(3)}
    assert handed == {"a", "b", "c"}
    assert take(scheduler).job_id is None


def test_a_closed_gate_moves_the_site_to_when_it_opens(redis_conn: Redis) -> None:
    fill(redis_conn, "a", 2, interval=0.01)
    scheduler = Scheduler(redis_conn)
    scheduler.close_gate("a", 0.5)  # e.g. Retry-After from another worker's response
    step = take(scheduler)
    assert step.job_id is None and step.wait is not None and 0.3 < step.wait <= 0.5
    assert 300 < redis_conn.pttl(keys.gate("a")) <= 500


def test_close_gate_never_shortens_a_longer_closure(redis_conn: Redis) -> None:
    scheduler = Scheduler(redis_conn)
    scheduler.close_gate("a", 2.0)
    scheduler.close_gate("a", 0.1)
    assert redis_conn.pttl(keys.gate("a")) > 1500


def test_a_paused_site_is_skipped_and_resumes(redis_conn: Redis) -> None:
    fill(redis_conn, "a", 2)
    publish_conf(redis_conn, "a", 0.05, 0.0, paused=True)
    scheduler = Scheduler(redis_conn)
    assert take(scheduler).job_id is None
    publish_conf(redis_conn, "a", 0.05, 0.0, paused=False)
    redis_conn.zadd(keys.ready(), {"a": 0})
    assert take(scheduler).site == "a"


def test_concurrency_cap_holds_back_a_site_with_requests_in_flight(redis_conn: Redis) -> None:
    fill(redis_conn, "a", 3, interval=0.001)
    publish_conf(redis_conn, "a", 0.001, 0.0, concurrency=1)
    scheduler = Scheduler(redis_conn)
    first = take(scheduler)
    assert first.job_id is not None  # now in RQ's intermediate list: in flight
    time.sleep(0.01)
    assert take(scheduler).job_id is None
    intermediate = Queue(keys.download_queue("a"), connection=redis_conn).intermediate_queue_key
    redis_conn.lrem(intermediate, 1, first.job_id)  # the job finished
    redis_conn.zadd(keys.ready(), {"a": 0})
    assert take(scheduler).job_id is not None


def test_a_worker_serving_some_sites_never_gets_another(redis_conn: Redis) -> None:
    fill(redis_conn, "a", 2)
    fill(redis_conn, "b", 2)
    only_b = Scheduler(redis_conn, ["b"])
    steps = [take(only_b) for _ in range(2)]
    assert {s.site for s in steps if s.job_id} == {"b"}


def test_drained_sites_leave_the_ready_set(redis_conn: Redis) -> None:
    fill(redis_conn, "a", 1, interval=0.001)
    scheduler = Scheduler(redis_conn)
    assert take(scheduler).job_id is not None
    time.sleep(0.01)
    assert take(scheduler).site is None
    assert redis_conn.zcard(keys.ready()) == 0


def test_dequeue_cost_does_not_grow_with_the_number_of_sites(redis_conn: Redis) -> None:
    for i in range(300):
        fill(redis_conn, f"s{i}", 1, interval=10)
    scheduler = Scheduler(redis_conn)
    before = redis_conn.info("commandstats")
    handed = [take(scheduler) for _ in range(50)]
    after = redis_conn.info("commandstats")
    calls = sum(v["calls"] for v in after.values()) - sum(v["calls"] for v in before.values())
    assert all(step.job_id for step in handed)
    # 50 handouts: PICK_SITE and NEXT_JOB each, plus the refills (a NEXT_JOB that asks for it,
    # a lock, a few reads, a transaction); independent of the 300 sites (RQ's own dequeue would
    # ask each queue in turn).
    assert calls < 50 * 45  # 40.3 a handout measured (37.3 when one script did both)


def test_a_process_looks_for_due_retries_when_one_may_be_due_not_five_times_a_second(redis_conn: Redis) -> None:
    """Each download process of each shard looked for due retries every 0.2 s (four commands), idle or
    not: a look now says when the first waiting one is due, and this process's own come due on time;
    another process's are looked for at least every PROMOTE_LOOKS_MOST seconds."""
    from crawler.coord.scheduler import PROMOTE_LOOKS_MOST

    redis_conn.delete(keys.delayed(), keys.recrawls())
    mine, other = Scheduler(redis_conn), Scheduler(redis_conn)
    assert mine.may_have_due() and mine.promote_due() == 0
    assert not mine.may_have_due(), "nothing waits: no look is needed before PROMOTE_LOOKS_MOST"
    mine.schedule("a", DownloadTask("a", "http://example.com/0").to_entry(), 0)
    assert mine.may_have_due() and mine.promote_due() == 1  # its own retry: looked for at once
    other.schedule("a", DownloadTask("a", "http://example.com/1").to_entry(), 0.2)
    assert mine.promote_due() == 0 and not mine.may_have_due()
    time.sleep(0.25)
    assert mine.may_have_due(), "the look saw the retry due in 0.2 s and said nothing is due till later"
    assert mine.promote_due() == 1
    other.schedule("a", DownloadTask("a", "http://example.com/2").to_entry(), 0)  # another process's, now
    assert not mine.may_have_due()
    time.sleep(PROMOTE_LOOKS_MOST + 0.05)
    assert mine.may_have_due() and mine.promote_due() == 1


def test_due_retries_come_back_to_the_front_with_ms_precision(redis_conn: Redis) -> None:
    front = fill(redis_conn, "a", 1)
    scheduler = Scheduler(redis_conn)
    retry = DownloadTask("a", "http://example.com/retry", attempt=2)
    scheduler.schedule("a", retry.to_entry(), 0.3)
    assert redis_conn.hget(keys.stats("a"), "delayed") == b"1"
    assert scheduler.promote_due() == 0
    time.sleep(0.32)
    assert scheduler.promote_due() == 1
    first = redis_conn.lindex(keys.frontier("a"), 0)
    assert DownloadTask.from_entry("a", first) == retry
    assert redis_conn.hget(keys.stats("a"), "delayed") == b"0"
    assert front.connection.zcard(keys.delayed()) == 0


def test_refill_turns_entries_into_json_jobs(redis_conn: Redis) -> None:
    fill(redis_conn, "a", 4)
    scheduler = Scheduler(redis_conn)
    step = take(scheduler)
    assert step.job_id is not None
    queue = Queue(keys.download_queue("a"), connection=redis_conn, serializer=JSONSerializer)
    assert queue.count == 1  # one more kept ahead; the rest stays compact
    assert redis_conn.llen(keys.frontier("a")) == 2


def test_a_robots_crawl_delay_spaces_handouts_more_than_the_interval(redis_conn: Redis) -> None:
    fill(redis_conn, "a", 3, interval=0.05)
    redis_conn.hset(keys.conf("a"), "robots_delay_ms", 400)
    scheduler = Scheduler(redis_conn)
    assert take(scheduler).job_id is not None
    step = take(scheduler)
    assert step.job_id is None and step.wait is not None and 0.3 < step.wait <= 0.4


def test_a_group_worker_walks_past_other_sites_to_its_own(redis_conn: Redis) -> None:
    for i in range(200):  # other workers' sites, all due before ours
        fill(redis_conn, f"other{i}", 1, interval=10)
        redis_conn.zadd(keys.ready(), {f"other{i}": 1})
    fill(redis_conn, "mine", 2, interval=10)
    redis_conn.zadd(keys.ready(), {"mine": 2})
    scheduler = Scheduler(redis_conn, ["mine"])
    assert redis_conn.smembers(keys.group(["mine"])) == {b"mine"}
    scheduler = Scheduler(redis_conn, ["mine", "mine-idle"])  # two sites: picked (one would be asked alone)
    redis_conn.config_resetstat()
    step = take(scheduler)
    assert step.site == "mine" and step.job_id is not None
    assert redis_conn.zscore(keys.ready(), "other0") == 1  # others' sites untouched
    # The walk asks the group about each chunk of 64 sites at once: 4 calls for 201 sites, not 201.
    calls = {name: int(stats["calls"]) for name, stats in redis_conn.info("commandstats").items()}
    assert calls.get("cmdstat_sismember", 0) == 0 and calls.get("cmdstat_smismember") == 4, calls


def test_a_job_is_handed_out_just_before_its_gate_opens_never_long_before(redis_conn: Redis) -> None:
    """PREPARE_AHEAD: handed out within that lead of the gate opening, never more, never a spin."""
    from crawler.coord.scheduler import PREPARE_AHEAD

    fill(redis_conn, "a", 5, interval=0.001)  # an interval shorter than the lead
    scheduler = Scheduler(redis_conn)
    assert take(scheduler).job_id is not None
    redis_conn.set(keys.gate("a"), "held", px=400)  # a request in flight, its gate closed 400 ms
    before = redis_conn.info("commandstats").get("cmdstat_pttl", {}).get("calls", 0)
    step = scheduler.next()
    assert step.job_id is None and step.wait is not None and step.wait > 0  # not handed out 400 ms ahead
    assert redis_conn.info("commandstats")["cmdstat_pttl"]["calls"] - before == 1  # looked at once, no spin
    time.sleep(step.wait)
    assert scheduler.next().job_id is None  # still closed beyond the lead
    redis_conn.pexpire(keys.gate("a"), int(PREPARE_AHEAD * 1000) - 5)  # now opening within the lead
    time.sleep(0.002)
    assert scheduler.next().job_id is not None


def test_two_workers_that_pick_the_same_site_are_handed_one_turn(redis_conn: Redis) -> None:
    """PICK_SITE only reads: NEXT_JOB checks again that the site is due, atomically with the hand-out."""
    front = fill(redis_conn, "a", 6, interval=10)
    front.refill(4)
    first, second = Scheduler(redis_conn), Scheduler(redis_conn)
    assert first._pick(keys=first._pick_keys, args=first._pick_args)[1] == b"a"
    assert second._pick(keys=second._pick_keys, args=second._pick_args)[1] == b"a"
    handed = first.take("a")
    assert handed is not None and handed.job_id is not None
    assert second.take("a") is None  # re-scored one interval ahead by the first
    assert redis_conn.zscore(keys.ready(), "a") > time.time() * 1000 + 9000


def test_a_site_without_work_leaves_the_ready_set_only_with_its_turn_checked(redis_conn: Redis) -> None:
    publish_conf(redis_conn, "gone", 0.05, 0.0)
    redis_conn.zadd(keys.ready(), {"gone": 0})
    scheduler = Scheduler(redis_conn)
    assert scheduler.take("gone") is None
    assert redis_conn.zscore(keys.ready(), "gone") is None
    assert scheduler.next() == Next()


def test_a_site_without_work_leaves_the_ready_set_paused_or_behind_a_shared_gate_its_conf_unread(
    redis_conn: Redis,
) -> None:
    """Most looks at a slow site find its one page handed out already: no conf, no second call to learn its gate."""

    def conf_reads() -> int:
        return int(redis_conn.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))

    publish_conf(redis_conn, "paused", 0.05, 0.0, paused=True)
    publish_conf(redis_conn, "shared", 0.05, 0.0, gate_key=keys.gate(keys.shared_gate_name("srv")))
    redis_conn.zadd(keys.ready(), {"paused": 0, "shared": 0})
    scheduler = Scheduler(redis_conn)
    before = conf_reads()
    assert scheduler.take("paused") is None and scheduler.take("shared") is None
    assert conf_reads() == before and redis_conn.zcard(keys.ready()) == 0


def test_a_shared_gate_named_by_the_sites_conf_is_learned_and_obeyed(redis_conn: Redis) -> None:
    shared = keys.gate(keys.shared_gate_name("srv"))
    front = fill(redis_conn, "a", 3, interval=10)
    front.refill(2)
    publish_conf(redis_conn, "a", 10, 0.0, gate_key=shared)
    redis_conn.set(shared, "held", px=5000)  # another site's request on the same server
    scheduler = Scheduler(redis_conn)
    assert scheduler.next().job_id is None  # the shared gate is closed, not the site's own
    assert scheduler._gates == {"a": shared}
    assert 4000 < redis_conn.zscore(keys.ready(), "a") - time.time() * 1000 <= 5100
    redis_conn.delete(shared)
    redis_conn.zadd(keys.ready(), {"a": 0})
    assert scheduler.next().job_id is not None


def test_a_due_retry_is_promoted_once_by_workers_that_read_it_at_once(redis_conn: Redis) -> None:
    fill(redis_conn, "a", 1)
    scheduler = Scheduler(redis_conn)
    scheduler.schedule("a", DownloadTask("a", "http://example.com/retry", attempt=2).to_entry(), 0, priority=3)
    (member,) = redis_conn.zrange(keys.delayed(), 0, -1)
    promote = lua.script(redis_conn, "promote_due")
    args = ["delayed", "delayed", keys.wake(), member, 4]
    promote_keys = [keys.delayed(), keys.ready(), keys.quarantine()]
    promote_keys += [keys.frontier("a", 3), keys.levels("a"), keys.stats("a")]
    assert promote(keys=promote_keys, args=args) == 1
    assert promote(keys=promote_keys, args=args) == 0  # the second worker's call finds it gone
    assert redis_conn.llen(keys.frontier("a", 3)) == 1
    assert redis_conn.hget(keys.stats("a"), "delayed") == b"0"
    assert redis_conn.zscore(keys.levels("a"), "3") == 3


@pytest.mark.parametrize(
    ("member", "parsed"),
    [
        (b'a\t0\tn\t["u"]', ("a", 0)),
        (b'www.shop.example\t-3\t-\t["u"]', ("www.shop.example", -3)),
        (b"a\t10\tn\tentry\twith\ttabs", ("a", 10)),
        (b"a\t0\tn", None),
        (b'\t0\tn\t["u"]', None),
        (b'a\t05\tn\t["u"]', None),
        (b'a\t1e3\tn\t["u"]', None),
        (b'a\t-0\tn\t["u"]', None),
        (b'a\t1234567890123456\tn\t["u"]', None),
        (b'\xff\t0\tn\t["u"]', None),
    ],
)
def test_a_waiting_member_is_read_as_schedule_writes_it(member: bytes, parsed: tuple[str, int] | None) -> None:
    assert parse_member(member) == parsed


def test_a_frontiers_size_is_counted_only_over_the_priorities_still_there(redis_conn: Redis) -> None:
    front = frontier(redis_conn, "sized")
    front.add([Request(f"http://example.com/{i}", priority=i % 2 * 5) for i in range(7)])
    size = lua.script(redis_conn, "frontier_size")
    lists = [keys.frontier("sized", 0), keys.frontier("sized", 5)]
    extra = keys.frontier_extra("sized")
    assert size(keys=[keys.levels("sized"), extra, *lists], args=["0", "5"]) == 7
    # Read before a push of a new priority (or a forget): no count, the caller reads again.
    assert size(keys=[keys.levels("sized"), extra, lists[0]], args=["0"]) == -1
    assert frontier_sizes(redis_conn, ["sized", "empty"]) == [7, 0]


def test_a_frontier_whose_priorities_keep_changing_counts_as_busy(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    frontier(redis_conn, "moving").add([Request("http://example.com/a")])
    # Every count finds other priorities than those just read (a push between each read and count).
    monkeypatch.setattr("crawler.coord.scheduler.text", lambda reply: "9")
    assert frontier_sizes(redis_conn, ["moving"]) == [1]


def test_a_scheduler_of_one_site_asks_once_a_look_and_is_told_its_wait(redis_conn: Redis) -> None:
    """Nothing to pick for one site (``crawler crawl SITE``): NEXT_JOB alone, which also says when to look again."""
    front = fill(redis_conn, "solo", 3, interval=0.2)
    front.refill(3)
    fill(redis_conn, "other", 1, interval=0.2)  # due, but not this worker's
    scheduler = Scheduler(redis_conn, ["solo"])

    def evalsha_calls() -> int:
        return int(redis_conn.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    redis_conn.script_load(lua.source("next_job"))  # else a server that never ran it counts the EVALSHA it refused
    before = evalsha_calls()
    first = scheduler.next()
    assert first.site == "solo" and first.job_id is not None
    second = scheduler.next()
    assert second.job_id is None and second.wait is not None and 0.15 < second.wait <= 0.2
    assert evalsha_calls() - before == 2
    time.sleep(second.wait)
    assert scheduler.next().job_id is not None
    redis_conn.zrem(keys.ready(), "solo")
    assert scheduler.next() == Next()  # not in the ready set: no work for this worker


def test_a_promotion_look_with_nothing_due_is_one_call(redis_conn: Redis) -> None:
    """Every worker looks five times a second: one EVALSHA, no SCRIPT EXISTS (as a pipeline would add)."""
    scheduler = Scheduler(redis_conn)
    scheduler.schedule("a", DownloadTask("a", "http://example.com/later").to_entry(), 60)
    scheduler.promote_due()  # the script loaded

    def calls() -> dict[str, int]:
        stats = redis_conn.info("commandstats")
        return {name: int(stat["calls"]) for name, stat in stats.items() if "eval" in name or "script" in name}

    before = calls()
    assert scheduler.promote_due() == 0
    after = calls()
    assert {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)} == {
        "cmdstat_evalsha": 1
    }


def test_a_priority_that_is_not_an_integer_in_a_levels_set_is_not_counted_and_breaks_no_count(
    redis_conn: Redis,
) -> None:
    """Written by hand into Redis: the count goes on over the lists of real priorities."""
    frontier(redis_conn, "junk").add([Request(f"http://example.com/{i}") for i in range(3)])
    redis_conn.zadd(keys.levels("junk"), {"x": 1, "1.5": 2})
    assert frontier_sizes(redis_conn, ["junk"]) == [3]


@pytest.mark.parametrize("group", [False, True])
def test_a_job_handed_out_says_how_long_nothing_else_of_the_workers_is_due(redis_conn: Redis, group: bool) -> None:
    """With a job, ``next`` says when the worker's next site is due (PICK_SITE's next one, or the site
    taken, re-scored an interval on), so the thread woken to look next sleeps until then instead of
    asking to be told so: at 1,000 slow sites that ask was one PICK_SITE a request."""
    from crawler.coord.scheduler import PREPARE_AHEAD

    def redis_ms() -> int:
        seconds, micros = redis_conn.time()
        return int(seconds) * 1000 + int(micros) // 1000

    for site in ("a", "b", "c"):
        fill(redis_conn, site, 3, interval=10)
        frontier(redis_conn, site).refill(2, due_now=True)
    for i in range(100):  # another worker's sites, between ours in the ready set
        redis_conn.zadd(keys.ready(), {f"other{i}": redis_ms() + 50 + i})
    now = redis_ms()
    redis_conn.zadd(keys.ready(), {"a": 0, "b": now + 400, "c": now + 900})
    scheduler = Scheduler(redis_conn, ["a", "b", "c"] if group else [])
    step = scheduler.next()
    assert step.site == "a" and step.job_id is not None and step.quiet_for is not None
    # Its next site: b for a worker of a, b and c; other0, due before b, for a worker of every site.
    expected = (0.4 if group else 0.05) - PREPARE_AHEAD
    assert expected - 0.05 <= step.quiet_for <= expected + 0.005, step.quiet_for
    # The only site left (b and c without work): quiet until it is due again, an interval on.
    for site in ("b", "c", *(f"other{i}" for i in range(100))):
        redis_conn.zrem(keys.ready(), site)
    redis_conn.zadd(keys.ready(), {"a": 0})
    redis_conn.delete(keys.gate("a"))
    step = scheduler.next()
    assert step.site == "a" and step.job_id is not None and step.quiet_for is not None
    assert 10 - PREPARE_AHEAD - 0.05 <= step.quiet_for <= 10, step.quiet_for
    # A job taken by name (as after a refill) knows nothing of the worker's other sites.
    frontier(redis_conn, "a").refill(2, due_now=True)
    redis_conn.zadd(keys.ready(), {"a": 0})
    redis_conn.delete(keys.gate("a"))
    taken = scheduler.take("a")
    assert taken is not None and taken.job_id is not None and taken.quiet_for is None


def test_a_sites_conf_is_written_in_one_transaction_of_two_commands_and_drops_what_no_longer_holds(
    redis_conn: Redis,
) -> None:
    """Every process writes the conf of each site it meets, and again every REPUBLISH_EVERY: 3,000
    writes at 1,000 sites, each an HSET or HDEL a field (seven commands). Now one HSET of what holds
    and one HDEL of what no longer does, whatever the options."""
    conf = keys.conf("pub")
    redis_conn.delete(conf)
    redis_conn.hset(conf, mapping={"pace_ms": 900, "pace_why": "auto"})

    def commands(**options: object) -> int:
        before = int(redis_conn.info("stats")["total_commands_processed"])
        publish_conf(redis_conn, "pub", 1.0, 0.005, **options)  # type: ignore[arg-type]
        return int(redis_conn.info("stats")["total_commands_processed"]) - before - 1

    assert commands(concurrency=2, batch=8, auto=True, gate_key="crawler:gate:{shared:x}") == 3  # MULTI HSET EXEC
    assert redis_conn.hgetall(conf) == {
        b"interval_ms": b"1005",
        b"margin_ms": b"5",
        b"paused": b"0",
        b"concurrency": b"2",
        b"batch": b"8",
        b"gate": b"crawler:gate:{shared:x}",
        b"pace_ms": b"900",
        b"pace_why": b"auto",
    }
    assert commands(paused=True) == 4  # MULTI HSET HDEL EXEC
    assert redis_conn.hgetall(conf) == {b"interval_ms": b"1005", b"margin_ms": b"5", b"paused": b"1"}
    redis_conn.hset(conf, "gate", "crawler:gate:{ip:10.0.0.1}")  # written by the download workers
    publish_conf(redis_conn, "pub", 1.0, 0.005, gate_by_ip=True)
    assert redis_conn.hget(conf, "gate") == b"crawler:gate:{ip:10.0.0.1}"


def test_confs_queued_in_one_transaction_are_written_as_each_alone_writes_its_own(redis_conn: Redis) -> None:
    """``publish_conf(pipe=)``: ``crawler seed --all`` writes a chunk of sites' confs in one round trip."""
    for name in ("alone", "queued"):
        redis_conn.hset(keys.conf(name), mapping={"pace_ms": 900, "concurrency": 3})
    publish_conf(redis_conn, "alone", 2.0, 0.01, paused=True, batch=4)
    with redis_conn.pipeline(transaction=True) as pipe:
        publish_conf(redis_conn, "queued", 2.0, 0.01, paused=True, batch=4, pipe=pipe)
        assert redis_conn.hget(keys.conf("queued"), "pace_ms") == b"900"  # queued, not written yet
        pipe.execute()
    assert redis_conn.hgetall(keys.conf("queued")) == redis_conn.hgetall(keys.conf("alone"))
    assert redis_conn.hgetall(keys.conf("queued")) == {
        b"interval_ms": b"2010",
        b"margin_ms": b"10",
        b"paused": b"1",
        b"batch": b"4",
    }


def test_a_job_handed_out_comes_with_its_hash_and_is_loaded_without_a_round_trip_of_its_own(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crawling import count_round_trips

    from crawler.coord import joblife
    from crawler.coord.vetting import CrawlerJob

    fill(redis_conn, "a", 3, interval=0.01)
    step = take(Scheduler(redis_conn))
    assert step.job_id is not None and step.job_hash
    queue = Queue(keys.download_queue("a"), connection=redis_conn, serializer=JSONSerializer)
    trips = count_round_trips(monkeypatch)
    job = joblife.fetch(redis_conn, step.job_id, queue, step.job_hash)
    assert not trips
    fetched = CrawlerJob.fetch(step.job_id, connection=redis_conn, serializer=JSONSerializer)
    assert job is not None and (job.id, job.func_name, job.args, job.kwargs, job.origin) == (
        fetched.id,
        fetched.func_name,
        fetched.args,
        fetched.kwargs,
        fetched.origin,
    )
    # A job whose hash is gone by the hand-out is dropped from the intermediate list, as a fetch drops it.
    redis_conn.delete(fetched.key)
    assert joblife.fetch(redis_conn, step.job_id, queue, {}) is None
    assert step.job_id.encode() not in redis_conn.lrange(queue.intermediate_queue_key, 0, -1)


def test_a_handed_out_job_hash_that_is_not_the_crawlers_is_refused_and_quarantined(redis_conn: Redis) -> None:
    from crawler.coord import joblife, quarantine

    fill(redis_conn, "a", 3, interval=0.01)
    step = take(Scheduler(redis_conn))
    assert step.job_id is not None and step.job_hash is not None
    queue = Queue(keys.download_queue("a"), connection=redis_conn, serializer=JSONSerializer)
    forged = {**step.job_hash, b"data": b"\x80\x04\x95pickled"}
    assert joblife.fetch(redis_conn, step.job_id, queue, forged) is None
    assert step.job_id.encode() not in redis_conn.lrange(queue.intermediate_queue_key, 0, -1)
    kept = quarantine.entries(redis_conn)
    assert [entry.job_id for entry in kept] == [step.job_id]
    assert not redis_conn.exists(f"rq:job:{step.job_id}")
