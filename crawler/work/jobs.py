"""The download job, which RQ runs: ``download``. Arguments are plain JSON.

download, one ``Attempt`` a URL, in named steps (``_download_one``): taken (the URL checked
again) → robots.txt → login session → request headers → gate → GET (or a browser's render)
→ ``classify`` → record, and: (HTML) add the page, its body compressed, to the pages stream
(``pages``), where parse workers take it (``parse_job``) | (3xx) send the target through the
frontier | (304 to a refresh) its items seen again | (5xx/429/timeout) schedule a retry with
backoff | (4xx, refused) record and stop; then its next refresh, if it has one.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import time
import zlib
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urljoin

from rq import get_current_job

from ..coord import joblife, keys, pages, quarantine
from ..coord.frontier import (
    Frontier,
    Rider,
    check_url,
    fingerprint,
    higher_waits,
    look_for_higher,
    outranked,
)
from ..coord.gate import Gate, Unless
from ..coord.pacing import throttle_pause
from ..coord.scheduler import FOLLOW_AHEAD
from ..coord.session import LOGIN_WAIT, Jar, Session, logs_in, uses_cookies
from ..coord.task import DownloadTask
from ..errors import (
    ClientStatus,
    ConfigError,
    ConnectError,
    CrawlerError,
    FetchTimeout,
    PermanentError,
    ProxyError,
    RefusedURL,
    RetryableStatus,
    RobotsUnavailable,
    TooManyRedirects,
    TransientError,
)
from ..http.addresses import redirects_inward
from ..http.conditional import Validators, request_headers, validators_of
from ..http.fetch import Response, encode_headers, merge_headers, user_agent_of
from ..http.redirects import redirected_request, refresh_target, withheld
from ..spiders.items import failure_text
from ..spiders.spider import HTML_TYPES, Page, Request, accepts
from ..store.database import FAILED, OK, REDIRECT, REFUSED, RETRY, SKIPPED, UNCHANGED, FetchRecord, utcnow
from . import runtime
from .events import Done, HeldRecords, SoonRecords, jobs_done, write_now
from .render import DEFAULT_BLOCK, Visit, rendering
from .sitemaps import SITEMAP_CALLBACK, SITEMAP_MAX_BYTES, SitemapSink

log = logging.getLogger("crawler.jobs")


#: Seconds of a site's interval (margin included) past which a page whose turn went to robots.txt
#: goes back to its frontier rather than wait for the next turn holding its thread (``Attempt.next_turn_near``).
TURN_WAIT_MOST = runtime.PACED_MAX_INTERVAL
#: Seconds before a paced batch's next request is prepared by which its last record is written (``SoonRecords``).
WRITE_AHEAD = 0.02
#: Transient errors in a row from one site before its gate is closed for everyone.
ERRORS_BEFORE_PAUSE = 3
#: Longest such pause, seconds.
MAX_ERROR_PAUSE = 300.0

#: Outcomes whose record a batch may hold back (``download``). A retry or a failure is
#: written at once, after what was held: the errors-in-a-row rule reads what came before.
HELD_OUTCOMES = frozenset({OK, UNCHANGED, REDIRECT, SKIPPED, REFUSED})

#: Response headers handed on to the parse step first (``page.headers``); the others follow
#: within HANDED_HEADER_BYTES, but for Set-Cookie (a secret, of no use to a callback).
KEPT_HEADERS = ("content-type", "last-modified", "etag", "content-language")
#: Bytes of names and values of the response headers a page carries to its callback: enough for a
#: JSON API's Link or X-Total-Count, while a server sending megabytes of headers adds little to the stream.
HANDED_HEADER_BYTES = 8 * 1024


def _worker_name() -> str | None:
    job = get_current_job()
    return job.worker_name if job is not None else None


def download(
    *payloads: dict[str, Any],
    rt: runtime.Runtime | None = None,
    stopping: Callable[[], bool] | None = None,
    crowded: Callable[[], bool] | None = None,
    finishing: list[joblife.Finishing] | None = None,
    rest: Callable[[float], bool] | None = None,
) -> None:
    """Download the job's URLs, all of one site, in turn: one URL, or a batch (``Runtime.batching``).

    Each URL goes through the gate and on as a job of its own would (see the module
    docstring). A batch's second and later URLs wait for the gate at most
    ``Batching.gate_wait``: past it (the site was closed, paused or slowed meanwhile) they go
    back to the front of the site's frontier, to be made into jobs again, as they do when the
    worker is ``stopping`` (a graceful stop: checked before each of them), and for a slow site's
    batch when work of a higher priority waits (``frontier.outranked``: a seed waits for the
    request in flight, not for the batch), or when the worker's process is ``crowded`` (every
    thread it may have is busy: the other sites' jobs get threads in turn).

    A fast site's batch holds its URLs' records back (``events.HeldRecords``: pages reach the
    parse workers with their records) and writes them together: in one database transaction
    and one Redis pipeline at its end, before a record that must go at once (an error, a
    retry), and when it stops on an exception. A slow site's batch (``Batching.paced``: its
    thread waits on the gate between URLs) hands each record to its process's writer, to be
    written with other threads' (``events.SoonRecords``), waits until it is, and, before each
    of its next URLs, saves how far it got; when any job of such a site ends (of one URL too: NEXT_JOB held the
    site for a whole batch), the scheduler has the site due again as its gate opens
    (``Scheduler.batch_over``). The job's meta counts the URLs done (``joblife.BATCH_DONE``),
    so a batch retried (its worker died, or it raised) skips what is saved done and fetches again
    what was not: at worst (a worker that died while it rested) the last URL written, once more.
    Between a paced batch's URLs the thread ``rest``s (given by a download worker: its stop event's
    wait) until FOLLOW_AHEAD before the gate opens, so a graceful stop ends the wait at once and
    hands the rest back; a URL robots.txt refuses, as this process knows it, needs no rest
    (``_takes_turn``). Before each of its next URLs it saves its progress and reads the site's
    settings along (``_between_urls``), in the write of the record before it (``_Look``), or after
    the rest with a look for work of a higher priority when that record went on its own: the pause
    check and the URL's steps use what was read, not a round trip of their own, and are done before
    the gate opens. The take of the gate asks along whether work of a higher priority waits
    (``_outranked_by``), and gives the take up if so.
    A download worker gives ``finishing`` and runs what the job leaves there once it ends, whatever
    the outcome: that call, in the transaction that finishes the job (``joblife.finish``), or when
    the job failed, on its own: at 1,000 sites it was a round trip of its own for each request.
    """
    if rt is None:  # called directly (a test, a benchmark), not by a download worker, which gives its own
        rt = runtime.current()
    job = get_current_job()
    first = joblife.batch_done(job) if job is not None else 0
    task = DownloadTask.from_json(payloads[first])
    site, priority = task.site, task.priority  # one site and one priority per job (``vetting``, ``refill``)
    batching = rt.batching(site)
    if len(payloads) == 1:
        try:
            _download_one(rt, payloads[0], None)
        finally:
            if batching.slow:  # held for a batch's span by NEXT_JOB, which cannot tell this job is one URL
                _batch_over(rt, site, finishing)
        return
    held = _soon_records(rt, site) if batching.paced else HeldRecords(rt)
    done = first
    complete = False
    paced_since = time.monotonic()
    look: _Look | None = None  # the look before URL i, riding in URL i - 1's record (a paced batch's)
    try:
        for i in range(first, len(payloads)):
            before, look = look, None
            if isinstance(held, SoonRecords):
                look = _Look(rt, site, job, i + 1) if i + 1 < len(payloads) else None
                held.ride(look)
            if i == first:  # the URL the job was handed out for: it waits for its gate
                _download_one(rt, payloads[i], None, held)
                paced_since = time.monotonic()
            else:  # the site may have been paused, closed or slowed since
                rode = before is not None and before.rode
                unless = _outranked_by(site, priority) if batching.paced else None
                if (
                    (stopping is not None and stopping())
                    or (batching.paced and crowded is not None and crowded())
                    or (batching.paced and _takes_turn(rt, payloads[i]) and not _rest_until_turn(rt, site, rest))
                    or (
                        batching.paced
                        and not rode
                        and outranked(rt.connection, site, priority, _between_urls(rt, site, job, i))
                    )
                    or rt.policy(site).paused
                    or not _download_one(rt, payloads[i], batching.gate_wait, held, unless)
                ):
                    held.flush()
                    rt.frontier(site).hand_back([DownloadTask.from_json(p) for p in payloads[i:]])
                    done = len(payloads)
                    return
            if batching.paced:  # written before the URL counts as done: a batch retried fetches it again
                held.flush()
            done = i + 1
        if batching.paced:
            rt.batch_paced(site, done - first - 1, time.monotonic() - paced_since, batching)
        complete = True
    finally:
        held.flush()
        # A batch done in full is deleted by its finish: no need to save that it is (a round trip a job).
        if job is not None and done > first and not complete:
            joblife.save_batch_done(job, done)
        if batching.slow:
            _batch_over(rt, site, finishing)


def _batch_over(rt: runtime.Runtime, site: str, finishing: list[joblife.Finishing] | None) -> None:
    """``Scheduler.batch_over`` for ``site``: left to the job's worker when it gives ``finishing``, else now."""
    if finishing is None:
        rt.scheduler.batch_over(site)
    else:
        finishing.append(functools.partial(rt.scheduler.batch_over_in, site=site))


def _soon_records(rt: runtime.Runtime, site: str) -> SoonRecords:
    """Where a paced batch of ``site`` hands its records: to its process's writer, to be written with
    others' before the batch's next request is prepared (WRITE_AHEAD before ``_rest_until_turn`` ends)."""
    return SoonRecords(rt.record_writer, lambda: rt.gate_opens_at(site) - FOLLOW_AHEAD - WRITE_AHEAD)


def _rest_until_turn(rt: runtime.Runtime, site: str, rest: Callable[[float], bool] | None) -> bool:
    """Wait with ``rest`` until FOLLOW_AHEAD before ``site``'s gate opens, as this process's last send
    rearmed it (``Runtime.gate_opens_at``), so the next URL's steps up to the gate are done by then;
    False when ``rest`` said stop meanwhile. Without ``rest`` (a direct call), nothing: the gate's
    own wait is the wait."""
    left = rt.gate_opens_at(site) - FOLLOW_AHEAD - time.monotonic()
    return rest is None or left <= 0 or not rest(left)


def _takes_turn(rt: runtime.Runtime, payload: dict[str, Any]) -> bool:
    """Whether the URL of ``payload`` may take its site's next turn, as far as this process knows without
    asking anyone: False when robots.txt rules held here refuse it. It is then recorded refused without a
    request, and a paced batch does not rest for it: at 200 slow sites one disallowed link a site cost
    each an interval's wait for nothing. By the spider and policy as last read: asked before the rest,
    it reads nothing (the look after the rest does)."""
    task = DownloadTask.from_json(payload)
    if not rt.held_policy(task.site).obey_robots:
        return True
    return not rt.robots.refuses(task.site, task.url, _user_agent(rt, rt.held_spider(task.site), task))


def _user_agent(rt: runtime.Runtime, spider: Any, task: DownloadTask) -> str:
    """The User-Agent ``task``'s request goes with: its own header, else the spider's, else the crawl's."""
    return user_agent_of(sent_headers(spider, task), spider.user_agent or rt.settings.user_agent)


def _between_urls(rt: runtime.Runtime, site: str, job: Any, done: int, always: bool = False) -> Rider:
    """What a paced batch sends with its look for work of a higher priority before its next URL
    (``frontier.outranked``): that its first ``done`` URLs are done (``job`` None: run directly,
    nothing to save), so a batch retried skips them; and its site's live settings and spider arguments
    when due for a re-read (``Runtime.read_site_along``), for the pause check and the URL's steps that
    follow: a round trip of their own before each request at intervals of a second and more."""

    def also(pipe: Any) -> Callable[[list[Any]], None] | None:
        base = len(pipe)  # the replies it is given start at its first command
        if job is not None:
            joblife.save_batch_done(job, done, pipe)
        start = len(pipe) - base
        keep = rt.read_site_along(pipe, site, always)
        if keep is None:
            return None
        return lambda replies: keep(replies[start:])

    return also


class _Look:
    """What a paced batch sends before its next URL (``_between_urls``), riding in the write of the
    record of the URL before it (``SoonRecords.ride``): with the look for work of a higher priority
    (``frontier.outranked``), a round trip of its own after each rest was a sixth of a download
    process's round trips at 200 slow sites. That look now rides in the take of the gate
    (``_outranked_by``), as fresh as it can be. ``rode``: whether it went (not when the record went
    at once, on its own, or never came: the batch then looks on its own after the rest, as before)."""

    def __init__(self, rt: runtime.Runtime, site: str, job: Any, done: int):
        # Read whether due or not: the write may come well before the URL's steps (records are written
        # together as the first is due), and a read skipped then was a round trip of its own at the steps.
        self.between = _between_urls(rt, site, job, done, always=True)
        self.rode = False

    def __call__(self, pipe: Any) -> Callable[[list[Any]], None]:
        keep = self.between(pipe)

        def answer(replies: list[Any]) -> None:
            if keep is not None:
                keep(replies)
            self.rode = True

        return answer


def _outranked_by(site: str, priority: int) -> Unless:
    """What a paced batch's take of the gate asks along: whether work of a higher priority than the
    batch's waits (``frontier.outranked``), so that a seed waits for the request in flight, not
    for the rest of the batch; the take is then given up and the batch handed back."""

    def unless(pipe: Any) -> Callable[[list[Any]], bool]:
        look_for_higher(pipe, site)
        return lambda replies: higher_waits(replies, priority)

    return unless


def _download_one(
    rt: runtime.Runtime,
    payload: dict[str, Any],
    max_gate_wait: float | None,
    held: HeldRecords | SoonRecords | None = None,
    unless: Unless | None = None,
) -> bool:
    """Download one URL; False, having done nothing, if its gate stayed closed for ``max_gate_wait``
    seconds, or ``unless``, asked along with the take, said to give it up (``Gate.acquire``). With
    ``held``, its record waits there (see ``download``), unless it must go at once: a retry or a failure.

    Its steps, in order (``Attempt``'s methods): each deals with the page (records it, schedules
    it again) and stops there, or leaves it to the next one.
    """
    attempt = _taken(rt, payload, held)
    if attempt is None or not attempt.robots_allow() or not attempt.next_turn_near() or not attempt.logged_in():
        return True
    render, wait_for = rendering(attempt.spider, attempt.task.meta)
    if render:  # the browser's requests carry the site's session too (``_browser_fetch``)
        response = attempt.render(wait_for)
        if response is not None:
            attempt.conclude(response)
        return True
    if not attempt.build_request():
        return True
    gate = attempt.take_gate(max_gate_wait, unless)
    if gate is None:
        return False
    try:
        response = attempt.fetch(gate)
        if response is not None:
            attempt.conclude(response)
    finally:
        attempt.rearm_now()  # sent, but no record took its rearm along
    return True


def _taken(rt: runtime.Runtime, payload: dict[str, Any], held: HeldRecords | SoonRecords | None) -> Attempt | None:
    """The first step: the attempt at the payload's URL, or None when the URL is refused now (its
    domain, its scheme: ``check_url``), the payload quarantined (``quarantine.record``) and nothing
    recorded. Checked again here: a job can be written straight into Redis, past the frontier."""
    task = DownloadTask.from_json(payload)
    spider = rt.spider(task.site)
    try:
        check_url(task.url, spider.domains())
    except RefusedURL as exc:
        job = get_current_job()
        quarantine.record(
            rt.connection,
            job.origin if job else keys.download_queue(task.site),
            f"download refused when taken: {exc}",
            job.id if job else None,
            payload,
        )
        return None
    policy = rt.policy(task.site)
    user_agent = _user_agent(rt, spider, task)
    started = utcnow()
    return Attempt(rt, task, spider, held, policy.obey_robots, user_agent, started, proxy=rt.proxy(task.site))


class Verdict(enum.Enum):
    """What a response that is neither an error nor logged out comes to (``classify``)."""

    #: A 304 to a conditional refresh: the page is as it was parsed last time (``_unchanged``).
    UNCHANGED = "unchanged"
    #: A 3xx with a Location: its target goes through the frontier (``_follow_redirect``).
    REDIRECT = "redirect"
    #: A 3xx without one (or a 304 to a request that asked for none): the page fails.
    NO_LOCATION = "redirect without Location"
    #: A content type the spider does not take (``Spider.content_types``): recorded skipped.
    NOT_HANDLED = "not handled"
    #: Anything else: the page goes to the parse workers.
    PARSE = "parse"


def classify(response: Response, conditional: bool, content_types: tuple[str, ...], sitemap: bool) -> Verdict:
    """What ``response`` comes to, once past the error statuses (``_raise_for_status``: 429 and 5xx
    retried, other 4xx failed): ``conditional``, the request asked If-None-Match/If-Modified-Since;
    ``sitemap``, it is a sitemap's, taken whatever its content type (XML, gzip, robots.txt: its
    parse job reads it). Reads nothing, writes nothing."""
    if response.status == 304 and conditional:
        return Verdict.UNCHANGED
    if 300 <= response.status < 400:
        return Verdict.REDIRECT if response.location else Verdict.NO_LOCATION
    if not sitemap and not accepts(content_types, response.content_type):
        return Verdict.NOT_HANDLED
    return Verdict.PARSE


@dataclasses.dataclass
class Attempt:
    """One attempt at one URL of a download job: what its steps share, each leaving its part for the next.

    ``_download_one`` runs the steps in order: ``_taken`` → ``robots_allow`` → ``next_turn_near`` →
    ``logged_in`` → ``build_request`` → ``take_gate`` → ``fetch`` → ``conclude`` (for a
    page to render, ``render`` takes the place of the three before ``conclude``). A step
    returning False or None has dealt with the page (recorded it, scheduled it again), but
    ``take_gate``, which has done nothing. Every record goes through ``record``.
    """

    rt: runtime.Runtime
    task: DownloadTask
    spider: Any
    #: A batch's records held back (``download``): until its end, or (a paced batch's) a little; or
    #: None: each written at once.
    held: HeldRecords | SoonRecords | None
    obey_robots: bool
    user_agent: str
    #: When the attempt began: the ``started`` of records with no response of their own.
    started: datetime
    #: The proxy the attempt's requests go through (None: direct), chosen once when taken.
    proxy: str | None = None
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

    def robots_allow(self) -> bool:
        """Whether robots.txt lets the page be fetched: True at once for a site that does not obey it.

        Asking may fetch robots.txt through the site's gate, recorded (``_robots_fetched``).
        False when the page has been dealt with instead: disallowed (recorded REFUSED);
        robots.txt unreadable (the page scheduled again after its ``retry_after`` without
        spending an attempt, the site's gate closed as long, recorded RETRY; or, once it has
        failed past ``max_retries`` readings, the page failed: ``_robots_gave_up``); the
        proxy failing (benched, the page retried or failed: ``_retry_or_fail``).
        """
        if not self.obey_robots:
            return True
        rt, task = self.rt, self.task
        try:
            allowed = rt.robots.allowed(
                task.site,
                task.url,
                self.user_agent,
                functools.partial(rt.take_gate, task.site, task.url),
                self._robots_fetched,
                allow_private=self.spider.allow_private_addresses,
                proxy=self.proxy,
            )
        except ProxyError as exc:  # robots.txt could not be asked through this proxy: another one will
            if self.proxy is not None:
                rt.proxies.bench(self.proxy, str(exc))
            _retry_or_fail(self, exc)
            return False
        except RobotsUnavailable as exc:
            if exc.attempts > rt.settings.max_retries:
                _robots_gave_up(self, exc)
                return False
            # Not the page's fault: it waits for robots.txt without spending one of its attempts,
            # and the rest of the site waits with it (RFC 9309: unreachable means disallow all).
            rt.close_gate(task.site, task.url, exc.retry_after, "robots.txt unreadable")
            self.record(RETRY, error=f"{exc}; retry in {exc.retry_after:.0f}s")
            rt.scheduler.schedule(task.site, task.to_entry(), exc.retry_after, task.priority)
            return False
        if not allowed:
            self.record(REFUSED, error="disallowed by robots.txt")
            return False
        return True

    def _robots_fetched(self, url: str, status: int | None, error: str | None) -> None:
        """Record a fetch of robots.txt made for this page: OK when it could be read (an answer
        below 500 but 429), FAILED otherwise."""
        readable = status is not None and status < 500 and status != 429 and error is None
        self.robots_fetched = True
        self.record(OK if readable else FAILED, url=url, status=status, error=error)

    def next_turn_near(self) -> bool:
        """Whether the page may wait here for its site's next turn at the gate: False (dealt with) when
        robots.txt took this turn (``robots_allow``) and the next is more than TURN_WAIT_MOST away; the
        page then goes back to the front of its frontier, to be handed out at that turn.

        Up to TURN_WAIT_MOST the page waits in its thread, as a paced batch's URLs do (a thread a slow
        site: at 1,000 sites of 5 s, a hand-back, a refill and a job a site spared); beyond it no thread
        waits that long.
        """
        if not self.robots_fetched or self.rt.batching(self.task.site).interval <= TURN_WAIT_MOST:
            return True
        self.rt.frontier(self.task.site).hand_back([self.task])
        return False

    def logged_in(self) -> bool:
        """For a site that logs in (``logs_in``), take its login session (``_session``: the fleet
        logged in first if no worker has); False when the page has been dealt with instead (it waits
        for another worker's login, or the login failed: retried or failed). True at once for
        a site without a login."""
        if not logs_in(self.spider):
            return True
        self.generation = _session(self)
        return self.generation is not None

    def build_request(self) -> bool:
        """Make the request's headers: the spider's under the task's own, a refresh's conditional ones
        (``_conditional_headers``: one SISMEMBER), the site's cookies (``Jar.header``).

        False when they cannot be built (``request_problem``), the page recorded FAILED and its
        next refresh scheduled to ask for the whole page: raised from the fetch, such an error
        would leave the job with no record and no next refresh. The gate is not taken yet.
        """
        rt, task, spider = self.rt, self.task, self.spider
        self.conditional = _conditional_headers(rt, task, spider)
        headers = {**sent_headers(spider, task), **self.conditional}
        if uses_cookies(spider):
            headers = {**headers, **Jar(rt.connection, task.site).header(task.url)}
        self.headers = headers
        unbuildable = request_problem(self.user_agent, headers)
        if unbuildable is not None:
            self.record(FAILED, error=f"request cannot be built: {unbuildable}")
            _schedule_refresh(rt, task, None)  # the next refresh asks for the whole page
            return False
        return True

    def take_gate(self, max_wait: float | None, unless: Unless | None = None) -> Gate | None:
        """Take the site's gate for the request, waiting as long as it takes (``max_wait`` None) or at
        most ``max_wait`` seconds; None when it stayed closed that long, or ``unless`` said to give
        the take up (``Gate.acquire``), nothing else done. The wait goes into the page's record
        (``gate_wait``)."""
        waiting = time.monotonic()
        if max_wait is None:
            gate = self.rt.take_gate(self.task.site, self.task.url)
        else:
            taken = self.rt.take_gate_within(self.task.site, self.task.url, max_wait, unless)
            if taken is None:
                return None
            gate = taken
        self.gate_wait = time.monotonic() - waiting
        return gate

    def fetch(self, gate: Gate) -> Response | None:
        """Send the request through the taken ``gate``; the response when it is one to conclude on
        (``conclude``), else None, the page dealt with:

        - no answer (a timeout, a refused connection, a proxy's failure, which benches the
          proxy) or a 429/5xx: retried or failed (``_retry_or_fail``);
        - another 4xx, or another permanent error: recorded FAILED;
        - an answer the spider says is logged out: its session ended, the page fetched again
          (``_logged_out``).

        The gate is let go once the request is over, whatever came of it; the site's cookie
        jar is updated from the answer; the site's adaptive interval is told how it went
        (``_observe``).
        """
        rt, task, spider = self.rt, self.task, self.spider
        response: Response | None = None  # kept when its status is an error, for its timing and size
        self.sink = SitemapSink() if task.callback == SITEMAP_CALLBACK else None
        # A record written soon (not held by a fast site's batch) carries the rearm when the site
        # answers well within its interval: one round trip less, the gate opening when it would have.
        if (self.held is None or self.held.prompt) and rt.rearms_late(task.site, gate):
            on_sent = functools.partial(_sent, self, gate)
        else:
            on_sent = functools.partial(_rearm, gate, task)
        try:
            try:
                response = rt.fetcher.get(
                    task.url,
                    user_agent=spider.user_agent,
                    on_sent=on_sent,
                    before_send=gate.before_send,
                    headers=self.headers,
                    method=task.method,
                    body=task.body,
                    allow_private=spider.allow_private_addresses,
                    max_bytes=SITEMAP_MAX_BYTES if self.sink else None,
                    sink=self.sink.feed if self.sink else None,
                    proxy=self.proxy,
                )
            finally:
                gate.let_go()  # sent (passed on already, at the rearm) or not: another thread's turn at the gate
            if uses_cookies(spider):
                Jar(rt.connection, task.site).update(task.url, response.set_cookies)
            if self.generation is not None and _is_logged_out(spider, response):
                _observe(rt, task, gate, response)
                _logged_out(self, self.generation, response)
                return None
            _raise_for_status(response)
        except TransientError as exc:
            _observe(rt, task, gate, response, exc)
            if isinstance(exc, ProxyError) and self.proxy is not None:
                rt.proxies.bench(self.proxy, str(exc))
            _retry_or_fail(self, exc, response)
            return None
        except PermanentError as exc:
            _observe(rt, task, gate, response, exc)
            self.record(FAILED, response=response, error=str(exc), status=getattr(exc, "status", None))
            return None
        _observe(rt, task, gate, response)
        return response

    def rearm_now(self) -> None:
        """Rearm the gate of the request sent, if its rearm was left to the page's record and no record
        has taken it yet (``Gate.rearm_sent_now``): one round trip of its own."""
        gate, self.unarmed = self.unarmed, None
        if gate is not None:
            gate.rearm_sent_now()

    def render(self, wait_for: str | None) -> Response | None:
        """Render the page in the process's browser (``render``): the response to conclude on, or None,
        the page dealt with (a render that failed: retried or failed as a fetch; with no browser to
        render with, failed with the reason, for ``crawler retry`` once one is installed).

        Every request the page makes to the allowed domains takes the site's gate, as a
        fetch does, and is recorded (``_browser_fetch``); the page's own record is ``conclude``'s.
        """
        rt, task, spider = self.rt, self.task, self.spider
        visit = Visit(
            fetch=_browser_fetch(self),
            domains=spider.domains(),
            block=frozenset(getattr(spider, "render_block", DEFAULT_BLOCK)),
            user_agent=spider.user_agent or rt.settings.user_agent,
        )
        try:
            response = rt.renderer.render(task.url, visit, wait_for, rt.settings.timeout, rt.settings.max_body_bytes)
            _raise_for_status(response)
        except TransientError as exc:
            _retry_or_fail(self, exc)
            return None
        except (PermanentError, ConfigError) as exc:
            self.record(FAILED, error=str(exc), status=getattr(exc, "status", None))
            return None
        self.rendered = True
        return response

    def conclude(self, response: Response) -> None:
        """Act on what ``classify`` makes of ``response``, then schedule the page's next refresh
        (``_schedule_refresh``), with the validators the outcome leaves for a conditional one:

        - UNCHANGED: its items seen again, recorded UNCHANGED (``_unchanged``); validators kept;
        - REDIRECT: the target through the frontier, recorded REDIRECT, or FAILED when refused
          (``_follow_redirect``); no validators;
        - NO_LOCATION: recorded FAILED; no validators;
        - NOT_HANDLED: recorded SKIPPED; the response's validators;
        - PARSE, but an HTML page that refreshes to another at once (``meta_refresh``): as a
          REDIRECT, to that page;
        - PARSE: recorded OK, the page added to the pages stream (``_hand_to_parser``) in the
          pipeline of its record, after it; the response's validators.

        A rendered page's next refresh carries no validators: it is asked for whole.
        """
        task, spider = self.task, self.spider
        verdict = classify(response, bool(self.conditional), spider.content_types, self.sink is not None)
        validators = None  # a redirect, or a failure: the next refresh asks for the whole page
        if verdict is Verdict.UNCHANGED:
            _unchanged(self, response)
            validators = validators_of(response.headers, task.validators)
        elif verdict is Verdict.REDIRECT:
            _follow_redirect(self, response)
        elif verdict is Verdict.NO_LOCATION:
            self.record(FAILED, response=response, error="redirect without Location")
        elif verdict is Verdict.NOT_HANDLED:
            self.record(SKIPPED, response=response, error=_not_handled(spider.content_types, response.content_type))
            validators = validators_of(response.headers)
        elif (refresh_to := self.meta_refresh(response)) is not None:
            _follow_redirect(self, response, refresh_to)
        else:
            # The page goes to the parse workers in the pipeline of its record, after the record is
            # written: a parse record (a callback that failed) is then always the page's latest.
            compressed = self.sink.finish() if self.sink else None
            hand = functools.partial(
                _hand_to_parser,
                task=task,
                response=response,
                compressed=compressed,
                sent=sent_headers(self.spider, task),
            )
            self.record(OK, response=response, then=hand)
            validators = validators_of(response.headers)
        _schedule_refresh(self.rt, task, None if self.rendered else validators)

    def meta_refresh(self, response: Response) -> str | None:
        """Where an HTML page of a spider that follows meta refreshes (``Spider.follow_meta_refresh``)
        refreshes to within ``META_REFRESH_MAX_DELAY`` s (``redirects.refresh_target``); None for
        any other page, a rendered one (its browser ran it), and a sitemap's."""
        if self.rendered or self.sink is not None or not getattr(self.spider, "follow_meta_refresh", True):
            return None
        return refresh_target(response)

    def record(
        self,
        outcome: str,
        url: str | None = None,
        response: Response | None = None,
        error: str | None = None,
        status: int | None = None,
        then: Callable[[Any], None] | None = None,
    ) -> None:
        """Record ``outcome`` for the page, or for another request the attempt made (``url``: robots.txt,
        a login's, a rendered page's), with ``then``'s Redis commands in the pipeline after it.

        Only the page's own record counts it (``fetched``, ``failed``, ``refused``,
        ``unchanged``) and carries the gate's wait; its success (OK, UNCHANGED, REDIRECT)
        ends the site's run of errors in that pipeline (DEL ``keys.errors``), before ``then``'s
        commands. A batch holds the record back (``HELD_OUTCOMES``); a retry or a failure is
        written at once, after what was held (``HeldRecords.flush``): the errors-in-a-row
        rule reads what came before.
        """
        task = self.task
        url = task.url if url is None else url
        finished = utcnow()
        counter = {OK: "fetched", UNCHANGED: "fetched", REDIRECT: "fetched", FAILED: "failed", REFUSED: "refused"}.get(
            outcome
        )
        stats = {counter: 1} if counter and url == task.url else {}
        if stats and outcome == UNCHANGED:
            stats["unchanged"] = 1
        ends_errors = bool(stats) and outcome in (OK, UNCHANGED, REDIRECT)
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
                worker=_worker_name(),
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
            write_now(self.rt, done)
            return
        self.held.flush()  # in order: what was held goes first
        jobs_done(self.rt, [done])


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


def _session(attempt: Attempt) -> int | None:
    """The generation of the site's login session to send the page with, logging the fleet in first
    if no worker has (``session``); None when the page has been dealt with instead.

    While another worker logs in, the page goes back to the delayed set for ``LOGIN_WAIT``
    (its attempts unchanged), holding neither the gate nor this thread. A login that fails
    (an error status, a refused URL, ``login`` raising or returning no Request) gives its
    lease back and counts as the page's failed attempt: retried with backoff, then failed.
    """
    rt, task = attempt.rt, attempt.task
    session = Session(rt.connection, task.site)
    generation = session.generation()
    if generation is not None:
        return generation
    token = session.lead()
    if token is None:
        rt.scheduler.schedule(task.site, task.to_entry(), LOGIN_WAIT, task.priority)
        return None
    try:
        _log_in(rt, task, attempt.spider)
    except TransientError as exc:
        session.let_go(token)
        _retry_or_fail(attempt, exc)
        return None
    except Exception as exc:  # the spider's login() or a permanent error: the page fails, the login is tried again
        session.let_go(token)
        _retry_or_fail(attempt, LoginFailed(f"login failed: {failure_text(exc).splitlines()[-1]}"))
        return None
    generation = session.logged_in(token)
    log.info("%s: logged in (session %d)", task.site, generation)
    return generation


class LoginFailed(TransientError):
    """The fleet could not log in to the site (the page waits for a later login)."""


def _log_in(rt: runtime.Runtime, task: DownloadTask, spider: Any) -> None:
    """Fetch the spider's ``login_url`` and send the Request its ``login(page)`` returns, each through the
    gate with the site's cookies, the jar updated from both responses; raises if either fails, or if
    the spider's ``logged_out`` says the answer to the login is still logged out.

    Only a GET can be sent by this fetcher: a Request with another method raises ConfigError.
    """
    page = _page_of(_session_get(rt, task, spider, Request(str(spider.login_url))))
    submit = spider.login(page)
    if not isinstance(submit, Request):
        raise ConfigError(f"{type(spider).__name__}.login must return a Request, got {submit!r:.80}")
    if _is_logged_out(spider, _session_get(rt, task, spider, submit)):  # refused credentials, an expired token
        raise LoginFailed("login failed: the answer to the login request is still logged out (logged_out)")


def _session_get(rt: runtime.Runtime, task: DownloadTask, spider: Any, request: Request) -> Response:
    """One request of a login (its method, headers and body: a login form's POST), as a download
    sends a page (gate, the site's headers, cookies, caps); recorded, and raised on an error status."""
    url = request.url
    check_url(url, spider.domains())
    jar = Jar(rt.connection, task.site)
    gate = rt.take_gate(task.site, url)
    try:
        response = rt.fetcher.get(
            url,
            user_agent=spider.user_agent,
            on_sent=lambda: _rearm(gate, task),
            before_send=gate.before_send,
            headers={**(getattr(spider, "headers", None) or {}), **request.headers, **jar.header(url)},
            allow_private=spider.allow_private_addresses,
            proxy=rt.proxy(task.site),
            method=request.method,
            body=request.body,
        )
    finally:
        gate.let_go()
    jar.update(url, response.set_cookies)
    _observe(rt, task, gate, response)
    outcome = OK if response.status < 400 else FAILED
    jobs_done(rt, [_login_done(task, url, outcome, response)])
    _raise_for_status(response)
    return response


def _login_done(task: DownloadTask, url: str, outcome: str, response: Response) -> Done:
    """The fetch record of one request of a login (no page counts: it is not one of the crawl's pages)."""
    return Done(
        FetchRecord(
            site=task.site,
            url=url,
            outcome=outcome,
            started=response.started,
            finished=utcnow(),
            status=response.status,
            bytes=len(response.body),
            elapsed=response.elapsed,
            worker=_worker_name(),
            attempt=1,
            error="login" if outcome == OK else f"login: HTTP {response.status}",
        ),
        None,
        stats={},
    )


def _page_of(response: Response) -> Page:
    return Page(
        response.url, response.body, status=response.status, headers=response.headers, encoding=response.encoding
    )


def _is_logged_out(spider: Any, response: Response) -> bool:
    """What the spider's ``logged_out(page)`` says of ``response`` (False when it has none); raises
    LoggedOutFailed, with the traceback, when it raises."""
    check = getattr(spider, "logged_out", None)
    if not callable(check):
        return False
    try:
        return bool(check(_page_of(response)))
    except Exception as exc:  # any: the spider's code fails its page, never the download job
        raise LoggedOutFailed(f"logged_out raised: {failure_text(exc)}") from exc


class LoggedOutFailed(PermanentError):
    """The spider's ``logged_out(page)`` raised: the page fails, its record holding the traceback, and
    ``crawler retry`` sends it again (as a page whose callback raised)."""


def _logged_out(attempt: Attempt, generation: int, response: Response) -> None:
    """A page the spider says is logged out: end its session (the fleet logs in again, once) and fetch
    the page again, never parse it; after 1 + ``max_retries`` such answers in a row it fails."""
    rt, task = attempt.rt, attempt.task
    ended = Session(rt.connection, task.site).end(generation)
    if task.attempt > rt.settings.max_retries:
        attempt.record(FAILED, response=response, error=f"logged out after {task.attempt} logins")
        return
    why = "ended it" if ended else "already ended"
    attempt.record(
        RETRY, response=response, error=f"logged out (session {generation}, {why}): fetched again after login"
    )
    rt.scheduler.schedule(task.site, dataclasses.replace(task, attempt=task.attempt + 1).to_entry(), 0, task.priority)


def _browser_fetch(attempt: Attempt) -> Callable[[str, Mapping[str, str], float, bool], Response]:
    """``Visit.fetch`` for a download: each request through the site's gate, as ``Attempt.fetch``
    sends one, with the site's headers and, for a site with cookies, its jar (updated from each
    answer); a record for each but the page's own (``Attempt.conclude`` writes that one)."""
    rt, task, spider, record = attempt.rt, attempt.task, attempt.spider, attempt.record
    proxy = rt.proxy(task.site)
    site_headers = dict(getattr(spider, "headers", None) or {})
    jar = Jar(rt.connection, task.site) if uses_cookies(spider) else None

    def fetch(url: str, headers: Mapping[str, str], wait: float, is_page: bool) -> Response:
        deadline = time.monotonic() + wait  # the gate's wait and the request share it
        gate = rt.take_gate_within(task.site, url, wait)
        if gate is None:
            raise FetchTimeout(f"the site's gate stayed closed until the render's deadline: {url}")
        try:
            response = rt.fetcher.get(
                url,
                user_agent=spider.user_agent,
                on_sent=lambda: _rearm(gate, task),
                before_send=gate.before_send,
                headers={**site_headers, **headers, **(jar.header(url) if jar is not None else {})},
                allow_private=spider.allow_private_addresses,
                proxy=proxy,
                timeout=deadline - time.monotonic(),
            )
        except CrawlerError as exc:
            if not is_page:
                record(FAILED, url=url, error=f"requested by the rendered page {task.url}: {exc}")
            raise
        finally:
            gate.let_go()
        if jar is not None:
            jar.update(url, response.set_cookies)
        if not is_page:
            record(OK if response.status < 400 else FAILED, url=url, response=response)
        return response

    return fetch


def _not_handled(content_types: tuple[str, ...], content_type: str) -> str:
    """Why a response of ``content_type`` is skipped (``Spider.content_types``)."""
    if tuple(content_types) == HTML_TYPES:
        return f"not HTML ({content_type})"
    return f"not in content_types ({content_type})"


def _robots_gave_up(attempt: Attempt, exc: RobotsUnavailable) -> None:
    """Record the page failed: its robots.txt has failed 1 + ``max_retries`` times in a row.

    So a crawl drains (``--burst`` ends) on a site whose robots.txt never answers, where
    its pages would otherwise wait for it up to ``ROBOTS_OUTAGE_GRACE`` (30 days); each is
    recorded, for ``crawler retry``, which has robots.txt asked again at once
    (``robots.ask_again``). The gate is left open: the site's other pages fail as fast,
    unrequested (RFC 9309: unreachable means disallow all), and robots.txt is still asked
    when its wait is over.
    """
    attempt.record(FAILED, error=f"robots.txt unreachable: {exc} (gave up after {exc.attempts} attempts)")
    _schedule_refresh(attempt.rt, attempt.task, attempt.task.validators)


def _conditional_headers(rt: runtime.Runtime, task: DownloadTask, spider: Any) -> dict[str, str]:
    """If-None-Match / If-Modified-Since for a refresh that carries its page's validators.

    None for a page whose last parse failed (``keys.parse_failed``): its body is needed
    again, whatever the server would say about it.
    """
    if task.validators is None or task.method != "GET" or not getattr(spider, "conditional_refresh", True):
        return {}
    if rt.connection.sismember(keys.parse_failed(task.site), fingerprint(task.url)):  # type: ignore[arg-type]
        return {}
    return request_headers(task.validators)


def sent_headers(spider: Any, task: DownloadTask) -> dict[str, str]:
    """The headers a task's request is sent with, beyond the fetcher's own (User-Agent, Accept,
    Accept-Encoding, which these override): the spider's ``headers`` under the request's own
    (a name in both, in any case, is the request's), without the credentials a redirect to
    another origin withheld (``redirects.withheld``)."""
    return withheld(merge_headers(getattr(spider, "headers", None) or {}, task.headers))


def request_problem(user_agent: str, headers: Mapping[str, str]) -> str | None:
    """Why a request with ``user_agent`` and ``headers`` cannot be built (a name or value the fetcher
    cannot send: not a string, not ASCII), or None when it can.

    Asked before the gate is taken: raised from the fetch, such an error left the job
    with no fetch record and no next refresh. The URL is the fetch's to judge (``RefusedURL``).
    """
    try:
        encode_headers({**headers, "user-agent": user_agent})
    except Exception as exc:  # any: whatever the fetcher refuses a header for, the page must not be lost
        return f"{type(exc).__name__}: {exc}"
    return None


def _unchanged(attempt: Attempt, response: Response) -> None:
    """A 304 to a conditional refresh: the page is as it was parsed last time.

    Its items are seen again (``last_seen`` moves on); no body is kept, no parse job made.
    """
    touched = attempt.rt.store.touch_items(attempt.task.site, attempt.task.url, response.started)
    attempt.record(UNCHANGED, response=response, error=f"not modified; {touched} item(s) seen again")


def _schedule_refresh(rt: runtime.Runtime, task: DownloadTask, validators: Validators | None) -> None:
    """If the page is to be refreshed, schedule its next fetch (one pending per page), with ``validators``.

    Pages answered with a client error (gone, forbidden) or refused by robots.txt are
    not refreshed; everything else is, so a site's outage does not end its refreshes.
    """
    if task.refresh is None:
        return
    again = dataclasses.replace(task, attempt=1, hops=0, validators=validators)
    rt.scheduler.schedule_refresh(task.site, again.to_entry(), task.refresh, rt.spider(task.site).refresh_priority)


def _sent(attempt: Attempt, gate: Gate) -> None:
    """The request is on the wire: the gate's rearm goes with the page's record (``Gate.sent``); or
    at once, as ever, if the send came past the gate's send grace (a process frozen as it wrote
    the request): the lock may be gone, the gap short, and ``_rearm`` says so."""
    if gate.acquired_at is not None and time.monotonic() - gate.acquired_at >= gate.expire - gate.rearm_expire:
        _rearm(gate, attempt.task)
        return
    gate.sent()
    attempt.unarmed = gate


def _rearm(gate: Gate, task: DownloadTask) -> None:
    """Start the site's interval now that the request is on the wire; warn if the gate was lost."""
    if not gate.rearm():
        # Taking the gate and sending took longer than its send grace (a slow connect, a
        # paused process): another worker may have taken it, so this gap may be short.
        log.warning(
            "%s: request sent after the gate's send grace had run out; spacing may be short: %s", task.site, task.url
        )


def _observe(
    rt: runtime.Runtime, task: DownloadTask, gate: Gate, response: Response | None, exc: Exception | None = None
) -> None:
    """Tell the site's adaptive interval (if it has one) how the request went: its time, or no answer;
    and the runtime how long the site took to answer (``Runtime.rearms_late``)."""
    rt.answered(task.site, response.elapsed if response is not None else None)
    if response is not None:
        rt.observe(task.site, gate, response.elapsed, status=response.status)
    elif isinstance(exc, FetchTimeout | ConnectError):
        rt.observe(task.site, gate, 0.0, error="timeout" if isinstance(exc, FetchTimeout) else "no connection")


def _raise_for_status(response: Response) -> None:
    if response.status == 429 or response.status >= 500:
        raise RetryableStatus(response.status, response.retry_after())
    if 400 <= response.status < 500:
        raise ClientStatus(response.status)


def _retry_or_fail(attempt: Attempt, exc: TransientError, response: Response | None = None) -> None:
    """Schedule another attempt after a backoff (or the server's Retry-After), or give up.

    Retry-After, a 429 or 503 without it, and a run of errors from one site, close the
    site's gate for every worker, not only delay this one URL. Without Retry-After, a
    429/503 closes it at once for ``throttle_pause`` (backoff × 2^(n−1) with jitter for
    the n-th error in a row); other errors after ERRORS_BEFORE_PAUSE in a row. Records a
    batch ``held`` are written first: a success among them ends the run of errors before
    this error counts.
    """
    rt, task = attempt.rt, attempt.task
    if attempt.held is not None:
        attempt.held.flush()
    attempt.rearm_now()  # before any closure: the gate as taken may outlast it, and keep it short
    settings = rt.settings
    status = getattr(exc, "status", None)
    errors_in_a_row = int(rt.connection.incr(keys.errors(task.site)))
    if exc.retry_after is not None:
        rt.close_gate(
            task.site, task.url, min(exc.retry_after, settings.max_retry_after), f"Retry-After after {status}"
        )
    elif status in (429, 503):
        pause = throttle_pause(settings.backoff, errors_in_a_row, MAX_ERROR_PAUSE)
        rt.close_gate(task.site, task.url, pause, f"backoff after {status}")
    elif errors_in_a_row >= ERRORS_BEFORE_PAUSE:
        pause = min(settings.backoff * 2 ** (errors_in_a_row - ERRORS_BEFORE_PAUSE), MAX_ERROR_PAUSE)
        rt.close_gate(task.site, task.url, pause, f"{errors_in_a_row} errors in a row")
    if task.attempt > settings.max_retries:
        attempt.record(FAILED, response=response, error=f"{exc} (gave up after {task.attempt} attempts)", status=status)
        _schedule_refresh(rt, task, task.validators)  # the site may be back by then, the page as it was
        return
    delay = settings.backoff * 2 ** (task.attempt - 1)
    if exc.retry_after is not None:
        delay = max(delay, min(exc.retry_after, settings.max_retry_after))
    attempt.record(RETRY, response=response, error=f"{exc}; retry in {delay:g}s", status=status)
    retry = dataclasses.replace(task, attempt=task.attempt + 1)
    rt.scheduler.schedule(task.site, retry.to_entry(), delay, task.priority)


def _follow_redirect(attempt: Attempt, response: Response, refresh_to: str | None = None) -> None:
    """Send a redirect's target through the frontier as a request of its own: the Location of a
    3xx, or ``refresh_to``, a page's meta refresh (``http.redirects.meta_refresh_target``),
    which is asked for as a browser would, with a GET.

    The target's domain is checked before its name is resolved (for the private-address
    check): a hostile page cannot make the worker look up names of its choosing outside
    the allowed domains (a tracking channel, or a name server of its own that never answers).
    """
    rt, task, record = attempt.rt, attempt.task, attempt.record
    target = refresh_to if refresh_to is not None else urljoin(task.url, (response.location or "").strip())
    how = "meta refresh" if refresh_to is not None else "redirect"
    if task.hops + 1 > rt.settings.max_redirects:
        too_many = TooManyRedirects(f"more than {rt.settings.max_redirects} redirects")
        record(FAILED, response=response, error=str(too_many))
        return
    spider = rt.spider(task.site)
    try:
        check_url(target, spider.domains())
    except RefusedURL as exc:
        record(FAILED, response=response, error=f"{how} refused: {exc}")
        return
    if not spider.allow_private_addresses and redirects_inward(task.url, target, rt.fetcher.timeout):
        record(FAILED, response=response, error=f"{how} refused: {target} is a private or loopback address")
        return
    frontier: Frontier = rt.frontier(task.site)
    status = 303 if refresh_to is not None else response.status
    site_headers = getattr(spider, "headers", None) or {}
    method, headers, body = redirected_request(
        status, task.method, task.headers, task.body, task.url, target, site_headers
    )
    request = Request(
        target, callback=task.callback, method=method, headers=headers, body=body, meta=task.meta or {},
        priority=task.priority,
    )  # fmt: skip
    result = frontier.add([request], depth=task.depth, hops=task.hops + 1)
    if result.refused:
        record(FAILED, response=response, error=f"{how} refused: {result.refused[0][1]}")
    elif result.duplicates:
        record(REDIRECT, response=response, error=f"{how} to {target} (already seen)")
    else:
        record(REDIRECT, response=response, error=f"{how} to {result.enqueued[0]}")


def handed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The response headers a page's callback sees: ``KEPT_HEADERS``, then the others in their order
    while their names and values add up to ``HANDED_HEADER_BYTES`` (never Set-Cookie)."""
    handed = {k: headers[k] for k in KEPT_HEADERS if k in headers}
    room = HANDED_HEADER_BYTES - sum(len(k) + len(v) for k, v in handed.items())
    for name, value in headers.items():
        if name in handed or name == "set-cookie":
            continue
        room -= len(name) + len(value)
        if room < 0:
            break
        handed[name] = value
    return handed


def _hand_to_parser(
    pipe: Any,
    task: DownloadTask,
    response: Response,
    compressed: bytes | None = None,
    sent: dict[str, str] | None = None,
) -> None:
    """Hand the page (``compressed`` already for a sitemap) to the parse workers: one stream entry, in ``pipe``.

    ``sent``: the request's headers beyond the fetcher's own (``sent_headers``), for ``page.request``."""
    sent = sent or {}
    payload = {
        "site": task.site,
        "url": task.url,
        "status": response.status,
        "headers": handed_headers(response.headers),
        "encoding": response.encoding,
        "callback": task.callback,
        "meta": task.meta or {},
        "depth": task.depth,
        "fetched": response.started.isoformat(),  # items are "seen" when fetched, not when parsed
    }
    if not (task.method == "GET" and task.body is None and not sent):
        # page.request; and, for a request that is not a plain GET, what tells its items from
        # those of another request for the same URL (another body).
        sent_request: dict[str, Any] = {"method": task.method, "headers": sent}
        if task.method != "GET" or task.body is not None:
            sent_request["variant"] = task.fingerprint.hex()
        payload["request"] = sent_request
    again = task.recorded()
    if again:  # what the page's record keeps of its request, should its parse fail (``crawler retry``)
        payload["again"] = again
    if task.refresh is not None:  # the page will be refreshed: its parse outcome matters (``parse_job._parse_done``)
        payload["refresh"] = task.refresh
    body = compressed if compressed is not None else zlib.compress(response.body, 6)
    pages.add(pipe, payload, body)
