"""Backoff: waits that double with each failure in a row, from a first one up to a cap.

``backoff`` is the wait after the n-th failure in a row; ``Backoff`` counts the failures of
one loop (Redis or a database that does not answer, a lock that is not free) and says how
long to wait before the next try. Jitter is "equal jitter" (a uniform draw from half the
wait to all of it), so clients that failed together do not come back together.
"""

from __future__ import annotations

import math
import random

#: First wait of a worker's loop while Redis or the database does not answer, seconds (``outage_waits``).
OUTAGE_WAIT_FIRST = 0.5
#: Longest such wait, seconds: once it is back, the loop notices within this.
OUTAGE_WAIT_MOST = 30.0


def backoff(
    first: float, failures: int, cap: float = math.inf, jitter: bool = False, rng: random.Random | None = None
) -> float:
    """The wait after ``failures`` failures in a row: ``first`` × 2^(failures − 1), at most ``cap``
    (``first`` for a first failure, and for none). With ``jitter``, a uniform draw (from ``rng``,
    else the ``random`` module) from half that wait to all of it."""
    try:
        step = min(math.ldexp(first, max(0, failures - 1)), cap)
    except OverflowError:  # doubled past any float: the cap, if any
        step = cap
    if not jitter:
        return step
    return step / 2 + (rng or random).uniform(0, step / 2)


class Backoff:
    """The waits of one retrying loop: ``next`` after each failure (``first``, doubling up to ``cap``),
    ``reset`` after a success. ``failures`` counts the failures in a row (0: none, nothing waited)."""

    def __init__(self, first: float, cap: float):
        self.first = first
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        """One more failure: the seconds to wait before the next try."""
        self.failures += 1
        return backoff(self.first, self.failures, self.cap)

    def reset(self) -> None:
        """A success: the next failure waits ``first`` again."""
        self.failures = 0


def outage_waits() -> Backoff:
    """The waits of a worker's loop while Redis or the database does not answer: OUTAGE_WAIT_FIRST,
    doubling up to OUTAGE_WAIT_MOST."""
    return Backoff(OUTAGE_WAIT_FIRST, OUTAGE_WAIT_MOST)
