"""What one attempt at a URL knows as its steps go (``AttemptState``), and how its fetch records are written."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from rq import get_current_job

from ...coord import keys
from ...coord.gate import Gate
from ...coord.task import DownloadTask
from ...errors import ConnectError, FetchTimeout
from ...http.fetch import Response
from ...http.headers import user_agent_of
from ...spiders.spider import Spider
from ...store.database import FAILED, OK, REDIRECT, REFUSED, SKIPPED, UNCHANGED, FetchRecord, utcnow
from .. import runtime
from ..events import Done, HeldRecords, SoonRecords, jobs_done, write_now
from ..gated_fetch import rearm, sent_headers
from ..sitemaps import SitemapSink
from .context import SiteContext
from .errback import to_errback

log = logging.getLogger("crawler.jobs")

#: Outcomes whose record a batch may hold back (``download``). A retry or a failure is
#: written at once, after what was held: the errors-in-a-row rule reads what came before.
HELD_OUTCOMES = frozenset({OK, UNCHANGED, REDIRECT, SKIPPED, REFUSED})


def worker_name() -> str | None:
    """The name of the RQ worker running this job (None outside one)."""
    job = get_current_job()
    return job.worker_name if job is not None else None


@dataclasses.dataclass
class AttemptState:
    """One attempt at one URL of a download job: what its steps share, each leaving its part for the next.

    The steps are ``attempt.Attempt``'s; the outcomes they come to (``outcomes``, ``login``) take
    this state. A step returning False or None has dealt with the page (recorded it, scheduled it
    again). Every record goes through ``record``.
    """

    rt: runtime.Runtime
    task: DownloadTask
    #: The site as read once for this URL: its spider, policy, proxy (``context.site_context``).
    context: SiteContext
    #: A batch's records held back (``download``): until its end, or (a paced batch's) a little; or
    #: None: each written at once.
    held: HeldRecords | SoonRecords | None
    #: The User-Agent the request goes with (``SiteContext.user_agent_for``): what robots.txt is read for.
    user_agent: str
    #: When the attempt began: the ``started`` of records with no response of their own.
    started: datetime
    #: Seconds waited for the gate (``take_gate``): part of the page's own record.
    gate_wait: float | None = None
    #: The site's login session the request is sent with (``logged_in``), for a site that logs in.
    generation: int | None = None
    #: The request's If-None-Match/If-Modified-Since (``build_request``), for a conditional refresh.
    conditional: dict[str, str] = dataclasses.field(default_factory=dict)
    #: The request's headers beyond the fetcher's own, conditional ones and cookies included (``build_request``).
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    #: A sitemap streams into this compressor (up to 50 MB decoded), never held whole (``fetch``).
    sink: SitemapSink | None = None
    #: The page was rendered (``render``): its next refresh asks for it whole, its scripts may have changed it.
    rendered: bool = False
    #: The gate of the request sent whose rearm goes with the page's record (``Runtime.rearms_late``).
    unarmed: Gate | None = None
    #: robots.txt was fetched for this page (``robots_allow``): the site's turn at its gate went to it.
    robots_fetched: bool = False

    @property
    def spider(self) -> Spider:
        return self.context.spider

    @property
    def proxy(self) -> str | None:
        """The proxy of the attempt's requests (None: direct), chosen once for the URL (``SiteContext.proxy``)."""
        return self.context.proxy

    def rearm_now(self) -> None:
        """Rearm the gate of the request sent, if its rearm was left to the page's record and no record
        has taken it yet (``Gate.rearm_sent_now``): one round trip of its own."""
        gate, self.unarmed = self.unarmed, None
        if gate is not None:
            gate.rearm_sent_now()

    def record(
        self,
        outcome: str,
        url: str | None = None,
        response: Response | None = None,
        error: str | None = None,
        status: int | None = None,
        then: Callable[[Any], None] | None = None,
        kind: str | None = None,
    ) -> None:
        """Record ``outcome`` for the page, or for another request the attempt made (``url``: robots.txt,
        a login's, a rendered page's), with ``then``'s Redis commands in the pipeline after it.

        Only the page's own record counts it (``fetched``, ``failed``, ``refused``, ``unchanged``)
        and carries the gate's wait; its success (OK, UNCHANGED, REDIRECT) ends the site's run of
        errors in that pipeline (DEL ``keys.errors``), before ``then``'s commands; its failure
        (FAILED, REFUSED) goes to its errback too (``errback.to_errback``; ``kind``: what failed,
        ``errback.failure_kind``). A batch holds the record back (``HELD_OUTCOMES``); a retry or a
        failure is written at once, after what was held: the errors-in-a-row rule reads what came before.
        """
        task = self.task
        url = task.url if url is None else url
        finished = utcnow()
        stats = _counted(outcome) if url == task.url else {}
        ends_errors = bool(stats) and _ends_errors(self.rt, task.site, outcome)
        if url == task.url and outcome in (FAILED, REFUSED):
            handed = to_errback(task, self.spider, outcome, response, error, status, kind)
            then = then if handed is None else _both(then, handed)
        done = Done(
            FetchRecord(
                site=task.site,
                url=url,
                outcome=outcome,
                started=response.started if response else self.started,
                finished=finished,
                status=response.status if response else status,
                bytes=len(response.body) + response.sunk if response else None,
                elapsed=response.elapsed if response else (finished - self.started).total_seconds(),
                worker=worker_name(),
                attempt=task.attempt,
                error=error,
                callback=task.callback,
                meta=task.meta or None,
                request=task.recorded(),
            ),
            self.gate_wait if url == task.url else None,
            also=functools.partial(_after_record, task.site, ends_errors, then, self.unarmed),
            stats=stats,
            check=self.unarmed.check_rearm_sent if self.unarmed is not None else None,
        )
        self.unarmed = None
        if self.held is not None and outcome in HELD_OUTCOMES:
            self.held.add(done)
            return
        if self.held is None:  # with other threads' records, in one write
            write_now(self.rt.record_writer, done)
            return
        self.held.flush()  # in order: what was held goes first
        jobs_done(self.rt.sink, [done])


def _ends_errors(rt: runtime.Runtime, site: str, outcome: str) -> bool:
    """Whether a page's own record of ``outcome`` ends a run of errors of ``site`` in Redis: a success,
    when there may be one (``SiteMemory.error_runs``), which then there is not."""
    if outcome not in (OK, UNCHANGED, REDIRECT):
        return False
    may = rt.memory.error_runs.get(site, True)
    rt.memory.error_runs[site] = False
    return may


def _counted(outcome: str) -> dict[str, int]:
    """The statistics a page's own record of ``outcome`` counts (none for a retry or a skip)."""
    counter = {OK: "fetched", UNCHANGED: "fetched", REDIRECT: "fetched", FAILED: "failed", REFUSED: "refused"}.get(
        outcome
    )
    if counter is None:
        return {}
    return {counter: 1, "unchanged": 1} if outcome == UNCHANGED else {counter: 1}


def user_agent(rt: runtime.Runtime, spider: Any, task: DownloadTask) -> str:
    """The User-Agent ``task``'s request goes with: its own header, else the spider's, else the crawl's."""
    return user_agent_of(sent_headers(spider, task), spider.user_agent or rt.settings.user_agent)


def _both(first: Callable[[Any], None] | None, second: Callable[[Any], None]) -> Callable[[Any], None]:
    """Queue ``first``'s commands (if any), then ``second``'s, in one pipeline."""

    def queue(pipe: Any) -> None:
        if first is not None:
            first(pipe)
        second(pipe)

    return queue


def _after_record(
    site: str, ends_errors: bool, then: Callable[[Any], None] | None, unarmed: Gate | None, pipe: Any
) -> None:
    """The Redis commands of a download's record, in its pipeline (``Attempt.record``): the rearm of
    the gate its request went through, if left for it (``Gate.rearm_sent``), the end of the site's run
    of errors, then the caller's (``then``)."""
    if unarmed is not None:  # first: its reply is the first of the record's (``Gate.check_rearm_sent``)
        unarmed.rearm_sent(pipe)
    # Exact at once, not a statistic: the rule that closes the gate after errors in a row reads it.
    if ends_errors:  # the site answers again: end any run of errors
        pipe.delete(keys.errors(site))
    if then is not None:
        then(pipe)


def sent(attempt: AttemptState, gate: Gate) -> None:
    """The request is on the wire: the gate's rearm goes with the page's record (``Gate.sent``); or
    at once, as ever, if the send came past the gate's send grace (a process frozen as it wrote
    the request): the lock may be gone, the gap short, and ``rearm`` says so."""
    if gate.acquired_at is not None and time.monotonic() - gate.acquired_at >= gate.expire - gate.rearm_expire:
        rearm(gate, attempt.task.site, attempt.task.url)
        return
    gate.sent()
    attempt.unarmed = gate


def observe(
    rt: runtime.Runtime, task: DownloadTask, gate: Gate, response: Response | None, exc: Exception | None = None
) -> None:
    """Tell the site's adaptive interval (if it has one) how the request went: its time, or no answer;
    and the runtime how long the site took to answer (``Runtime.rearms_late``)."""
    rt.answered(task.site, response.elapsed if response is not None else None)
    if response is not None:
        rt.observe(task.site, gate, response.elapsed, status=response.status)
    elif isinstance(exc, FetchTimeout | ConnectError):
        rt.observe(task.site, gate, 0.0, error="timeout" if isinstance(exc, FetchTimeout) else "no connection")
