"""A request that finally failed, handed to its errback: one page entry for the parse workers.

The page's failed (or refused) record goes as ever; in its pipeline, when the request or its
spider has an errback (``spiders.failure.errback_of``), an entry for the parse workers goes too,
naming the errback as its callback and carrying what failed (``failure``) and the answer's body
when there was one. A parse worker calls the errback with a ``Failure`` (``parse_job``); what
it yields is stored and queued as a callback's output. The errback's own failure is recorded
as a parse's, and never calls an errback: a failure is handed on once.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from ...coord import pages
from ...coord.task import DownloadTask
from ...errors import (
    BadResponse,
    BodyTooLarge,
    ClientStatus,
    ConnectError,
    FetchTimeout,
    RefusedURL,
    RetryableStatus,
    RobotsUnavailable,
    TooManyRedirects,
)
from ...http.fetch import Response
from ...http.headers import handed_headers
from ...spiders.failure import errback_of
from ...spiders.spider import Spider
from ...store.database import REFUSED, utcnow

#: The failure kind of each exception a request may finally fail with (``spiders.failure.KINDS``).
KIND_OF: tuple[tuple[type[BaseException], str], ...] = (
    (FetchTimeout, "timeout"),
    (ConnectError, "connection"),
    (RetryableStatus, "status"),
    (ClientStatus, "status"),
    (RobotsUnavailable, "robots"),
    (RefusedURL, "refused"),
    (BodyTooLarge, "too_large"),
    (BadResponse, "bad_response"),
    (TooManyRedirects, "redirects"),
)


def failure_kind(exc: BaseException) -> str:
    """The kind of failure ``exc`` is, as an errback is told it (``error`` for any other)."""
    return next((kind for cls, kind in KIND_OF if isinstance(exc, cls)), "error")


def to_errback(
    task: DownloadTask,
    spider: Spider,
    outcome: str,
    response: Response | None,
    error: str | None,
    status: int | None,
    kind: str | None,
) -> Callable[[Any], None] | None:
    """What adds ``task``'s failure for its errback to a record's pipeline; None when it has no errback."""
    name = errback_of(spider, task.errback)
    if name is None:
        return None
    if kind is None:
        kind = "refused" if outcome == REFUSED else "status" if status or response is not None else "error"
    payload: dict[str, Any] = {
        "site": task.site,
        "url": task.url,
        "status": response.status if response is not None else 0,
        "headers": handed_headers(response.headers) if response is not None else {},
        "encoding": response.encoding if response is not None else None,
        "callback": name,
        "meta": task.meta or {},
        "depth": task.depth,
        "fetched": (response.started if response is not None else utcnow()).isoformat(),
        "failure": {
            "kind": kind,
            "error": error or outcome,
            "attempts": task.attempt,
            "method": task.method,
            "status": status if status is not None else (response.status if response is not None else None),
            "answered": response is not None,
        },
    }
    if task.method != "GET" or task.body is not None:
        payload["request"] = {"method": task.method, "headers": {}, "variant": task.fingerprint.hex()}
    again = task.recorded()
    if again:  # should the errback fail, its record keeps the request (``crawler retry``)
        payload["again"] = again
    body = zlib.compress(response.body if response is not None else b"", 6)
    return lambda pipe: pages.add(pipe, payload, body)
