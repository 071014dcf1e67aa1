"""The one backoff helper: waits that double from a first one up to a cap, with equal jitter if asked."""

from __future__ import annotations

import math
import random

import pytest

from crawler.backoff import OUTAGE_WAIT_FIRST, OUTAGE_WAIT_MOST, Backoff, backoff, outage_waits


def test_the_wait_doubles_with_each_failure_in_a_row_up_to_its_cap() -> None:
    assert [backoff(0.5, n, 30.0) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff(0.5, 0, 30.0) == 0.5  # no failure yet: the first wait


def test_without_a_cap_the_wait_keeps_doubling_and_never_overflows() -> None:
    assert [backoff(0.2, n) for n in (1, 2, 5)] == [0.2, 0.4, 3.2]
    assert backoff(60.0, 5000, 3600.0) == 3600.0  # a robots.txt outage of months: no OverflowError
    assert backoff(1.0, 5000) == math.inf


def test_equal_jitter_draws_from_half_the_wait_to_all_of_it() -> None:
    rng = random.Random(42)
    pauses = [backoff(2.0, 3, 60.0, jitter=True, rng=rng) for _ in range(500)]
    assert all(4.0 <= pause <= 8.0 for pause in pauses)
    assert max(pauses) - min(pauses) > 3.0  # spread, not one value
    assert backoff(2.0, 3, 60.0, jitter=True, rng=random.Random(7)) == 4.0 + random.Random(7).uniform(0, 4.0)


def test_a_loop_s_waits_double_while_it_fails_and_start_over_after_a_success() -> None:
    waits = Backoff(0.5, 30.0)
    assert waits.failures == 0
    assert [waits.next() for _ in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert waits.failures == 8
    waits.reset()
    assert waits.failures == 0 and waits.next() == 0.5


def test_outage_waits_go_from_half_a_second_to_thirty() -> None:
    waits = outage_waits()
    assert (OUTAGE_WAIT_FIRST, OUTAGE_WAIT_MOST) == (0.5, 30.0)
    assert [waits.next() for _ in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


@pytest.mark.parametrize("n", range(1, 40))
def test_each_former_formula_gives_the_same_waits(n: int) -> None:
    """The nine formulas it replaced, each with its own cap, as they were written."""
    # retries (``outcomes.retry_or_fail``) and a schema upgrade SQLite found locked (``Store._upgrade``)
    assert backoff(0.2, n) == 0.2 * 2 ** (n - 1)
    assert backoff(0.1, n) == 0.1 * 2 ** (n - 1)
    # a site's gate closed after errors in a row, from the third (ERRORS_BEFORE_PAUSE) on
    errors = n + 2
    assert backoff(0.2, errors - 3 + 1, 300.0) == min(0.2 * 2 ** (errors - 3), 300.0)
    # robots.txt asked again (``robots.Outage.next``), with or without a longer Retry-After
    for retry_after in (None, 90.0, 7200.0):
        old = min(max(60.0 * 2 ** (n - 1), retry_after or 0.0), 3600.0)
        assert min(max(backoff(60.0, n, 3600.0), retry_after or 0.0), 3600.0) == old
    # a throttled site's pause (``pacing.throttle_pause``), jitter from the same draw
    step = min(2.0 * 2 ** max(0, n - 1), 60.0)
    assert backoff(2.0, n, 60.0, jitter=True, rng=random.Random(n)) == step / 2 + random.Random(n).uniform(0, step / 2)
    # the workers' waits for Redis or the database, and the SQLite writer's turn (``write_turns``)
    wait, pause = 0.0, 0.0005
    for _ in range(n - 1):
        wait, pause = min(max(wait * 2, 0.5), 30.0), min(pause * 2, 0.004)
    assert backoff(0.5, n, 30.0) == min(max(wait * 2, 0.5), 30.0)
    assert backoff(0.0005, n, 0.004) == pause


def test_a_robots_txt_outage_of_months_is_asked_again_hourly_without_overflowing() -> None:
    """Asked hourly for 60 days, an outage counts some 1,440 failures: 60 s × 2^1440 is past any float."""
    from crawler.work.robots import ROBOTS_RETRY_MAX, Outage

    outage = Outage(since=0.0, failures=1440, retry_at=0.0, reason="HTTP 503").next("HTTP 503", now=1000.0)
    assert outage.failures == 1441 and outage.retry_at == 1000.0 + ROBOTS_RETRY_MAX
