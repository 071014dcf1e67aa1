"""The Redis outage a process's download threads wait out together."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from crawler.work.outage import Outage


def _waiting(outage: Outage, seconds: float, stop: threading.Event) -> tuple[threading.Thread, list[float]]:
    """A thread that notes a failure and waits ``seconds``; the list gets how long it waited."""
    waited: list[float] = []

    def wait_out() -> None:
        seen = outage.down(ConnectionError("refused"))
        start = time.monotonic()
        outage.wait(seconds, seen, stop)
        waited.append(time.monotonic() - start)

    thread = threading.Thread(target=wait_out)
    thread.start()
    return thread, waited


def test_every_waiting_thread_tries_again_as_soon_as_one_finds_redis_back() -> None:
    outage, stop = Outage(logging.getLogger("test")), threading.Event()
    waiters = [_waiting(outage, 30.0, stop) for _ in range(5)]
    time.sleep(0.2)
    outage.back()
    for thread, _ in waiters:
        thread.join(5)
    assert all(len(waited) == 1 and waited[0] < 5 for _, waited in waiters)
    assert not outage.is_down


def test_a_wait_ends_after_its_seconds_while_redis_stays_away() -> None:
    outage, stop = Outage(logging.getLogger("test")), threading.Event()
    thread, waited = _waiting(outage, 0.3, stop)
    thread.join(5)
    assert 0.29 <= waited[0] < 5 and outage.is_down


def test_a_stopped_thread_stops_waiting() -> None:
    outage, stop = Outage(logging.getLogger("test")), threading.Event()
    thread, waited = _waiting(outage, 30.0, stop)
    time.sleep(0.1)
    stop.set()
    thread.join(5)
    assert waited and waited[0] < 5 and outage.is_down


def test_a_failure_after_the_outage_ended_is_a_new_outage() -> None:
    """A thread that fails again after Redis came back waits its own backoff: the end of the last outage
    does not cut the new one short."""
    outage, stop = Outage(logging.getLogger("test")), threading.Event()
    first = outage.down(ConnectionError("refused"))
    outage.back()
    second = outage.down(ConnectionError("refused again"))
    assert second != first
    start = time.monotonic()
    outage.wait(0.3, second, stop)
    assert time.monotonic() - start >= 0.29
    start = time.monotonic()
    outage.wait(30.0, first, stop)  # an outage over already: no wait
    assert time.monotonic() - start < 1


def test_an_outage_is_logged_once_for_the_process_not_once_a_thread(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(logging.getLogger("test.outage"))
    with caplog.at_level(logging.INFO, logger="test.outage"):
        for _ in range(10):
            outage.down(ConnectionError("Connection refused\nmore"))
        for _ in range(3):
            outage.back()
    assert [r.getMessage() for r in caplog.records] == [
        "Redis unreachable (Connection refused): waiting and reconnecting",
        "Redis is back: resuming",
    ]
