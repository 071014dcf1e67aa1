"""The frontier: canonicalize URLs, keep to allowed domains, deduplicate, enqueue.

Every URL that enters a site's queue passes ``Frontier.add``: it is
canonicalized (w3lib; fragments dropped, query sorted, default port removed), refused
unless http(s) and within the spider's allowed domains, and enqueued only if its
fingerprint is new to the site's seen set in Redis. Redirect targets go through the
same door, so no page is downloaded twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
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
from .scheduler import decode_entry, encode_entry
from .spider import Request

#: Dotted path of the download job function.
DOWNLOAD_FUNC = "crawler.jobs.download"

_DEFAULT_PORTS = {"http": 80, "https": 443}
COUNTERS = (("depth", 0), ("hops", 0), ("attempt", 1))


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

    def to_json(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "url": self.url,
            "callback": self.callback,
            "meta": self.meta or {},
            "depth": self.depth,
            "hops": self.hops,
            "attempt": self.attempt,
        }

    def to_entry(self) -> str:
        """The compact frontier entry for this task (the site is implied by the list)."""
        return encode_entry(self.url, self.callback, self.depth, self.hops, self.attempt, self.meta)

    @classmethod
    def from_entry(cls, site: str, entry: str | bytes) -> DownloadTask:
        """Rebuild a task from a compact frontier entry; ValueError for a malformed one."""
        return cls.from_json({"site": site, **decode_entry(entry)})

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
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad download task counters: {data!r:.200}") from exc
        return cls(site=data["site"], url=data["url"], callback=str(data.get("callback") or "parse"), meta=meta,
                   **counters)


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

    def __init__(self, connection: Redis, site: str, domains: Iterable[str], failure_ttl: int, job_timeout: int):
        self.connection = connection
        self.site = site
        self.domains = list(domains)
        self.failure_ttl = failure_ttl
        self.job_timeout = job_timeout
        self.queue = download_queue(connection, site)

    def check(self, url: str) -> str:
        """The canonical URL, or RefusedURL if it is malformed or off-domain."""
        canonical = canonicalize(url)
        if not host_allowed(canonical, self.domains):
            raise RefusedURL(f"{canonical} is outside the allowed domains ({', '.join(self.domains)})")
        return canonical

    def add(self, requests: Iterable[Request], depth: int = 0, hops: int = 0) -> AddResult:
        """Queue the requests whose canonical URL is new to the site.

        ``dont_filter`` requests skip the seen set. Refused URLs are returned, not raised.
        """
        result = AddResult(enqueued=[], refused=[])
        candidates: list[tuple[str, Request]] = []
        for request in requests:
            try:
                candidates.append((self.check(request.url), request))
            except RefusedURL as exc:
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
                tasks.append(DownloadTask(self.site, url, str(request.callback), request.meta, depth, hops))
            else:
                result.duplicates += 1
        self.push(tasks)
        result.enqueued = [t.url for t in tasks]
        return result

    def push(self, tasks: list[DownloadTask]) -> None:
        """Append tasks to the compact frontier, without dedup, and mark the site ready."""
        if not tasks:
            return
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.rpush(keys.frontier(self.site), *(task.to_entry() for task in tasks))
            pipe.zadd(keys.ready(), {self.site: 0}, nx=True)  # score 0: due now
            pipe.sadd(keys.sites(), self.site)
            pipe.execute()

    def refill(self, jobs_ahead: int) -> int:
        """Turn compact entries into RQ jobs until ``jobs_ahead`` are queued. Returns how many.

        A short per-site lock keeps two workers from turning the same entries into jobs;
        the jobs and the trim of the frontier are written in one transaction.
        """
        lock = Gate(self.connection, f"refill:{self.site}", expire=5, auto_release=True,
                    namespace=keys.PREFIX + "lock")
        if not lock.acquire(blocking=False):
            return 0
        try:
            wanted = jobs_ahead - int(self.connection.llen(self.queue.key))
            if wanted <= 0:
                return 0
            entries = self.connection.lrange(keys.frontier(self.site), 0, wanted - 1)
            tasks = []
            for entry in entries:
                try:
                    tasks.append(DownloadTask.from_entry(self.site, entry))
                except ValueError:  # a malformed entry (written by hand?) is dropped, not retried forever
                    continue
            with self.connection.pipeline(transaction=True) as pipe:
                self.queue.enqueue_many(self._jobs(tasks), pipeline=pipe)
                pipe.ltrim(keys.frontier(self.site), len(entries), -1)
                pipe.execute()
            return len(tasks)
        finally:
            lock.release()

    def _jobs(self, tasks: list[DownloadTask]) -> list[Any]:
        return [
            Queue.prepare_data(
                DOWNLOAD_FUNC,
                args=(task.to_json(),),
                result_ttl=0,
                failure_ttl=self.failure_ttl,
                timeout=self.job_timeout,
                description=task.url,
                retry=job_retry(),
            )
            for task in tasks
        ]

    def forget(self, url: str) -> None:
        """Drop ``url`` from the seen set, so it may be enqueued again."""
        self.connection.srem(keys.seen(self.site), fingerprint(canonicalize(url)))


def seed(frontier: Frontier, urls: Iterable[str], force: bool = False) -> AddResult:
    """Enqueue start URLs; RefusedURL for the first malformed or off-domain one.

    Every URL is checked before any is enqueued, so a bad seed enqueues nothing.
    ``force`` enqueues URLs even if already seen.
    """
    urls = list(urls)
    for url in urls:
        frontier.check(url)
    return frontier.add([Request(url, dont_filter=force) for url in urls])
