"""One attempt at one URL of a download job, in steps: ``download_one`` runs them in order.

``taken`` (the URL checked again) → ``robots_allow`` → ``next_turn_near`` → ``logged_in`` →
``build_request`` → ``take_gate`` → ``fetch`` → ``conclude`` (for a page to render, ``render``
takes the place of the three before ``conclude``). Each step deals with the page (records
it, schedules it again: ``outcomes``, ``login``) and stops there, or leaves it to the next.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

from rq import get_current_job

from ...coord import keys, quarantine
from ...coord.gate import Gate, Unless
from ...coord.session import Jar
from ...coord.task import DownloadTask, fingerprint
from ...errors import (
    ConfigError,
    PermanentError,
    ProxyError,
    RefusedURL,
    RobotsUnavailable,
    TransientError,
)
from ...http.conditional import request_headers
from ...http.fetch import Response
from ...http.headers import encode_headers
from ...store.database import FAILED, OK, REFUSED, RETRY, utcnow
from ...urls import check_url
from .. import runtime
from ..batching import PACED_MAX_INTERVAL
from ..events import HeldRecords, SoonRecords
from ..gated_fetch import page_headers, page_request, send
from ..render import rendering
from ..sitemaps import SITEMAP_CALLBACK, SITEMAP_MAX_BYTES, SitemapSink
from . import browser, outcomes
from .context import SiteContext
from .errback import failure_kind
from .login import is_logged_out, logged_out, take_session
from .outcomes import raise_for_status, retry_or_fail, robots_gave_up, schedule_refresh
from .state import AttemptState, observe, sent

#: Seconds of a site's interval (margin included) past which a page whose turn went to robots.txt
#: goes back to its frontier rather than wait for the next turn holding its thread (``Attempt.next_turn_near``).
TURN_WAIT_MOST = PACED_MAX_INTERVAL


def download_one(
    rt: runtime.Runtime,
    context: SiteContext,
    payload: dict[str, Any],
    max_gate_wait: float | None,
    held: HeldRecords | SoonRecords | None = None,
    unless: Unless | None = None,
) -> bool:
    """Download one URL; False, having done nothing, if its gate stayed closed for ``max_gate_wait``
    seconds, or ``unless``, asked along with the take, said to give it up (``Gate.acquire``). With
    ``held``, its record waits there (see ``download``), unless it must go at once: a retry or a failure.

    Its steps, in order (``Attempt``'s methods): each deals with the page (records it, schedules
    it again) and stops there, or leaves it to the next one. ``context``: the site as read for
    this URL (``context.site_context``).
    """
    attempt = taken(rt, context, payload, held)
    if attempt is None or not attempt.robots_allow() or not attempt.next_turn_near() or not attempt.logged_in():
        return True
    render, wait_for = rendering(attempt.spider, attempt.task.meta)
    if render:  # the browser's requests carry the site's session too (``browser.routed_fetch``)
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


def taken(
    rt: runtime.Runtime, context: SiteContext, payload: dict[str, Any], held: HeldRecords | SoonRecords | None
) -> Attempt | None:
    """The first step: the attempt at the payload's URL, or None when the URL is refused now (its
    domain, its scheme: ``check_url``), the payload quarantined (``quarantine.record``) and nothing
    recorded. Checked again here: a job can be written straight into Redis, past the frontier."""
    task = DownloadTask.from_json(payload)
    try:
        check_url(task.url, list(context.domains))
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
    return Attempt(rt, task, context, held, context.user_agent_for(task), utcnow())


class Attempt(AttemptState):
    """The steps of one attempt at a URL, in the order ``download_one`` runs them (see the module docstring)."""

    def robots_allow(self) -> bool:
        """Whether robots.txt lets the page be fetched: True at once for a site that does not obey it.

        Asking may fetch robots.txt through the site's gate, recorded (``_robots_fetched``).
        False when the page has been dealt with instead: disallowed (recorded REFUSED);
        robots.txt unreadable (the page scheduled again after its ``retry_after`` without
        spending an attempt, the site's gate closed as long, recorded RETRY; or, once it has
        failed past ``max_retries`` readings, the page failed: ``robots_gave_up``); the
        proxy failing (benched, the page retried or failed: ``retry_or_fail``).
        """
        if not self.context.policy.obey_robots:
            return True
        rt, task, policy = self.rt, self.task, self.context.policy
        try:
            allowed = rt.robots.allowed(
                task.site,
                task.url,
                self.user_agent,
                functools.partial(rt.take_gate, task.site, task.url, policy),
                self._robots_fetched,
                allow_private=self.spider.allow_private_addresses,
                proxy=self.proxy,
            )
        except ProxyError as exc:  # robots.txt could not be asked through this proxy (benched): another one will
            retry_or_fail(self, exc)
            return False
        except RobotsUnavailable as exc:
            if exc.attempts > rt.settings.max_retries:
                robots_gave_up(self, exc)
                return False
            # Not the page's fault: it waits for robots.txt without spending one of its attempts,
            # and the rest of the site waits with it (RFC 9309: unreachable means disallow all).
            rt.close_gate(task.site, task.url, exc.retry_after, "robots.txt unreadable", policy)
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
        # The interval in force now: robots.txt, just read, may have lengthened it (its Crawl-delay).
        interval = self.rt.batching(self.task.site, self.context.policy).interval
        if not self.robots_fetched or interval <= TURN_WAIT_MOST:
            return True
        self.rt.frontier(self.task.site).hand_back([self.task])
        return False

    def logged_in(self) -> bool:
        """For a site that logs in (``logs_in``), take its login session (``login.take_session``: the fleet
        logged in first if no worker has); False when the page has been dealt with instead (it waits
        for another worker's login, or the login failed: retried or failed). True at once for
        a site without a login."""
        if not self.context.logs_in:
            return True
        self.generation = take_session(self)
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
        self.headers = page_headers(rt.connection, spider, task, self.conditional)
        unbuildable = request_problem(self.user_agent, self.headers)
        if unbuildable is not None:
            self.record(FAILED, error=f"request cannot be built: {unbuildable}")
            schedule_refresh(self, None)  # the next refresh asks for the whole page
            return False
        return True

    def take_gate(self, max_wait: float | None, unless: Unless | None = None) -> Gate | None:
        """Take the site's gate for the request, waiting as long as it takes (``max_wait`` None) or at
        most ``max_wait`` seconds; None when it stayed closed that long, or ``unless`` said to give
        the take up (``Gate.acquire``), nothing else done. The wait goes into the page's record
        (``gate_wait``)."""
        waiting = time.monotonic()
        site, url, policy = self.task.site, self.task.url, self.context.policy
        if max_wait is None:
            gate = self.rt.take_gate(site, url, policy)
        else:
            taken = self.rt.take_gate_within(site, url, max_wait, unless, policy)
            if taken is None:
                return None
            gate = taken
        self.gate_wait = time.monotonic() - waiting
        return gate

    def fetch(self, gate: Gate) -> Response | None:
        """Send the request through the taken ``gate``; the response when it is one to conclude on
        (``conclude``), else None, the page dealt with:

        - no answer (a timeout, a refused connection, a proxy's failure, which benches the
          proxy) or a 429/5xx: retried or failed (``retry_or_fail``);
        - another 4xx, or another permanent error: recorded FAILED;
        - an answer the spider says is logged out: its session ended, the page fetched again
          (``login.logged_out``).

        Sent by ``gated_fetch.send``: the gate let go once the request is over, whatever came of
        it; the site's cookie jar updated from the answer; the site's adaptive interval told how
        it went (``state.observe``).
        """
        rt, task, spider = self.rt, self.task, self.spider
        response: Response | None = None  # kept when its status is an error, for its timing and size
        self.sink = SitemapSink() if task.callback == SITEMAP_CALLBACK else None
        # A record written soon (not held by a fast site's batch) carries the rearm when the site
        # answers well within its interval: one round trip less, the gate opening when it would have.
        late = (self.held is None or self.held.prompt) and rt.rearms_late(task.site, gate)
        try:
            response = send(
                rt.fetcher,
                gate,
                page_request(task, spider, self.headers, self.proxy),
                on_sent=functools.partial(sent, self, gate) if late else None,
                jar=Jar(rt.connection, task.site) if self.context.uses_cookies else None,
                observe=functools.partial(observe, rt, task),
                proxies=rt.proxies,
                max_bytes=SITEMAP_MAX_BYTES if self.sink else None,
                sink=self.sink.feed if self.sink else None,
            )
            if self.generation is not None and is_logged_out(spider, response):
                logged_out(self, self.generation, response)
                return None
            raise_for_status(response)
        except TransientError as exc:
            retry_or_fail(self, exc, response)
            return None
        except PermanentError as exc:
            status = getattr(exc, "status", None)
            self.record(FAILED, response=response, error=str(exc), status=status, kind=failure_kind(exc))
            return None
        return response

    def render(self, wait_for: str | None) -> Response | None:
        """Render the page in the process's browser (``render``): the response to conclude on, or None,
        the page dealt with (a render that failed: retried or failed as a fetch; with no browser to
        render with, failed with the reason, for ``crawler retry`` once one is installed).

        Every request the page makes to the allowed domains takes the site's gate, as a
        fetch does, and is recorded (``browser.visit``); the page's own record is ``conclude``'s.
        """
        rt, task = self.rt, self.task
        visit = browser.visit(rt, self.context, task, self.record)
        try:
            response = rt.renderer.render(
                task.url_to_send, visit, wait_for, rt.settings.timeout, rt.settings.max_body_bytes
            )
            raise_for_status(response)
        except TransientError as exc:
            retry_or_fail(self, exc)
            return None
        except (PermanentError, ConfigError) as exc:
            self.record(FAILED, error=str(exc), status=getattr(exc, "status", None), kind=failure_kind(exc))
            return None
        self.rendered = True
        return response

    def conclude(self, response: Response) -> None:
        """Act on the response (``outcomes.conclude``): the page recorded, and its next refresh scheduled."""
        outcomes.conclude(self, response)


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
