"""What ``crawler crawl`` tells while it runs: progress over both stages, and callback errors as they come.

``Progress`` turns successive status snapshots into rates (downloads and parses per
second) and an ETA that covers what is left to download *and* to parse, so a crawl
whose downloads are done but whose parses are not never reads "ETA 0s". ``ErrorWatch``
reads new failed parse records from the database and gives the first of each kind
(site and exception type) once, with its URL and where to see the rest.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from ..store.database import FAILED, Store
from ..store.schema import fetches
from .failures import FailedPage
from .status import ParseBacklog, SiteStatus

#: Seconds of samples a rate is taken over. The counters it reads are written by each
#: worker process once a second (``counters.FLUSH_EVERY``), in steps: over 5 s a step
#: moves a rate by a fifth at most, where over the last half second it would swing
#: between nothing and double.
RATE_WINDOW = 5.0
#: Least seconds of samples before there is a rate (a shorter span gives a noisy one).
RATE_MIN_SPAN = 0.5


@dataclass
class Snapshot:
    """One site's progress: its status, the parse backlog, rates and the ETA over both stages."""

    status: SiteStatus
    backlog: ParseBacklog
    download_rate: float
    parse_rate: float
    eta: float | None

    @property
    def to_parse(self) -> int:
        return self.backlog.queued + self.backlog.in_flight


def eta(status: SiteStatus, backlog: ParseBacklog, download_rate: float, parse_rate: float) -> float | None:
    """Seconds until every download and every parse left is done; None while a rate needed is unknown.

    Every download left is also a parse to come, so the parse stage has the backlog plus
    the downloads left; the slower of the two stages decides.
    """
    downloads = status.left
    parses = backlog.queued + backlog.in_flight + downloads
    if not downloads and not parses:
        return 0.0
    if (downloads and not download_rate) or (parses and not parse_rate):
        return None
    return max(downloads / download_rate if downloads else 0.0, parses / parse_rate if parses else 0.0)


class Progress:
    """Downloads and parses per second per site over the last RATE_WINDOW, from successive snapshots."""

    def __init__(self) -> None:
        self._samples: dict[str, deque[tuple[float, int, int]]] = {}

    def update(self, statuses: Iterable[SiteStatus], backlog: ParseBacklog) -> list[Snapshot]:
        now = time.monotonic()
        snapshots = []
        for s in statuses:
            samples = self._samples.setdefault(s.site, deque())
            samples.append((now, s.done, s.parsed))
            while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW:  # the oldest left spans the window
                samples.popleft()
            then, done, parsed = samples[0]
            download_rate, parse_rate = 0.0, 0.0
            if now - then >= RATE_MIN_SPAN:  # never below zero: a reset meanwhile starts the counters again
                download_rate = max(0.0, (s.done - done) / (now - then))
                parse_rate = max(0.0, (s.parsed - parsed) / (now - then))
            snapshots.append(
                Snapshot(s, backlog, download_rate, parse_rate, eta(s, backlog, download_rate, parse_rate))
            )
        return snapshots


class ErrorWatch:
    """Callback errors of ``sites`` recorded after it was made: the first of each kind, once."""

    def __init__(self, database_url: str, sites: Sequence[str]):
        self.database_url = database_url
        self.sites = list(sites)
        self._after_id = self._last_id()
        self._kinds: set[tuple[str, str]] = set()
        #: Errors of a kind already shown, by site (told at the end).
        self.more: dict[str, int] = {}

    def poll(self) -> Iterator[str]:
        """Lines about the first error of each new kind found since the last poll."""
        for page in self._new_failures():
            kind = (page.site, exception_name(page.reason))
            if kind in self._kinds:
                self.more[page.site] = self.more.get(page.site, 0) + 1
                continue
            self._kinds.add(kind)
            callback = f" ({page.callback})" if page.callback else ""
            yield f"error: {page.site}: {page.reason}"
            yield f"  at {page.url}{callback}; the whole error: crawler failed {page.site} --traceback"

    def _new_failures(self) -> list[FailedPage]:
        query = (
            select(fetches)
            .where(
                fetches.c.site.in_(self.sites),
                fetches.c.kind == "parse",
                fetches.c.outcome == FAILED,
                fetches.c.id > self._after_id,
            )
            .order_by(fetches.c.id)
            .limit(500)
        )
        rows = self._rows(query)
        if rows:
            self._after_id = rows[-1]["id"]
        return [FailedPage.from_row(row) for row in rows]

    def _last_id(self) -> int:
        rows = self._rows(select(func.max(fetches.c.id).label("id")))
        return int(rows[0]["id"] or 0) if rows else 0

    def _rows(self, query: Any) -> list[dict[str, Any]]:
        store = Store(self.database_url)
        try:
            with store.engine.connect() as conn:
                return [dict(row._mapping) for row in conn.execute(query)]
        finally:
            store.close()

    def closing_lines(self) -> Iterator[str]:
        """One line per site with more errors than were shown."""
        for site, count in sorted(self.more.items()):
            plural = "" if count == 1 else "s"
            yield f"{site}: {count} more callback error{plural} of the kinds shown: crawler failed {site}"


def exception_name(reason: str) -> str:
    """``ValueError`` from ``ValueError: could not convert ...`` (the whole reason if it names none)."""
    head = reason.split(":", 1)[0].strip()
    return head if head and " " not in head else reason
