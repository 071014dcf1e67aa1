"""The download job, which RQ runs: ``download``. Arguments are plain JSON.

A job's URLs are fetched in turn (``batch``), each in steps (``attempt``): taken (the URL
checked again) → robots.txt → login session (``login``) → request headers → gate → GET (or
a browser's render: ``browser``) → what the answer comes to (``outcomes``): (HTML) the page
added, its body compressed, to the pages stream, where parse workers take it
(``parse_job``) | (3xx) the target sent through the frontier | (304 to a refresh) its items
seen again | (5xx/429/timeout) a retry with backoff | (4xx, refused) recorded; then its
next refresh, if it has one. Every record goes through ``state.AttemptState.record``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...coord import joblife
from ...http.headers import handed_headers
from .. import runtime
from ..gated_fetch import sent_headers
from . import batch
from .attempt import Attempt
from .outcomes import Verdict, classify

__all__ = ["Attempt", "Verdict", "classify", "download", "handed_headers", "sent_headers"]


def download(
    *payloads: dict[str, Any],
    rt: runtime.Runtime,
    stopping: Callable[[], bool] | None = None,
    crowded: Callable[[], bool] | None = None,
    finishing: list[joblife.Finishing] | None = None,
    rest: Callable[[float], bool] | None = None,
) -> None:
    """Download the job's URLs, all of one site and priority, in turn: one URL, or a batch (``batch``).

    ``rt``: what the job runs against, given by the download worker that runs it (``CrawlerJob.bound``)
    or the caller (a test, a benchmark). A download worker also gives the rest:
    ``stopping``, whether the worker is stopping gracefully (a batch hands its rest back);
    ``crowded``, whether every thread its process may have is busy (a paced batch hands its
    rest back after its request in flight); ``rest(seconds)``, a wait a graceful stop ends at
    once (a paced batch's between two URLs), True when one did; ``finishing``, a list
    the job leaves calls in, which the worker runs once the job ends, in the transaction that
    finishes it (``joblife.finish``) or, when the job failed, on their own.
    """
    batch.run(rt, payloads, stopping, crowded, finishing, rest)
