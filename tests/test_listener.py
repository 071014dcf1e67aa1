"""One subscription per process: RQ's commands reach the worker they name, a site that got work wakes the
idle, more work of a site already known reaches the thread that follows it."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from redis import Redis
from rq.command import send_command

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
