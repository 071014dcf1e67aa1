"""The parse step parse workers run on each page of the stream: its callback, items, links, record.

``parse``: the spider's callback on the page (``body`` zlib-compressed) → items upserted →
new requests through the frontier (a chunk at a time as the callback yields them: ``PageLinks``)
→ the page's record, with the worker's acknowledgement of the page in the same pipeline. A
batch of pages is written together (``HeldParses``), and the sites whose links found no job
queued are refilled together (``together.refill_together``).
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

import redis
from rq.timeouts import JobTimeoutException

from ..coord import keys, pages
from ..coord.frontier import AddResult, Candidate, Frontier
from ..coord.task import fingerprint
from ..coord.together import enqueue_together, refill_together
from ..errors import (
    ConfigError,
    PermanentError,
    RefusedRecord,
)
from ..http.content import DecodeError, inflate_capped
from ..settings import DEFAULT_PARSE_TIMEOUT
from ..spiders.extensions import extension_type, link_extension, normal_extension
from ..spiders.failure import Failure
from ..spiders.items import Pipelines, failure_text
from ..spiders.spider import Page, Request, SentRequest, Spider, accepts
from ..store.database import FAILED, OK, FetchRecord, Item, utcnow
from . import runtime
from .events import Done, jobs_done
from .sitemaps import SITEMAP_CALLBACK, SitemapReader

log = logging.getLogger("crawler.jobs")

#: Bytes a held link costs beyond twice its URL (as requested, and canonical): its ``Request``
#: and the tuples and dict around it. Measured: 339 bytes a link of 22 characters (tracemalloc).
HELD_LINK_COST = 300
#: Estimated bytes of links (``HeldParses.link_bytes``) past which a parse worker writes its
#: batch before parsing the next page: a batch holds this much, plus one page's links at most.
HELD_LINK_BYTES = 32 * 1024 * 1024
#: Requests of one page queued together while its callback runs (``PageLinks``): a page holds at
#: most this many, whatever its links' count. One seen-set call each (``frontier.SEEN_CHUNK``).
LINK_CHUNK = 5000


def parse(
    payload: dict[str, Any],
    body: bytes,
    worker: str | None = None,
    done: Callable[[Any], None] | None = None,
    held: HeldParses | None = None,
    *,
    rt: runtime.Runtime,
) -> None:
    """Run the spider callback on a downloaded page (``body`` zlib-compressed); store items; enqueue its links.

    Whatever the outcome, the page's record and counters go out in one pipeline, with
    ``done``'s commands (the parse worker's acknowledgement of the page). A callback
    that raises or times out fails the page alone (recorded with the traceback, for
    ``crawler failed`` and ``crawler retry``). Errors of the database or Redis raise:
    the page was not parsed and stays with the worker.

    With ``held``, the page's links (vetted now, refusals in its record), items and
    record wait there, written with the rest of the parse worker's batch
    (``HeldParses.flush``).
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("site"), str):
        raise ValueError(f"not a parse task: {payload!r:.200}")
    site, url = payload["site"], str(payload["url"])
    started = utcnow()
    if payload.get("callback") == SITEMAP_CALLBACK:
        _read_sitemap(rt, payload, body, worker, done, started, held)
        return

    def fail(why: str) -> None:  # the page alone fails, recorded with ``why``
        parse_failed(rt, payload, why, worker, done, started, held)

    links: PageLinks | None = None
    try:
        spider = rt.spider(site)
        links = PageLinks(rt, site, spider, int(payload.get("depth", 0)) + 1, held)
        run = _run_errback if "failure" in payload else _run_callback  # a failed request's errback
        items, dropped = run(spider, rt.pipelines(site), url, body, payload, rt.settings.max_body_bytes, links)
    except JobTimeoutException:
        fail(f"parse timed out after {DEFAULT_PARSE_TIMEOUT}s\n" + traceback.format_exc(limit=20))
        return
    except Exception as exc:  # the callback's, or an item's step's (ItemError): the page alone fails
        if links is not None and exc is links.failure:  # Redis's, queuing links: the page stays with the worker
            raise
        fail(failure_text(exc))
        return
    if not _store_outputs(rt, payload, items, links, held, fail):
        return
    notes = links.notes()
    if links.passed and spider.max_pages is not None and rt.frontier(site).pages_admitted() >= spider.max_pages:
        notes.append(f"max_pages ({spider.max_pages:,}) reached: new links not queued")
    counts = {"parsed": 1, "items": len(items)}
    if dropped:  # by process_item or a pipeline (DropItem)
        counts["dropped"] = dropped
    _parse_done(rt, payload, OK, "; ".join(notes) or None, worker, done, started, counts, held)


def _store_outputs(
    rt: runtime.Runtime,
    payload: dict[str, Any],
    items: list[Item],
    links: PageLinks,
    held: HeldParses | None,
    fail: Callable[[str], None],
) -> bool:
    """Store the page's items (or hold them with ``held``) and queue the rest of its links; False when that
    timed out, the page failed with ``fail`` (some links may be in: its retry adds only the others)."""
    try:
        if held is None:
            rt.store.upsert_items(payload["site"], items, seen=_fetched_at(payload))
        else:
            held.hold_items(payload["site"], items, _fetched_at(payload))
        links.finish()
    except JobTimeoutException:
        fail(
            f"parse timed out after {DEFAULT_PARSE_TIMEOUT}s while storing {len(items)} items "
            f"and {links.passed:,} links\n" + traceback.format_exc(limit=20)
        )
        return False
    return True


class HeldParses:
    """Links, items and records of a parse worker's batch of pages, held back and written together.

    ``flush`` queues every page's new links (the seen-set calls of all its sites in one round
    trip, then their pushes together: ``together.enqueue_together``),
    upserts every page's items and writes the records in one database transaction, and
    sends their counters and the pages' acknowledgements in one Redis pipeline
    (``events.jobs_done``): where each page took two transactions and three round trips,
    a batch takes one and three. A page is acknowledged only once its links
    are queued and its items stored: a worker that dies first leaves its whole batch to
    be parsed again (its links are then duplicates, its items written again).

    A batch the database refuses (``store.refused``: not an outage) is written a page at
    a time, each page's items with its record: a page refused alone is recorded failed
    with the database's reason, the others are written.
    """

    def __init__(self, rt: runtime.Runtime):
        self.rt = rt
        #: Per page: its site, links (``Frontier.vet``'s candidates) and their depth.
        self.links: list[tuple[str, list[Candidate], int]] = []
        #: Per page: its site, items and when they were seen (fetched).
        self.items: list[tuple[str, list[Item], datetime | None]] = []
        #: Index in ``items`` of the items of the page whose record is ``done[i]``, by i.
        self.items_of: dict[int, int] = {}
        self.done: list[Done] = []
        #: Per page held: what ``fail`` needs to record it failed instead.
        self.pages: list[tuple[dict[str, Any], str | None, Callable[[Any], None] | None, datetime]] = []
        #: Pages written one at a time (a refused batch) whose pipeline is still to go.
        self._written: list[Done] = []

    def hold_items(self, site: str, items: list[Item], seen: datetime | None) -> None:
        """Hold the items of the page whose record comes next (``_parse_done``)."""
        self.items_of[len(self.done)] = len(self.items)
        self.items.append((site, items, seen))

    def flush(self) -> None:
        """Write what is held: links, then items and records in one transaction, then the pipeline.

        A database that is down raises SQLAlchemyError, with the items and records still
        held (the links, once queued, are not queued again; pages written already, after
        a refused batch, are not written again). Each record's page counts as done when
        its batch is written: its ``finished`` is now.
        """
        links, self.links = self.links, []
        sites = dict.fromkeys(site for site, _, _ in links)
        for site in sites:  # the scheduler learns the politeness of a site before its new work
            self.rt.publish(site)
        frontiers = [self.rt.frontier(site) for site in sites]
        added = enqueue_together(
            [(frontier, [(page, depth) for s, page, depth in links if s == frontier.site]) for frontier in frontiers]
        )
        _refill_dry([frontier for frontier, results in zip(frontiers, added, strict=True) if _found_dry(results)])
        finished = utcnow()
        for held in self.done:
            held.record.finished = finished
            held.record.elapsed = (finished - held.record.started).total_seconds()
        try:
            self.rt.store.upsert_pages(self.items, [held.record for held in self.done])
            self._written += self.done
        except RefusedRecord:
            self._write_each()
        written, self._written = self._written, []
        self.items, self.items_of, self.done, self.pages = [], {}, [], []
        jobs_done(self.rt.sink, written, written=True)

    def _write_each(self) -> None:
        """A page at a time, its items with its record: refused alone, the page is recorded failed.

        Each page leaves what is held once dealt with, so an outage on the way (raised)
        leaves only the others to write when ``flush`` is called again.
        """
        while self.done:
            held, page = self.done[0], self.pages[0]
            at = self.items_of.get(0)
            try:
                self.rt.store.upsert_pages([self.items[at]] if at is not None else [], [held.record])
                self._written.append(held)
            except RefusedRecord as exc:
                payload, worker, done, started = page
                log.warning("the database refused the items or record of %s: %s", payload.get("url"), exc)
                parse_failed(self.rt, payload, f"{exc} (this page's items or parse record)", worker, done, started)
            del self.done[0], self.pages[0]
            self.items_of = {i - 1: j for i, j in self.items_of.items() if i > 0}

    def fail(self, reason: str) -> None:
        """Record every page held failed with ``reason`` instead (their writes timed out), and let go of them."""
        pages_, self.links, self.items, self.done, self.pages = self.pages, [], [], [], []
        written, self.items_of, self._written = self._written, {}, []
        jobs_done(self.rt.sink, written, written=True)  # pages written one at a time before the timeout
        for payload, worker, done, started in pages_:
            parse_failed(self.rt, payload, reason, worker, done, started)

    def full(self) -> bool:
        """Whether the links held pass ``HELD_LINK_BYTES`` (estimated): time to write the batch.

        The parse worker then writes the batch before its next page, so pages of many
        links never pile up in memory (a page holds fewer than LINK_CHUNK links here: it
        queued the others itself, ``PageLinks``). Counted again at each call: a batch is a few pages.
        """
        held = sum(2 * len(url) + HELD_LINK_COST for _, candidates, _ in self.links for url, _ in candidates)
        return held >= HELD_LINK_BYTES


class PageLinks:
    """The requests a page's callback yields, queued as they come, a chunk at a time.

    Each request meets, in order: the page's cap (the ``max_links_per_page`` setting, else the
    spider's; none by default), the spider's ``depth_limit``, and its ``deny_extensions``
    (``_denied_extensions``); those stopped are counted for the page's record (``notes``).
    The others go to the frontier every LINK_CHUNK requests while the callback runs, so a page
    holds one chunk of requests, never all its links; the last, shorter chunk is queued by
    ``finish``, with the parse worker's batch (``held``) or at once. ``failure`` is what a
    chunk's queuing raised (Redis down), told apart from the callback's own exceptions.
    """

    def __init__(self, rt: runtime.Runtime, site: str, spider: Spider, depth: int, held: HeldParses | None):
        self.rt = rt
        self.site = site
        self.spider = spider
        self.depth = depth
        self.held = held
        #: The setting's cap (0: none), else the spider's (None: none).
        self.cap = rt.settings.max_links_per_page or spider.max_links_per_page
        self.too_deep = spider.depth_limit is not None and depth > spider.depth_limit
        self.denied = _denied_extensions(spider.deny_extensions, spider.content_types)
        self.pending: list[Request] = []
        self.yielded = 0
        #: Requests handed to the frontier (queued, or refused or found seen there).
        self.passed = 0
        self.beyond_depth = 0
        #: Requests not queued for their extension, by extension (in the order first met).
        self.by_extension: dict[str, int] = {}
        #: URL -> its denied extension or None, for the last few thousand URLs: pages repeat their links.
        self._extensions: dict[str, str | None] = {}
        self.refused = 0
        self.reasons: list[str] = []  # the first few refusals' reasons
        self.failure: BaseException | None = None

    def take(self, request: Request) -> None:
        """One request the callback yielded: counted, or queued with its chunk."""
        self.yielded += 1
        if self.cap is not None and self.yielded > self.cap:
            return
        if self.too_deep:
            self.beyond_depth += 1
            return
        extension = self._extensions.get(request.url, "")
        if extension == "":  # not looked at yet
            if len(self._extensions) >= LINK_CHUNK:
                self._extensions.clear()
            extension = self._extensions[request.url] = link_extension(request.url, self.denied)
        if extension is not None:
            self.by_extension[extension] = self.by_extension.get(extension, 0) + 1
            return
        self.passed += 1
        self.pending.append(request)
        if len(self.pending) >= LINK_CHUNK:
            self._add_pending()

    def finish(self) -> None:
        """Queue what is left: at once without ``held``, else held with the batch (vetted now)."""
        if self.held is None:
            self._add_pending()
            return
        candidates, refused = self.rt.frontier(self.site).vet(self.pending)
        self.pending = []
        self._count(refused)
        self.held.links.append((self.site, candidates, self.depth))

    def _add_pending(self) -> None:
        chunk, self.pending = self.pending, []
        if not chunk:
            return
        try:
            self.rt.publish(self.site)  # before its new work, as for a seed
            frontier = self.rt.frontier(self.site)
            result = frontier.add(chunk, depth=self.depth)
        except Exception as exc:
            self.failure = exc
            raise
        self._count(result.refused or [])
        if self.held is not None and result.queue_dry:  # as ``HeldParses.flush`` does for its links
            _refill_dry([frontier])

    def _count(self, refused: list[tuple[str, str]]) -> None:
        self.refused += len(refused)
        self.reasons += [reason for _, reason in refused[: 3 - len(self.reasons)]]

    def notes(self) -> list[str]:
        """What the page's record says of the links not queued (empty when every one was offered)."""
        notes = []
        over = self.yielded - self.cap if self.cap is not None and self.yielded > self.cap else 0
        if over:
            notes.append(f"links capped at max_links_per_page ({self.cap:,}): {over:,} more dropped")
        if self.refused:
            more = f" (+{self.refused - 3} more)" if self.refused > 3 else ""
            notes.append(f"{self.refused} links refused: {'; '.join(self.reasons)}{more}")
        if self.by_extension:
            count = sum(self.by_extension.values())
            shown = ", ".join(f".{extension}" for extension in list(self.by_extension)[:3])
            more = ", ..." if len(self.by_extension) > 3 else ""
            notes.append(f"{count:,} links to files by their extension ({shown}{more}): not queued (deny_extensions)")
        if self.beyond_depth:
            notes.append(f"{self.beyond_depth:,} links beyond depth_limit ({self.spider.depth_limit}): not queued")
        return notes


@functools.lru_cache(maxsize=256)
def _denied_with(deny: frozenset[str], content_types: tuple[str, ...]) -> frozenset[str]:
    return frozenset(
        extension
        for extension in map(normal_extension, deny)
        if extension and not accepts(content_types, extension_type(extension))
    )


def _denied_extensions(deny: Iterable[str], content_types: Iterable[str]) -> frozenset[str]:
    """The extensions of ``deny`` (``Spider.deny_extensions``) whose links are not followed: those whose
    type ``content_types`` does not take (a spider taking ``application/pdf`` follows ``.pdf`` links)."""
    return _denied_with(frozenset(deny), tuple(content_types))


def _found_dry(results: list[AddResult]) -> bool:
    """Whether a site's links found its RQ queue without a job (``AddResult.queue_dry``)."""
    return any(result.queue_dry for result in results)


def _refill_dry(frontiers: list[Frontier]) -> None:
    """``refill_together`` the sites whose RQ queue a parse worker's links found dry. A refill that fails
    (Redis went away) is left to the download workers: a look finds the site dry and refills it."""
    try:
        refill_together(frontiers)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        log.info("refill of %d site(s) after their links left to the download workers: %s", len(frontiers), exc)


def parse_failed(
    rt: runtime.Runtime,
    payload: dict[str, Any],
    error: str,
    worker: str | None = None,
    done: Callable[[Any], None] | None = None,
    started: datetime | None = None,
    held: HeldParses | None = None,
) -> None:
    """Record the page failed with ``error`` (the page alone fails: ``crawler retry`` requeues it)."""
    _parse_done(rt, payload, FAILED, error, worker, done, started or utcnow(), {"failed": 1}, held)


def _parse_done(
    rt: runtime.Runtime,
    payload: dict[str, Any],
    outcome: str,
    error: str | None,
    worker: str | None,
    done: Callable[[Any], None] | None,
    started: datetime,
    counts: dict[str, int],
    held: HeldParses | None = None,
) -> None:
    site = str(payload["site"])

    def also(pipe: Any) -> None:
        # A page whose parse failed is fetched whole on its next refresh (its validators would
        # otherwise answer 304 and its items never be stored); once parsed, validators hold again.
        # Only refreshed pages are ever asked about (``_conditional_headers``), so only theirs are
        # cleared: a page without ``refresh`` spares an SREM that would find nothing.
        if outcome == FAILED:
            pipe.sadd(keys.parse_failed(site), fingerprint(str(payload["url"])))
        elif payload.get("refresh"):
            pipe.srem(keys.parse_failed(site), fingerprint(str(payload["url"])))
        if done is not None and ack is None:
            done(pipe)

    ack = done.entry_id if isinstance(done, pages.Ack) else None  # sent with the write's others
    finished = utcnow()
    record = FetchRecord(
        site=site,
        url=str(payload["url"]),
        outcome=outcome,
        kind="parse",
        started=started,
        finished=finished,
        status=payload.get("status"),
        worker=worker,
        error=error,
        callback=payload.get("callback"),
        elapsed=(finished - started).total_seconds(),
        meta=payload.get("meta") or None,
        request=payload["again"] if isinstance(payload.get("again"), dict) else None,
    )
    if held is None:
        jobs_done(rt.sink, [Done(record, None, also, counts, ack=ack)])
    else:
        held.done.append(Done(record, None, also, counts, ack=ack))
        held.pages.append((payload, worker, done, started))


def _read_sitemap(
    rt: runtime.Runtime,
    payload: dict[str, Any],
    body: bytes,
    worker: str | None,
    done: Callable[[Any], None] | None,
    started: datetime,
    held: HeldParses | None = None,
) -> None:
    """The parse step of a sitemap (or robots.txt read for its Sitemap: lines): queue what it lists."""
    site, url = payload["site"], str(payload["url"])
    try:
        rt.publish(site)  # before the work it lists
        reader = SitemapReader(rt.connection, rt.frontier(site), rt.spider(site), int(payload.get("depth", 0)))
    except ConfigError as exc:  # the spider's rules are wrong: its pages fail until it is fixed
        parse_failed(rt, payload, str(exc), worker, done, started, held)
        return
    try:
        report = reader.read(url, body)
    except JobTimeoutException:  # what was queued stays queued; the retry adds only the rest (seen set)
        parse_failed(
            rt,
            payload,
            f"sitemap read timed out after {DEFAULT_PARSE_TIMEOUT}s\n" + traceback.format_exc(limit=20),
            worker,
            done,
            started,
            held,
        )
        return
    except (PermanentError, DecodeError) as exc:  # not XML, over the cap, a corrupt gzip
        parse_failed(
            rt,
            payload,
            f"sitemap unreadable after {reader.report.urls} URLs: {type(exc).__name__}: {exc}",
            worker,
            done,
            started,
            held,
        )
        return
    _parse_done(rt, payload, OK, report.summary(), worker, done, started, {"parsed": 1}, held)


def _run_callback(
    spider: Any, pipelines: Pipelines, url: str, raw: bytes, payload: dict[str, Any], max_body: int, links: PageLinks
) -> tuple[list[Item], int]:
    """The page's items (through ``process_item`` and the pipelines) and the count of items dropped;
    each request the callback yields goes to ``links`` as it comes. Raises whatever the callback
    raises, ItemError (``items``), and what ``links`` raises.

    The callback runs to its end (items may come after links). The stored body is inflated
    within ``max_body`` bytes (BodyTooLarge past it): a body written into Redis by someone
    else may be a zlib bomb.
    """
    page = _page_of(url, raw, payload, max_body)
    name = str(payload.get("callback") or "parse")
    out = pipelines.sort(_requests_to(links, spider.callback(name)(page)), page, name)
    variant = (payload.get("request") or {}).get("variant")
    place = f"{url}#{variant}" if variant else url  # a POST's items are told from another body's
    items = [Item(_item_key(spider.item_key, data, place, position), url, data) for position, data in out.items]
    return items, len(out.dropped)


def _run_errback(
    spider: Any, pipelines: Pipelines, url: str, raw: bytes, payload: dict[str, Any], max_body: int, links: PageLinks
) -> tuple[list[Item], int]:
    """``_run_callback`` for a request that finally failed (``jobs.errback``): its errback called with a
    ``Failure``, whose ``page`` is the answer when there was one. ValueError for a failure that does not hold."""
    page = _page_of(url, raw, payload, max_body)  # empty when no answer came: what pipelines are handed
    failed = payload["failure"]
    if not isinstance(failed, dict) or not isinstance(failed.get("kind"), str):
        raise ValueError(f"not a failure: {failed!r:.200}")
    status = failed.get("status")
    failure = Failure(
        url=url,
        method=str(failed.get("method") or "GET"),
        kind=failed["kind"],
        error=str(failed.get("error") or ""),
        attempts=int(failed.get("attempts") or 1),
        status=int(status) if status is not None else None,
        page=page if failed.get("answered") else None,
        meta=page.meta,
    )
    name = str(payload.get("callback"))
    out = pipelines.sort(_requests_to(links, spider.callback(name)(failure)), page, name)
    items = [Item(_item_key(spider.item_key, data, url, position), url, data) for position, data in out.items]
    return items, len(out.dropped)


def _page_of(url: str, raw: bytes, payload: dict[str, Any], max_body: int) -> Page:
    """The page a parse task hands its callback: ``raw`` inflated within ``max_body`` bytes (BodyTooLarge past it)."""
    sent = payload.get("request") or {}
    return Page(
        url,
        inflate_capped(raw, max_body),
        status=int(payload.get("status", 200)),
        headers=payload.get("headers") or {},
        meta=payload.get("meta") or {},
        encoding=payload.get("encoding"),
        request=SentRequest(
            str(sent.get("method") or "GET"), str(sent.get("url") or url), dict(sent.get("headers") or {})
        ),
    )


def _requests_to(links: PageLinks, outputs: Iterable[Any] | None) -> Iterator[Any]:
    """``outputs`` but for its requests, each handed to ``links`` as it comes."""
    for output in outputs or ():
        if isinstance(output, Request):
            links.take(output)
        else:
            yield output


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
