"""A site's login: the fleet's session taken or made before a page is fetched, and a page logged out.

For a spider with a ``login_url`` (``session.logs_in``): the first worker to need the session
logs the fleet in (``take_session``: the login page, then the Request its ``login(page)``
returns, each through the site's gate); the others wait for it. A page the spider's
``logged_out(page)`` says is logged out ends the session and is fetched again (``logged_out``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from ...coord.session import LOGIN_WAIT, Jar, Session
from ...coord.task import DownloadTask
from ...errors import ConfigError, PermanentError, TransientError
from ...http.fetch import Response
from ...spiders.items import failure_text
from ...spiders.spider import Page, Request
from ...store.database import FAILED, OK, RETRY, FetchRecord, utcnow
from ...urls import check_url
from ..events import Done, jobs_done
from ..gated_fetch import LOGIN, Outgoing, send, spider_hook
from .outcomes import raise_for_status, retry_or_fail
from .state import AttemptState, observe, worker_name

log = logging.getLogger("crawler.jobs")


def take_session(attempt: AttemptState) -> int | None:
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
        log_in(attempt)
    except TransientError as exc:
        session.let_go(token)
        retry_or_fail(attempt, exc)
        return None
    except Exception as exc:  # the spider's login() or a permanent error: the page fails, the login is tried again
        session.let_go(token)
        retry_or_fail(attempt, LoginFailed(f"login failed: {failure_text(exc).splitlines()[-1]}"))
        return None
    generation = session.logged_in(token)
    log.info("%s: logged in (session %d)", task.site, generation)
    return generation


class LoginFailed(TransientError):
    """The fleet could not log in to the site (the page waits for a later login)."""


def log_in(attempt: AttemptState) -> None:
    """Fetch the spider's ``login_url`` and send the Request its ``login(page)`` returns, each through the
    gate with the site's cookies, the jar updated from both responses; raises if either fails, or if
    the spider's ``logged_out`` says the answer to the login is still logged out.

    Only a GET can be sent by this fetcher: a Request with another method raises ConfigError.
    """
    spider: Any = attempt.spider  # its login() is the spider author's, not a Spider's
    page = page_of(session_get(attempt, Request(str(spider.login_url))))
    submit = spider.login(page)
    if not isinstance(submit, Request):
        raise ConfigError(f"{type(spider).__name__}.login must return a Request, got {submit!r:.80}")
    if is_logged_out(spider, session_get(attempt, submit)):  # refused credentials, an expired token
        raise LoginFailed("login failed: the answer to the login request is still logged out (logged_out)")


def session_get(attempt: AttemptState, request: Request) -> Response:
    """One request of a login (its method, headers and body: a login form's POST), sent as a download
    sends a page (``gated_fetch.send``: the gate, the site's headers, cookies, the attempt's proxy,
    the caps, the spider's ``before_send``); recorded, and raised on an error status."""
    rt, task, spider = attempt.rt, attempt.task, attempt.spider
    url = request.url
    check_url(url, list(attempt.context.domains))
    jar = Jar(rt.connection, task.site)
    gate = rt.take_gate(task.site, url, attempt.context.policy)
    headers = {**(getattr(spider, "headers", None) or {}), **request.headers, **jar.header(url)}
    outgoing = Outgoing(
        task.site,
        url,
        headers,
        spider.user_agent,
        attempt.proxy,
        spider.allow_private_addresses,
        request.method,
        request.body,
        spider_hook(spider, LOGIN, request.meta),
    )
    response = send(
        rt.fetcher, gate, outgoing, jar=jar, observe=functools.partial(observe, rt, task), proxies=rt.proxies
    )
    outcome = OK if response.status < 400 else FAILED
    jobs_done(rt.sink, [login_done(task, url, outcome, response)])
    raise_for_status(response)
    return response


def login_done(task: DownloadTask, url: str, outcome: str, response: Response) -> Done:
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
            worker=worker_name(),
            attempt=1,
            error="login" if outcome == OK else f"login: HTTP {response.status}",
        ),
        None,
        stats={},
    )


def page_of(response: Response) -> Page:
    return Page(
        response.url, response.body, status=response.status, headers=response.headers, encoding=response.encoding
    )


def is_logged_out(spider: Any, response: Response) -> bool:
    """What the spider's ``logged_out(page)`` says of ``response`` (False when it has none); raises
    LoggedOutFailed, with the traceback, when it raises."""
    check = getattr(spider, "logged_out", None)
    if not callable(check):
        return False
    try:
        return bool(check(page_of(response)))
    except Exception as exc:  # any: the spider's code fails its page, never the download job
        raise LoggedOutFailed(f"logged_out raised: {failure_text(exc)}") from exc


class LoggedOutFailed(PermanentError):
    """The spider's ``logged_out(page)`` raised: the page fails, its record holding the traceback, and
    ``crawler retry`` sends it again (as a page whose callback raised)."""


def logged_out(attempt: AttemptState, generation: int, response: Response) -> None:
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
