"""A download job's life in Redis, in one module: made, read, claimed, renewed, finished, handed back.

A download is an RQ job on its site's queue ``download:{SITE}``, always handled through
RQ's public classes: **made** from frontier entries (``make_jobs``, one URL or a batch of
one site, whose meta counts the URLs done: ``tasks_left``), **read** as NEXT_JOB hands it
out (``fetch``, vetted), **claimed** (``claim``) with a lease renewed while it runs
(``renew_claims``), **finished** (``finish``) or failed through RQ with ``job_retry``, and
**handed back** (``give_back``; ``hand_back_cut`` once a Redis outage cut its run short).
One whose worker died is reclaimed by the fleet-wide reaper (``reaper``) once its lease lapsed.
See docs/RELIABILITY.md.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from uuid import uuid4

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, Retry
from rq.exceptions import NoSuchJobError
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp, now
from rq.worker import BaseWorker, WorkerStatus

from . import keys
from .scheduler import batch_over, mark_ready
from .vetting import DOWNLOAD_FUNC, CrawlerJob

log = logging.getLogger("crawler.joblife")

#: Seconds between two heartbeats of a running job (its claim lasts ``job_lease`` seconds).
HEARTBEAT_EVERY = 1


def renew_every(job_lease: float) -> float:
    """Seconds between two renewals of a running download job's claim: half its lease, at least
    HEARTBEAT_EVERY (a claim has half its lease left when renewed; most pages are never renewed)."""
    return max(HEARTBEAT_EVERY, job_lease / 2)


#: Least seconds between two heartbeats of a worker's own key (job heartbeats are separate):
#: its key lives ``worker_ttl`` + 60 s from a plain beat and ``job_monitoring_interval`` + 60 s
#: (90) from a renewal's, so more often is waste.
WORKER_BEAT_EVERY = 30.0


def renew_claims(connection: Redis, claims: Sequence[tuple[Any, Job, Execution]]) -> None:
    """Renew the claims of running jobs (worker, job, execution), all in one transaction: what RQ's
    ``maintain_heartbeats`` writes but the job's index of its executions (``claim``), the worker's own
    key beaten only if it was not in the last WORKER_BEAT_EVERY seconds: one round trip for every claim
    due at once (``LeaseKeeper``).
    """
    if not claims:
        return
    beaten_workers: list[tuple[int, Any]] = []
    job_beats: list[tuple[int, Job]] = []
    with connection.pipeline() as pipe:
        for worker, job, execution in claims:
            if worker.last_heartbeat is None or (now() - worker.last_heartbeat).total_seconds() >= WORKER_BEAT_EVERY:
                beaten_workers.append((len(pipe), worker))
                worker.heartbeat(worker.job_monitoring_interval + 60, pipeline=pipe)
            ttl = int(worker.get_heartbeat_ttl(job))
            _beat(pipe, job, execution, ttl)
            job_beats.append((len(pipe), job))
            job.heartbeat(now(), ttl, pipeline=pipe, xx=True)
        results = pipe.execute()
        # As RQ's ``maintain_heartbeats``: a job deleted as it ended (its beat made a new hash) is deleted
        # again; a worker's hash that had expired (its beat made a new one) is written whole again.
        for index, job in job_beats:
            if results[index] == 1:
                pipe.delete(job.key)
        for index, worker in beaten_workers:
            if results[index] == 1:
                pipe.hset(worker.key, mapping=worker.serialize())
                pipe.expire(worker.key, worker.job_monitoring_interval + 60)
        pipe.execute()  # no round trip when empty


def _beat(pipe: Any, job: Job, execution: Execution, ttl: int) -> None:
    """Queue ``Execution.heartbeat``'s writes but the job's index of its executions (``claim``)."""
    execution.last_heartbeat = now()
    pipe.hset(execution.key, "last_heartbeat", execution.last_heartbeat.timestamp())
    pipe.expire(execution.key, ttl)
    job.started_job_registry.add_execution(execution, pipeline=pipe, ttl=ttl, xx=True)


def _start_execution(pipe: Any, job: Job, queue: Queue, worker_name: str, ttl: int) -> Execution:
    """Queue ``Execution.create``'s writes but the job's index of its executions: the execution's hash
    and its lease in the started registry, and its entry in the worker's index (a dashboard's list of
    the worker's current jobs reads both)."""
    execution = Execution(uuid4().hex, job.id, job.connection, worker_name=worker_name)
    execution.save(ttl=ttl, pipeline=pipe)
    queue.started_job_registry.add_execution(execution, pipeline=pipe, ttl=ttl)
    pipe.sadd(execution.worker_executions_key, execution.composite_key)
    pipe.expire(execution.worker_executions_key, ttl + 60)
    return execution


def _end_execution(pipe: Any, registry: StartedJobRegistry, execution: Execution) -> None:
    """Queue ``Execution.delete``'s writes but the job's index of its executions (``claim``), the hash's
    ``DEL`` left to the caller (who deletes the job's keys in the same command)."""
    registry.remove_execution(execution, pipeline=pipe)
    pipe.srem(execution.worker_executions_key, execution.composite_key)


#: Delays (seconds) before the retries of a job that raised or whose worker died. The first is
#: immediate: a dead worker's page has already waited out its lease, and RQ queues a retry
#: with no interval at once instead of scheduling it (which would add up to two reaper periods).
RETRY_DELAYS = [0, 15, 60, 300, 900]
RETRIES = len(RETRY_DELAYS)
#: The job meta field that counts a batch's URLs done, in order.
BATCH_DONE = "done"


def job_retry() -> Retry:
    """The RQ retry policy every download job is enqueued with: ``RETRY_DELAYS``, each retry at the
    front of the site's queue (it was next in line), not behind the jobs made since."""
    return Retry(max=RETRIES, interval=RETRY_DELAYS, enqueue_at_front=True)


def prune_dead_executions(connection: Redis, job: Job) -> int:
    """Forget executions of ``job`` whose worker died, before the job runs again.

    RQ 3.0 keeps a dead execution's id in the job's execution registry for a minute
    after the execution itself expired; finishing the job meanwhile raises (the
    execution is "not found") and turns the success into a failure and another retry.
    Only retried jobs can have such ids, so fresh jobs cost nothing here; ``claim`` writes no
    such registry, so only a job claimed by RQ's own methods (an earlier crawler) has one.
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


def make_jobs(
    queue: Queue, batches: Sequence[Sequence[dict[str, Any]]], ids: Sequence[str], failure_ttl: int, timeout: int,
    pipeline: Any,
) -> None:  # fmt: skip
    """Queue one download job per batch of payloads (in ``pipeline``), ids chosen by the caller.

    A job's timeout is ``timeout`` per URL it carries; its description is its first URL.
    """
    queue.enqueue_many(
        [
            Queue.prepare_data(
                DOWNLOAD_FUNC,
                args=tuple(batch),
                result_ttl=0,
                failure_ttl=failure_ttl,
                timeout=timeout * len(batch),
                description=str(batch[0]["url"]) + (f" (+{len(batch) - 1} more)" if len(batch) > 1 else ""),
                job_id=job_id,
                retry=job_retry(),
            )
            for batch, job_id in zip(batches, ids, strict=True)
        ],
        pipeline=pipeline,
    )


def batch_done(job: Job) -> int:
    """How many of ``job``'s URLs, in order, are done (a retried batch skips them)."""
    done = job.meta.get(BATCH_DONE, 0) if isinstance(job.meta, dict) else 0
    return done if isinstance(done, int) and not isinstance(done, bool) and 0 <= done <= len(job.args) else 0


def save_batch_done(job: Job, done: int, pipeline: Any = None) -> None:
    """Record that ``job``'s first ``done`` URLs are done (one HSET of the job's meta, in ``pipeline`` if given)."""
    job.meta[BATCH_DONE] = done
    if pipeline is None:
        job.save_meta()
    else:  # as RQ's ``save_meta`` writes it
        pipeline.hset(job.key, "meta", job.serializer.dumps(job.meta))


def tasks_left(job: Job) -> list[dict[str, Any]]:
    """The payloads of ``job`` still to download: all of them, less a batch's URLs already done."""
    return list(job.args[batch_done(job) :])


def fetch(connection: Redis, job_id: str, queue: Queue, fields: dict[bytes, bytes] | None = None) -> Job | None:
    """The job handed out as ``job_id``, vetted; None (and out of the intermediate list) if it is gone or refused.

    ``fields``: its hash as read already (NEXT_JOB reads it along the hand-out), else it is read here."""
    try:
        if fields is None:
            return CrawlerJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
        if not fields:
            raise NoSuchJobError(job_id)
        job = CrawlerJob(job_id, connection=connection, serializer=JSONSerializer)
        job.restore(fields)  # vetted as a fetch vets it: refused and quarantined if it is not ours
        return job
    except NoSuchJobError:  # its hash expired or was deleted, or it was refused and quarantined
        connection.lrem(queue.intermediate_queue_key, 1, job_id)
        return None


#: What a job's finish carries besides RQ's writes: queues one command (a script's EVALSHA) in the
#: transaction and gives back what to run instead if Redis answers NoScriptError (``Scheduler.batch_over_in``).
Finishing = Callable[[Any], Callable[[], None]]


def claim(
    worker: BaseWorker,
    job: Job,
    queue: Queue,
    along: Callable[[Any], Callable[[list[Any]], None] | None] | None = None,
    cut: Callable[[Execution], None] | None = None,
) -> Execution:
    """Claim ``job`` for ``worker`` in one transaction: what RQ writes before a job that the crawl reads.

    Made with RQ's public methods: the execution, its lease in the started registry (what the
    reaper and RQ's cleanup read) and its entry in the worker's index, the worker busy and its
    heartbeat, the job started (status, worker, times) and out of the queue's intermediate list;
    atomic, so a job is never out of the intermediate list without a lease. The job's own index
    of its executions (``rq:executions:JOB`` and its TTL, three commands a job with the finish's)
    is not written: RQ reads it for rate limits, which crawler jobs have none of, and to drop a
    running job's leases as it is deleted (those then lapse, and the reaper drops them). The
    worker's state and heartbeat are written only when they change or are due: a worker that
    goes from job to job is already ``busy``, and its key was renewed less than
    WORKER_BEAT_EVERY ago (it outlives the job: the lease keeper renews it while the job runs).

    ``along(pipe)`` may queue reads last in the transaction (``SiteReads.read_site_along``: the
    site's live settings, due for a re-read) and give back what to call with their replies. ``cut`` is
    called with the execution when a Redis outage cuts the claim short (made or not: its reply is lost).
    """
    ttl = worker.get_heartbeat_ttl(job)
    beat_due = worker.last_heartbeat is None or (now() - worker.last_heartbeat).total_seconds() >= WORKER_BEAT_EVERY
    with worker.connection.pipeline() as pipe:
        execution = _start_execution(pipe, job, queue, worker.name, int(ttl))
        worker.executions[execution.id] = execution
        if worker.get_state() != WorkerStatus.BUSY:
            worker.set_state(WorkerStatus.BUSY, pipeline=pipe)
        if beat_due:
            worker.heartbeat(ttl, pipeline=pipe)
        job.prepare_for_execution(worker.name, pipeline=pipe)
        pipe.persist(job.key)
        pipe.lrem(queue.intermediate_queue_key, 1, job.id)
        start = len(pipe)
        keep = along(pipe) if along is not None else None
        try:
            replies = pipe.execute()
        except (RedisConnectionError, RedisTimeoutError):
            worker.executions.pop(execution.id, None)
            if cut is not None:
                cut(execution)
            raise
    if keep is not None:
        keep(replies[start:])
    return execution


def finish(worker: BaseWorker, job: Job, execution: Execution, finishing: Sequence[Finishing] = ()) -> None:
    """RQ's success handling of a plain job, in one transaction instead of four round trips.

    The same end state (the worker stays ``busy`` until its next look for work finds
    none): the worker's counters, the job's execution and its lease gone, the job deleted
    (``result_ttl`` 0) with its result, dependency and execution keys in one ``DEL``. Crawler
    jobs have no dependents (``vetting``), so RQ's watch of the dependents set is left out.
    ``finishing``: what the job left to be done in the same transaction (``Finishing``).
    """
    assert job.started_at is not None and job.ended_at is not None
    with worker.connection.pipeline() as pipe:
        worker.increment_successful_job_count(pipeline=pipe)
        _add_working_time(worker, job.ended_at - job.started_at, pipe)
        worker.executions.pop(execution.id, None)
        _end_execution(pipe, job.started_job_registry, execution)
        pipe.delete(
            job.key,
            job.dependents_key,
            job.dependencies_key,
            Result.get_key(job.id),
            job.execution_registry.key,
            execution.key,
        )
        _execute_finishing(pipe, finishing)


#: Per worker: its working time not yet written, and when it last was (monotonic).
_working_time: weakref.WeakKeyDictionary[BaseWorker, tuple[timedelta, float]] = weakref.WeakKeyDictionary()


def _add_working_time(worker: BaseWorker, worked: timedelta, pipe: Any) -> None:
    """Count ``worked`` into the worker's total working time (RQ's ``increment_total_working_time``), written
    once a WORKER_BEAT_EVERY a worker, not a job: shown by dashboards only (``rq info`` shows the job counts,
    written a job); a worker's time since its last write is lost with it, as its hash is once it dies."""
    unwritten, written_at = _working_time.get(worker, (timedelta(0), 0.0))
    unwritten += worked
    if time.monotonic() - written_at >= WORKER_BEAT_EVERY:
        worker.increment_total_working_time(unwritten, pipe)
        unwritten, written_at = timedelta(0), time.monotonic()
    _working_time[worker] = (unwritten, written_at)


def run_finishing(connection: Redis, finishing: Sequence[Finishing]) -> None:
    """What a job left to its finish (``Finishing``), for a job that failed: one round trip, none if nothing."""
    if finishing:
        with connection.pipeline(transaction=False) as pipe:
            _execute_finishing(pipe, finishing)


def _execute_finishing(pipe: Any, finishing: Sequence[Finishing]) -> None:
    """Execute ``pipe`` with ``finishing``'s commands added; a NoScriptError among their replies
    is answered by running that one on its own, another error raised once all have run."""
    rerun = [(len(pipe), add(pipe)) for add in finishing]
    replies = pipe.execute(raise_on_error=False)
    for index, again in rerun:
        if isinstance(replies[index], NoScriptError):
            again()
            replies[index] = None
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def give_back(connection: Redis, site: str, job_id: str) -> None:
    """Put a handed-out job of ``site`` back at the front of its queue, for a worker that has its spider."""
    queue = Queue(keys.download_queue(site), connection=connection)
    with connection.pipeline(transaction=True) as pipe:
        pipe.lrem(queue.intermediate_queue_key, 1, job_id)
        pipe.lpush(queue.key, job_id)
        pipe.execute()


#: Seconds of its lease a job cut short by a Redis outage must have left for its own process to hand it
#: back (``hand_back_cut``): the reaper hands back only jobs whose lease ran out (on its host's clock),
#: so the two never both retry one job.
CUT_MARGIN = 2.0
#: Transactions ``hand_back_cut`` tries while other jobs of the site change its registry meanwhile.
CUT_TRIES = 3


def hand_back_cut(connection: Redis, queue: Queue, execution: Execution, unclaimed: int | None = None) -> bool:
    """Hand back at once a job of ``queue`` whose run a Redis outage cut short (its worker gave it up), as
    the reaper would once its lease ran out: its execution ended and the job retried (``job_retry``: the
    first retry at the front of its queue) in one transaction, then its site due again when its gate
    opens (``scheduler.batch_over``: the job's batch is over).

    Only while the job is still started under ``execution`` with CUT_MARGIN seconds of its lease left
    (checked under WATCH, so a reaper's retry in between voids this one): otherwise False, and nothing
    done but the site's ``batch_over`` if the job's end was written after all (it finished, or failed and
    was retried, its reply lost to the outage); nothing if it is out of retries or the reaper's to hand back.
    ``unclaimed``: the outage cut the job's claim, and the job had these retries left as it was handed
    out; if the claim was not made, a job still handed out, queued and with as many retries left goes
    back to the front of its queue (as the reaper's ``rescue_stranded`` would, STRANDED_AFTER later).
    """
    site = keys.site_of_queue(queue.name)
    for _ in range(CUT_TRIES):
        with connection.pipeline(transaction=True) as pipe:
            try:
                done = _hand_back(connection, pipe, queue, execution, unclaimed)
            except WatchError:  # the site's other jobs claimed or ended meanwhile: looked at again
                continue
        if done is None:  # its failure (a retry) or finish was written after all: the batch is over
            if site is not None:
                batch_over(connection, site)
            return False
        if done and site is not None:  # due again when its gate opens: NEXT_JOB held it for the batch's span
            mark_ready(connection, {site: 0})
            batch_over(connection, site)
        return done
    return False


def _hand_back(connection: Redis, pipe: Any, queue: Queue, execution: Execution, unclaimed: int | None) -> bool | None:
    """``hand_back_cut``'s transaction in ``pipe``: True once made, False if not the process's to make, None
    if the job has no lease under ``execution`` (nor, for a cut claim, a hand-out to give back)."""
    registry, job_id = queue.started_job_registry, execution.job_id
    pipe.watch(registry.key, Job.key_for(job_id), queue.intermediate_queue_key)
    lease_ends = pipe.zscore(registry.key, execution.composite_key)
    if lease_ends is not None and lease_ends < current_timestamp() + CUT_MARGIN:
        return False
    try:
        job = CrawlerJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
    except NoSuchJobError:  # deleted as it finished, or refused (quarantined) as it was read
        return False if lease_ends is not None else None
    status = job.get_status(refresh=False)
    if lease_ends is None:
        handed_out = unclaimed is not None and status == JobStatus.QUEUED and job.retries_left == unclaimed
        if not handed_out or pipe.lpos(queue.intermediate_queue_key, job_id) is None:
            return None
        pipe.multi()
        pipe.lrem(queue.intermediate_queue_key, 1, job_id)
        pipe.lpush(queue.key, job_id)
        pipe.execute()
        return True
    if status != JobStatus.STARTED or not job.retries_left:
        return False
    pipe.multi()
    _end_execution(pipe, registry, execution)
    pipe.delete(execution.key)
    job.retry(queue, pipe)
    pipe.execute()
    return True
