"""The fleet-wide reaper: hands back the download jobs whose worker died or was never told of them.

One pass every REAP_EVERY, by whichever worker takes its lock first (``reap``): a job whose
lease lapsed is retried (or failed once out of retries) as RQ's cleanup does, a retry that is
due is moved into its queue, and a job left handed out with no lease (``rescue_stranded``) goes
back to the front of its queue. It looks at the sites the claims say are due (NEXT_JOB names a
site there as it hands out a job), and at every queue once a FULL_REAP_EVERY. See
docs/RELIABILITY.md.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.registry import ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp

from . import keys, lua, redisclock
from .gate import Gate
from .replies import text
from .scheduler import mark_ready
from .vetting import CrawlerJob

log = logging.getLogger("crawler.reaper")

#: Seconds between two reaper passes, fleet-wide.
REAP_EVERY = 5.0

#: Seconds a job may sit in its queue's intermediate list without a lease before the reaper
#: hands it back: handed out by NEXT_JOB, it is claimed within milliseconds by a live worker.
STRANDED_AFTER = 2 * REAP_EVERY
#: Seconds after which a sighting of a job in an intermediate list no longer counts: the reaper looks at
#: a queue with a job there again STRANDED_AFTER later, so a sighting this old is of an earlier stay.
STALE_SIGHTING = 3 * STRANDED_AFTER


def queue_names(connection: Redis) -> list[str]:
    """Every crawler queue on this Redis: each seeded site's downloads."""
    sites = sorted(text(s) for s in connection.smembers(keys.sites()))
    return [keys.download_queue(site) for site in sites]


#: Queues whose state one survey pipeline of the reaper reads (four commands each).
SURVEY_CHUNK = 500
#: Seconds between two full reaper passes over every queue, fleet-wide; between them a pass surveys
#: only the sites the claims say are due. What a job no claim names (handed out by a crawler of
#: before the claims) waits for at most.
FULL_REAP_EVERY = 3600.0
#: Sites of the claims one reaper pass surveys at most (the others at the next pass).
CLAIMS_A_PASS = 5000


def reap(connection: Redis) -> bool:
    """Run one reaper pass unless another worker ran one in the last REAP_EVERY seconds.

    Hands abandoned jobs back (or fails them once out of retries), moves RQ retries that
    are due into their queues, and hands back jobs stranded in an intermediate list
    (``rescue_stranded``). It surveys the queues of the sites the claims say are due
    (``keys.claims``: NEXT_JOB names a site there as it hands out a job, to be looked at
    once the job's lease could have lapsed), acts on those with something to do, and settles
    when it looks at each again (``settle_claims``; a site with nothing to watch the survey forgets
    itself); once a FULL_REAP_EVERY, fleet-wide, it surveys every queue instead. Returns whether this
    call did the pass.
    """
    lock = Gate(connection, "reaper", expire=REAP_EVERY, key=keys.lock("reaper"))
    if not lock.acquire(blocking=False):
        return False
    full = Gate(connection, "full-reap", expire=FULL_REAP_EVERY, key=keys.lock("full-reap")).acquire(blocking=False)
    names = queue_names(connection) if full else [keys.download_queue(site) for site in claims_due(connection)]
    seen: dict[str, float] = {}
    queued: dict[str, float] = {}
    looks: dict[str, float | None] = {}
    for name, found in survey(connection, names):
        queue = _queue(connection, name)
        if found.expired:
            registry = StartedJobRegistry(queue=queue, serializer=JSONSerializer, job_class=CrawlerJob)
            registry.cleanup(found.at)  # refused jobs are quarantined as RQ reads them (see ``vetting``)
        if found.due:
            promote_scheduled(connection, queue)
        if found.handed_out:
            rescue_stranded(connection, queue, seen)
        site = keys.site_of_queue(name)
        if site is not None:
            looks[site] = found.next_look()
            if found.queued or found.expired or found.due or found.handed_out:
                queued[site] = 0
    # A job handed back must be seen by the scheduler; a site already in the ready set is left as it is.
    mark_ready(connection, queued)
    settle_claims(connection, looks)
    # A full pass forgets the ids no longer stranded (claimed, or handed back); every pass keeps the
    # others' first sighting (a sighting too old to be this stay's is taken again: ``rescue_stranded``).
    with connection.pipeline(transaction=True) as pipe:
        if full:
            pipe.delete(keys.stranded())
        if seen:
            pipe.hset(keys.stranded(), mapping=seen)  # type: ignore[arg-type]  # redis-py types keys invariantly
        pipe.execute()
    return True


def claims_due(connection: Redis) -> list[str]:
    """The sites the claims say the reaper should look at now (CLAIMS_A_PASS at most, the longest due first)."""
    now = redisclock.now_ms(connection)
    return [text(site) for site in connection.zrangebyscore(keys.claims(), "-inf", now, start=0, num=CLAIMS_A_PASS)]


def settle_claims(connection: Redis, looks: Mapping[str, float | None]) -> None:
    """Record when the reaper next looks at each site surveyed (``looks``: seconds from now; None for a
    site found with nothing to watch, whose claim the survey dropped), in one ZADD."""
    now = redisclock.now_ms(connection)
    later = {site: now + int(wait * 1000) for site, wait in looks.items() if wait is not None}
    if later:
        connection.zadd(keys.claims(), later)


@dataclass(frozen=True)
class QueueSurvey:
    """What the reaper found in one queue: ``at``, the timestamp (RQ's clock, seconds) it counted against."""

    at: float
    lease_ends: float | None  # the first lease in the started registry to run out (RQ's clock), None if none
    retry_due: float | None  # when the first RQ-scheduled job (a retry) is due, None if none
    handed_out: int  # job ids in the intermediate list
    queued: int  # job ids in the queue

    @property
    def expired(self) -> bool:
        """Whether a lease of the started registry ran out by ``at``."""
        return self.lease_ends is not None and self.lease_ends <= self.at

    @property
    def due(self) -> bool:
        """Whether a retry is due by ``at``."""
        return self.retry_due is not None and self.retry_due <= self.at

    def next_look(self) -> float | None:
        """Seconds from ``at`` until the reaper should look at the queue again (0: at its next pass), None when
        nothing is there to watch: no job handed out, leased, or scheduled."""
        waits = [max(0.0, t - self.at) for t in (self.lease_ends, self.retry_due) if t is not None]
        if self.handed_out:
            waits.append(STRANDED_AFTER)
        return min(waits) if waits else None


def survey(connection: Redis, names: Iterable[str]) -> Iterator[tuple[str, QueueSurvey]]:
    """Each queue of ``names`` with what it holds (``QueueSurvey``), read SURVEY_CHUNK queues a round trip
    (SURVEY_QUEUES: the claim of a site with nothing to watch dropped as it is read)."""
    names = list(names)
    script = lua.script(connection, "survey_queues")
    for start in range(0, len(names), SURVEY_CHUNK):
        chunk = names[start : start + SURVEY_CHUNK]
        at = current_timestamp()
        queue_keys = [keys.claims()]
        for name in chunk:
            queue = _queue(connection, name)
            queue_keys += [queue.key, queue.intermediate_queue_key]
            queue_keys += [queue.started_job_registry.key, queue.scheduled_job_registry.key]
        sites = [keys.site_of_queue(name) or "" for name in chunk]
        for name, (lease_ends, retry_due, handed_out, queued) in zip(chunk, script(queue_keys, sites), strict=True):
            yield name, QueueSurvey(at, _score(lease_ends), _score(retry_due), int(handed_out), int(queued))


def _score(reply: Any) -> float | None:
    """A score SURVEY_QUEUES read, None if its set was empty."""
    return float(reply) if reply is not None else None


_queues: weakref.WeakKeyDictionary[Redis, dict[str, Queue]] = weakref.WeakKeyDictionary()
_queues_lock = threading.Lock()


def _queue(connection: Redis, name: str) -> Queue:
    """RQ's queue ``name`` on ``connection``, made once per connection (making one checks its
    serializer against a typing Protocol, which is slow)."""
    with _queues_lock:
        made = _queues.setdefault(connection, {})
        queue = made.get(name)
        if queue is None:
            queue = made[name] = Queue(name, connection=connection, serializer=JSONSerializer, job_class=CrawlerJob)
        return queue


def rescue_stranded(connection: Redis, queue: Queue, seen: dict[str, float]) -> int:
    """Hand back the jobs of ``queue`` left in its intermediate list with no lease; how many.

    NEXT_JOB moves a job id into the intermediate list and the worker that asked claims it
    at once (``claim``); a worker that dies, or whose Redis call fails, in between leaves it
    there, where no worker takes it and the drain check counts it forever. A job seen there
    without a lease on passes STRANDED_AFTER seconds apart goes back to the front of its
    queue (RQ's own cleanup fails such a job instead, and only on a worker's 10-minute
    maintenance). ``seen`` gathers the ids still waiting, with their first sighting.
    """
    ids = [text(i) for i in connection.lrange(queue.intermediate_queue_key, 0, -1)]
    if not ids:
        return 0
    with connection.pipeline(transaction=False) as pipe:
        pipe.zrange(queue.started_job_registry.key, 0, -1)  # members "job id:execution id"
        pipe.hmget(keys.stranded(), ids)
        pipe.time()
        started, first_seen, clock = pipe.execute()
    running = {text(member).split(":", 1)[0] for member in started}
    wall = int(clock[0]) + int(clock[1]) / 1e6
    rescued = 0
    for job_id, first in zip(ids, first_seen, strict=True):
        if job_id in running:
            continue
        # A sighting older than STALE_SIGHTING is of an earlier stay of the job (it was claimed, and
        # later handed out again): this stay is seen now for the first time.
        if first is None or not STRANDED_AFTER <= wall - float(first) < STALE_SIGHTING:
            seen[job_id] = wall if first is None or wall - float(first) >= STALE_SIGHTING else float(first)
            continue
        with connection.pipeline(transaction=True) as pipe:
            pipe.lrem(queue.intermediate_queue_key, 1, job_id)
            pipe.lpush(queue.key, job_id)
            pipe.execute()
        log.warning("job %s was left in %s without a worker: handed back", job_id, queue.intermediate_queue_key)
        rescued += 1
    return rescued


def promote_scheduled(connection: Redis, queue: Queue) -> int:
    """Move ``queue``'s RQ-scheduled jobs (retries) that are due into the queue."""
    registry = ScheduledJobRegistry(queue=queue, serializer=JSONSerializer)
    job_ids = registry.get_jobs_to_schedule(current_timestamp())
    if not job_ids:
        return 0
    jobs: list[Job | None] = []
    for job_id in job_ids:
        try:
            jobs.append(CrawlerJob.fetch(job_id, connection=connection, serializer=JSONSerializer))
        except NoSuchJobError:  # gone, or refused and quarantined
            jobs.append(None)
    with connection.pipeline() as pipe:
        for job_id, job in zip(job_ids, jobs, strict=True):
            if job is not None:
                queue.enqueue_job(job, pipeline=pipe)
            registry.remove(job_id, pipeline=pipe)
        pipe.execute()
    return len(job_ids)
