"""Moving a crawl's Redis keys to the names with a site hash tag: ``crawler migrate-keys``.

A crawl left under the key names without hash tags (``crawler:KIND:SITE…``, RQ queue
``download:SITE``) is found by ``old_sites`` (the ``worker`` and ``crawl`` commands refuse
to start while there is one) and moved by ``migrate_keys``, every worker stopped: each
site key and shared gate renamed (``RENAMENX``: a name already taken is left and counted;
a conf's ``gate`` field naming a renamed gate rewritten), the old queue's jobs handed back
to the front of their frontier (one that is not a download task quarantined), its
registries deleted. Running it again finds nothing to do. What it moves, for operators: docs/OPERATING.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from redis import Redis
from rq import Queue, Worker
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from ..coord import bulk, joblife, keys, pages, quarantine
from ..coord.priorities import entries_by_priority, push_to_front
from ..coord.replies import text
from ..coord.scheduler import mark_ready
from ..coord.task import DownloadTask

#: The kinds of per-site key before hash tags: ``crawler:KIND:SITE`` and, for some, ``:MORE`` after it.
OLD_SITE_KINDS = (
    "seen",
    "robots",
    "robots-copy",
    "robots-outage",
    "parse-failed",
    "lastmod",
    "stats",
    "settings",
    "frontier",
    "frontier-extra",  # newer than hash tags, but renamed with its lists (a crawl moved by hand)
    "levels",
    "conf",
    "errors",
    "metrics",
)

#: The RQ queue name of a site's downloads before hash tags.
OLD_QUEUE = "download:"


@dataclass
class MigrationReport:
    """What ``migrate_keys`` did."""

    sites: list[str]
    renamed: int = 0
    left: int = 0  # keys whose new name was taken already
    jobs_back: int = 0  # download jobs handed back to their frontier
    quarantined: int = 0

    def summary(self) -> str:
        if not self.sites and not self.renamed:
            return "no keys under the old names: nothing to do"
        left = f"; {self.left} left as they were (their new name was taken)" if self.left else ""
        refused = f"; {self.quarantined} jobs quarantined" if self.quarantined else ""
        return (
            f"{len(self.sites)} sites: {self.renamed} keys renamed, {self.jobs_back} queued downloads "
            f"handed back to their frontier{left}{refused}"
        )


def old_sites(connection: Redis) -> list[str]:
    """The seeded sites whose crawl Redis holds under the key names before hash tags (a few commands,
    ``bulk.any_exist``: every worker process's start asks, at 10,000 sites too)."""
    sites = sorted(text(site) for site in connection.smembers(keys.sites()))
    if not sites:
        return []
    queue = Queue.redis_queue_namespace_prefix + OLD_QUEUE
    kinds = ("conf", "levels", "seen", "stats")
    old = [[*(f"{keys.PREFIX}{kind}:{site}" for kind in kinds), queue + site] for site in sites]
    return [site for site, found in zip(sites, bulk.any_exist(connection, old), strict=True) if found]


def running_workers(connection: Redis) -> int:
    """Download workers registered with RQ, and parse workers alive, on this Redis."""
    return len(Worker.all(connection=connection, serializer=JSONSerializer)) + len(pages.live_consumers(connection))


def migrate_keys(connection: Redis) -> MigrationReport:
    """Rename the crawl's keys of before hash tags, and hand the old queues' jobs back (module docstring)."""
    report = MigrationReport(sites=sorted(set(old_sites(connection)) | set(_old_queue_sites(connection))))
    _rename_keys(connection, report)
    for site in report.sites:
        _hand_back_jobs(connection, site, report)
        _rewrite_gate_field(connection, site)
        if connection.exists(keys.levels(site)):
            mark_ready(connection, {site: 0})
    return report


def new_name(old: str) -> str | None:
    """The name with a hash tag of a key named before them, or None when it is not a site's key or gate."""
    match = re.fullmatch(r"crawler:([a-z-]+):([^:{][^:]*)(:.*)?", old, re.DOTALL)
    if match is None:
        return None
    kind, first, rest = match[1], match[2], match[3] or ""
    if kind == "gate":  # the site's own, or shared by name or IP address: the whole name is the tag
        return keys.gate(first + rest)
    if kind not in OLD_SITE_KINDS:
        return None
    return f"{keys.PREFIX}{kind}:{{{first}}}{rest}"


def _rename_keys(connection: Redis, report: MigrationReport) -> None:
    olds = [text(key) for key in connection.scan_iter(match=f"{keys.PREFIX}*", count=1000)]
    renames = [(old, new) for old in olds if (new := new_name(old)) is not None]
    for start in range(0, len(renames), 1000):
        batch = renames[start : start + 1000]
        with connection.pipeline(transaction=False) as pipe:
            for old, new in batch:
                pipe.renamenx(old, new)
            done = pipe.execute()
        report.renamed += sum(1 for ok in done if ok)
        report.left += sum(1 for ok in done if not ok)


def _rewrite_gate_field(connection: Redis, site: str) -> None:
    """A conf naming a gate by its old key names it by its new one."""
    gate = connection.hget(keys.conf(site), "gate")
    if gate is not None and (new := new_name(text(gate))) is not None:
        connection.hset(keys.conf(site), "gate", new)


def _old_queue_sites(connection: Redis) -> list[str]:
    prefix = Queue.redis_queue_namespace_prefix + OLD_QUEUE
    names = (text(key) for key in connection.smembers(Queue.redis_queues_keys))
    return [name[len(prefix) :] for name in names if name.startswith(prefix) and "{" not in name]


def _hand_back_jobs(connection: Redis, site: str, report: MigrationReport) -> None:
    """The old queue's unfinished jobs back to the front of the site's frontier; the queue and its registries gone."""
    queue = Queue(f"{OLD_QUEUE}{site}", connection=connection, serializer=JSONSerializer)
    unfinished = [
        *queue.get_job_ids(),
        *(text(i) for i in connection.lrange(queue.intermediate_queue_key, 0, -1)),
        *queue.started_job_registry.get_job_ids(),
        *queue.scheduled_job_registry.get_job_ids(),
    ]
    registries = [
        queue.started_job_registry,
        queue.scheduled_job_registry,
        queue.failed_job_registry,
        queue.finished_job_registry,
        queue.deferred_job_registry,
        queue.canceled_job_registry,
    ]
    finished = [i for registry in registries[2:] for i in registry.get_job_ids()]
    tasks: list[DownloadTask] = []
    for job_id in dict.fromkeys(unfinished):  # in queue order, each once
        try:
            job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
            left = [DownloadTask.from_json(payload) for payload in joblife.tasks_left(job)]
        except NoSuchJobError:
            continue
        except Exception as exc:  # not a download task (or not JSON): kept aside, as a worker would
            quarantine.record(connection, queue.name, f"not a download task: {exc}", job_id)
            report.quarantined += 1
            continue
        tasks += left
        report.jobs_back += 1
    with connection.pipeline(transaction=True) as pipe:
        push_to_front(pipe, site, entries_by_priority(tasks))  # the front, in their order
        if unfinished or finished:
            pipe.delete(*(Job.key_for(job_id) for job_id in {*unfinished, *finished}))
        pipe.delete(queue.intermediate_queue_key, *(registry.key for registry in registries))
        pipe.delete(f"{keys.PREFIX}queued:{site}")  # the old queue's job ids
        pipe.execute()
    queue.delete(delete_jobs=False)
