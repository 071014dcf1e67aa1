"""The idle room of a process's download threads: one looks, the rest sleep, the room grows with the work."""

from __future__ import annotations

import threading
import time

import pytest

from crawler.work import idle
from crawler.work.idle import IdleRoom


class Grower:
    """Stands in for the process's pool: counts the threads asked for, and enters them in the room."""

    def __init__(self, room: IdleRoom, refuse: bool = False):
        self.room = room
        self.refuse = refuse
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        if self.refuse:
            return False
        self.room.enter()
        return True


def test_a_room_with_every_thread_busy_grows_one_thread_for_each_job_found_up_to_its_most() -> None:
    room = IdleRoom()
    room.grow = grower = Grower(room)
    room.most = 3
    room.enter()
    room.found_work()  # the only thread is busy now: nobody looks for the next job
    assert grower.asked == 1 and room.members == 2
    room.found_work()  # the grown one found a job too
    assert grower.asked == 2 and room.members == 3
    room.found_work()
    assert grower.asked == 2 and room.members == 3, "grown past its most"


def test_a_room_is_crowded_once_every_thread_it_may_have_is_busy() -> None:
    room = IdleRoom()
    room.grow = Grower(room)
    room.most = 2
    room.enter()
    room.found_work()  # grows the second
    assert not room.crowded()
    room.found_work()
    assert room.crowded()  # a paced batch now yields its thread between two URLs
    room.done_work()
    assert not room.crowded()
    room.hold_thread()  # a thread following its site counts as busy too
    assert room.crowded()


def test_a_room_with_a_free_thread_does_not_grow() -> None:
    room = IdleRoom()
    room.grow = grower = Grower(room)
    room.most = 10
    room.enter()
    room.enter()
    room.found_work()  # one busy, one free: the free one looks next
    assert grower.asked == 0
    room.done_work()
    room.found_work()
    room.found_work()  # both busy
    assert grower.asked == 1


def test_a_thread_that_follows_its_site_when_no_other_is_free_has_one_more_grown_to_look() -> None:
    """A thread between two jobs was the one to look next; following its site instead, it leaves
    nobody looking: one more thread is grown (at 1,000 slow sites the last 200 waited a minute)."""
    room = IdleRoom()
    room.grow = grower = Grower(room)
    room.most = 10
    room.enter()
    room.enter()
    room.found_work()  # one busy, the other free between two jobs: it looks next
    assert grower.asked == 0
    room.hold_thread()  # ... but it follows its site to its next turn instead
    assert grower.asked == 1 and room.members == 3
    stop = threading.Event()
    assert room.start_look(stop) is True  # the grown one looks
    room.enter()
    room.hold_thread()  # another follows its site while a thread is looking: that one finds the next
    room.hold_thread()
    assert grower.asked == 1
    room.end_look()
    room.most = 4
    room.hold_thread()  # full: nothing grows past its most
    assert grower.asked == 1 and room.members == 4


def test_a_thread_the_pool_could_not_start_is_not_counted() -> None:
    room = IdleRoom()
    room.grow = grower = Grower(room, refuse=True)
    room.most = 5
    room.enter()
    room.found_work()
    assert grower.asked == 1 and room.members == 1
    room.done_work()
    room.found_work()
    assert grower.asked == 2, "a refused start left a phantom thread that looks for work"


def test_a_room_without_a_pool_never_grows() -> None:
    room = IdleRoom()
    room.most = 100
    room.enter()
    room.found_work()
    assert room.members == 1


def test_the_watcher_is_poked_awake_and_a_sleeper_is_woken_by_work_found() -> None:
    room = IdleRoom()
    stop = threading.Event()
    returned: list[float] = []

    def rest() -> None:
        started = time.monotonic()
        room.rest(30.0, stop)
        returned.append(time.monotonic() - started)

    watcher = threading.Thread(target=rest)
    watcher.start()
    time.sleep(0.2)
    sleeper = threading.Thread(target=rest)
    sleeper.start()
    time.sleep(0.2)
    room.poke()  # Redis said work came: the watcher looks now, not in 30 s
    watcher.join(5)
    assert not watcher.is_alive() and len(returned) == 1
    room.found_work()  # the watcher found a job: the sleeper looks too
    sleeper.join(5)
    assert not sleeper.is_alive() and len(returned) == 2
    assert max(returned) < 5


def test_a_look_that_knew_nothing_else_is_due_hands_its_watch_to_the_next_thread_once() -> None:
    """``found_work(quiet_for)``: the next thread to look first watches for that time (``handed_watch``),
    one thread only; none is handed over while a watcher is already there."""
    room = IdleRoom()
    room.found_work(0.3)
    first = room.handed_watch()
    assert 0.25 <= first <= 0.3
    assert room.handed_watch() == 0.0  # taken: the next thread looks at once
    room.found_work()  # nothing known: look at once
    assert room.handed_watch() == 0.0
    room.found_work(0.05)
    time.sleep(0.1)
    assert room.handed_watch() == 0.0  # run out
    stop = threading.Event()
    watcher = threading.Thread(target=room.rest, args=(30.0, stop))
    watcher.start()
    time.sleep(0.1)
    room.found_work(0.3)  # a watcher is there already: it looks when its own wait ends
    assert room.handed_watch() == 0.0
    stop.set()
    room.poke()
    watcher.join(5)


def test_a_grown_thread_unwanted_for_long_retires_and_the_first_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idle, "SLEEPER_CHECK_EVERY", 0.05)
    monkeypatch.setattr(idle, "RETIRE_AFTER", 0.3)
    room = IdleRoom()
    stop = threading.Event()
    answers: dict[str, bool] = {}
    watcher = threading.Thread(target=lambda: answers.setdefault("watcher", room.rest(5.0, stop, may_retire=True)))
    watcher.start()
    time.sleep(0.1)
    first = threading.Thread(target=lambda: answers.setdefault("first", room.rest(5.0, stop, may_retire=False)))
    grown = threading.Thread(target=lambda: answers.setdefault("grown", room.rest(5.0, stop, may_retire=True)))
    first.start()
    grown.start()
    grown.join(5)
    assert answers.get("grown") is True, "a grown thread asleep past RETIRE_AFTER did not retire"
    stop.set()
    first.join(5)
    watcher.join(5)
    assert answers["first"] is False and answers["watcher"] is False


def test_a_paused_thread_ends_at_once_when_the_room_is_drained_and_otherwise_sleeps_its_time() -> None:
    """A thread following its slow site to its next turn (up to PACED_MAX_INTERVAL, 10 s) must not hold
    a drained burst open that long (``IdleRoom.pause``)."""
    room, stop = IdleRoom(), threading.Event()
    started = time.monotonic()
    assert room.pause(0.2, stop) is False
    assert 0.2 <= time.monotonic() - started < 1.0

    ended: list[tuple[bool, float]] = []
    paused = threading.Thread(target=lambda: ended.append((room.pause(30.0, stop), time.monotonic())))
    paused.start()
    time.sleep(0.2)
    drained_at = time.monotonic()
    room.end_all()
    paused.join(5)
    assert ended and ended[0][0] is True and ended[0][1] - drained_at < 0.5

    room = IdleRoom()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    assert room.pause(30.0, stop) is True
    assert time.monotonic() - started < idle.SLEEPER_CHECK_EVERY + 0.5  # a stop is seen within a check
