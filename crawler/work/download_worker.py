"""Download workers: the download queues of a process's sites, served gate-aware, a paced site followed to its turn."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis import Redis
from rq import Queue
from rq.job import Job

from ..coord import joblife, keys
from ..coord.replies import text
from ..coord.scheduler import FOLLOW_AHEAD, JOBS_AHEAD, Next, Scheduler, mark_ready
from . import idle, runtime
from .batching import PACED_MAX_INTERVAL
from .crawl_worker import CrawlWorker
from .drain import held_here, queues_for

log = logging.getLogger("crawler.workers")

#: Seconds between two idle looks for sites with work missing from the ready set.
REPAIR_EVERY = 5.0
#: Sites one such look reads (two commands each), in turn: its cost is bounded whatever the sites' number.
REPAIR_SITES = 25
#: Seconds between two looks for sites with work that no worker of this process serves (to warn).
WARN_UNSERVED_EVERY = 30.0
#: Picks in one look (a site served elsewhere, a job gone) before the worker loops back to its checks.
MAX_TAKES = 8
#: Longest a thread that finished a paced batch waits for that site's gate to take its next
#: job itself (``DownloadWorker.follow``); a longer wait is left to the ready set and the lookers.
FOLLOW_WAIT = PACED_MAX_INTERVAL
#: Longest a thread that finished a paced batch waits for new work of its site when it has none
#: (``DownloadWorker.follow``): the links of its last pages, on their way through a parse worker.
WORK_WAIT = 2.0


class DownloadWorker(CrawlWorker):
    """Serves the download queues of ``sites``, always taking a site whose gate is open.

    ``PICK_SITE`` names the first due site and ``NEXT_JOB`` hands over one of its jobs if
    its gate opens soon (``scheduler.Scheduler.next``; a worker of one site skips the
    pick), so the worker never sits behind one closed gate while another site has budget;
    when every gate with work is closed it sleeps until the first one opens. The job takes
    the gate right before its request. After the job, the site's RQ queue is topped up from
    its compact frontier if the call asked for it.
    """

    def __init__(self, connection: Redis, sites: Sequence[str], *, rt: runtime.Runtime, **kwargs: Any):
        # Made once per process, not per thread: hundreds of threads each holding a queue
        # object and the scheduler's keys for every site would multiply their memory.
        shared = idle.shared(rt, type(self), sites)
        queues = shared.made("queues", lambda: queues_for(connection, (keys.download_queue(s) for s in sites)))
        super().__init__(queues, connection, sites, rt=rt, **kwargs)
        self._by_site: dict[str, Queue] = shared.made("by_site", lambda: dict(zip(sites, queues, strict=True)))
        # Always the sites this worker has spiders for: a site seeded elsewhere, or whose
        # spider failed to load here, is never handed to it (it would hand it back, again and again).
        self.site_scheduler: Scheduler = shared.made(
            "scheduler", lambda: Scheduler(connection, sites, rt.settings.job_lease)
        )
        self._refill: str | None = None
        self._warned: set[str] = set()
        self._site_of: dict[str, str] = shared.made("site_of", lambda: {q.name: s for s, q in self._by_site.items()})
        #: The site this thread takes its next job of outside the lookers' room (``follow``), when its
        #: gate opens (monotonic), and whether a look handed it over (its queue dry; the thread counted busy).
        self._follow: tuple[str, float, bool] | None = None

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        while True:
            found = self.follow() or super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            if found is not None or self._follow is None:
                return found
            if self.stop_event.is_set():  # the look's hand-off is left: its thread is free again
                self._follow = None
                self._idle.room.done_work()
                return None
            # The look handed this thread a site whose queue ran dry: it refills it in ``follow``.

    def _handed_off(self) -> bool:
        return self._follow is not None

    def follow(self) -> tuple[Job, Queue] | None:
        """The next job of the site whose paced batch this thread just ran, taken ahead of its gate, if any.

        When a paced batch ends, its site is due again as its gate opens (``BATCH_OVER``); left
        to the ready set, its next job waits for a looker, whose sleep was set before the site
        came due, up to a second later. The thread that ran it knows when the gate opens (its own
        send rearmed it): it sleeps until FOLLOW_AHEAD before (FOLLOW_WAIT at most) and asks for
        that site's next job alone (NEXT_JOB), outside the lookers' room; the job's gate wait does
        the rest. When the site has no work yet (its last pages' links are still with a parse
        worker), the thread waits WORK_WAIT for work of it to be announced (``IdleRoom.expect``)
        and asks again. None: no job (taken by another worker, no work came), and the thread looks as usual. A look
        that met a site whose RQ queue ran dry hands it here too (``next_job``): refilled, then taken.
        """
        follow, self._follow = self._follow, None
        if follow is None:
            return None
        site, opens_at, handed = follow
        room = self._idle.room
        wait = opens_at - FOLLOW_AHEAD - time.monotonic()
        if wait > FOLLOW_WAIT:
            return None
        if not handed:  # a look's hand-off was counted busy by the look (``found_work``)
            room.hold_thread()
        found: tuple[Job, Queue] | None = None
        # A dry queue handed by a look has work: no need to wait for any (nor to take another
        # thread's expectation of the site's work).
        announced = None if handed else room.expect(site)
        try:
            if wait > 0 and room.pause(wait, self.stop_event):  # a burst that drained meanwhile ends at once
                return None
            awaited = announced is None
            for _ in range(MAX_TAKES):
                step = self._take_followed(site, handed)
                handed = False
                if step is None or isinstance(step, tuple):
                    found = step
                    return found
                if step.wait is not None and step.wait <= FOLLOW_WAIT:  # due later: its gate, a refill
                    if room.pause(step.wait, self.stop_event):
                        return None
                elif step.wait is None and not awaited:  # no work now: its links may be on their way
                    awaited = True
                    assert announced is not None
                    if not room.await_work(announced, WORK_WAIT, self.stop_event):
                        return None
                else:
                    return None
            return None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._redis_down(exc)
            return None
        finally:
            if announced is not None:
                room.unexpect(site, announced)
            if found is None:
                room.done_work()

    def _take_followed(self, site: str, handed: bool) -> tuple[Job, Queue] | Next | None:
        """``follow``'s ask for ``site``'s next job, FOLLOW_AHEAD before its gate opens: the job, or the
        scheduler's answer without one (when to ask again, or no work), or None (the job was gone).
        ``handed``: a look found the site's queue dry (NEXT_JOB said so and holds the site for the refill)."""
        step = Next(site=site, refill=True) if handed else self.site_scheduler.next_of(site, FOLLOW_AHEAD)
        if step.site is not None and step.job_id is None:  # its RQ queue ran dry: refill, then take
            self.runtime.publish(site)  # the politeness NEXT_JOB reads, kept fresh as the site's work is made
            self.runtime.frontier(site).refill(JOBS_AHEAD, due_now=True)
            step = self.site_scheduler.next_of(site, FOLLOW_AHEAD)
        if step.site is None or step.job_id is None:
            return step if step.site is None else None
        queue = self._by_site[site]
        job = joblife.fetch(self.connection, step.job_id, queue, step.job_hash)
        if job is None:
            return None
        self._refill = site if step.refill else None
        return job, queue

    def next_job(self) -> tuple[tuple[Job, Queue] | None, float | None]:
        scheduler = self.site_scheduler
        for _ in range(MAX_TAKES):
            # Every answer is used in the look that asked for it: a job handed out and then
            # left behind would sit in RQ's intermediate list until the reaper's next pass.
            step = scheduler.next()
            if step.site is not None and step.site not in self._by_site:
                self._give_back(step)
                continue
            if step.job_id is not None:
                assert step.site is not None
                queue = self._by_site[step.site]
                job = joblife.fetch(self.connection, step.job_id, queue, step.job_hash)
                if job is None:
                    continue
                self._refill = step.site if step.refill else None
                self.quiet_for = step.quiet_for
                return (job, queue), None
            if step.site is None:
                return None, step.wait
            # Its RQ queue ran dry: this thread compacts entries into jobs and takes the site's turn
            # outside the lookers' room (``follow``), so the refill's round trips hold up no look.
            self._follow = (step.site, 0.0, True)
            return None, 0.0
        return None, 0.0

    def when_idle(self) -> None:
        """Mark ready any served site that has work but is missing from the ready set.

        Jobs put straight into an RQ queue, or a ready set lost with a Redis restart,
        would otherwise never be seen. Costs a round trip per idle second, never while busy:
        REPAIR_SITES sites a look, in turn, so every site is read once in sites /
        REPAIR_SITES seconds of idle time (the first look after a start reads them all), of those given
        work on this Redis (``drain.held_here``: on one of several shards, not the fleet's).
        The process's counts are written too once it has stopped counting, so a crawl at
        rest shows exact totals (``counters.Counters.flush_if_quiet``).
        """
        self.runtime.counters.flush_if_quiet()
        if not self._idle.every.due("repair", REPAIR_EVERY):  # once a period per process
            return
        turn = next(self._idle.made("repair", itertools.count))
        sites = list(self._by_site)
        looked = sites
        if turn and len(sites) > REPAIR_SITES:
            start = (turn - 1) * REPAIR_SITES % len(sites)
            looked = (sites + sites)[start : start + REPAIR_SITES]
        # Only sites ever given work on this Redis can have any here: on one of several shards, the
        # first look read every site of the fleet (two commands each) for a third of them.
        looked = held_here(self.connection, looked)
        if not looked:
            return
        with self.connection.pipeline(transaction=False) as pipe:
            for site in looked:
                pipe.llen(self._by_site[site].key)
                pipe.zcard(keys.levels(site))
            replies = pipe.execute()
        mark_ready(self.connection, {s: 0 for i, s in enumerate(looked) if replies[2 * i] or replies[2 * i + 1]})
        if self._idle.every.due("unserved", WARN_UNSERVED_EVERY):
            self._warn_unserved()

    def _warn_unserved(self) -> None:
        """Say once per site that a site with work waiting has no spider in this worker."""
        others = sorted({text(s) for s in self.connection.smembers(keys.sites())} - set(self._by_site) - self._warned)
        if not others:
            return
        with self.connection.pipeline(transaction=False) as pipe:
            for site in others:
                pipe.zscore(keys.ready(), site)
            waiting = pipe.execute()
        for site, score in zip(others, waiting, strict=True):
            if score is not None:
                self._warned.add(site)
                log.warning(
                    "site %r has work but no spider in this worker (not loaded here, or its module "
                    "failed to load): left to other workers",
                    site,
                )

    def _give_back(self, step: Next) -> None:
        """Return a job of a site this worker has no spider for to the front of its queue."""
        assert step.site is not None
        if step.site not in self._warned:
            self._warned.add(step.site)
            log.warning("no spider for site %r here: leaving its work to other workers", step.site)
        if step.job_id is not None:
            joblife.give_back(self.connection, step.site, step.job_id)

    def execute_job(self, job: Job, queue: Queue) -> None:
        super().execute_job(job, queue)
        served = self._site_of.get(queue.name)
        # Not when every thread is busy: the thread's turn goes to whichever site waits longest.
        if served is not None and self.runtime.batching(served).paced and not self._idle.room.crowded():
            self._follow = (served, self.runtime.gate_opens_at(served), False)
        site, self._refill = self._refill, None
        if site is not None:
            try:
                self.runtime.publish(site)
                self.runtime.frontier(site).refill(JOBS_AHEAD)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._redis_down(exc)  # the site's next NEXT_JOB asks for the refill again
