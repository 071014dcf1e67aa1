"""A download job's life in Redis, in one module: made, claimed, finished, handed back, reclaimed.

A download is an RQ job on its site's queue ``download:{SITE}``, always handled through
RQ's public classes: **made** from frontier entries (``make_jobs``, one URL or a batch of
one site, whose meta counts the URLs done: ``tasks_left``), **read** as NEXT_JOB hands it
out (``fetch``, vetted), **claimed** (``claim``) with a lease renewed while it runs
(``renew_claims``), **finished** (``finish``) or failed through RQ with ``job_retry``,
**handed back** (``give_back``; ``hand_back_cut`` once a Redis outage cut its run short), and
**reclaimed** by the fleet-wide reaper (``reap``, one pass every ``REAP_EVERY``) once its worker
died and its lease lapsed, so a killed worker's page runs again within ``job_lease`` +
``REAP_EVERY`` seconds. See docs/RELIABILITY.md.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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
from rq.registry import ScheduledJobRegistry, StartedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp, now
from rq.worker import BaseWorker, WorkerStatus

from . import keys, lua, redisclock
from .gate import Gate
from .replies import text
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


#: Seconds between two reaper passes, fleet-wide.
REAP_EVERY = 5.0
#: Delays (seconds) before the retries of a job that raised or whose worker died. The first is
#: immediate: a dead worker's page has already waited out its lease, and RQ queues a retry
#: with no interval at once instead of scheduling it (which would add up to two reaper periods).
RETRY_DELAYS = [0, 15, 60, 300, 900]
#: Seconds a job may sit in its queue's intermediate list without a lease before the reaper
#: hands it back: handed out by NEXT_JOB, it is claimed within milliseconds by a live worker.
STRANDED_AFTER = 2 * REAP_EVERY
#: Seconds after which a sighting of a job in an intermediate list no longer counts: the reaper looks at
#: a queue with a job there again STRANDED_AFTER later, so a sighting this old is of an earlier stay.
STALE_SIGHTING = 3 * STRANDED_AFTER
RETRIES = len(RETRY_DELAYS)
#: The job meta field that counts a batch's URLs done, in order.
BATCH_DONE = "done"


def job_retry() -> Retry:
    """The RQ retry policy every download job is enqueued with: ``RETRY_DELAYS``, each retry at the
    front of the site's queue (it was next in line), not behind the jobs made since."""
    return Retry(max=RETRIES, interval=RETRY_DELAYS, enqueue_at_front=True)


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
        worker.increment_total_working_time(job.ended_at - job.started_at, pipe)
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
