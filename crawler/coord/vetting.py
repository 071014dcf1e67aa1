"""What a job or a page entry read from Redis must be before any of it runs.

RQ runs whatever function a job hash names, calls the success, failure and stopped
callbacks it names, and posts to its webhooks. A crawler shares its Redis with other
programs, so a job is checked the moment it is read (``CrawlerJob.restore``, which
every fetch of a job goes through) and refused before anything is imported:

- its function is the crawler's own ``download`` (under its name of today or of before,
  ``OLD_DOWNLOAD_FUNCS``), on a ``download:SITE`` queue, with
  one to ``MAX_BATCH`` plain JSON objects as its arguments;
- it names no callback, webhook, dependency, group or repeat;
- each argument has the shape of a download task whose site is the site of the queue
  it came from.

A refused job is quarantined where it is met (``quarantine.job``: its hash deleted, a
copy kept with the reason) and ``RefusedJob`` raised, a NoSuchJobError, so that RQ and
the worker go on as for a job that is gone. Whether a download's URL is within the spider's domains is checked
again when the job runs (``jobs.download``), where the spider is known.

A page entry of the parse stream (``pages``) names no function: it is plain data, but
anyone can add one, so ``page_entry`` checks its fields and their types before the
parse worker runs anything on it, and raises ``RefusedEntry`` otherwise.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from rq.exceptions import NoSuchJobError
from rq.job import Job

from . import keys, quarantine
from .task import DownloadTask

#: Dotted path of the only function a crawler job may name.
DOWNLOAD_FUNC = "crawler.work.jobs.download"
#: Names the function had before it moved: a job queued under one runs as ``DOWNLOAD_FUNC``.
OLD_DOWNLOAD_FUNCS = ("crawler.jobs.download",)

#: Most URLs (arguments) one download job carries: a batch, for a fast site (``Runtime.batch_size``).
MAX_BATCH = 16

#: Job hash fields that make RQ import or call something beyond the job's function.
_FORBIDDEN_FIELDS = (
    "success_callback_name", "failure_callback_name", "stopped_callback_name", "webhooks",
    "dependency_ids", "group_id", "repeats_left", "repeat_intervals",
)  # fmt: skip


class RefusedJob(NoSuchJobError):
    """A job that is not the crawler's to run; ``reason`` says why.

    By the time it is raised the job is quarantined and its hash deleted; it is a
    NoSuchJobError so that every RQ code path that reads jobs (dequeue, registry and
    intermediate-list maintenance, the reaper) treats it as a job that is gone.
    """

    def __init__(self, reason: str, job_id: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.job_id = job_id


class CrawlerJob(Job):
    """An RQ job that refuses to load unless it is one of the crawler's own (see the module docstring).

    ``bound``: keyword arguments the worker running the job gives its function besides the
    job's own (the download job's runtime); never stored, so never read from Redis.
    """

    bound: dict[str, Any] = {}

    @property
    def func(self) -> Any:
        func = super().func
        return functools.partial(func, **self.bound) if self.bound and func is not None else func

    def restore(self, raw_data: Any) -> Any:
        try:
            try:
                result = super().restore(raw_data)
            except Exception as exc:  # a field that does not parse, or no data at all: RQ's own error, named
                raise RefusedJob(f"malformed job hash: {type(exc).__name__}: {str(exc)[:200]}", self.id) from None
            vet(self, raw_data)
        except RefusedJob as refused:
            origin = raw_data.get(b"origin", b"?") if isinstance(raw_data, dict) else b"?"
            quarantine.job(
                self.connection,
                origin.decode("utf-8", "replace") if isinstance(origin, bytes) else str(origin),
                self.id,
                refused.reason,
                raw_data if isinstance(raw_data, dict) else {},
            )
            raise
        return result


def _field(raw: Any, name: str) -> Any:
    return raw.get(name.encode(), raw.get(name)) if isinstance(raw, dict) else None


def vet(job: Job, raw: Any = None) -> None:
    """Raise RefusedJob unless ``job`` is a crawler job (see the module docstring)."""
    for name in _FORBIDDEN_FIELDS:
        if _field(raw, name) not in (None, b"", ""):
            raise RefusedJob(f"job sets {name!r}, which crawler jobs never do", job.id)
    try:
        func_name = job.func_name
        args, kwargs = job.args, job.kwargs
    except Exception as exc:  # RQ's DeserializationError: data that is not the serializer's JSON
        raise RefusedJob(f"job data is not a JSON job: {exc.__cause__ or exc}", job.id) from None
    origin = job.origin or ""
    if func_name in OLD_DOWNLOAD_FUNCS:
        job.func_name = func_name = DOWNLOAD_FUNC  # RQ's setter: the job imports the function where it is now
    if func_name != DOWNLOAD_FUNC:
        raise RefusedJob(f"job calls {str(func_name)[:200]!r}, not a crawler job function", job.id)
    queue_site = keys.site_of_queue(origin)
    if queue_site is None:
        raise RefusedJob(f"download job on queue {origin!r}", job.id)
    if kwargs or not isinstance(args, list | tuple) or not 1 <= len(args) <= MAX_BATCH:
        raise RefusedJob(f"job arguments are not 1 to {MAX_BATCH} JSON objects", job.id)
    for payload in args:
        if not isinstance(payload, dict):
            raise RefusedJob(f"job arguments are not 1 to {MAX_BATCH} JSON objects", job.id)
        _vet_download(payload, queue_site, job.id)


def _vet_download(payload: dict[str, Any], queue_site: str, job_id: str) -> None:
    try:
        task = DownloadTask.from_json(payload)
    except ValueError as exc:
        raise RefusedJob(str(exc), job_id) from None
    if task.site != queue_site:
        raise RefusedJob(f"download job for site {task.site[:100]!r} on the queue of {queue_site!r}", job_id)


class RefusedEntry(ValueError):
    """A page entry that is not one the crawler wrote; its message says why."""


_PARSE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "site": str, "url": str, "status": int, "headers": dict, "encoding": (str, type(None)),
    "callback": (str, type(None)), "meta": dict, "depth": int, "fetched": str, "refresh": (int, float),
}  # fmt: skip


def page_entry(fields: Mapping[bytes, bytes]) -> tuple[dict[str, Any], bytes]:
    """The parse task and the compressed body of a page entry; RefusedEntry unless it is one.

    An entry is ``task`` (a JSON object: site, url, status, headers, encoding, callback,
    meta, depth, fetched, and refresh for a page to be refreshed) and ``body`` (zlib).
    The body is inflated later, within the body cap (``content.inflate_capped``): a bomb
    fails its page, it is not refused here.
    """
    for name in ("task", "body"):
        if name.encode() not in fields:
            raise RefusedEntry(f"page entry without {name!r}")
    try:
        task = json.loads(fields[b"task"])
    except ValueError as exc:  # UnicodeDecodeError included
        raise RefusedEntry(f"page entry task is not JSON: {str(exc)[:200]}") from None
    if not isinstance(task, dict):
        raise RefusedEntry("page entry task is not a JSON object")
    for name in ("site", "url"):
        if name not in task:
            raise RefusedEntry(f"parse task without {name!r}")
    for name, kinds in _PARSE_FIELDS.items():
        if name in task and (not isinstance(task[name], kinds) or isinstance(task[name], bool)):
            raise RefusedEntry(f"parse task field {name!r} has the wrong type")
    headers = task.get("headers") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise RefusedEntry("parse task headers are not strings")
    return task, fields[b"body"]
