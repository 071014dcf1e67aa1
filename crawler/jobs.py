"""The two job functions RQ runs: ``download`` and ``parse``. Arguments are plain JSON.

download: robots.txt → gate → GET → record → (HTML) store the compressed body and
enqueue a parse job | (3xx) send the target through the frontier | (5xx/429/timeout)
schedule a retry with backoff | (4xx, refused) record and stop.

parse: load the body → run the spider callback → upsert items → new requests through
the frontier → record → delete the body.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import secrets
import socket
import time
import traceback
import zlib
from datetime import datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

from rq import Queue, get_current_job
from rq.serializers import JSONSerializer

from . import keys, runtime
from .errors import ClientStatus, PermanentError, RetryableStatus, TooManyRedirects, TransientError
from .events import job_done
from .fetch import Response
from .frontier import DownloadTask, Frontier
from .gate import Gate
from .recovery import job_retry
from .settings import DEFAULT_BODY_TTL, DEFAULT_PARSE_TIMEOUT
from .spider import Page, Request
from .store import FAILED, OK, REDIRECT, REFUSED, RETRY, SKIPPED, FetchRecord, Item, utcnow

log = logging.getLogger("crawler.jobs")

#: Dotted path of the parse job function.
PARSE_FUNC = "crawler.jobs.parse"

#: Transient errors in a row from one site before its gate is closed for everyone.
ERRORS_BEFORE_PAUSE = 3
#: Longest such pause, seconds.
MAX_ERROR_PAUSE = 300.0

#: Response headers handed on to the parse step.
KEPT_HEADERS = ("content-type", "last-modified", "etag", "content-language")


def _worker_name() -> str | None:
    job = get_current_job()
    return job.worker_name if job is not None else None


def download(payload: dict[str, Any]) -> None:
    """Download one URL for one site (see the module docstring for what follows)."""
    rt = runtime.current()
    task = DownloadTask.from_json(payload)
    spider = rt.spider(task.site)
    policy = rt.policy(task.site)
    user_agent = spider.user_agent or rt.settings.user_agent
    started = utcnow()
    gate_wait: float | None = None

    def record(outcome: str, url: str = task.url, response: Response | None = None,
               error: str | None = None, status: int | None = None) -> None:
        finished = utcnow()
        counter = {OK: "fetched", REDIRECT: "fetched", FAILED: "failed", REFUSED: "refused"}.get(outcome)

        def count(pipe: Any) -> None:
            if counter and url == task.url:
                pipe.hincrby(keys.stats(task.site), counter, 1)
                if outcome in (OK, REDIRECT):  # the site answers again: end any run of errors
                    pipe.delete(keys.errors(task.site))

        job_done(rt, FetchRecord(
            site=task.site, url=url, outcome=outcome, started=response.started if response else started,
            finished=finished, status=response.status if response else status,
            bytes=len(response.body) if response else None,
            elapsed=response.elapsed if response else (finished - started).total_seconds(),
            worker=_worker_name(), attempt=task.attempt, error=error, callback=task.callback,
            meta=task.meta or None,
        ), gate_wait if url == task.url else None, also=count)

    if policy.obey_robots:
        def robots_fetched(url: str, status: int | None, error: str | None) -> None:
            record(OK if status and status < 500 else FAILED, url=url, status=status, error=error)

        allowed = rt.robots.allowed(task.site, task.url, user_agent, lambda: rt.take_gate(task.site), robots_fetched)
        if not allowed:
            record(REFUSED, error="disallowed by robots.txt")
            return

    waiting = time.monotonic()
    gate = rt.take_gate(task.site)
    gate_wait = time.monotonic() - waiting
    response: Response | None = None  # kept when its status is an error, for its timing and size
    try:
        response = rt.fetcher.get(task.url, user_agent=spider.user_agent, on_sent=lambda: _rearm(gate, task))
        _raise_for_status(response)
    except TransientError as exc:
        _retry_or_fail(rt, task, exc, record, response)
        return
    except PermanentError as exc:
        record(FAILED, response=response, error=str(exc), status=getattr(exc, "status", None))
        return

    if 300 <= response.status < 400 and response.location:
        _follow_redirect(rt, task, response, record)
    elif 300 <= response.status < 400:
        record(FAILED, response=response, error="redirect without Location")
    elif not response.is_html:
        record(SKIPPED, response=response, error=f"not HTML ({response.content_type})")
    else:
        _hand_to_parser(rt, task, response)
        record(OK, response=response)
    _schedule_refresh(rt, task)


def _schedule_refresh(rt: runtime.Runtime, task: DownloadTask) -> None:
    """If the page is to be refreshed, schedule its next fetch (one pending per page).

    Pages answered with a client error (gone, forbidden) or refused by robots.txt are
    not refreshed; everything else is, so a site's outage does not end its refreshes.
    """
    if task.refresh is None:
        return
    again = dataclasses.replace(task, attempt=1, hops=0)
    rt.scheduler.schedule_refresh(task.site, again.to_entry(), task.refresh, rt.spider(task.site).refresh_priority)

def _rearm(gate: Gate, task: DownloadTask) -> None:
    """Start the site's interval now that the request is on the wire; warn if the gate was lost."""
    if not gate.rearm():
        # Taking the gate and sending took longer than its send grace (a slow connect, a
        # paused process): another worker may have taken it, so this gap may be short.
        log.warning("%s: request sent after the gate's send grace had run out; spacing may be short: %s",
                    task.site, task.url)


def _raise_for_status(response: Response) -> None:
    if response.status == 429 or response.status >= 500:
        raise RetryableStatus(response.status, response.retry_after())
    if 400 <= response.status < 500:
        raise ClientStatus(response.status)


def _retry_or_fail(rt: runtime.Runtime, task: DownloadTask, exc: TransientError, record: Any,
                   response: Response | None = None) -> None:
    """Schedule another attempt after a backoff (or the server's Retry-After), or give up.

    Retry-After, and a run of errors from one site, close the site's gate for every
    worker, not only delay this one URL.
    """
    settings = rt.settings
    status = getattr(exc, "status", None)
    errors_in_a_row = int(rt.connection.incr(keys.errors(task.site)))
    if exc.retry_after is not None:
        rt.scheduler.close_gate(task.site, min(exc.retry_after, settings.max_retry_after))
    elif errors_in_a_row >= ERRORS_BEFORE_PAUSE:
        pause = min(settings.backoff * 2 ** (errors_in_a_row - ERRORS_BEFORE_PAUSE), MAX_ERROR_PAUSE)
        rt.scheduler.close_gate(task.site, pause)
    if task.attempt > settings.max_retries:
        record(FAILED, response=response, error=f"{exc} (gave up after {task.attempt} attempts)", status=status)
        _schedule_refresh(rt, task)  # the site may be back by then
        return
    delay = settings.backoff * 2 ** (task.attempt - 1)
    if exc.retry_after is not None:
        delay = max(delay, min(exc.retry_after, settings.max_retry_after))
    record(RETRY, response=response, error=f"{exc}; retry in {delay:g}s", status=status)
    retry = dataclasses.replace(task, attempt=task.attempt + 1)
    rt.scheduler.schedule(task.site, retry.to_entry(), delay, task.priority)


def _follow_redirect(rt: runtime.Runtime, task: DownloadTask, response: Response, record: Any) -> None:
    """Send a redirect's target through the frontier as a request of its own."""
    target = urljoin(task.url, (response.location or "").strip())
    if task.hops + 1 > rt.settings.max_redirects:
        too_many = TooManyRedirects(f"more than {rt.settings.max_redirects} redirects")
        record(FAILED, response=response, error=str(too_many))
        return
    if not rt.spider(task.site).allow_private_addresses and redirects_inward(task.url, target):
        record(FAILED, response=response, error=f"redirect refused: {target} is a private or loopback address")
        return
    frontier: Frontier = rt.frontier(task.site)
    request = Request(target, callback=task.callback, meta=task.meta or {}, priority=task.priority)
    result = frontier.add([request], depth=task.depth, hops=task.hops + 1)
    if result.refused:
        record(FAILED, response=response, error=f"redirect refused: {result.refused[0][1]}")
    elif result.duplicates:
        record(REDIRECT, response=response, error=f"redirect to {target} (already seen)")
    else:
        record(REDIRECT, response=response, error=f"redirect to {result.enqueued[0]}")


def is_private_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) resolves to a private, loopback or link-local address."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False  # unresolvable: the fetch itself will fail and be recorded
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address.is_private or address.is_loopback or address.is_link_local or address.is_reserved:
            return True
    return False


def redirects_inward(source: str, target: str) -> bool:
    """Whether a redirect leads from a public host to a private or loopback one (SSRF)."""
    source_host, target_host = urlsplit(source).hostname or "", urlsplit(target).hostname or ""
    return not is_private_host(source_host) and is_private_host(target_host)


def _hand_to_parser(rt: runtime.Runtime, task: DownloadTask, response: Response) -> None:
    page_id = secrets.token_hex(12)
    body = zlib.compress(response.body, 6)
    payload = {
        "site": task.site,
        "url": task.url,
        "body": page_id,
        "status": response.status,
        "headers": {k: response.headers[k] for k in KEPT_HEADERS if k in response.headers},
        "encoding": response.encoding,
        "callback": task.callback,
        "meta": task.meta or {},
        "depth": task.depth,
        "fetched": response.started.isoformat(),  # items are "seen" when fetched, not when parsed
    }
    # The body and its parse job in one transaction: one round trip, never a job without its body.
    with rt.connection.pipeline() as pipe:
        pipe.multi()  # RQ's enqueue starts the transaction itself unless one is started
        pipe.set(keys.body(page_id), body, ex=DEFAULT_BODY_TTL)
        parse_queue(rt.connection).enqueue(
            PARSE_FUNC, payload, result_ttl=0, failure_ttl=rt.settings.failure_ttl,
            job_timeout=DEFAULT_PARSE_TIMEOUT, description=task.url, retry=job_retry(), pipeline=pipe,
        )
        pipe.execute()


def parse_queue(connection: Any) -> Queue:
    """The RQ queue of parse jobs (JSON payloads only)."""
    return Queue(keys.PARSE_QUEUE, connection=connection, serializer=JSONSerializer)


def parse(payload: dict[str, Any]) -> None:
    """Run the spider callback on a downloaded page; store items; enqueue its links."""
    rt = runtime.current()
    if not isinstance(payload, dict) or not isinstance(payload.get("site"), str):
        raise ValueError(f"not a parse task: {payload!r:.200}")
    site, url, body_key = payload["site"], str(payload["url"]), keys.body(str(payload["body"]))
    started = utcnow()

    def record(outcome: str, error: str | None = None, also: Any = None) -> None:
        job_done(rt, FetchRecord(
            site=site, url=url, outcome=outcome, kind="parse", started=started, finished=utcnow(),
            status=payload.get("status"), worker=_worker_name(), error=error, callback=payload.get("callback"),
            elapsed=(utcnow() - started).total_seconds(), meta=payload.get("meta") or None,
        ), also=also)

    raw = rt.connection.get(body_key)
    if raw is None:
        record(FAILED, error="page body missing (expired before it was parsed)")
        rt.connection.hincrby(keys.stats(site), "failed", 1)
        return
    spider = rt.spider(site)
    page = Page(url, zlib.decompress(raw), status=int(payload.get("status", 200)),
                headers=payload.get("headers") or {}, meta=payload.get("meta") or {},
                encoding=payload.get("encoding"))
    items: list[Item] = []
    requests: list[Request] = []
    try:
        callback = spider.callback(str(payload.get("callback") or "parse"))
        for output in callback(page) or ():
            if isinstance(output, Request):
                requests.append(output)
            elif isinstance(output, dict):
                items.append(Item(_item_key(spider.item_key, output, url, len(items)), url, output))
            elif output is not None:
                raise TypeError(f"callback yielded {type(output).__name__}; expected dict or Request")
    except Exception:
        # The spider's bug fails this page only; the traceback is kept for `crawler failed`.
        record(FAILED, error=traceback.format_exc(limit=20))
        rt.connection.hincrby(keys.stats(site), "failed", 1)
        rt.connection.delete(body_key)
        return
    rt.store.upsert_items(site, items, seen=_fetched_at(payload))
    added = rt.frontier(site).add(requests, depth=int(payload.get("depth", 0)) + 1)

    def count(pipe: Any) -> None:
        pipe.hincrby(keys.stats(site), "parsed", 1)
        pipe.hincrby(keys.stats(site), "items", len(items))
        pipe.delete(body_key)

    record(OK, error=_refusals(added.refused) if added.refused else None, also=count)


def _fetched_at(payload: dict[str, Any]) -> datetime | None:
    """When the page was fetched (its items were seen), if the payload says and it is valid."""
    try:
        moment = datetime.fromisoformat(str(payload["fetched"]))
    except (KeyError, ValueError):
        return None
    return moment if moment.tzinfo is not None else None


def _item_key(field: str | None, item: dict[str, Any], url: str, position: int) -> str:
    """The item's key: its ``field`` value, else the page URL and its position on the page."""
    if field and item.get(field) not in (None, ""):
        return str(item[field])
    return f"{url}#{position}"


def _refusals(refused: list[tuple[str, str]]) -> str:
    shown = "; ".join(reason for _, reason in refused[:3])
    more = f" (+{len(refused) - 3} more)" if len(refused) > 3 else ""
    return f"{len(refused)} links refused: {shown}{more}"

