"""Parse workers: read downloaded pages from the pages stream in batches and parse each.

A parse worker is not an RQ worker: it is one consumer of the group ``parsers`` on
``crawler:pages`` (see ``pages``). Its loop claims entries whose holder died, else reads up
to ``READ_COUNT`` new ones, checks each (``vetting.page_entry``: a malformed one is
quarantined, never run) and runs ``parse_job.parse`` on it under the job-timeout watchdog
(``_run_batch``), while ``EntryLease`` keeps the entries it holds from being reclaimed. A
page of a site with no spider here goes back to the stream; a page waits in hand while the
database is down; one whose items the database refuses is recorded failed. ``rq suspend``
pauses it; SIGTERM stops it after the current page, the rest of its batch back to the
stream; ``--burst`` ends it once the crawl is drained.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import traceback
from collections.abc import Sequence
from functools import partial
from typing import Any

import redis
from redis import Redis
from rq.suspension import is_suspended
from rq.timeouts import JobTimeoutException
from sqlalchemy.exc import SQLAlchemyError

from ..backoff import outage_waits
from ..coord import keys, pages
from ..coord.gate import Gate
from ..coord.joblife import HEARTBEAT_EVERY
from ..coord.vetting import RefusedEntry, page_entry
from ..errors import ConfigError, RefusedRecord
from ..store import outbox
from . import drain, parse_job, runtime
from .drain import crawl_drained
from .idle import Every
from .watchdog import WatchdogDeathPenalty

log = logging.getLogger("crawler.parsing")

#: Entries read at once: fewer round trips, at the cost of spreading a small backlog less evenly.
READ_COUNT = 8
#: Longest wait for a new entry, seconds (stop requests are seen this often).
READ_BLOCK = 1.0
#: Longest wait for a new entry of a burst worker (its drain look follows each wait that found
#: none): a burst ends up to about this long after its last page.
BURST_READ_BLOCK = 0.05
#: The same while its last drain look saw only sites' work waiting for its turn (the tail of a crawl
#: of slow sites): the crawl cannot end before a job of theirs is handed out, whose page wakes it.
BURST_WAITING_BLOCK = 0.25
#: Least seconds between two drain looks of a burst worker that count every site's work (five
#: commands a site): the look after each empty wait costs a few commands until then.
DRAIN_COUNT_EVERY = 0.25
#: Seconds a worker lets pages gather after a batch that was not full: a batch's links, items,
#: records and acknowledgements are written together, so fuller batches cost less a page. A
#: worker that keeps up waits this long, a page this much later; one behind reads full batches.
READ_PAUSE = 0.01
#: Seconds between two looks for entries whose holder died.
RECLAIM_EVERY = 1.0
#: Seconds between two fleet-wide passes that remove long-gone consumers from the group.
FORGET_EVERY = 60.0
#: Seconds a worker waits after handing back pages of sites it has no spider for.
HAND_BACK_WAIT = 1.0
#: Seconds between two looks for ``rq suspend`` (one EXISTS), before a batch is read.
SUSPENSION_CHECK_EVERY = 1.0


class EntryLease:
    """One thread per parse worker that touches the entries it holds every second, and beats.

    ``hold`` names a batch's entries, ``drop`` one once done with, ``release`` the rest.
    An entry found no longer this worker's (claimed by another while this process was
    frozen past the lease) is ``lost``: the worker skips it. Every ``pages.BEAT_EVERY``
    seconds, busy or not, the thread says the worker is alive (``pages.beat``).
    """

    def __init__(self, connection: Redis, consumer: str):
        self._connection = connection
        self._consumer = consumer
        self._cond = threading.Condition()
        self._ids: list[str] = []
        self._lost: set[str] = set()
        self._due = 0.0
        self._beat_due = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Beat now, then keep beating from the thread."""
        self._quietly(pages.beat, self._connection, self._consumer)
        self._beat_due = time.monotonic() + pages.BEAT_EVERY
        self._thread = threading.Thread(target=self._run, name=f"lease-{self._consumer}", daemon=True)
        self._thread.start()

    def hold(self, ids: Sequence[str]) -> None:
        with self._cond:
            self._ids, self._lost = list(ids), set()
            self._due = time.monotonic() + HEARTBEAT_EVERY
            self._cond.notify()

    def drop(self, entry_id: str) -> None:
        with self._cond:  # waits for a touch under way: it runs holding the lock
            if entry_id in self._ids:
                self._ids.remove(entry_id)

    def lost(self, entry_id: str) -> bool:
        with self._cond:
            return entry_id in self._lost

    def release(self) -> None:
        with self._cond:
            self._ids = []

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._ids = []
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                if now >= self._beat_due:
                    self._beat_due = now + pages.BEAT_EVERY
                    self._quietly(pages.beat, self._connection, self._consumer)
                if self._ids and now >= self._due:
                    self._due = now + HEARTBEAT_EVERY
                    kept = self._quietly(pages.touch, self._connection, self._consumer, self._ids)
                    if kept is not None:
                        self._lost |= set(self._ids) - kept
                wake = min(self._beat_due, self._due) if self._ids else self._beat_due
                self._cond.wait(max(wake - time.monotonic(), 0.0))

    @staticmethod
    def _quietly(call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except redis.RedisError:
            return None  # the main loop reports Redis outages


class ParseWorker:
    """One consumer of the pages stream (see the module docstring); ``work`` runs it in this thread."""

    def __init__(
        self,
        connection: Redis,
        sites: Sequence[str],
        stop_event: threading.Event | None = None,
        *,
        rt: runtime.Runtime,
    ):
        self.connection = connection
        #: What the pages are parsed against.
        self.runtime = rt
        self.sites = list(sites)
        self.stop_event = stop_event or threading.Event()
        self.name = pages.consumer_name()
        self._client = pages.named_client(connection, self.name)
        self._lease = EntryLease(self._client, self.name)
        self._warned: set[str] = set()
        self._last_reclaim = self._last_flush = self._last_forget = self._last_suspension_check = 0.0
        self._every = Every()
        self._drain_saw = ""  # what the last drain look that found work saw first (``drain.crawl_drained``)
        #: The waits while Redis, or the database, does not answer (``_redis_down``, ``_db_down``).
        self._redis_waits = outage_waits()
        self._db_waits = outage_waits()
        self._started = False

    def work(self, burst: bool = False) -> bool:
        """Parse pages until stopped, or (``burst``) until the crawl is drained."""
        previous = self._install_signal_handlers()
        log.info("parse worker %s started", self.name)
        self._lease.start()
        try:
            while not self.stop_event.is_set():
                try:
                    if self._redis_waits.failures or not self._started:
                        pages.ensure_group(self._client)
                        self._started = True
                    if self._suspended(burst) or not self._step(burst):
                        break
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # Entries in hand stay pending in the group: reclaimed after the lease.
                    self.stop_event.wait(self._redis_down(exc))
                else:
                    self._redis_back()
        finally:
            self._lease.close()
            self._leave()
            self.runtime.counters.flush()  # a burst's totals are exact once its workers are done
            for signum, handler in previous.items():
                if handler is not None:  # None: not set from Python, nothing to put back
                    signal.signal(signum, handler)
        return True

    def _suspended(self, burst: bool) -> bool:
        """Wait while workers are suspended (``rq suspend``, the key RQ's workers read); True if
        the worker should end instead: burst (as RQ's workers do), or stopped while waiting.

        Looked at once a second (one EXISTS), before a batch is read: a suspended worker
        takes no page; one in hand was finished first.
        """
        now = time.monotonic()
        if now - self._last_suspension_check < SUSPENSION_CHECK_EVERY:
            return False
        self._last_suspension_check = now
        announced = False
        while is_suspended(self.connection):
            if burst:
                log.info("parse worker %s: suspended in burst mode, exiting", self.name)
                return True
            if not announced:
                log.info("parse worker %s: suspended, run `rq resume` to resume", self.name)
                announced = True
            if self.stop_event.wait(SUSPENSION_CHECK_EVERY):
                return True
        if announced:
            log.info("parse worker %s: resumed", self.name)
        return False

    def _install_signal_handlers(self) -> dict[int, Any]:
        """SIGTERM and SIGINT stop the worker after its page (main thread only); the handlers replaced."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {signum: signal.signal(signum, self._request_stop) for signum in (signal.SIGTERM, signal.SIGINT)}

    def _request_stop(self, signum: int, frame: Any) -> None:
        if self.stop_event.is_set():  # a second signal: stop now (pages in hand are reclaimed later)
            raise SystemExit(1)
        log.warning("parse worker %s: stopping after the current page", self.name)
        self.stop_event.set()

    def _step(self, burst: bool) -> bool:
        """One batch: reclaimed entries, else new ones. False when burst and the crawl is drained."""
        self._periodic()
        entries: list[pages.Entry] = []
        now = time.monotonic()
        if now - self._last_reclaim >= RECLAIM_EVERY:
            self._last_reclaim = now
            entries = pages.reclaim(self._client, self.name, self.runtime.settings.job_lease * 1000, READ_COUNT)
        if not entries:
            block = (
                READ_BLOCK if not burst else BURST_WAITING_BLOCK if self._drain_saw == drain.SITES else BURST_READ_BLOCK
            )
            entries = pages.read(self._client, self.name, READ_COUNT, int((block if burst else READ_BLOCK) * 1000))
        if entries:
            if not self._run_batch(entries):  # only pages of sites with no spider here: let others take them
                self.stop_event.wait(HAND_BACK_WAIT)
            elif len(entries) < READ_COUNT:
                self.stop_event.wait(READ_PAUSE)
            return True
        self.runtime.counters.flush_if_quiet()  # nothing to parse: at rest, the counts exact at once
        if not burst:
            return True
        count_all, seen = partial(self._every.due, "drain-all", DRAIN_COUNT_EVERY), list[str]()
        drained = crawl_drained(self.connection, self.sites, count_all, seen)
        self._drain_saw = seen[0] if seen else ""
        return not drained

    def _periodic(self) -> None:
        """Fetch records waiting for the database (every 2 s); long-gone consumers out of the group."""
        now = time.monotonic()
        if now - self._last_flush >= outbox.FLUSH_EVERY:
            self._last_flush = now
            outbox.flush(self.runtime.connection, self.runtime.store)
        if now - self._last_forget >= FORGET_EVERY:
            self._last_forget = now
            lock = Gate(self.connection, "consumers", expire=FORGET_EVERY, key=keys.lock("consumers"))
            if lock.acquire(blocking=False):
                pages.forget(self._client, pages.FORGET_IDLE * 1000)

    def _run_batch(self, entries: list[pages.Entry]) -> bool:
        """Run each entry in turn, oldest first (``pages.reclaim`` relies on it); whether any was ours to run.

        Entries on their first delivery are parsed as one batch: their items and records
        are held and written together at its end (``parse_job.HeldParses``), or before the next
        page once the links held pass their byte budget (``HeldParses.full``). Entries delivered
        before (their worker died holding them, maybe because of one of them) run one at
        a time, each written before the next, so a page that kills its worker takes no
        other page's deliveries with it.
        """
        ran = False
        # The sites' live settings and spider arguments due for a re-read, in one round trip for the
        # batch, not one a page.
        decoded = [_decode(entry) for entry in entries]  # once: ``_run`` takes them as they are
        self.runtime.sites.read_sites_due(found[0]["site"] for found in decoded if not isinstance(found, RefusedEntry))
        held = parse_job.HeldParses(self.runtime) if all(entry[2] == 1 for entry in entries) else None
        in_held: list[pages.Entry] = []  # the entries whose pages ``held`` holds
        self._lease.hold([entry_id for entry_id, _, _ in entries])
        try:
            for index, entry in enumerate(entries):
                if self.stop_event.is_set():
                    pages.hand_back(self._client, entries[index:])
                    break
                if self._lease.lost(entry[0]):
                    continue
                holding = len(held.pages) if held is not None else 0
                ran = self._run(entry, held, decoded[index]) or ran
                if held is None:
                    self._lease.drop(entry[0])
                elif len(held.pages) > holding:
                    in_held.append(entry)
                if held is not None and in_held and held.full():  # memory bounded, not the batch's length
                    self._flush(held, in_held)
                    for entry_id, _, _ in in_held:
                        self._lease.drop(entry_id)
                    in_held = []
            if held is not None and in_held:
                self._flush(held, in_held)
        finally:
            self._lease.release()
        return ran

    def _flush(self, held: parse_job.HeldParses, entries: list[pages.Entry]) -> None:
        """Write a batch's held pages (``entries``), waiting while the database is down.

        Stopped while waiting, the entries go back to the stream for any worker, to be
        parsed again; a write that times out records the held pages failed.
        """
        while True:
            try:
                with WatchdogDeathPenalty(parse_job.DEFAULT_PARSE_TIMEOUT, JobTimeoutException, job_id=entries[0][0]):
                    held.flush()
            except (SQLAlchemyError, ConfigError) as exc:
                if self.stop_event.wait(self._db_down(exc)):
                    pages.hand_back(self._client, entries)
                    return
                continue
            except JobTimeoutException:
                held.fail(f"storing the page timed out after {parse_job.DEFAULT_PARSE_TIMEOUT}s (with its batch)")
            self._db_waits.reset()
            return

    def _run(
        self,
        entry: pages.Entry,
        held: parse_job.HeldParses | None = None,
        decoded: tuple[dict[str, Any], bytes] | RefusedEntry | None = None,
    ) -> bool:
        """Parse one page entry (``decoded``: what ``page_entry`` made of it, if already asked)."""
        entry_id, fields, deliveries = entry
        found = _decode(entry) if decoded is None else decoded
        if isinstance(found, RefusedEntry):
            pages.refuse(self._client, entry_id, fields, str(found))
            return True
        task, body = found
        site = task["site"]
        if not self.runtime.sites.has_spider(site):
            if site not in self._warned:
                self._warned.add(site)
                log.warning("no spider for site %r here: leaving its pages to other parse workers", site[:100])
            pages.hand_back(self._client, [entry])
            return False
        done = pages.Ack(entry_id)
        if deliveries > pages.MAX_DELIVERIES:
            parse_job.parse_failed(
                self.runtime,
                task,
                f"parse worker died {deliveries - 1} times on this page: not parsed again",
                self.name,
                done,
            )
            return True
        self._parse(entry, task, body, done, held)
        return True

    def _parse(
        self,
        entry: pages.Entry,
        task: dict[str, Any],
        body: bytes,
        done: Any,
        held: parse_job.HeldParses | None = None,
    ) -> None:
        """``parse_job.parse`` under the watchdog; the page waits in hand while the database is down."""
        while True:
            try:
                with WatchdogDeathPenalty(parse_job.DEFAULT_PARSE_TIMEOUT, JobTimeoutException, job_id=entry[0]):
                    parse_job.parse(task, body, self.name, done, held, rt=self.runtime)
            except (redis.ConnectionError, redis.TimeoutError):
                raise
            except RefusedRecord as exc:  # the database will never take this page's items: it fails alone
                parse_job.parse_failed(self.runtime, task, f"{exc} (this page's items)", self.name, done, held=held)
            except (SQLAlchemyError, ConfigError) as exc:
                if self.stop_event.wait(self._db_down(exc)):
                    pages.hand_back(self._client, [entry])
                    return
                continue
            except Exception:  # not the callback's (parse_job.parse records those): ours, or a late timeout
                log.exception("parse of %s failed outside its callback", task.get("url"))
                parse_job.parse_failed(self.runtime, task, traceback.format_exc(limit=20), self.name, done, held=held)
            self._db_waits.reset()
            return

    def _db_down(self, exc: Exception) -> float:
        if not self._db_waits.failures:
            log.error(
                "database unavailable (%s): pages wait in the parse workers until it is back",
                str(exc).splitlines()[0][:200],
            )
        return self._db_waits.next()

    def _redis_down(self, exc: Exception) -> float:
        """Log the first failure in one line; the wait before the next try (backoff to 30 s)."""
        if not self._redis_waits.failures:
            log.error("Redis unreachable (%s): waiting and reconnecting", str(exc).splitlines()[0])
        return self._redis_waits.next()

    def _redis_back(self) -> None:
        if self._redis_waits.failures:
            log.warning("Redis is back: resuming")
            self._redis_waits.reset()

    def _leave(self) -> None:
        """Out of the live workers, and of the group if nothing is pending for it (else reclaimed later)."""
        try:
            pages.leave(self._client, self.name)
        except redis.RedisError:
            pass
        self._client.close()


def _decode(entry: pages.Entry) -> tuple[dict[str, Any], bytes] | RefusedEntry:
    """``page_entry`` of the entry's fields: its task (a str ``site`` in it) and body, or why it is refused."""
    try:
        return page_entry(entry[1])
    except RefusedEntry as exc:
        return exc
