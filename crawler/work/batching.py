"""How a site's download jobs carry its URLs (``Batching``): many for a fast site, a paced span for a slow one.

A pure decision (``batching_for``) from the site's policy, its robots.txt Crawl-delay and what
this process saw of its answers (``SiteMemory``): no Redis, no clock but the one it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..coord.policy import SitePolicy, effective_interval
from ..coord.scheduler import PREPARE_AHEAD
from ..coord.vetting import MAX_BATCH

#: A site whose fixed interval in force (margin included) is at most this many seconds gets
#: batch jobs (``batch_size``): a worker between two of a batch's URLs then waits for the gate
#: no longer than it waits for a job handed out ahead of its gate (``PREPARE_AHEAD``).
BATCH_BELOW = PREPARE_AHEAD
#: Longest wait for the gate before a fast site's batch's second and later URLs, beyond the
#: interval for a slow site's (``Batching.gate_wait``); past it the rest of the batch goes back
#: to the front of the frontier (the site was closed or slowed meanwhile).
BATCH_GATE_WAIT = 0.1
#: Seconds of a slow site's requests one job carries at most (``Batching``): its thread waits on
#: the gate between them, so RQ's per-job costs (the claim, the refill, the finish) are shared by
#: up to MAX_BATCH requests. A graceful stop, a pause and a new higher priority are seen before
#: each URL, so a longer span does not keep them waiting.
PACED_BATCH_SPAN = 40.0
#: Shortest interval in force (seconds) for which a slow site's jobs are paced batches: below it,
#: responses often take longer than the interval, and one thread in turn could not keep up.
PACED_MIN_INTERVAL = 0.5
#: Longest interval in force (seconds) for which a slow site's jobs are paced batches. A paced
#: batch holds its thread for its whole span, so the threads a process needs follow the sites it
#: serves at once (``launcher.MOST_DOWNLOAD_THREADS``); beyond this a span holds too few requests
#: to be worth a thread held that long.
PACED_MAX_INTERVAL = 10.0
#: A slow site whose batch's requests came on average more than this many intervals apart,
#: its last answer having taken at least SLOW_ANSWER of the interval (responses about as slow as
#: its interval: a thread in turn cannot keep up, several would), goes back to one URL a job for
#: UNBATCHED_FOR seconds.
LATE_SPACING = 1.25
UNBATCHED_FOR = 120.0
#: Share of the interval a site's answer must take for a late batch to be the site's doing.
#: With faster answers the lateness is the workers' own (a loaded machine), and one URL a job
#: would only add to the load: RQ's bookkeeping, a look and a claim for each request.
SLOW_ANSWER = 0.75


@dataclass(frozen=True)
class Batching:
    """How a site's download jobs carry its URLs (``batching_for``).

    ``size``: URLs a job carries. ``paced``: the site is slow, and a job's thread waits on the
    gate between its URLs; each page's record goes at once (the parse workers see it without
    waiting for the batch) and the job's progress is saved before each wait, and the scheduler
    holds the site out of other workers' picks for the batch's span (``batch`` in its conf),
    until the job gives it back (``Scheduler.batch_over``). ``interval``: in force, margin included.
    """

    size: int = 1
    paced: bool = False
    interval: float = 0.0

    @property
    def slow(self) -> bool:
        """A fixed interval beyond BATCH_BELOW: NEXT_JOB may hold the site for a batch's span (the conf's
        ``batch``, which another process may have written while this one batches the site no more), so
        every job of the site ends with ``Scheduler.batch_over``."""
        return self.interval > BATCH_BELOW

    @property
    def gate_wait(self) -> float:
        """Longest wait for the gate before a batch's second and later URLs."""
        return 2 * self.interval + BATCH_GATE_WAIT if self.paced else BATCH_GATE_WAIT


def batching_for(policy: SitePolicy, crawl_delay: float, margin: float, http_cache: bool, unbatched: bool) -> Batching:
    """How a site's download jobs carry its URLs: MAX_BATCH for a fast site, a span's worth for a slow one.

    Fast: a fixed interval whose value in force (robots.txt ``crawl_delay`` and ``margin``
    included) is at most BATCH_BELOW, so the gate is seldom what a worker waits for, and
    per-job costs (RQ's bookkeeping, the scheduler's call) are shared by the batch's URLs.
    Slow: a fixed interval from PACED_MIN_INTERVAL to PACED_MAX_INTERVAL; a job carries as
    many URLs as fit in PACED_BATCH_SPAN (at most MAX_BATCH), fetched in turn by one thread
    that waits on the gate between them (``Batching.paced``). One URL a job: any other
    interval, an adaptive interval (which may grow at any time), the development cache
    (which takes the gate only on a miss), a site allowed several requests in flight
    (``concurrency``: its requests overlap, a batch's would not), and a site ``unbatched``
    for now (``late_batch``).
    """
    if policy.auto is not None or http_cache:
        return Batching()
    interval, _ = effective_interval(policy, crawl_delay)
    interval += margin
    if interval <= BATCH_BELOW:
        return Batching(MAX_BATCH, False, interval)
    if not PACED_MIN_INTERVAL <= interval <= PACED_MAX_INTERVAL or (policy.concurrency or 1) > 1 or unbatched:
        return Batching(1, False, interval)
    size = max(1, min(MAX_BATCH, int(PACED_BATCH_SPAN // interval)))
    return Batching(size, size > 1, interval)


def late_batch(steps: int, seconds: float, batching: Batching, last_answer: float | None) -> bool:
    """Whether a paced batch that took ``seconds`` for ``steps`` URLs after its first should make its site
    one URL a job for UNBATCHED_FOR seconds: more than LATE_SPACING intervals each, the site's last answer
    (``last_answer`` seconds; None: none came) having taken SLOW_ANSWER of an interval or more."""
    late = steps > 0 and seconds / steps > LATE_SPACING * batching.interval
    slow = last_answer is None or last_answer >= SLOW_ANSWER * batching.interval
    return late and slow
