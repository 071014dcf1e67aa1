"""The frontier: a site's one door for requests (checked, deduplicated, queued by priority) and its refill into RQ.

Every URL that enters a site's queue passes ``Frontier.add``: it is checked
(``crawler.urls.check_url``: canonical, http(s), within the spider's allowed domains, at most
``max_url_length`` bytes long), and enqueued only if its fingerprint is new to the site's seen
set in Redis (``seen``). Links, redirect targets, sitemap entries, seeds and retries go
through the same door, so no page is downloaded twice and no URL is longer than the cap.
Admitted entries wait in lists by priority (``priorities``) until ``refill`` makes them jobs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from ..errors import RefusedURL
from ..settings import DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_MAX_URL_LENGTH
from ..spiders.spider import Request
from ..urls import QUOTED, BatchChecker, as_written, canonicalize, check_url, short_enough
from . import joblife, keys, lua, packs, quarantine
from .bulk import Arg, read_many
from .gate import Gate
from .priorities import entries_by_priority, push_to_front
from .replies import text
from .scheduler import JOBS_AHEAD, Scheduler, announce_work, entry_encoder, is_priority
from .seen import SeenSet, mark_seen_together, seen_key
from .task import DownloadTask, check_priority, check_refresh, request_data, request_fingerprint
from .vetting import MAX_BATCH, CrawlerJob

#: Priority of start URLs and of pages a user asks for (``seed``, ``retry``).
SEED_PRIORITY = 10
#: Default priority of scheduled refreshes: after everything else (``Spider.refresh_priority``).
REFRESH_PRIORITY = -10
#: Tries of a refill whose frontier lists change while it reads them.
REFILL_TRIES = 5

#: Entries per RPUSH (and per transaction) when a batch is queued: bounded work per Redis command.
PUSH_CHUNK = 5000


#: A request ``Frontier.vet`` let through, with its canonical URL.
Candidate = tuple[str, Request]


@dataclass
class AddResult:
    """What ``Frontier.add`` did with a batch of requests."""

    enqueued: list[str]
    duplicates: int = 0
    refused: list[tuple[str, str]] | None = None  # (url, reason)
    #: New requests not queued: the site's ``max_pages`` were admitted already.
    over_max_pages: int = 0
    #: Links were queued and the site's RQ queue held no job as they were (``refill_together``).
    queue_dry: bool = False


@dataclass
class Fresh:
    """A site's pages as the seen set answered (``Frontier.fresh``): a result a page, and each candidate
    as (canonical URL, request, depth, its page's result, whether it is taken: new, or ``dont_filter``)."""

    results: list[AddResult]
    flat: list[tuple[str, Request, int, AddResult, bool]]

    @property
    def taken(self) -> int:
        """How many candidates are taken: the new pages ``max_pages`` counts."""
        return sum(taken for *_, taken in self.flat)

    def found_dry(self) -> None:
        """Say in every page's result that the push found the site's RQ queue without a job."""
        for result in self.results:
            result.queue_dry = True


def download_queue(connection: Redis, site: str) -> Queue:
    """The RQ queue of ``site``'s download jobs (JSON payloads only)."""
    return Queue(keys.download_queue(site), connection=connection, serializer=JSONSerializer, job_class=CrawlerJob)


@dataclass
class RefillRead:
    """What one try of ``Frontier.refill`` read, and would move."""

    levels: list[bytes]  # the levels set's members as read, highest first
    wanted: int = 0  # jobs to make
    priorities: list[int] = field(default_factory=list)  # those of ``levels`` that name a list, highest first
    heads: dict[int, list[bytes]] = field(default_factory=dict)  # the head of each list read, by priority
    unread: list[int] = field(default_factory=list)  # priorities whose list is still to read (a second look)
    taken: list[tuple[int, packs.Taken]] = field(default_factory=list)  # (priority, what it takes) per list read
    batches: list[list[DownloadTask]] = field(default_factory=list)  # each of one priority: a job each
    refused: list[tuple[str, Any, str]] = field(default_factory=list)  # (key, entry, reason): kept aside

    @property
    def made(self) -> int:
        return len(self.batches)


class Frontier:
    """Admits requests for one site, each URL once, and feeds its RQ queue just in time.

    Admitted URLs wait in the site's compact frontier list (``scheduler``); ``refill``
    turns a few of them at a time into RQ jobs on ``download:SITE``.
    """

    def __init__(
        self,
        connection: Redis,
        site: str,
        domains: Iterable[str],
        failure_ttl: int,
        job_timeout: int,
        refresh: Callable[[Request], float | None] | None = None,
        revisit_after: float | None = None,
        batch: int = 1,
        max_url_length: int = DEFAULT_MAX_URL_LENGTH,
        max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
        max_pages: int | None = None,
        scheduler: Scheduler | None = None,
    ):
        """``refresh`` gives a request's refresh interval (the spider's rule); None: no refreshes.

        ``batch``: URLs (of one priority) a refill puts in one job, 1 to ``MAX_BATCH``
        (``Runtime.batch_size``: more than one for a site fast enough).

        ``revisit_after``: seconds a seen URL stays seen (at most a quarter more), after
        which it may be queued again; None: seen for good (``Spider.revisit_after``).

        ``max_url_length``: bytes of the longest URL admitted (``canonicalize_within``);
        a longer one is refused like an off-domain one.

        ``max_request_body_bytes``: bytes of the largest request body admitted; a request
        with a larger one is refused (its body would sit in Redis while it waits).

        ``max_pages``: new pages admitted to the site's frontier, fleet-wide, after which
        new requests are dropped (``Spider.max_pages``); None: no limit.

        ``scheduler``: the process's, shared by its sites' frontiers (None: one of its own).
        """
        if revisit_after is not None and not revisit_after > 0:
            raise ValueError(f"revisit_after must be a positive number of seconds, not {revisit_after!r}")
        self.revisit_after = revisit_after
        self.connection = connection
        self.refresh = refresh
        self.site = site
        self.domains = list(domains)
        self.failure_ttl = failure_ttl
        self.job_timeout = job_timeout
        self.batch = max(1, min(int(batch), MAX_BATCH))
        self.max_url_length = max_url_length
        self.max_request_body_bytes = max_request_body_bytes
        self.max_pages = max_pages
        self.queue = download_queue(connection, site)
        # Made now, not as cached properties: on Python 3.11 a cached property's first read takes a
        # lock of its class, which every site's frontier shares: at 1,000 sites 40 threads of a download
        # process waited on it at once, as each site's first refill came.
        self.scheduler = scheduler or Scheduler(connection)
        self._add_seen = lua.script(connection, "add_seen")
        self._add_seen_buckets = lua.script(connection, "add_seen_for_a_while")
        self.move = lua.script(connection, "move_to_queue")
        self.seen = SeenSet(connection, site, revisit_after, self._add_seen, self._add_seen_buckets)

    def check(self, url: str) -> str:
        """The canonical URL, or RefusedURL if it is malformed, off-domain or too long."""
        return check_url(url, self.domains, self.max_url_length)

    def add(self, requests: Iterable[Request], depth: int = 0, hops: int = 0, checked: bool = False) -> AddResult:
        """Queue the requests whose canonical URL is new to the site.

        ``dont_filter`` requests skip the seen set. Refused URLs (and requests with a bad
        priority or refresh) are returned, not raised. Linear in the number of requests:
        each distinct URL is checked once, and the seen set is asked in one round trip.
        ``checked``: the URLs are ``check``'s output already (canonical, allowed), taken as they are.
        """
        candidates, refused = self.vet(requests, checked)
        (result,) = self.enqueue([(candidates, depth)], hops)
        result.refused = refused
        return result

    def vet(self, requests: Iterable[Request], checked: bool = False) -> tuple[list[Candidate], list[tuple[str, str]]]:
        """The requests ``add`` would queue if new, each with its canonical URL; and those refused, with why.

        No Redis call: ``enqueue`` the candidates (several pages' at once, if need be) later.
        """
        refused: list[tuple[str, str]] = []
        check = self._short_enough if checked else BatchChecker(self.domains, self.max_url_length).check
        candidates: list[Candidate] = []
        for request in requests:
            try:
                check_priority(request.priority)
                check_refresh(request.refresh)
                if request.body is not None and len(request.body) > self.max_request_body_bytes:
                    raise RefusedURL(
                        f"request body longer than {self.max_request_body_bytes:,} bytes "
                        f"({len(request.body):,}): {request.method} {request.url[:QUOTED]}"
                    )
                candidates.append((check(request.url), request))
            except (RefusedURL, ValueError) as exc:
                refused.append((request.url, str(exc)))
        return candidates, refused

    def _short_enough(self, canonical: str) -> str:
        """A URL ``check`` passed, still refused if too long: ``check`` may have been another frontier's."""
        return short_enough(canonical, self.max_url_length)

    def enqueue(self, pages: Sequence[tuple[list[Candidate], int]], hops: int = 0) -> list[AddResult]:
        """Queue the candidates (``vet``) new to the site, of several pages (candidates, depth) at once.

        One seen-set call and one push for all of them; a URL on two of the pages is new
        on the first one only, as with one ``add`` after the other. Per page, what was done.
        (``together.enqueue_together``: several sites' pages, in a few round trips for them all.)
        """
        flat = [seen_key(url, request) for page, _ in pages for url, request in page]
        fresh = mark_seen_together([(self.seen, flat)])[0] if flat else []
        found = self.fresh(pages, fresh)
        room = self._admit(found.taken) if self.max_pages is not None else found.taken
        by_priority = self.entries(found, room, hops)
        if self._push_entries(by_priority):
            found.found_dry()
        return found.results

    def fresh(self, pages: Sequence[tuple[list[Candidate], int]], fresh: list[bool]) -> Fresh:
        """``enqueue``'s step after the seen-set call: ``fresh`` says, per candidate in order, whether it was new."""
        results = [AddResult(enqueued=[]) for _ in pages]
        is_new = iter(fresh)
        flat = [
            (url, request, depth, result, next(is_new) or request.dont_filter)
            for (page, depth), result in zip(pages, results, strict=True)
            for url, request in page
        ]
        return Fresh(results, flat)

    def entries(self, found: Fresh, room: int, hops: int) -> dict[int, list[str]]:
        """The entries to push of what ``fresh`` found, by priority, the first ``room`` new ones admitted
        (``max_pages``); each page's result says what became of its candidates."""
        by_priority: dict[int, list[str]] = {}
        encoders: dict[tuple[Any, ...], Callable[[str], str]] = {}
        for url, request, depth, result, take in found.flat:
            if not take:
                result.duplicates += 1
                continue
            if room <= 0:
                result.over_max_pages += 1
                continue
            room -= 1
            every = request.refresh if request.refresh is not None or not self.refresh else self.refresh(request)
            # The link's entry but for its URL is the same for all links of a page: encoded once.
            written = as_written(request.url, url) if request.url != url else None
            plain = request.is_plain and written is None
            shape = (
                str(request.callback),
                id(request.meta) if request.meta else None,
                every,
                depth,
                plain or id(request),
            )
            encode = encoders.get(shape)
            if encode is None:
                errback = str(request.errback) if request.errback else None
                extra = None if plain else request_data(request.method, request.headers, request.body, errback, written)
                encode = encoders[shape] = entry_encoder(
                    str(request.callback), depth, hops, 1, request.meta, every, extra
                )
            by_priority.setdefault(request.priority, []).append(encode(url))
            result.enqueued.append(url)
        return by_priority

    def _admit(self, pages: int) -> int:
        """How many of ``pages`` new pages fit under ``max_pages``, counted fleet-wide (one atomic
        INCRBY of the site's admitted counter: two workers admitting at once never pass the limit)."""
        assert self.max_pages is not None
        if not pages:
            return 0
        return self.room(pages, int(self.connection.incrby(keys.admitted(self.site), pages)))

    def room(self, pages: int, total: int) -> int:
        """How many of ``pages`` fit under ``max_pages`` once the admitted counter, raised by them, is ``total``."""
        assert self.max_pages is not None
        return max(0, min(pages, self.max_pages - (total - pages)))

    def pages_admitted(self) -> int:
        """New pages admitted to the site's frontier so far (counted only for a spider with ``max_pages``)."""
        return int(self.connection.get(keys.admitted(self.site)) or 0)

    def seen_keys(self) -> list[str]:
        """The keys that say which URLs are seen now: the plain set, and the live buckets with ``revisit_after``."""
        return self.seen.keys()

    def push(self, tasks: list[DownloadTask]) -> None:
        """Append tasks to the compact frontier by priority, without dedup, and mark the site ready.

        Jobs already made from entries of a lower priority are handed back first (see
        ``preempt``), so the new entries are next.
        """
        self._push_entries(entries_by_priority(tasks))

    def hand_back(self, tasks: list[DownloadTask]) -> None:
        """Put tasks taken from this site's frontier back at the front of their priority's list, in their order.

        For the rest of a batch that could not go on (``jobs.download``); no dedup (they
        were admitted once), and the site is marked ready.
        """
        with self.connection.pipeline(transaction=True) as pipe:
            push_to_front(pipe, self.site, entries_by_priority(tasks))
            pipe.zadd(keys.ready(), {self.site: 0}, nx=True)
            added = pipe.execute()[-1]
        if added:
            announce_work(self.connection, [self.site])

    def _push_entries(self, by_priority: dict[int, list[str]]) -> bool:
        """``push`` for entries already encoded, by priority; whether the site's RQ queue held no job then."""
        if not by_priority:
            return False
        last = self.push_all_but_last(by_priority)
        with self.connection.pipeline(transaction=True) as pipe:
            self.queue_last_push(pipe, last, max(by_priority))
            added, outranked, queued = self.last_push_replies(pipe.execute())
        if added:
            announce_work(self.connection, [self.site])
        return self.after_push(outranked, queued, max(by_priority))

    def push_all_but_last(self, by_priority: dict[int, list[str]]) -> tuple[int, list[str]]:
        """Push every piece of ``by_priority``'s entries but the last, each a transaction; the last (priority, entries).

        A transaction runs as one block on the server: a big batch goes in pieces of
        PUSH_CHUNK entries, each a transaction of its own (entries, levels), so other
        clients are served in between. Each piece leaves the lists consistent.
        """
        pieces = [
            (priority, entries[start : start + PUSH_CHUNK])
            for priority, entries in by_priority.items()
            for start in range(0, len(entries), PUSH_CHUNK)
        ]
        for priority, entries in pieces[:-1]:
            with self.connection.pipeline(transaction=True) as pipe:
                self._push_piece(pipe, priority, entries)
                pipe.execute()
        return pieces[-1]

    def queue_last_push(self, pipe: Any, piece: tuple[int, list[str]], top: int) -> None:
        """Queue in the transaction ``pipe`` a push's last piece and what follows it: the site marked ready,
        and the reads ``last_push_replies`` takes (``top``: the highest priority of the push)."""
        priority, entries = piece
        self._push_piece(pipe, priority, entries)
        pipe.zadd(keys.ready(), {self.site: 0}, nx=True)  # score 0: due now
        pipe.sadd(keys.sites(), self.site)
        pipe.zrangebyscore(keys.queued(self.site), "-inf", f"({top}", start=0, num=1)
        # For a thread that follows the site (``DownloadWorker.follow``): the site is in the ready set
        # already when its last job left it due at its gate, so ``added`` says nothing, and the
        # links of its last page reached the thread only by way of the lookers' picks, 0.3 s late
        # at 200 slow sites as they started.
        pipe.publish(keys.more_work(), self.site)
        pipe.llen(self.queue.key)

    @staticmethod
    def last_push_replies(replies: list[Any]) -> tuple[Any, Any, Any]:
        """(added to the ready set, jobs queued below the push's top priority, jobs queued) from the replies
        of ``queue_last_push``'s commands (those of its transaction that end with them)."""
        *_, added, _, outranked, _, queued = replies
        return added, outranked, queued

    def after_push(self, outranked: Any, queued: Any, top: int) -> bool:
        """A push's end, once its replies are in: jobs of lower priorities handed back (``preempt``);
        whether the site's RQ queue held no job as the push was made."""
        if outranked:
            self.preempt(top)
        return not queued

    def preempt(self, priority: int) -> int:
        """Hand queued jobs below ``priority`` back to the frontier and refill. Returns how many.

        Jobs a worker has already taken run; the others go back to the front of their
        priority's list, in their order, so nothing is lost or reordered within a priority.
        """
        lock = self._refill_lock()
        if not lock.acquire(timeout=5):
            return 0
        try:
            lower = {text(i) for i in self.connection.zrangebyscore(keys.queued(self.site), "-inf", f"({priority}")}
            if not lower:
                return 0
            order = [text(i) for i in self.connection.lrange(self.queue.key, 0, -1)]
            evicted = 0
            for job_id in reversed([i for i in order if i in lower]):  # back to front keeps their order
                job = self.queue.fetch_job(job_id)  # None when gone, or refused and quarantined
                if job is None:
                    continue
                tasks = [DownloadTask.from_json(payload) for payload in joblife.tasks_left(job)]
                if tasks:
                    entries = [task.to_entry() for task in tasks]
                    evicted += self.scheduler.evict(self.site, self.queue.key, job_id, tasks[0].priority, entries)
            stale = lower - set(order)
            if stale:  # taken meanwhile, or lost with a crashed refill: no longer ours to track
                self.connection.zrem(keys.queued(self.site), *stale)
        finally:
            lock.release()
        self.refill(JOBS_AHEAD)
        return evicted

    def refill(self, jobs_ahead: int, due_now: bool = False) -> int:
        """Turn compact entries into RQ jobs until ``jobs_ahead`` are queued, highest priority first.

        Each job carries up to ``batch`` entries of one priority, in their order. ``due_now``:
        the refill was asked for by a NEXT_JOB that found the queue dry (and held the site out
        of other workers' picks): once jobs are made, the site is due again at once.

        Returns how many. The read (``_read_for_refill``: one round trip, two when priorities
        above 0 wait) and the move (MOVE_TO_QUEUE: jobs written, lists trimmed, emptied
        priorities forgotten) form an optimistic transaction: the move is made only if the
        priorities and the heads of the lists read are still as read, so an entry is never
        trimmed unread or made into two jobs, and a push of a new, higher priority in between
        is not left behind the jobs made here (its preemption would find no job yet to hand
        back). Otherwise it reads again. Two round trips in all; a lock, a WATCH and a read a
        command, then the writes, were some ten, at every fifth request of a slow site.
        """
        for _ in range(REFILL_TRIES):
            read = self._read_for_refill(jobs_ahead)
            if read is None:
                return 0
            if self.move_to_queue(read, due_now):
                return read.made
        return 0  # the lists kept changing; the next refill will do it

    def _read_for_refill(self, jobs_ahead: int) -> RefillRead | None:
        """What a refill would move now: None when ``jobs_ahead`` jobs are queued already.

        The list of priority 0 (most links) is read along with the queue's length and the
        priorities, as far as a refill could take from it; those above it, when any, in a
        second round trip.
        """
        read = self.refill_read(jobs_ahead, read_many(self.connection, self.refill_reads(jobs_ahead)))
        if read is None or not read.unread:
            return read
        return self.refill_take(read, read_many(self.connection, self.second_reads(read)))

    def refill_reads(self, jobs_ahead: int, also: Sequence[int] = ()) -> list[tuple[Arg, ...]]:
        """The reads of ``_read_for_refill``'s first round trip (``bulk.read_many``): the RQ queue's length,
        the priorities waiting, and the head of the list of priority 0, as far as a refill could take
        from it, and of each of ``also`` (those likely waiting, as a seed's: no second look for them)."""
        last = jobs_ahead * self.batch - 1
        return [
            ("LLEN", self.queue.key),
            ("ZREVRANGE", keys.levels(self.site), 0, -1),
            *(("LRANGE", keys.frontier(self.site, priority), 0, last) for priority in dict.fromkeys((0, *also))),
        ]

    def _push_piece(self, pipe: Any, priority: int, entries: list[str]) -> None:
        """Queue in ``pipe`` the push of ``entries`` at the end of the list of ``priority``, packed
        (``packs``: a page's links, a seed file's chunk), and its priority in the levels set."""
        elements, extra = packs.pack(entries)
        pipe.rpush(keys.frontier(self.site, priority), *elements)
        if extra:
            pipe.hincrby(keys.frontier_extra(self.site), str(priority), extra)
        pipe.zadd(keys.levels(self.site), {str(priority): priority})

    def refill_read(self, jobs_ahead: int, replies: list[Any], also: Sequence[int] = ()) -> RefillRead | None:
        """``_read_for_refill`` from the replies of ``refill_reads(jobs_ahead, also)``: None when ``jobs_ahead``
        jobs are queued already; else what a refill would move, once the lists of the priorities it
        names in ``unread`` are read (``second_reads``, then ``refill_take``)."""
        queued, levels, *lists = replies
        wanted = jobs_ahead - int(queued)
        if wanted <= 0:
            return None
        read = RefillRead(levels=list(levels), wanted=wanted)
        for raw in levels:
            if not is_priority(raw):  # written by hand: names no list; kept aside, dropped from the set
                read.refused.append((keys.levels(self.site), raw, "malformed priority in a levels set"))
                continue
            read.priorities.append(int(text(raw)))
        heads = dict(zip(dict.fromkeys((0, *also)), lists, strict=True))
        read.heads = {0: heads[0]}
        others = [p for p in read.priorities if p != 0]
        if others and (max(others) > 0 or len(heads[0]) < wanted * self.batch):  # those above 0 are read too
            read.heads.update((p, heads[p]) for p in others if p in heads)
            read.unread = [p for p in others if p not in heads]
            if read.unread:
                return read
        return self.refill_take(read, [])

    def second_reads(self, read: RefillRead) -> list[tuple[Arg, ...]]:
        """The reads of the lists ``read.unread`` names (``bulk.read_many``; a reply each, for ``refill_take``)."""
        last = read.wanted * self.batch - 1
        return [("LRANGE", keys.frontier(self.site, priority), 0, last) for priority in read.unread]

    def refill_take(self, read: RefillRead, heads: list[Any]) -> RefillRead:
        """What a refill moves, highest priority first: ``read`` once the heads of the lists it had left
        unread are in (``heads``, in the order of ``read.unread``)."""
        read.heads.update(zip(read.unread, heads, strict=True))
        read.unread = []
        wanted = read.wanted
        for priority in read.priorities:  # highest first
            if priority not in read.heads:  # below 0, left unread: enough was read above it
                break
            taken = packs.take(read.heads[priority], (wanted - len(read.batches)) * self.batch)
            read.taken.append((priority, taken))
            # Written by hand? kept aside with its reason, never retried.
            read.refused += [(keys.frontier(self.site, priority), bad, why) for bad, why in taken.refused]
            tasks = []
            for entry in taken.entries:
                try:
                    tasks.append(DownloadTask.from_entry(self.site, entry, priority))
                except ValueError as exc:
                    read.refused.append((keys.frontier(self.site, priority), entry, str(exc)))
            read.batches += [tasks[i : i + self.batch] for i in range(0, len(tasks), self.batch)]
            if len(read.batches) >= wanted:
                break
        return read

    def move_to_queue(self, read: RefillRead, due_now: bool) -> bool:
        """One try of ``refill``'s move (MOVE_TO_QUEUE); False, nothing written, if what it read changed."""
        script_keys, args = self.move_call(read, due_now)
        return bool(int(self.move(keys=script_keys, args=args)))

    def move_call(self, read: RefillRead, due_now: bool) -> tuple[list[str], list[Any]]:
        """The keys and arguments of MOVE_TO_QUEUE for ``read``."""
        # The writes are queued in a pipeline never sent (RQ's own, as ``enqueue_many`` makes
        # them), then handed to the script with their keys, which runs them if nothing changed.
        writes = self.connection.pipeline(transaction=False)
        ids = [uuid.uuid4().hex for _ in read.batches]
        if read.batches:
            joblife.make_jobs(
                self.queue, [[t.to_json() for t in batch] for batch in read.batches], ids, self.failure_ttl,
                self.job_timeout, writes,
            )  # fmt: skip
            writes.zadd(keys.queued(self.site), {i: b[0].priority for i, b in zip(ids, read.batches, strict=True)})
        for key, entry, reason in read.refused:
            if key == keys.levels(self.site):
                writes.zrem(key, entry)
            quarantine.record(self.connection, key, reason, content={"entry": entry}, pipeline=writes)
        script_keys = [
            keys.levels(self.site),
            keys.ready(),
            keys.frontier_extra(self.site),
            *(keys.frontier(self.site, p) for p, _ in read.taken),
        ]
        args: list[Any] = [self.site if due_now and read.batches else "", len(read.levels), *read.levels]
        args.append(len(read.taken))
        for priority, taken in read.taken:
            args += [str(priority), len(taken.elements), *taken.elements, taken.whole, taken.extra]
            args += ["" if taken.rest is None else taken.rest]
        args.append(len(writes.command_stack))
        for command, _options in writes.command_stack:
            name, key, *rest = command
            if key not in script_keys:
                script_keys.append(key)
            args += [name, script_keys.index(key) + 1, len(rest), *rest]
        writes.reset()
        return script_keys, args

    def _refill_lock(self) -> Gate:
        lock = keys.refill_lock(self.site)
        return Gate(self.connection, f"refill:{self.site}", expire=5, auto_release=True, key=lock)

    def waiting(self) -> list[DownloadTask]:
        """Tasks waiting in the compact frontier (not yet RQ jobs), highest priority first."""
        tasks = []
        for raw in self.connection.zrevrange(keys.levels(self.site), 0, -1):
            if not is_priority(raw):
                continue  # names no list (the next refill quarantines it)
            priority = int(text(raw))
            for element in self.connection.lrange(keys.frontier(self.site, priority), 0, -1):
                tasks += [DownloadTask.from_entry(self.site, entry, priority) for entry in packs.unpack(element)]
        return tasks

    def forget(self, url: str, method: str = "GET", body: bytes | None = None) -> None:
        """Drop the request for ``url`` (a GET without a body by default) from the seen set (or sets),
        so it may be enqueued again."""
        self.seen.forget(request_fingerprint(canonicalize(url), method, body))


def seed(
    frontier: Frontier, urls: Iterable[str], force: bool = False, priority: int = SEED_PRIORITY, callback: str = "parse"
) -> AddResult:
    """Enqueue start URLs at ``priority``, for ``callback``; RefusedURL for the first malformed or off-domain one.

    Every URL is checked before any is enqueued, so a bad seed enqueues nothing.
    ``force`` enqueues URLs even if already seen (a refresh the user asks for).
    """
    urls = list(urls)
    for url in urls:
        frontier.check(url)
    return frontier.add([Request(url, callback=callback, dont_filter=force, priority=priority) for url in urls])
