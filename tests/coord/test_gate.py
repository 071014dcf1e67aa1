"""The gate: a time-limited Redis mutex, tested on a real Redis server.

Spacing is measured where the lock lives: right after ``acquire`` returns, the holder
reads Redis' clock and the key's PTTL in one MULTI, so the lock's start on the
server is ``TIME - (expire - PTTL)``. A client-side ``time.time()`` would add the
holder's own scheduling delay after the SET, which a loaded machine makes noisy.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import ResponseError

from crawler.coord import gate as gate_module
from crawler.coord import keys
from crawler.coord.gate import SEND_GRACE, Gate, Turn, site_gate
from crawler.work.runtime import Runtime

INTERVAL = 0.05
RUN_FOR = 1.0
#: Redis reports PTTL in whole milliseconds.
CLOCK_EPSILON = 0.002


def server_start_of_lock(connection: Redis, gate: Gate) -> float | None:
    """When (server clock, seconds) ``gate``'s lock was taken; None if it is no longer ours."""
    with connection.pipeline(transaction=True) as pipe:
        pipe.time()
        pipe.pttl(gate.key)
        pipe.get(gate.key)
        (seconds, micros), pttl, holder = pipe.execute()
    if holder is None or holder.decode() != gate.token or pttl < 0:
        return None
    now = seconds + micros / 1e6
    return now - (gate.expire - pttl / 1000.0)


def hammer(connection: Redis, name: str, until: float, out: list[float | None]) -> None:
    """Acquire ``name`` again and again until ``until``; record each lock's server start."""
    gate = Gate(connection, name, INTERVAL)
    while True:
        left = until - time.time()
        if left <= 0:
            return
        if gate.acquire(timeout=left):
            out.append(server_start_of_lock(connection, gate))


def process_hammer(url: str, name: str, ready: Any, until: Any, threads: int, results: Any) -> None:
    """One process: ``threads`` threads, each with its own connection, once all are ready."""
    from crawler.coord.connection import connect

    out: list[float | None] = []
    connections = [connect(url) for _ in range(threads)]
    ready.wait()  # connected
    ready.wait()  # the parent has set `until`
    workers = [threading.Thread(target=hammer, args=(c, name, until.value, out)) for c in connections]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results.put(out)


def assert_spaced_and_busy(samples: list[float | None], duration: float) -> None:
    starts = sorted(s for s in samples if s is not None)
    assert len(starts) >= len(samples) // 2, "most holders should still hold their lock when measured"
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert min(gaps) >= INTERVAL - CLOCK_EPSILON, f"two acquisitions {min(gaps) * 1000:.2f} ms apart"
    budget = duration / INTERVAL
    assert len(samples) >= 0.7 * budget, f"only {len(samples)} acquisitions in {duration:.2f}s (budget {budget:.0f})"


@pytest.fixture
def gate_factory(redis_conn: Redis) -> Callable[..., Gate]:
    def make(name: str = "site", expire: float = INTERVAL, **kwargs: object) -> Gate:
        return Gate(redis_conn, name, expire, **kwargs)  # type: ignore[arg-type]

    return make


def test_eight_threads_never_acquire_closer_than_interval(redis_url: str, redis_conn: Redis) -> None:
    from crawler.coord.connection import connect

    samples: list[float | None] = []
    connections = [connect(redis_url) for _ in range(8)]
    started = time.time()
    until = started + RUN_FOR
    threads = [threading.Thread(target=hammer, args=(c, "threads", until, samples)) for c in connections]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for connection in connections:
        connection.close()
    assert_spaced_and_busy(samples, until - started)


def test_three_processes_never_acquire_closer_than_interval(redis_url: str, redis_conn: Redis) -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    # Spawned interpreters take a while to import; all start hammering together.
    ready = context.Barrier(4)
    until = context.Value("d", 0.0)
    processes = [
        context.Process(target=process_hammer, args=(redis_url, "procs", ready, until, 2, results)) for _ in range(3)
    ]
    for process in processes:
        process.start()
    ready.wait(timeout=30)  # every child has connected
    start = time.time()
    until.value = start + RUN_FOR
    ready.wait(timeout=30)  # go
    samples: list[float | None] = []
    for _ in processes:
        samples.extend(results.get(timeout=30))
    for process in processes:
        process.join(timeout=10)
        assert process.exitcode == 0
    assert_spaced_and_busy(samples, until.value - start)


def test_nonblocking_acquire_fails_while_held(gate_factory: Callable[..., Gate]) -> None:
    holder, other = gate_factory(expire=5), gate_factory(expire=5)
    assert holder.acquire(blocking=False)
    assert other.acquire(blocking=False) is False
    assert other.token is None


def test_try_acquire_returns_time_until_open(gate_factory: Callable[..., Gate]) -> None:
    holder, other = gate_factory(expire=2), gate_factory(expire=2)
    assert holder.try_acquire() == 0.0
    wait = other.try_acquire()
    assert 1.0 < wait <= 2.0
    assert 1.0 < holder.remaining() <= 2.0


def test_only_the_token_holder_can_release(gate_factory: Callable[..., Gate], redis_conn: Redis) -> None:
    owner, stranger = gate_factory(expire=5), gate_factory(expire=5)
    assert owner.acquire(blocking=False)
    assert stranger.release() is False  # never acquired: no token
    stranger.token = "not-the-owners-token"
    assert stranger.release() is False
    assert owner.locked()
    assert owner.release() is True
    assert not owner.locked()
    assert redis_conn.get(owner.key) is None


def test_release_after_expiry_leaves_the_new_holders_lock(gate_factory: Callable[..., Gate], redis_conn: Redis) -> None:
    first, second = gate_factory(expire=0.05), gate_factory(expire=5)
    assert first.acquire(blocking=False)
    time.sleep(0.1)
    assert second.acquire(blocking=False)
    assert first.release() is False
    assert redis_conn.get(second.key) == second.token.encode()  # type: ignore[union-attr]


def test_lock_expires_on_its_own(gate_factory: Callable[..., Gate]) -> None:
    gate = gate_factory(expire=0.1)
    assert gate.acquire(blocking=False)
    assert gate.locked()
    time.sleep(0.2)
    assert not gate.locked()
    assert gate.remaining() == 0.0


def test_acquire_with_timeout_gives_up_about_the_timeout(gate_factory: Callable[..., Gate]) -> None:
    holder, waiter = gate_factory(expire=5), gate_factory(expire=5)
    assert holder.acquire(blocking=False)
    started = time.monotonic()
    assert waiter.acquire(timeout=0.2) is False
    elapsed = time.monotonic() - started
    assert 0.19 <= elapsed < 0.6
    assert waiter.token is None


def test_blocked_acquirer_wakes_when_the_lock_expires(gate_factory: Callable[..., Gate]) -> None:
    holder, waiter = gate_factory(expire=0.3), gate_factory(expire=5)
    assert holder.acquire(blocking=False)
    started = time.monotonic()
    assert waiter.acquire(timeout=5) is True
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed <= 0.4, f"woke after {elapsed:.3f}s for a 0.3s lock"


def test_context_manager_with_auto_release_releases_on_exit(gate_factory: Callable[..., Gate]) -> None:
    gate = gate_factory(expire=5, auto_release=True)
    with gate as entered:
        assert entered is gate
        assert gate.locked()
    assert not gate.locked()


def test_context_manager_releases_on_exception(gate_factory: Callable[..., Gate]) -> None:
    gate = gate_factory(expire=5, auto_release=True)
    with pytest.raises(RuntimeError):
        with gate:
            raise RuntimeError("boom")
    assert not gate.locked()


def test_context_manager_without_auto_release_leaves_lock_to_expire(gate_factory: Callable[..., Gate]) -> None:
    gate = gate_factory(expire=0.15)
    with gate:
        pass
    assert gate.locked()
    time.sleep(0.25)
    assert not gate.locked()


def test_synchronize_holds_the_gate_during_the_call(gate_factory: Callable[..., Gate]) -> None:
    released = gate_factory(expire=5, auto_release=True)
    seen: list[bool] = []

    @released.synchronize
    def work(x: int, *, y: int) -> int:
        """Doc kept."""
        seen.append(released.locked())
        return x + y

    assert work(1, y=2) == 3
    assert seen == [True]
    assert not released.locked()
    assert work.__name__ == "work" and work.__doc__ == "Doc kept."

    kept = gate_factory(name="other", expire=5)
    kept.synchronize(lambda: None)()
    assert kept.locked()


def test_a_gate_key_is_one_keys_builds_and_distinct_keys_keep_gates_apart(redis_conn: Redis) -> None:
    default = Gate(redis_conn, "site", 5)
    lock = Gate(redis_conn, "site", 5, key=keys.lock("site"))
    assert default.key == keys.gate("site") and lock.key == keys.lock("site")
    assert default.acquire(blocking=False)
    assert lock.acquire(blocking=False)
    assert Gate(redis_conn, "site", 5).acquire(blocking=False) is False


@pytest.mark.parametrize("expire", [0, -1, -0.5])
def test_non_positive_expire_is_refused(fake_redis: Redis, expire: float) -> None:
    with pytest.raises(ValueError, match="expire"):
        Gate(fake_redis, "site", expire)


def test_site_gate_adds_the_margin_to_the_interval_counted_from_the_send(redis_conn: Redis) -> None:
    gate = site_gate(redis_conn, "shop", 0.2, margin=0.01)
    assert gate.expire == pytest.approx(0.21 + SEND_GRACE)
    assert gate.rearm_expire == pytest.approx(0.21)
    assert gate.acquire(blocking=False)
    assert 210 < redis_conn.pttl(gate.key) <= 210 + SEND_GRACE * 1000  # closed until the request is sent
    time.sleep(0.05)
    assert gate.rearm()  # the request is on the wire: the interval starts now
    assert 150 < redis_conn.pttl(gate.key) <= 210


def test_rearm_takes_an_expired_gate_again_and_reports_a_lost_one(redis_conn: Redis) -> None:
    gate = Gate(redis_conn, "shop", 0.05, rearm_expire=0.3)
    assert gate.acquire(blocking=False)
    time.sleep(0.07)  # expired, nobody took it
    assert gate.rearm() and 200 < redis_conn.pttl(gate.key) <= 300
    other = Gate(redis_conn, "shop", 0.05)
    redis_conn.delete(gate.key)
    assert other.acquire(blocking=False)
    assert not gate.rearm()  # someone else holds it: spacing may have been lost
    assert redis_conn.get(gate.key) == other.token.encode()  # type: ignore[union-attr]


def test_a_holder_frozen_past_its_send_grace_waits_for_the_gate_again_before_sending(redis_conn: Redis) -> None:
    interval = 0.2
    frozen, other = site_gate(redis_conn, "frozen", interval), site_gate(redis_conn, "frozen", interval)
    frozen.acquire()
    time.sleep(interval + SEND_GRACE + 0.05)  # frozen (SIGSTOP, a GC pause) until its lock expired
    other.acquire()
    other.before_send()
    other_sent = time.monotonic()
    other.rearm()

    frozen.before_send()  # resumed: must not send on the lapsed turn
    frozen_sent = time.monotonic()

    assert frozen_sent - other_sent >= interval, f"{(frozen_sent - other_sent) * 1000:.1f} ms after the other send"
    assert redis_conn.get(frozen.key) == frozen.token.encode()  # it holds the gate now


def test_a_holder_within_its_send_grace_sends_at_once_without_a_redis_call(redis_conn: Redis) -> None:
    gate = site_gate(redis_conn, "prompt", 0.5)
    gate.acquire()
    before = sum(int(s["calls"]) for s in redis_conn.info("commandstats").values())
    started = time.monotonic()
    gate.before_send()
    assert time.monotonic() - started < 0.01
    after = sum(int(s["calls"]) for s in redis_conn.info("commandstats").values())
    assert after - before == 1  # the INFO above itself


def test_a_holder_past_its_grace_that_still_holds_the_gate_renews_it_at_once(redis_conn: Redis) -> None:
    gate = site_gate(redis_conn, "slow-connect", 1.0)
    gate.acquire()
    first = gate.acquired_at
    time.sleep(SEND_GRACE)  # a slow connection set-up: the lock is still ours (1.25 s lifetime)
    started = time.monotonic()
    gate.before_send()
    assert time.monotonic() - started < 0.05  # renewed, not waited for
    assert gate.acquired_at is not None and first is not None and gate.acquired_at > first
    assert redis_conn.pttl(gate.key) > 1000  # a full lifetime again


def test_many_sends_past_their_grace_are_warned_of_in_one_line_a_period(
    redis_conn: Redis, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An overloaded process meets hundreds at once; a line each queued its threads on the log's lock."""
    from crawler.coord import gate as gate_module

    monkeypatch.setattr(gate_module, "_late_sends", gate_module._LateSends())
    gates = [site_gate(redis_conn, f"late-{i}", 1.0) for i in range(5)]
    for gate in gates:
        gate.acquire()
        assert gate.acquired_at is not None
        gate.acquired_at -= SEND_GRACE  # as if frozen that long since the take
    with caplog.at_level("WARNING", logger="crawler.gate"):
        for gate in gates:
            gate.before_send()
    lines = [r.getMessage() for r in caplog.records if "send grace ran out" in r.getMessage()]
    assert len(lines) == 1 and "late-0" in lines[0]
    assert all(redis_conn.pttl(gate.key) > 1000 for gate in gates)  # each taken again all the same
    monkeypatch.setattr(gate_module, "LATE_SEND_WARN_EVERY", 0.0)
    gates[0].acquired_at -= SEND_GRACE  # type: ignore[operator]
    with caplog.at_level("WARNING", logger="crawler.gate"):
        gates[0].before_send()
    assert "(5 such sends since the last warning)" in caplog.records[-1].getMessage()


# A process's turn at a gate (gate.Turn, Runtime.take_gate) ---------------------------


def test_a_turn_waits_for_the_one_before_it_and_can_time_out() -> None:
    turn = Turn()
    first = turn.take()
    assert first is not None
    assert turn.take(timeout=0.05) is None  # still the first thread's
    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(turn.take()))
    waiter.start()
    time.sleep(0.05)
    assert got == []
    turn.give(first)
    waiter.join(5)
    assert got and got[0] is not None and got[0] != first


def test_a_turn_not_given_back_lapses_and_its_late_give_ends_no_one_elses() -> None:
    turn = Turn()
    stale = turn.take()
    assert stale is not None
    turn.hold(stale, 0.05)  # took the gate, then died before sending
    started = time.monotonic()
    current = turn.take(timeout=5)
    assert current is not None and time.monotonic() - started >= 0.04
    turn.give(stale)  # the lapsed holder wakes up: the turn stays the current one's
    assert turn.take(timeout=0.02) is None
    turn.give(current)
    assert turn.take(timeout=0.02) is not None


def test_a_thread_asks_redis_for_a_gate_only_once_its_processs_holder_has_sent(
    runtime: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    asks: list[tuple[str, float]] = []
    try_acquire = Gate.try_acquire

    def counted(self: Gate) -> float:
        asks.append((threading.current_thread().name, time.monotonic()))
        return try_acquire(self)

    monkeypatch.setattr(Gate, "try_acquire", counted)
    # A send grace far past the slow connection below: the turn must pass on at the send, not
    # lapse first because a busy machine woke this thread late from its sleep (it would, rightly).
    monkeypatch.setattr(gate_module, "SEND_GRACE", 5.0)
    holder = runtime.take_gate("demo")
    second: list[Gate] = []
    thread = threading.Thread(target=lambda: second.append(runtime.take_gate("demo")), name="second")
    thread.start()
    time.sleep(0.2)  # the holder connects slowly: the gate is held, not yet sent
    sent = time.monotonic()
    holder.rearm()
    thread.join(5)

    assert second, "the second thread never took the gate"
    seconds = [at for name, at in asks if name == "second"]
    assert seconds and min(seconds) >= sent  # no ask while the holder had yet to send
    assert redis_conn.get(second[0].key) == second[0].token.encode()
    second[0].let_go()


def test_a_holder_that_never_sends_passes_its_turn_on_when_it_lets_go(runtime: Runtime) -> None:
    holder = runtime.take_gate("demo")
    taken: list[float] = []
    thread = threading.Thread(target=lambda: (runtime.take_gate("demo"), taken.append(time.monotonic())))
    thread.start()
    time.sleep(0.05)
    assert taken == []
    let_go = time.monotonic()
    holder.let_go()  # the fetch failed before a byte was sent
    thread.join(5)
    # The gate itself opens with the unsent holder's send grace: a request may never follow a take sooner.
    assert taken and taken[0] >= let_go


def test_a_rearm_sent_with_a_record_ends_the_lock_an_interval_after_the_send(redis_conn: Redis) -> None:
    gate = site_gate(redis_conn, "late-rearm", 0.3)
    assert gate.try_acquire() == 0.0
    assert redis_conn.pttl(gate.key) > 300  # as taken: the interval and the send grace
    gate.sent()
    time.sleep(0.1)
    redis_conn.script_flush()  # a Redis restarted mid-crawl: the script is no longer loaded
    with redis_conn.pipeline(transaction=False) as pipe:
        pipe.echo("the record's own commands")
        gate.rearm_sent(pipe)
        replies = pipe.execute(raise_on_error=False)
    assert gate.check_rearm_sent(replies[1:]) == [1]  # the script run again, loaded
    pttl = redis_conn.pttl(gate.key)
    # Read after the PTTL, the time since the send bounds what the lock lost since it (a loaded machine
    # may pause between the two calls).
    since_send_ms = (time.monotonic() - gate.sent_at) * 1000  # type: ignore[operator]
    assert 300 - since_send_ms - 2 <= pttl <= 200


def test_a_rearm_sent_moves_its_sites_turn_in_the_ready_set_to_when_the_gate_opens(redis_conn: Redis) -> None:
    """A slow site's next job was handed out about an interval after the last hand-out, some ms before
    its gate (taken later, at the send) opened: NEXT_JOB found it closed and re-scored the site, a
    PICK_SITE and a NEXT_JOB lost for each request. The late rearm moves the turn to the gate's opening,
    never sooner than it was, and only for a site in the ready set, and only while its token held."""

    def redis_ms() -> int:
        seconds, micros = redis_conn.time()
        return int(seconds) * 1000 + int(micros) // 1000

    gate = site_gate(redis_conn, "turns", 0.5, ready_member="turns")
    redis_conn.zadd(keys.ready(), {"turns": redis_ms() + 100})  # as NEXT_JOB left it: too soon
    assert gate.try_acquire() == 0.0
    gate.sent()
    assert gate.rearm_sent_now()
    opens = redis_ms() + redis_conn.pttl(gate.key)
    score = redis_conn.zscore(keys.ready(), "turns")
    assert score is not None and abs(score - opens) <= 5, (score, opens)
    # Never sooner: a batch's span held by NEXT_JOB stays.
    held = redis_ms() + 60_000
    redis_conn.zadd(keys.ready(), {"turns": held})
    redis_conn.delete(gate.key)
    assert gate.try_acquire() == 0.0
    gate.sent()
    assert gate.rearm_sent_now() and redis_conn.zscore(keys.ready(), "turns") == held
    # A site out of the ready set (no work) is not put back; a lost gate moves nothing.
    redis_conn.zrem(keys.ready(), "turns")
    redis_conn.delete(gate.key)
    assert gate.try_acquire() == 0.0
    gate.sent()
    assert gate.rearm_sent_now() and redis_conn.zscore(keys.ready(), "turns") is None
    redis_conn.zadd(keys.ready(), {"turns": 1})
    redis_conn.set(gate.key, "someone-else", px=5000)
    assert not gate.rearm_sent_now() and redis_conn.zscore(keys.ready(), "turns") == 1


def test_a_rearm_sent_never_takes_a_lost_gate_and_opens_one_whose_interval_is_over(redis_conn: Redis) -> None:
    gate = site_gate(redis_conn, "lost", 0.05)
    assert gate.try_acquire() == 0.0
    gate.sent()
    redis_conn.set(gate.key, "someone-else", px=5000)  # expired and taken by another holder
    assert not gate.rearm_sent_now()
    assert redis_conn.get(gate.key) == b"someone-else" and redis_conn.pttl(gate.key) > 4000
    redis_conn.delete(gate.key)
    assert not gate.rearm_sent_now() and not redis_conn.exists(gate.key)  # expired: not taken again
    assert gate.try_acquire() == 0.0
    gate.sent()
    time.sleep(0.1)  # past the interval, within the send grace: the lock still holds
    assert redis_conn.pttl(gate.key) > 0
    assert gate.rearm_sent_now() and not redis_conn.exists(gate.key)  # open at once


def test_a_rearm_sent_that_meets_another_error_leaves_it_for_the_caller_to_raise(redis_conn: Redis) -> None:
    from crawler.coord import lua

    redis_conn.script_load(lua.source("rearm_sent"))  # loaded: the error comes in the pipeline's replies
    gate = site_gate(redis_conn, "junk-gate", 0.3)
    assert gate.try_acquire() == 0.0
    gate.sent()
    redis_conn.delete(gate.key)
    redis_conn.hset(gate.key, "written", "by hand")  # anyone who can write to Redis: not a string
    with redis_conn.pipeline(transaction=False) as pipe:
        gate.rearm_sent(pipe)
        replies = pipe.execute(raise_on_error=False)
    (reply,) = gate.check_rearm_sent(replies)
    assert isinstance(reply, ResponseError) and "WRONGTYPE" in str(reply)


@pytest.mark.parametrize("rearmed", ["at the send", "with the record"])
def test_a_turn_that_knows_when_its_gate_opens_asks_redis_once(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, rearmed: str
) -> None:
    """Redis expires a key once its whole-millisecond clock is past the deadline, not at it: a turn
    that asked at the very deadline its last send set found the gate closed "1 ms" more and asked
    again (27 % of a paced crawl's takes at 200 sites). The opening it waits for counts that tick."""
    refused: list[float] = []
    try_acquire = Gate.try_acquire

    def counted(self: Gate) -> float:
        wait = try_acquire(self)
        if wait:
            refused.append(wait)
        return wait

    monkeypatch.setattr(Gate, "try_acquire", counted)
    for _ in range(15):
        gate = runtime.take_gate("demo")
        if rearmed == "at the send":
            gate.rearm()
        else:
            gate.sent()
            assert gate.rearm_sent_now()
    assert refused == []


@pytest.mark.parametrize("scripts_flushed", [False, True])
def test_a_take_given_up_by_what_it_asked_along_lets_the_lock_go(redis_conn: Redis, scripts_flushed: bool) -> None:
    """A paced batch's take asks along whether work of a higher priority waits: if so, the take is
    given up, and the lock it took is let go (nothing was sent through it), so the work that
    outranks it takes the gate at once. A Redis that lost its scripts still takes in that round trip's stead."""
    asked: list[list[Any]] = []

    def unless(give_up: bool) -> Callable[[Any], Callable[[list[Any]], bool]]:
        def ask(pipe: Any) -> Callable[[list[Any]], bool]:
            pipe.echo("anything of a higher priority?")
            return lambda replies: asked.append(replies) or give_up

        return ask

    gate = site_gate(redis_conn, "veto", 5.0)
    if scripts_flushed:
        redis_conn.script_flush()
    assert not gate.acquire(timeout=1, unless=unless(True))
    assert asked == [[b"anything of a higher priority?"]]
    assert not redis_conn.exists(gate.key), "a take given up kept the gate closed"
    assert gate.acquire(timeout=1, unless=unless(False)) and gate.token is not None
    assert redis_conn.get(gate.key) == gate.token.encode()
    other = site_gate(redis_conn, "veto", 5.0)  # closed now: given up at once, nothing of another's let go
    assert not other.acquire(timeout=1, unless=unless(True))
    assert redis_conn.get(gate.key) == gate.token.encode()
