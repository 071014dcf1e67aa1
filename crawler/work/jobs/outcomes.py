"""What an attempt at a URL comes to once answered: parsed, unchanged, redirected, skipped, retried or failed.

Each outcome records the page (``AttemptState.record``) and, where it has one, schedules its
next refresh (``schedule_refresh``). ``conclude`` acts on a response below 400 by its
``classify`` verdict; ``retry_or_fail`` on an error that may pass.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import zlib
from typing import Any
from urllib.parse import urljoin

from ...backoff import backoff
from ...coord import keys, pages
from ...coord.frontier import Frontier
from ...coord.pacing import throttle_pause
from ...coord.task import DownloadTask
from ...errors import ClientStatus, RefusedURL, RetryableStatus, RobotsUnavailable, TooManyRedirects, TransientError
from ...http.addresses import redirects_inward
from ...http.conditional import Validators, validators_of
from ...http.fetch import Response
from ...http.headers import handed_headers
from ...http.redirects import redirected_request, refresh_target
from ...spiders.spider import HTML_TYPES, Request, accepts
from ...store.database import FAILED, OK, REDIRECT, RETRY, SKIPPED, UNCHANGED
from ...urls import check_url
from ..gated_fetch import sent_headers
from .errback import failure_kind
from .state import AttemptState

#: Transient errors in a row from one site before its gate is closed for everyone.
ERRORS_BEFORE_PAUSE = 3


#: Longest such pause, seconds.
MAX_ERROR_PAUSE = 300.0


class Verdict(enum.Enum):
    """What a response that is neither an error nor logged out comes to (``classify``)."""

    #: A 304 to a conditional refresh: the page is as it was parsed last time (``unchanged``).
    UNCHANGED = "unchanged"
    #: A 3xx with a Location: its target goes through the frontier (``follow_redirect``).
    REDIRECT = "redirect"
    #: A 3xx without one (or a 304 to a request that asked for none): the page fails.
    NO_LOCATION = "redirect without Location"
    #: A content type the spider does not take (``Spider.content_types``): recorded skipped.
    NOT_HANDLED = "not handled"
    #: Anything else: the page goes to the parse workers.
    PARSE = "parse"


def classify(response: Response, conditional: bool, content_types: tuple[str, ...], sitemap: bool) -> Verdict:
    """What ``response`` comes to, once past the error statuses (``raise_for_status``: 429 and 5xx
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


def conclude(attempt: AttemptState, response: Response) -> None:
    """Act on what ``classify`` makes of ``response``, then schedule the page's next refresh
    (``schedule_refresh``), with the validators the outcome leaves for a conditional one:

    - UNCHANGED: its items seen again, recorded UNCHANGED (``unchanged``); validators kept;
    - REDIRECT: the target through the frontier, recorded REDIRECT, or FAILED when refused
      (``follow_redirect``); no validators;
    - NO_LOCATION: recorded FAILED; no validators;
    - NOT_HANDLED: recorded SKIPPED; the response's validators;
    - PARSE, but an HTML page that refreshes to another at once (``meta_refresh``): as a
      REDIRECT, to that page;
    - PARSE: recorded OK, the page added to the pages stream (``hand_to_parser``) in the
      pipeline of its record, after it; the response's validators.

    A rendered page's next refresh carries no validators: it is asked for whole.
    """
    task, spider = attempt.task, attempt.spider
    verdict = classify(response, bool(attempt.conditional), spider.content_types, attempt.sink is not None)
    validators = None  # a redirect, or a failure: the next refresh asks for the whole page
    if verdict is Verdict.UNCHANGED:
        unchanged(attempt, response)
        validators = validators_of(response.headers, task.validators)
    elif verdict is Verdict.REDIRECT:
        follow_redirect(attempt, response)
    elif verdict is Verdict.NO_LOCATION:
        attempt.record(FAILED, response=response, error="redirect without Location")
    elif verdict is Verdict.NOT_HANDLED:
        attempt.record(SKIPPED, response=response, error=not_handled(spider.content_types, response.content_type))
        validators = validators_of(response.headers)
    elif (refresh_to := meta_refresh(attempt, response)) is not None:
        follow_redirect(attempt, response, refresh_to)
    else:
        # The page goes to the parse workers in the pipeline of its record, after the record is
        # written: a parse record (a callback that failed) is then always the page's latest.
        compressed = attempt.sink.finish() if attempt.sink else None
        hand = functools.partial(
            hand_to_parser,
            task=task,
            response=response,
            compressed=compressed,
            sent=sent_headers(attempt.spider, task),
        )
        attempt.record(OK, response=response, then=hand)
        validators = validators_of(response.headers)
    schedule_refresh(attempt, None if attempt.rendered else validators)


def meta_refresh(attempt: AttemptState, response: Response) -> str | None:
    """Where an HTML page of a spider that follows meta refreshes (``Spider.follow_meta_refresh``)
    refreshes to within ``META_REFRESH_MAX_DELAY`` s (``redirects.refresh_target``); None for
    any other page, a rendered one (its browser ran it), and a sitemap's."""
    if attempt.rendered or attempt.sink is not None or not getattr(attempt.spider, "follow_meta_refresh", True):
        return None
    return refresh_target(response)


def not_handled(content_types: tuple[str, ...], content_type: str) -> str:
    """Why a response of ``content_type`` is skipped (``Spider.content_types``)."""
    if tuple(content_types) == HTML_TYPES:
        return f"not HTML ({content_type})"
    return f"not in content_types ({content_type})"


def robots_gave_up(attempt: AttemptState, exc: RobotsUnavailable) -> None:
    """Record the page failed: its robots.txt has failed 1 + ``max_retries`` times in a row.

    So a crawl drains (``--burst`` ends) on a site whose robots.txt never answers, where
    its pages would otherwise wait for it up to ``ROBOTS_OUTAGE_GRACE`` (30 days); each is
    recorded, for ``crawler retry``, which has robots.txt asked again at once
    (``robots.ask_again``). The gate is left open: the site's other pages fail as fast,
    unrequested (RFC 9309: unreachable means disallow all), and robots.txt is still asked
    when its wait is over.
    """
    attempt.record(
        FAILED, error=f"robots.txt unreachable: {exc} (gave up after {exc.attempts} attempts)", kind="robots"
    )
    schedule_refresh(attempt, attempt.task.validators)


def unchanged(attempt: AttemptState, response: Response) -> None:
    """A 304 to a conditional refresh: the page is as it was parsed last time.

    Its items are seen again (``last_seen`` moves on); no body is kept, no parse job made.
    """
    touched = attempt.rt.store.touch_items(attempt.task.site, attempt.task.url, response.started)
    attempt.record(UNCHANGED, response=response, error=f"not modified; {touched} item(s) seen again")


def schedule_refresh(attempt: AttemptState, validators: Validators | None) -> None:
    """If the page is to be refreshed, schedule its next fetch (one pending per page), with ``validators``.

    Pages answered with a client error (gone, forbidden) or refused by robots.txt are
    not refreshed; everything else is, so a site's outage does not end its refreshes.
    """
    task = attempt.task
    if task.refresh is None:
        return
    again = dataclasses.replace(task, attempt=1, hops=0, validators=validators)
    priority = attempt.spider.refresh_priority
    attempt.rt.scheduler.schedule_refresh(task.site, again.to_entry(), task.refresh, priority)


def raise_for_status(response: Response) -> None:
    if response.status == 429 or response.status >= 500:
        raise RetryableStatus(response.status, response.retry_after())
    if 400 <= response.status < 500:
        raise ClientStatus(response.status)


def retry_or_fail(attempt: AttemptState, exc: TransientError, response: Response | None = None) -> None:
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
    settings, policy = rt.settings, attempt.context.policy
    status = getattr(exc, "status", None)
    errors_in_a_row = int(rt.connection.incr(keys.errors(task.site)))
    rt.memory.error_runs[task.site] = True
    if exc.retry_after is not None:
        rt.close_gate(
            task.site, task.url, min(exc.retry_after, settings.max_retry_after), f"Retry-After after {status}", policy
        )
    elif status in (429, 503):
        pause = throttle_pause(settings.backoff, errors_in_a_row, MAX_ERROR_PAUSE)
        rt.close_gate(task.site, task.url, pause, f"backoff after {status}", policy)
    elif errors_in_a_row >= ERRORS_BEFORE_PAUSE:
        pause = backoff(settings.backoff, errors_in_a_row - ERRORS_BEFORE_PAUSE + 1, MAX_ERROR_PAUSE)
        rt.close_gate(task.site, task.url, pause, f"{errors_in_a_row} errors in a row", policy)
    if task.attempt > settings.max_retries:
        error = f"{exc} (gave up after {task.attempt} attempts)"
        attempt.record(FAILED, response=response, error=error, status=status, kind=failure_kind(exc))
        schedule_refresh(attempt, task.validators)  # the site may be back by then, the page as it was
        return
    delay = backoff(settings.backoff, task.attempt)
    if exc.retry_after is not None:
        delay = max(delay, min(exc.retry_after, settings.max_retry_after))
    attempt.record(RETRY, response=response, error=f"{exc}; retry in {delay:g}s", status=status)
    retry = dataclasses.replace(task, attempt=task.attempt + 1)
    rt.scheduler.schedule(task.site, retry.to_entry(), delay, task.priority)


def follow_redirect(attempt: AttemptState, response: Response, refresh_to: str | None = None) -> None:
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
        record(FAILED, response=response, error=str(too_many), kind="redirects")
        return
    spider = attempt.spider
    try:
        check_url(target, list(attempt.context.domains))
    except RefusedURL as exc:
        record(FAILED, response=response, error=f"{how} refused: {exc}", kind="refused")
        return
    if not spider.allow_private_addresses and redirects_inward(task.url, target, rt.fetcher.timeout):
        record(
            FAILED, response=response, error=f"{how} refused: {target} is a private or loopback address", kind="refused"
        )
        return
    frontier: Frontier = rt.frontier(task.site)
    status = 303 if refresh_to is not None else response.status
    site_headers = getattr(spider, "headers", None) or {}
    method, headers, body = redirected_request(
        status, task.method, task.headers, task.body, task.url, target, site_headers
    )
    request = Request(
        target, callback=task.callback, method=method, headers=headers, body=body, meta=task.meta or {},
        priority=task.priority, errback=task.errback,
    )  # fmt: skip
    result = frontier.add([request], depth=task.depth, hops=task.hops + 1)
    if result.refused:
        record(FAILED, response=response, error=f"{how} refused: {result.refused[0][1]}", kind="refused")
    elif result.duplicates:
        record(REDIRECT, response=response, error=f"{how} to {target} (already seen)")
    else:
        record(REDIRECT, response=response, error=f"{how} to {result.enqueued[0]}")


def hand_to_parser(
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
    if not (task.method == "GET" and task.body is None and not sent and task.sent_url is None):
        # page.request; and, for a request that is not a plain GET, what tells its items from
        # those of another request for the same URL (another body).
        sent_request: dict[str, Any] = {"method": task.method, "headers": sent}
        if task.method != "GET" or task.body is not None:
            sent_request["variant"] = task.fingerprint.hex()
        if task.sent_url is not None:  # page.request.url: as sent; page.url: the canonical URL
            sent_request["url"] = task.sent_url
        payload["request"] = sent_request
    again = task.recorded()
    if again:  # what the page's record keeps of its request, should its parse fail (``crawler retry``)
        payload["again"] = again
    if task.refresh is not None:  # the page will be refreshed: its parse outcome matters (``parse_job._parse_done``)
        payload["refresh"] = task.refresh
    body = compressed if compressed is not None else zlib.compress(response.body, 6)
    pages.add(pipe, payload, body)
