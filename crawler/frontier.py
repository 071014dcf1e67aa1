"""The frontier: canonicalize URLs, keep to allowed domains, deduplicate, enqueue.

Every URL that enters a site's queue passes ``Frontier.add``: it is
canonicalized (w3lib; fragments dropped, query sorted, default port removed), refused
unless http(s) and within the spider's allowed domains, and enqueued only if its
fingerprint is new to the site's seen set in Redis. Redirect targets go through the
same door, so no page is downloaded twice.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer
from w3lib.url import canonicalize_url

from . import keys
from .errors import RefusedURL
from .gate import Gate
from .recovery import job_retry
from .scheduler import JOBS_AHEAD, Scheduler, decode_entry, encode_entry
from .spider import Request

#: Dotted path of the download job function.
DOWNLOAD_FUNC = "crawler.jobs.download"

_DEFAULT_PORTS = {"http": 80, "https": 443}
COUNTERS = (("depth", 0), ("hops", 0), ("attempt", 1), ("priority", 0))

#: Priority of start URLs and of pages a user asks for (``seed``, ``retry``).
SEED_PRIORITY = 10
#: Default priority of scheduled refreshes: after everything else (``Spider.refresh_priority``).
REFRESH_PRIORITY = -10
#: Priorities a request may have (each one used is a list per site in Redis).
PRIORITY_RANGE = (-1000, 1000)


def canonicalize(url: str) -> str:
    """The one spelling of ``url`` used for dedup and requests.

    Raises RefusedURL for anything but an absolute http(s) URL with a valid host.
    """
    url = url.strip()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RefusedURL(f"malformed URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise RefusedURL(f"not an http(s) URL: {url!r}")
    host = (parts.hostname or "").lower()
    if not host or any(c.isspace() for c in host) or "%" in host:
        raise RefusedURL(f"URL has no valid host: {url!r}")
    try:
        canonical = canonicalize_url(url, keep_fragments=False)
    except (ValueError, UnicodeError) as exc:
        raise RefusedURL(f"malformed URL {url!r}: {exc}") from None
    if port == _DEFAULT_PORTS[scheme]:
        parts = urlsplit(canonical)
        netloc = parts.netloc.rsplit(":", 1)[0]
        canonical = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    return canonical


def fingerprint(canonical_url: str) -> bytes:
    """8-byte digest of a canonical URL: the member stored in the seen set."""
    return hashlib.blake2b(canonical_url.encode(), digest_size=8).digest()


def host_allowed(url: str, domains: Iterable[str]) -> bool:
    """Whether ``url``'s host is one of ``domains`` or a subdomain of one."""
    host = (urlsplit(url).hostname or "").lower()
    return any(host == d or host.endswith("." + d) for d in domains)


@dataclass(frozen=True)
class DownloadTask:
    """The plain-data payload of one download job."""

    site: str
    url: str
    callback: str = "parse"
    meta: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    hops: int = 0
    attempt: int = 1
    priority: int = 0
    #: Seconds after which the page is to be fetched again (None: never).
    refresh: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = {
            "site": self.site,
            "url": self.url,
            "callback": self.callback,
            "meta": self.meta or {},
            "depth": self.depth,
            "hops": self.hops,
            "attempt": self.attempt,
            "priority": self.priority,
        }
        if self.refresh is not None:
            data["refresh"] = self.refresh
        return data

    def to_entry(self) -> str:
        """The compact frontier entry for this task (site and priority are implied by the list)."""
        return encode_entry(self.url, self.callback, self.depth, self.hops, self.attempt, self.meta, self.refresh)

    @classmethod
    def from_entry(cls, site: str, entry: str | bytes, priority: int = 0) -> DownloadTask:
        """Rebuild a task from a compact frontier entry; ValueError for a malformed one."""
        return cls.from_json({"site": site, "priority": priority, **decode_entry(entry)})

    @classmethod
    def from_json(cls, data: Any) -> DownloadTask:
        """Rebuild a task from a job argument; ValueError unless it has the right shape."""
        if not isinstance(data, dict) or not isinstance(data.get("site"), str) or not isinstance(data.get("url"), str):
            raise ValueError(f"not a download task: {data!r:.200}")
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError("download task meta must be an object")
        try:
            counters = {name: int(data.get(name, default)) for name, default in COUNTERS}
            refresh = check_refresh(data.get("refresh"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad download task counters: {data!r:.200}") from exc
        return cls(site=data["site"], url=data["url"], callback=str(data.get("callback") or "parse"), meta=meta,
                   refresh=refresh, **counters)


def check_priority(value: Any) -> int:
    """``value`` as a request priority; ValueError unless an integer within PRIORITY_RANGE."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"priority must be an integer, not {value!r}")
    low, high = PRIORITY_RANGE
    if not low <= value <= high:
        raise ValueError(f"priority must be between {low} and {high}, not {value}")
    return value


def check_refresh(value: Any) -> float | None:
    """``value`` as a refresh interval in seconds (None: never); ValueError unless positive."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"refresh must be a positive number of seconds, not {value!r}")
    return float(value)


@dataclass
class AddResult:
    """What ``Frontier.add`` did with a batch of requests."""

    enqueued: list[str]
    duplicates: int = 0
    refused: list[tuple[str, str]] | None = None  # (url, reason)


def download_queue(connection: Redis, site: str) -> Queue:
    """The RQ queue of ``site``'s download jobs (JSON payloads only)."""
    return Queue(keys.download_queue(site), connection=connection, serializer=JSONSerializer)


class Frontier:
    """Admits requests for one site, each URL once, and feeds its RQ queue just in time.

    Admitted URLs wait in the site's compact frontier list (``scheduler``); ``refill``
    turns a few of them at a time into RQ jobs on ``download:SITE``.
    """

    def __init__(self, connection: Redis, site: str, domains: Iterable[str], failure_ttl: int, job_timeout: int,
                 refresh: Callable[[Request], float | None] | None = None):
        """``refresh`` gives a request's refresh interval (the spider's rule); None: no refreshes."""
        self.connection = connection
        self.refresh = refresh
        self.site = site
        self.domains = list(domains)
        self.failure_ttl = failure_ttl
        self.job_timeout = job_timeout
        self.queue = download_queue(connection, site)

    @cached_property
    def scheduler(self) -> Scheduler:
        return Scheduler(self.connection)

    def check(self, url: str) -> str:
        """The canonical URL, or RefusedURL if it is malformed or off-domain."""
        canonical = canonicalize(url)
        if not host_allowed(canonical, self.domains):
            raise RefusedURL(f"{canonical} is outside the allowed domains ({', '.join(self.domains)})")
        return canonical

    def add(self, requests: Iterable[Request], depth: int = 0, hops: int = 0) -> AddResult:
        """Queue the requests whose canonical URL is new to the site.

        ``dont_filter`` requests skip the seen set. Refused URLs (and requests with a bad
        priority or refresh) are returned, not raised.
        """
        result = AddResult(enqueued=[], refused=[])
        candidates: list[tuple[str, Request]] = []
        for request in requests:
            try:
                check_priority(request.priority)
                check_refresh(request.refresh)
                candidates.append((self.check(request.url), request))
            except (RefusedURL, ValueError) as exc:
                assert result.refused is not None
                result.refused.append((request.url, str(exc)))
        if not candidates:
            return result
        with self.connection.pipeline(transaction=False) as pipe:
            for url, _ in candidates:
                pipe.sadd(keys.seen(self.site), fingerprint(url))
            fresh = pipe.execute()
        tasks = []
        for (url, request), is_new in zip(candidates, fresh, strict=True):
            if is_new or request.dont_filter:
                every = request.refresh if request.refresh is not None or not self.refresh else self.refresh(request)
                tasks.append(DownloadTask(self.site, url, str(request.callback), request.meta, depth, hops,
                                          priority=request.priority, refresh=every))
            else:
                result.duplicates += 1
        self.push(tasks)
        result.enqueued = [t.url for t in tasks]
        return result

    def push(self, tasks: list[DownloadTask]) -> None:
        """Append tasks to the compact frontier by priority, without dedup, and mark the site ready.

        Jobs already made from entries of a lower priority are handed back first (see
        ``preempt``), so the new entries are next.
        """
        if not tasks:
            return
        by_priority: dict[int, list[str]] = {}
        for task in tasks:
            by_priority.setdefault(task.priority, []).append(task.to_entry())
        with self.connection.pipeline(transaction=True) as pipe:
            for priority, entries in by_priority.items():
                pipe.rpush(keys.frontier(self.site, priority), *entries)
                pipe.zadd(keys.levels(self.site), {str(priority): priority})
            pipe.zadd(keys.ready(), {self.site: 0}, nx=True)  # score 0: due now
            pipe.sadd(keys.sites(), self.site)
            pipe.zrangebyscore(keys.queued(self.site), "-inf", f"({max(by_priority)}", start=0, num=1)
            outranked = pipe.execute()[-1]
        if outranked:
            self.preempt(max(by_priority))

    def preempt(self, priority: int) -> int:
        """Hand queued jobs below ``priority`` back to the frontier and refill. Returns how many.

        Jobs a worker has already taken run; the others go back to the front of their
        priority's list, in their order, so nothing is lost or reordered within a priority.
        """
        lock = self._refill_lock()
        if not lock.acquire(timeout=5):
            return 0
        try:
            lower = {_text(i) for i in self.connection.zrangebyscore(keys.queued(self.site), "-inf", f"({priority}")}
            if not lower:
                return 0
            order = [_text(i) for i in self.connection.lrange(self.queue.key, 0, -1)]
            evicted = 0
            for job_id in reversed([i for i in order if i in lower]):  # back to front keeps their order
                job = self.queue.fetch_job(job_id)
                if job is None:
                    continue
                task = DownloadTask.from_json(job.args[0])
                evicted += self.scheduler.evict(self.site, self.queue.key, job_id, task.priority, task.to_entry())
            stale = lower - set(order)
            if stale:  # taken meanwhile, or lost with a crashed refill: no longer ours to track
                self.connection.zrem(keys.queued(self.site), *stale)
        finally:
            lock.release()
        self.refill(JOBS_AHEAD)
        return evicted

    def refill(self, jobs_ahead: int) -> int:
        """Turn compact entries into RQ jobs until ``jobs_ahead`` are queued, highest priority first.

        Returns how many. A short per-site lock keeps two workers from turning the same
        entries into jobs; the jobs and the trims of the frontier lists are written in one
        transaction.
        """
        lock = self._refill_lock()
        if not lock.acquire(blocking=False):
            return 0
        try:
            wanted = jobs_ahead - int(self.connection.llen(self.queue.key))
            if wanted <= 0:
                return 0
            taken: list[tuple[int, int]] = []  # (priority, entries read)
            tasks = []
            for raw in self.connection.zrevrange(keys.levels(self.site), 0, -1):
                priority = int(raw)
                entries = self.connection.lrange(keys.frontier(self.site, priority), 0, wanted - len(tasks) - 1)
                taken.append((priority, len(entries)))
                for entry in entries:
                    try:
                        tasks.append(DownloadTask.from_entry(self.site, entry, priority))
                    except ValueError:  # a malformed entry (written by hand?) is dropped, not retried forever
                        continue
                if len(tasks) >= wanted:
                    break
            ids = [uuid.uuid4().hex for _ in tasks]
            with self.connection.pipeline(transaction=True) as pipe:
                self.queue.enqueue_many(self._jobs(tasks, ids), pipeline=pipe)
                if tasks:
                    pipe.zadd(keys.queued(self.site), {i: t.priority for i, t in zip(ids, tasks, strict=True)})
                for priority, count in taken:
                    if count:
                        pipe.ltrim(keys.frontier(self.site, priority), count, -1)
                pipe.execute()
            self.scheduler.forget_empty_levels(self.site, [p for p, _ in taken])
            return len(tasks)
        finally:
            lock.release()

    def _refill_lock(self) -> Gate:
        return Gate(self.connection, f"refill:{self.site}", expire=5, auto_release=True,
                    namespace=keys.PREFIX + "lock")

    def _jobs(self, tasks: list[DownloadTask], ids: list[str]) -> list[Any]:
        return [
            Queue.prepare_data(
                DOWNLOAD_FUNC,
                args=(task.to_json(),),
                result_ttl=0,
                failure_ttl=self.failure_ttl,
                timeout=self.job_timeout,
                description=task.url,
                job_id=job_id,
                retry=job_retry(),
            )
            for task, job_id in zip(tasks, ids, strict=True)
        ]

    def waiting(self) -> list[DownloadTask]:
        """Tasks waiting in the compact frontier (not yet RQ jobs), highest priority first."""
        tasks = []
        for raw in self.connection.zrevrange(keys.levels(self.site), 0, -1):
            priority = int(raw)
            for entry in self.connection.lrange(keys.frontier(self.site, priority), 0, -1):
                tasks.append(DownloadTask.from_entry(self.site, entry, priority))
        return tasks

    def forget(self, url: str) -> None:
        """Drop ``url`` from the seen set, so it may be enqueued again."""
        self.connection.srem(keys.seen(self.site), fingerprint(canonicalize(url)))


def seed(frontier: Frontier, urls: Iterable[str], force: bool = False, priority: int = SEED_PRIORITY) -> AddResult:
    """Enqueue start URLs at ``priority``; RefusedURL for the first malformed or off-domain one.

    Every URL is checked before any is enqueued, so a bad seed enqueues nothing.
    ``force`` enqueues URLs even if already seen (a refresh the user asks for).
    """
    urls = list(urls)
    for url in urls:
        frontier.check(url)
    return frontier.add([Request(url, dont_filter=force, priority=priority) for url in urls])


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
