"""Failed pages: list them with their reason, and requeue them for another try.

A page has failed when its latest fetch record, download or parse, says so: a download
that gave up (4xx, 5xx after its retries, a refused redirect, ...) or a callback that
raised (the record keeps the traceback). ``crawler failed`` and ``crawler retry`` are
thin shells over ``failed_pages`` and ``retry_pages``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from redis import Redis

from ..coord import counters
from ..coord.frontier import SEED_PRIORITY, Frontier
from ..coord.task import read_errback, read_request_data
from ..errors import ConfigError, RefusedURL
from ..spiders.spider import Request
from ..store.database import FAILED, REQUEUED, FetchRecord, Store
from ..urls import canonicalize
from ..work.robots import ask_again, origin_of


@dataclass(frozen=True)
class FailedPage:
    """The latest fetch record of a page that failed."""

    site: str
    url: str
    kind: str  # download | parse
    status: int | None
    attempt: int
    finished: datetime  # UTC
    error: str | None
    callback: str | None
    worker: str | None = None
    meta: dict[str, Any] | None = None
    #: What the record keeps of the request to send it again (``DownloadTask.recorded``); None for a plain GET.
    request: dict[str, Any] | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> FailedPage:
        finished = row["finished"]  # SQLite gives back the UTC time without its zone
        finished = finished.replace(tzinfo=UTC) if finished.tzinfo is None else finished.astimezone(UTC)
        return cls(
            site=row["site"],
            url=row["url"],
            kind=row["kind"],
            status=row["status"],
            attempt=row["attempt"],
            finished=finished,
            error=row["error"],
            callback=row["callback"],
            worker=row["worker"],
            meta=row.get("meta"),
            request=row.get("request"),
        )

    @property
    def reason(self) -> str:
        """One line: the exception of a traceback, else the error's first line, else the status."""
        lines = [line.strip() for line in (self.error or "").splitlines() if line.strip()]
        if lines:
            return lines[-1] if lines[0].startswith("Traceback") else lines[0]
        return f"HTTP {self.status}" if self.status is not None else "failed"

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data, full error included."""
        return {
            "site": self.site,
            "url": self.url,
            "kind": self.kind,
            "status": self.status,
            "attempt": self.attempt,
            "finished": self.finished.isoformat(),
            "reason": self.reason,
            "error": self.error,
            "callback": self.callback,
            "worker": self.worker,
            "meta": self.meta,
            "request": self.request,
        }


def failed_pages(store: Store, site: str | None = None, limit: int | None = None) -> list[FailedPage]:
    """The failed pages of ``site`` (of every site when None), by site then age."""
    return [FailedPage.from_row(row) for row in store.failed_pages(site, limit)]


def retry_pages(store: Store, frontier: Frontier, urls: Iterable[str] | None = None) -> list[FailedPage]:
    """Requeue failed pages of the frontier's site: ``urls``, or every one when None.

    Each URL must be a failed page of the site (or one already requeued), else
    ConfigError naming it and nothing is requeued. Pages go back as the request that
    failed (its method, headers and body: a POST is sent again as a POST), with the callback
    they failed for, and skip the seen set (they are in it); items are upserted, so a page
    parsed again duplicates nothing. Each requeued page gets a ``retry`` record
    (``requeued``), so it is no longer listed as failed and asking again queues it
    once, not twice, until it has been fetched and failed again. Returns the pages
    requeued now.
    """
    site = frontier.site
    pages = failed_pages(store, site) if urls is None else _failed_among(store, site, urls)
    requests = []
    for page in pages:  # all or nothing: a page the spider would now refuse stops the lot
        try:
            frontier.check(page.url)
        except RefusedURL as exc:
            raise ConfigError(f"cannot requeue {page.url}: {exc}") from None
        requests.append(_request_again(page))
    # The records first: a second retry finds these pages requeued, whatever happens next.
    _record_requeued(store, site, pages)
    # A page that failed because robots.txt could not be read gets it asked again now, not after its backoff.
    ask_again(frontier.connection, site, [origin_of(page.url) for page in pages])
    frontier.add(requests)
    _uncount_failed(frontier.connection, site, len(pages))
    return pages


def _failed_among(store: Store, site: str, urls: Iterable[str]) -> list[FailedPage]:
    """The pages of ``urls`` whose latest record failed, one a canonical URL; ConfigError naming a URL
    that is not a failed page of ``site`` nor one already requeued."""
    spellings = {url: (url, _canonical(url)) for url in urls}  # as given, and as records spell it
    looked_up = store.failed_pages(
        site, urls=[form for forms in spellings.values() for form in forms], outcomes=(FAILED, REQUEUED)
    )
    found = {row["url"]: row for row in looked_up}
    missing = [url for url, forms in spellings.items() if not any(form in found for form in forms)]
    if missing:
        raise ConfigError(
            f"not a failed page of {site!r}: {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    chosen = (
        found[form]
        for forms in spellings.values()
        for form in forms
        if form in found and found[form]["outcome"] == FAILED
    )
    return list({_canonical(page.url): page for page in map(FailedPage.from_row, chosen)}.values())


def _record_requeued(store: Store, site: str, pages: list[FailedPage]) -> None:
    """A ``retry`` record (outcome ``requeued``) for each page, with what it takes to send it again."""
    now = datetime.now(UTC)
    store.record_fetches(
        [
            FetchRecord(
                site=site,
                url=page.url,
                outcome=REQUEUED,
                kind="retry",
                started=now,
                finished=now,
                callback=page.callback,
                meta=page.meta,
                request=page.request,
            )
            for page in pages
        ]
    )


def _request_again(page: FailedPage) -> Request:
    """The request that failed, as its record keeps it; ConfigError if what it keeps does not hold."""
    try:
        method, headers, body = read_request_data(page.request or {})
        return Request(
            page.url,
            callback=page.callback or "parse",
            meta=page.meta or {},
            dont_filter=True,
            priority=SEED_PRIORITY,
            method=method,
            headers=headers,
            body=body,
            errback=read_errback(page.request or {}),
        )
    except ValueError as exc:
        raise ConfigError(f"cannot requeue {page.url}: its recorded request does not hold ({exc})") from None


def _uncount_failed(connection: Redis, site: str, pages: int) -> None:
    """Take requeued pages out of the site's ``failed`` counter: they count again if they fail again."""
    counters.uncount(connection, site, "failed", pages)


def _canonical(url: str) -> str:
    """The spelling fetch records use; a URL that cannot be canonicalized is looked up as given."""
    try:
        return canonicalize(url)
    except RefusedURL:
        return url
