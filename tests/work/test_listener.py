"""One subscription per process: RQ's commands reach the worker they name, a site that got work wakes the
idle, more work of a site already known reaches the thread that follows it."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest
import redis
from redis import Redis
from rq.command import parse_payload, send_command
from rq.worker.base import PUBSUB_CHANNEL_TEMPLATE

from crawler.coord import keys
from crawler.coord.frontier import DownloadTask, Frontier
from crawler.coord.scheduler import mark_ready
from crawler.work import listener
from crawler.work.idle import IdleRoom


class Heard:
    """A worker as the listener sees one: a name, and what RQ hands it (``handle_payload``)."""

    def __init__(self, name: str):
        self.name = name
        self.payloads: list[dict[str, Any]] = []
        self.heard = threading.Event()

    def handle_payload(self, message: dict[str, Any]) -> None:
        self.payloads.append(json.loads(message["data"]))
        self.heard.set()


def _subscribed(connection: Redis, channel: str) -> None:
    """Wait until ``channel`` (or a pattern) has a subscriber, so a message sent next is heard."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if connection.pubsub_numsub(channel)[0][1] or connection.pubsub_numpat():
            return
        time.sleep(0.01)
    raise AssertionError(f"nobody subscribed to {channel}")


def test_rq_commands_reach_the_worker_they_name_through_one_subscription(redis_conn: Redis) -> None:
    hears = listener.of(redis_conn)
    workers = [Heard(f"w{i}") for i in range(20)]
    before = len(redis_conn.client_list(_type="pubsub"))
    for worker in workers:
        hears.register(worker)
    try:
        _subscribed(redis_conn, keys.wake())
        assert len(redis_conn.client_list(_type="pubsub")) - before == 1, "more than one subscription for 20 workers"
        send_command(redis_conn, "w7", "kill-horse")
        assert workers[7].heard.wait(5), "the command never reached its worker"
        assert workers[7].payloads == [{"command": "kill-horse"}]
        assert not any(w.payloads for i, w in enumerate(workers) if i != 7)
        send_command(redis_conn, "someone-elses", "kill-horse")  # another process's worker: ignored here
    finally:
        for worker in workers:
            hears.unregister(worker)
    deadline = time.monotonic() + 5
    while len(redis_conn.client_list(_type="pubsub")) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(redis_conn.client_list(_type="pubsub")) == before, "the last worker out left the subscription open"


def test_a_site_newly_marked_ready_is_announced_once_and_wakes_the_idle_watcher(redis_conn: Redis) -> None:
    redis_conn.zrem(keys.ready(), "woken")
    room = IdleRoom()
    worker = Heard("watching")
    hears = listener.of(redis_conn)
    hears.register(worker, room)
    stop = threading.Event()
    rested: list[float] = []

    def watch() -> None:
        started = time.monotonic()
        room.rest(30.0, stop)  # the first gate that matters opens in 30 s, as far as it knows
        rested.append(time.monotonic() - started)

    own = redis_conn.pubsub(ignore_subscribe_messages=True)
    own.subscribe(keys.wake())
    try:
        _subscribed(redis_conn, keys.wake())
        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(0.1)
        mark_ready(redis_conn, {"woken": 0})
        watcher.join(5)
        assert rested and rested[0] < 5, "the watcher slept on although a site got work"
        mark_ready(redis_conn, {"woken": 0})  # already ready: nothing to announce
        announced = []
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            message = own.get_message(timeout=0.1)
            if message is not None:
                announced.append(message["data"])
        assert announced == [b"woken"]
    finally:
        stop.set()
        own.close()
        hears.unregister(worker)


def test_more_work_of_a_site_already_ready_tells_the_thread_that_follows_it_and_wakes_no_one_else(
    redis_conn: Redis,
) -> None:
    """A site whose last job left it in the ready set (due when its gate opens) is not announced again
    when its links come: the thread that follows it (``DownloadWorker.follow``) is told on its own channel."""
    site = "followed"
    redis_conn.delete(keys.frontier(site))
    mark_ready(redis_conn, {site: 0})  # in the ready set already: ``mark_ready`` would say nothing
    room = IdleRoom()
    worker = Heard("following")
    hears = listener.of(redis_conn)
    hears.register(worker, room)
    stop = threading.Event()
    expected, other = room.expect(site), room.expect("another")
    try:
        _subscribed(redis_conn, keys.more_work())
        started = time.monotonic()
        Frontier(redis_conn, site, [], 0, 0).push([DownloadTask(site, "http://127.0.0.1:9/next")])
        assert room.await_work(expected, 5.0, stop), "the follower was not told of its site's work"
        assert time.monotonic() - started < 5
        assert not other.is_set(), "another site's follower was told"
        assert not room._poked.is_set(), "the idle watcher was woken for a site it already knows of"
    finally:
        stop.set()
        room.unexpect(site, expected)
        room.unexpect("another", other)
        hears.unregister(worker)


class RqLike(Heard):
    """A worker that reads its commands as RQ's does (``rq.command.parse_payload``, then ``payload["command"]``)."""

    def handle_payload(self, message: dict[str, Any]) -> None:
        self.payloads.append(parse_payload(message)["command"])
        self.heard.set()


def test_malformed_messages_on_every_channel_are_logged_once_and_the_listener_keeps_serving(
    redis_conn: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    worker = RqLike("garbled")
    room = IdleRoom()
    hears = listener.of(redis_conn)
    hears.register(worker, room)
    stop = threading.Event()
    huge = b"\xff" + b"x" * (4 << 20)
    garbage = [b"not json", b"\xff\xfe\x00", b'{"no": "command"}', b"[1, 2]", b"null", b'"text"', huge]
    try:
        _subscribed(redis_conn, keys.wake())
        for data in garbage:  # to the worker's own channel, as `rq` sends its commands
            redis_conn.publish(PUBSUB_CHANNEL_TEMPLATE % "garbled", data)
        redis_conn.publish((PUBSUB_CHANNEL_TEMPLATE % "").encode() + b"\xff\xfe", b"{}")  # a channel not UTF-8
        for channel in (keys.wake(), keys.more_work()):
            for data in (b"\xff\xfe", huge, b""):
                redis_conn.publish(channel, data)

        send_command(redis_conn, "garbled", "kill-horse")  # a real command after the garbage
        assert worker.heard.wait(10), "the listener stopped serving after malformed messages"
        assert worker.payloads == ["kill-horse"]

        rested: list[float] = []

        def watch() -> None:
            started = time.monotonic()
            room.rest(30.0, stop)
            rested.append(time.monotonic() - started)

        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(0.1)
        redis_conn.zrem(keys.ready(), "after-garbage")
        mark_ready(redis_conn, {"after-garbage": 0})  # a real wake-up
        watcher.join(5)
        assert rested and rested[0] < 5, "the wake-up after the garbage did not wake the idle watcher"
    finally:
        stop.set()
        hears.unregister(worker)
    ignored = [r for r in caplog.records if r.levelno >= logging.WARNING and "malformed" in r.getMessage()]
    assert len(ignored) == 1, [r.getMessage()[:200] for r in ignored]  # once, not once a message
    assert "garbled" in ignored[0].getMessage() and len(ignored[0].getMessage()) < 500
    assert not [r for r in caplog.records if "ended" in r.getMessage()]


def test_an_error_reading_the_subscription_is_logged_and_the_listener_listens_on(
    redis_conn: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Heard("steady")
    hears = listener.of(redis_conn)
    hears.register(worker)
    try:
        _subscribed(redis_conn, keys.wake())
        pubsub = hears._pubsub
        assert pubsub is not None
        real, failures = pubsub.get_message, [redis.ResponseError("a reply redis-py cannot read")]

        def get_message(*args: Any, **kwargs: Any) -> Any:
            if failures:
                raise failures.pop()
            return real(*args, **kwargs)

        pubsub.get_message = get_message  # type: ignore[method-assign]  # the next read fails, once
        send_command(redis_conn, "steady", "kill-horse")  # heard by the read under way; the next one fails
        assert worker.heard.wait(5)
        deadline = time.monotonic() + 5
        while failures and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not failures, "the failing read never came"
        worker.heard.clear()
        send_command(redis_conn, "steady", "shutdown")
        assert worker.heard.wait(5), "the listener ended on the error"
        assert worker.payloads == [{"command": "kill-horse"}, {"command": "shutdown"}]
    finally:
        hears.unregister(worker)
    assert "met ResponseError: a reply redis-py cannot read; listening on" in caplog.text


def test_the_last_worker_out_ends_the_subscription_at_once_not_after_a_read(redis_conn: Redis) -> None:
    """The listening thread reads for up to LISTEN_WAIT (60 s); the last ``unregister`` ends it at once,
    each time: a process's exit waits for it (redis-py 8.2's ``PubSubWorkerThread.stop`` joined a thread that
    had gone back to waiting a whole read for a subscription)."""
    hears = listener.of(redis_conn)
    for round_ in range(10):
        worker = Heard(f"short-{round_}")
        hears.register(worker)
        _subscribed(redis_conn, keys.wake())
        thread = hears._thread
        assert thread is not None
        started = time.monotonic()
        hears.unregister(worker)
        thread.join(5)
        assert not thread.is_alive(), f"round {round_}: the listening thread outlived its last worker"
        assert time.monotonic() - started < 5 < listener.LISTEN_WAIT
