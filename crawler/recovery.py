"""Getting download jobs back: jobs of killed workers, jobs that raised, and the RQ retries due.

(Pages waiting for a parser come back through their stream's consumer group: ``pages``.)

Every job carries an RQ ``Retry``: when its worker dies (SIGKILL, OOM, a lost host) its
entry in RQ's started registry stops being renewed by the running job's heartbeat
and expires after ``job_lease`` seconds (a setting, 10 by default); the reaper then hands it back to its queue. A job
that raises (a bug, the database down) is retried after growing delays, and only
after ``RETRIES`` failures lands in RQ's failed registry.

One reaper pass runs every ``REAP_EVERY`` seconds across the whole fleet: the worker
that takes the pass's lock (a gate) does it, so its cost does not grow with workers.
A killed worker's page is thus picked up again within job_lease + REAP_EVERY seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from redis import Redis
from rq import Queue, Retry
from rq.exceptions import NoSuchJobError
from rq.executions import Execution
from rq.job import Job
from rq.registry import ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp

from . import keys
from .gate import Gate
from .replies import text
from .vetting import CrawlerJob

log = logging.getLogger("crawler.recovery")

#: Seconds between two heartbeats of a running job (its claim lasts ``job_lease`` seconds).
HEARTBEAT_EVERY = 1
#: Seconds between two reaper passes, fleet-wide.
REAP_EVERY = 5.0
#: Delays (seconds) before the retries of a job that raised or whose worker died. The first is
#: immediate: a dead worker's page has already waited out its lease, and RQ queues a retry
#: with no interval at once instead of scheduling it (which would add up to two reaper periods).
RETRY_DELAYS = [0, 15, 60, 300, 900]
RETRIES = len(RETRY_DELAYS)


def job_retry() -> Retry:
    """The RQ retry policy every download job is enqueued with."""
    return Retry(max=RETRIES, interval=RETRY_DELAYS)


def queue_names(connection: Redis) -> list[str]:
    """Every crawler queue on this Redis: each seeded site's downloads."""
    sites = sorted(text(s) for s in connection.smembers(keys.sites()))
    return [keys.download_queue(site) for site in sites]


def reap(connection: Redis, names: Iterable[str] | None = None) -> bool:
    """Run one reaper pass unless another worker ran one in the last REAP_EVERY seconds.

    Hands abandoned jobs back (or fails them once out of retries) and moves RQ retries
    that are due into their queues. Returns whether this call did the pass.
    """
    lock = Gate(connection, "reaper", expire=REAP_EVERY, namespace=keys.PREFIX + "lock")
    if not lock.acquire(blocking=False):
        return False
    for name in queue_names(connection) if names is None else names:
        queue = Queue(name, connection=connection, serializer=JSONSerializer, job_class=CrawlerJob)
        registry = StartedJobRegistry(queue=queue, serializer=JSONSerializer, job_class=CrawlerJob)
        registry.cleanup()  # refused jobs are quarantined as RQ reads them (see ``vetting``)
        promote_scheduled(connection, queue)
        site = keys.site_of_queue(name)
        if site is not None and connection.llen(queue.key):
            # A job handed back must be seen by the scheduler.
            connection.zadd(keys.ready(), {site: 0}, nx=True)
    return True


def prune_dead_executions(connection: Redis, job: Job) -> int:
    """Forget executions of ``job`` whose worker died, before the job runs again.

    RQ 3.0 keeps a dead execution's id in the job's execution registry for a minute
    after the execution itself expired; finishing the job meanwhile raises (the
    execution is "not found") and turns the success into a failure and another retry.
    Only retried jobs can have such ids, so fresh jobs cost nothing here.
    """
    if job.retries_left is None or job.retries_left >= RETRIES:
        return 0
    registry = job.execution_registry
    ids = registry.get_execution_ids()
    with connection.pipeline(transaction=False) as pipe:
        for execution_id in ids:
            pipe.exists(Execution(execution_id, job.id, connection).key)
        alive = pipe.execute()
    dead = [execution_id for execution_id, exists in zip(ids, alive, strict=True) if not exists]
    if dead:
        connection.zrem(registry.key, *dead)
    return len(dead)


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
