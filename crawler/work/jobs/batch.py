"""A download job's URLs fetched in turn: one URL, a fast site's batch or a slow site's paced batch.

Each URL goes through the gate and on as a job of its own would (``attempt.download_one``).
Before each of a batch's second and later URLs, ``_Batch.stop_reason`` says whether the batch
goes on; when it does not (a ``StopReason``), or the gate stays closed past
``Batching.gate_wait``, the rest of the batch goes back to the front of the site's frontier,
in order, to be made into jobs again.

A fast site's batch holds its URLs' records back (``events.HeldRecords``) and writes them
together: at its end, before a record that must go at once (an error, a retry), and when it
stops on an exception. A slow site's batch (``Batching.paced``: its thread waits on the gate
between URLs) hands each record to its process's writer, to be written with other threads'
(``events.SoonRecords``), and waits until it is. Between its URLs the thread rests until
FOLLOW_AHEAD before the gate opens (``_rest_until_turn``); a URL robots.txt refuses, as this
process knows it, needs no rest (``_takes_turn``). Its progress and the site's settings ride
in the write of the record before (``_Look``), or go in a look of their own after the rest
when that record went alone; the take of the gate asks along whether work of a higher
priority waits (``_outranked_by``). The job's meta counts the URLs done
(``joblife.BATCH_DONE``), so a batch retried skips what is saved done. When any job of a slow
site ends (NEXT_JOB held the site for a batch's span), the scheduler has the site due again
as its gate opens (``Scheduler.batch_over``).
"""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from rq import get_current_job

from ...coord import joblife
from ...coord.gate import Unless
from ...coord.priorities import Rider, higher_waits, look_for_higher, outranked
from ...coord.scheduler import FOLLOW_AHEAD
from ...coord.task import DownloadTask
from .. import runtime
from ..events import HeldRecords, SoonRecords
from .attempt import download_one
from .context import SiteContext, site_context
from .state import user_agent

log = logging.getLogger("crawler.jobs")

#: Seconds before a paced batch's next request is prepared by which its last record is written (``SoonRecords``).
WRITE_AHEAD = 0.02


class StopReason(enum.Enum):
    """Why a batch stopped before one of its URLs; that URL and the rest go back to the frontier."""

    #: The worker is stopping (a graceful stop), checked before each URL.
    STOPPING = "stopping"
    #: Every thread the worker's process may have is busy (a paced batch): other sites' jobs get threads in turn.
    CROWDED = "crowded"
    #: The rest until the site's turn was cut short by a graceful stop (a paced batch).
    REST_INTERRUPTED = "rest interrupted"
    #: Work of a higher priority than the batch's waits (a paced batch: ``frontier.outranked``).
    OUTRANKED = "outranked"
    #: The site is paused.
    PAUSED = "paused"
    #: The gate stayed closed past ``Batching.gate_wait`` (the site was closed or slowed meanwhile),
    #: or the take was given up because work of a higher priority waits (``_outranked_by``).
    GATE_NOT_TAKEN = "gate not taken"


def run(
    rt: runtime.Runtime,
    payloads: tuple[dict[str, Any], ...],
    stopping: Callable[[], bool] | None = None,
    crowded: Callable[[], bool] | None = None,
    finishing: list[joblife.Finishing] | None = None,
    rest: Callable[[float], bool] | None = None,
) -> None:
    """Download ``payloads``, the URLs of one job (one site, one priority), in turn (see ``download``)."""
    job = get_current_job()
    first = joblife.batch_done(job) if job is not None else 0
    task = DownloadTask.from_json(payloads[first])
    site, priority = task.site, task.priority  # one site and one priority per job (``vetting``, ``refill``)
    context = site_context(rt, site)  # the first URL's; a batch reads one for each of its next URLs
    if len(payloads) == 1:
        try:
            download_one(rt, context, payloads[0], None)
        finally:
            if context.batching.slow:  # held for a batch's span by NEXT_JOB, which cannot tell this job is one URL
                _batch_over(rt, site, finishing)
        return
    batch = _Batch(rt, payloads, job, first, context, priority)
    batch.stopping, batch.crowded, batch.rest, batch.finishing = stopping, crowded, rest, finishing
    batch.run()


class _Batch:
    """A job of several URLs of one site and priority, fetched in turn by ``run``. How they are carried
    (``batching``) is the first URL's context's, for the whole job."""

    def __init__(
        self,
        rt: runtime.Runtime,
        payloads: tuple[dict[str, Any], ...],
        job: Any,
        first: int,
        context: SiteContext,
        priority: int,
    ):
        self.rt, self.payloads, self.job, self.first = rt, payloads, job, first
        site, batching = context.site, context.batching
        self.site, self.priority, self.batching = site, priority, batching
        #: The site as read for the URL about to be fetched (``stop_reason`` reads it for each next URL).
        self.context = context
        self.held = _soon_records(rt, site) if batching.paced else HeldRecords(rt.sink)
        #: What a paced batch's takes of the gate ask along: whether work of a higher priority waits.
        self.unless = _outranked_by(site, priority) if batching.paced else None
        self.stopping: Callable[[], bool] | None = None
        self.crowded: Callable[[], bool] | None = None
        self.rest: Callable[[float], bool] | None = None
        self.finishing: list[joblife.Finishing] | None = None
        #: The URLs done (written, for a paced batch), counting those done by an earlier run of the job.
        self.done = first

    def run(self) -> None:
        """Fetch the URLs in turn, until the last or until the batch stops (``stop_reason``)."""
        rt, held, paced = self.rt, self.held, self.batching.paced
        complete = False
        paced_since = time.monotonic()
        look: _Look | None = None  # the look before URL i, riding in URL i - 1's record (a paced batch's)
        try:
            for i in range(self.first, len(self.payloads)):
                rode = look is not None and look.rode
                look = self._look_ahead(i)
                if i == self.first:  # the URL the job was handed out for: it waits for its gate
                    download_one(rt, self.context, self.payloads[i], None, held)
                    paced_since = time.monotonic()
                else:  # the site may have been paused, closed or slowed since
                    reason = self.stop_reason(i, rode)
                    if reason is None and not download_one(
                        rt, self.context, self.payloads[i], self.batching.gate_wait, held, self.unless
                    ):
                        reason = StopReason.GATE_NOT_TAKEN
                    if reason is not None:
                        self.hand_back(i, reason)
                        return
                if paced:  # written before the URL counts as done: a batch retried fetches it again
                    held.flush()
                self.done = i + 1
            if paced:
                rt.batch_paced(self.site, self.done - self.first - 1, time.monotonic() - paced_since, self.batching)
            complete = True
        finally:
            self.end(complete)

    def _look_ahead(self, i: int) -> _Look | None:
        """For a paced batch, the look before URL ``i + 1``, set to ride in URL ``i``'s record (``_Look``)."""
        if not isinstance(self.held, SoonRecords):
            return None
        look = _Look(self.rt, self.site, self.job, i + 1) if i + 1 < len(self.payloads) else None
        self.held.ride(look)
        return look

    def stop_reason(self, i: int, rode: bool) -> StopReason | None:
        """Why the batch stops before its URL ``i`` (not its first), or None: it goes on.

        Asked in this order: a graceful stop; for a paced batch, a crowded process, then the rest
        until the site's turn (a wait, cut short by a graceful stop), then, when the look before
        this URL did not ride in the record before it (``rode``), a look of its own for work of a
        higher priority (a round trip, which also saves the progress and reads the site's settings
        when due); last, the site's pause, by the context read for this URL (``context``: a round
        trip only when the site's settings are due and did not ride along).
        """
        rt, site = self.rt, self.site
        if self.stopping is not None and self.stopping():
            return StopReason.STOPPING
        if self.batching.paced:
            if self.crowded is not None and self.crowded():
                return StopReason.CROWDED
            if _takes_turn(rt, self.payloads[i]):
                rested = _rest_until_turn(rt, site, self.rest)
                if not rested:
                    return StopReason.REST_INTERRUPTED
            if not rode:
                between = _between_urls(rt, site, self.job, i)
                if outranked(rt.connection, site, self.priority, between):
                    return StopReason.OUTRANKED
        self.context = site_context(rt, site)
        if self.context.policy.paused:
            return StopReason.PAUSED
        return None

    def hand_back(self, i: int, reason: StopReason) -> None:
        """The batch stops before URL ``i`` for ``reason``: what it holds is written, and URL ``i`` and
        the rest go back to the front of the site's frontier, in order."""
        log.debug("%s: batch stops before URL %d of %d: %s", self.site, i + 1, len(self.payloads), reason.value)
        self.held.flush()
        self.rt.frontier(self.site).hand_back([DownloadTask.from_json(p) for p in self.payloads[i:]])
        self.done = len(self.payloads)

    def end(self, complete: bool) -> None:
        """Whatever happened: what is held written, the progress saved unless the batch is done in full
        (its finish deletes it: no need to save that it is, a round trip a job), and a slow site's turn
        given back (``_batch_over``)."""
        self.held.flush()
        if self.job is not None and self.done > self.first and not complete:
            joblife.save_batch_done(self.job, self.done)
        if self.batching.slow:
            _batch_over(self.rt, self.site, self.finishing)


def _batch_over(rt: runtime.Runtime, site: str, finishing: list[joblife.Finishing] | None) -> None:
    """``Scheduler.batch_over`` for ``site``: left to the job's worker when it gives ``finishing``, else now."""
    if finishing is None:
        rt.scheduler.batch_over(site)
    else:
        finishing.append(functools.partial(rt.scheduler.batch_over_in, site=site))


def _soon_records(rt: runtime.Runtime, site: str) -> SoonRecords:
    """Where a paced batch of ``site`` hands its records: to its process's writer, to be written with
    others' before the batch's next request is prepared (WRITE_AHEAD before ``_rest_until_turn`` ends)."""
    return SoonRecords(rt.record_writer, lambda: rt.gate_opens_at(site) - FOLLOW_AHEAD - WRITE_AHEAD)


def _rest_until_turn(rt: runtime.Runtime, site: str, rest: Callable[[float], bool] | None) -> bool:
    """Wait with ``rest`` until FOLLOW_AHEAD before ``site``'s gate opens, as this process's last send
    rearmed it (``Runtime.gate_opens_at``), so the next URL's steps up to the gate are done by then;
    False when ``rest`` said stop meanwhile. Without ``rest`` (a direct call), nothing: the gate's
    own wait is the wait."""
    left = rt.gate_opens_at(site) - FOLLOW_AHEAD - time.monotonic()
    return rest is None or left <= 0 or not rest(left)


def _takes_turn(rt: runtime.Runtime, payload: dict[str, Any]) -> bool:
    """Whether the URL of ``payload`` may take its site's next turn, as far as this process knows without
    asking anyone: False when robots.txt rules held here refuse it (it is then recorded refused without a
    request, and a paced batch does not rest for it). By the spider and policy as last read: asked
    before the rest, it reads nothing (the look after the rest does)."""
    task = DownloadTask.from_json(payload)
    if not rt.sites.held_policy(task.site).obey_robots:
        return True
    return not rt.robots.refuses(task.site, task.url, user_agent(rt, rt.sites.held_spider(task.site), task))


def _between_urls(rt: runtime.Runtime, site: str, job: Any, done: int, always: bool = False) -> Rider:
    """What a paced batch sends with its look for work of a higher priority before its next URL
    (``frontier.outranked``): that its first ``done`` URLs are done (``job`` None: run directly,
    nothing to save), so a batch retried skips them; and its site's live settings and spider arguments
    when due for a re-read (``SiteReads.read_site_along``), for the pause check and the URL's steps that
    follow."""

    def also(pipe: Any) -> Callable[[list[Any]], None] | None:
        base = len(pipe)  # the replies it is given start at its first command
        if job is not None:
            joblife.save_batch_done(job, done, pipe)
        start = len(pipe) - base
        keep = rt.sites.read_site_along(pipe, site, always)
        if keep is None:
            return None
        return lambda replies: keep(replies[start:])

    return also


class _Look:
    """What a paced batch sends before its next URL (``_between_urls``), riding in the write of the
    record of the URL before it (``SoonRecords.ride``); the look for work of a higher priority rides
    in the take of the gate (``_outranked_by``), as fresh as it can be. ``rode``: whether it went (not
    when the record went at once, on its own, or never came: the batch then looks on its own after
    the rest, ``_Batch.stop_reason``)."""

    def __init__(self, rt: runtime.Runtime, site: str, job: Any, done: int):
        # Read whether due or not: the write may come well before the URL's steps (records are written
        # together as the first is due), and a read skipped then would be a round trip of its own later.
        self.between = _between_urls(rt, site, job, done, always=True)
        self.rode = False

    def __call__(self, pipe: Any) -> Callable[[list[Any]], None]:
        keep = self.between(pipe)

        def answer(replies: list[Any]) -> None:
            if keep is not None:
                keep(replies)
            self.rode = True

        return answer


def _outranked_by(site: str, priority: int) -> Unless:
    """What a paced batch's take of the gate asks along: whether work of a higher priority than the
    batch's waits (``frontier.outranked``), so that a seed waits for the request in flight, not
    for the rest of the batch; the take is then given up and the batch handed back."""

    def unless(pipe: Any) -> Callable[[list[Any]], bool]:
        look_for_higher(pipe, site)
        return lambda replies: higher_waits(replies, priority)

    return unless
