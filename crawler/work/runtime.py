"""The per-process state jobs run against: Redis, settings, spiders, HTTP pool, database.

A worker process builds one ``Runtime`` at start and gives it to its workers, which
give it to the jobs they run: the download job, which RQ calls with plain-data
arguments, receives it as ``rt`` (``CrawlerJob.bound``), the parse job from its parse
worker. ``install``/``current`` remain for callers outside a worker (tests, benchmarks,
``crawler.testing``), which run jobs directly. Everything in it is safe to share
between a process's worker threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from redis import Redis

from ..coord import keys
from ..coord.changes import ChangeWatch
from ..coord.counters import Counters
from ..coord.frontier import Frontier
from ..coord.gate import Gate, Turn, Unless, site_gate
from ..coord.pacing import Pace, Pacer
from ..coord.policy import LIVE_REFRESH, PolicyCache, SitePolicy, effective_interval
from ..coord.replies import text_map
from ..coord.scheduler import PREPARE_AHEAD, Scheduler, publish_conf
from ..coord.spiderargs import ARGS_REFRESH, build_spider, usable_args
from ..coord.vetting import MAX_BATCH
from ..demo.spider import DemoShop
from ..http.addresses import AddressCache
from ..http.fetch import Fetcher
from ..http.proxies import ProxyPool, site_proxies
from ..settings import DEFAULT_DOWNLOAD_TIMEOUT, Settings
from ..spiders.items import Pipelines
from ..spiders.loading import SpiderSet, load_spiders
from ..spiders.spider import Spider
from ..store.database import Store
from .events import RecordWriter
from .render import Renderer
from .robots import RobotsCache

#: Seconds before a site's live settings and spider arguments are due for a re-read that a download
#: job's claim reads them along (``Runtime.read_site_along``): the job reads them within that time.
READ_ALONG_AHEAD = 0.25
#: The share of LIVE_REFRESH a token of ``changes`` may be old when it says a site's settings still
#: hold: they then count as read when it was, and are due again within the rest of LIVE_REFRESH.
TOKEN_AGE = 0.25
#: Seconds after which a process writes a site's unchanged policy again (``Runtime.publish``).
REPUBLISH_EVERY = 30.0
#: A site whose fixed interval in force (margin included) is at most this many seconds gets
#: batch jobs (``batch_size``): a worker between two of a batch's URLs then waits for the gate
#: no longer than it waits for a job handed out ahead of its gate (``PREPARE_AHEAD``).
BATCH_BELOW = PREPARE_AHEAD
#: Longest wait for the gate before a fast site's batch's second and later URLs, beyond the
#: interval for a slow site's (``Batching.gate_wait``); past it the rest of the batch goes back
#: to the front of the frontier (the site was closed or slowed meanwhile).
BATCH_GATE_WAIT = 0.1
#: Seconds of a slow site's requests one job carries at most (``Batching``): its thread waits on
#: the gate between them, so RQ's per-job costs (the claim, the refill, the finish) are shared by
#: up to MAX_BATCH requests. A graceful stop, a pause and a new higher priority are seen before
#: each URL, so a longer span does not keep them waiting.
PACED_BATCH_SPAN = 40.0
#: Shortest interval in force (seconds) for which a slow site's jobs are paced batches: below it,
#: responses often take longer than the interval, and one thread in turn could not keep up.
PACED_MIN_INTERVAL = 0.5
#: Longest interval in force (seconds) for which a slow site's jobs are paced batches. A paced
#: batch holds its thread for its whole span, so the threads a process needs follow the sites it
#: serves at once (``launcher.MOST_DOWNLOAD_THREADS``); beyond this a span holds too few requests
#: to be worth a thread held that long.
PACED_MAX_INTERVAL = 10.0
#: A slow site whose batch's requests came on average more than this many intervals apart,
#: its last answer having taken at least SLOW_ANSWER of the interval (responses about as slow as
#: its interval: a thread in turn cannot keep up, several would), goes back to one URL a job for
#: UNBATCHED_FOR seconds.
LATE_SPACING = 1.25
UNBATCHED_FOR = 120.0
#: Share of the interval a site's answer must take for a late batch to be the site's doing.
#: With faster answers the lateness is the workers' own (a loaded machine), and one URL a job
#: would only add to the load: RQ's bookkeeping, a look and a claim for each request.
SLOW_ANSWER = 0.75
#: A request leaves its gate's rearm to its record (``rearms_late``) when the site's last answer
#: took less than this share of the interval: a later answer would hold the gate shut past it
#: (at most the send grace, ``gate.SEND_GRACE``), so such a site's gate is rearmed at the send.
REARM_LATE_WITHIN = 0.75


@dataclass(frozen=True)
class Batching:
    """How a site's download jobs carry its URLs (``Runtime.batching``).

    ``size``: URLs a job carries. ``paced``: the site is slow, and a job's thread waits on the
    gate between its URLs; each page's record goes at once (the parse workers see it without
    waiting for the batch) and the job's progress is saved before each wait, and the scheduler
    holds the site out of other workers' picks for the batch's span (``batch`` in its conf),
    until the job gives it back (``Scheduler.batch_over``). ``interval``: in force, margin included.
    """

    size: int = 1
    paced: bool = False
    interval: float = 0.0

    @property
    def slow(self) -> bool:
        """A fixed interval beyond BATCH_BELOW: NEXT_JOB may hold the site for a batch's span (the conf's
        ``batch``, which another process may have written while this one batches the site no more), so
        every job of the site ends with ``Scheduler.batch_over``."""
        return self.interval > BATCH_BELOW

    @property
    def gate_wait(self) -> float:
        """Longest wait for the gate before a batch's second and later URLs."""
        return 2 * self.interval + BATCH_GATE_WAIT if self.paced else BATCH_GATE_WAIT


#: Spiders that ship with the package and are always available.
BUNDLED_SPIDERS: tuple[type[Spider], ...] = (DemoShop,)


class Runtime:
    """Shared state of one crawler process."""

    def __init__(self, connection: Redis, settings: Settings, spider_set: SpiderSet | None = None):
        self.connection = connection
        self.settings = settings
        self.spider_set = spider_set or load_spiders(settings.sites_dir, extra=BUNDLED_SPIDERS)
        self.policies = PolicyCache(connection, settings, self.spider_set.named(), refresh=self._read_site)
        #: Whether a site's live settings and spider arguments were written since they were read here.
        self.changes = ChangeWatch(connection)
        self._site_reads: dict[str, tuple[float, bytes | None]] = {}  # site -> (read at, token then)
        self._spiders: dict[str, tuple[float, dict[str, str], Spider]] = {}  # site -> (read at, arguments, spider)
        self._raw_args: dict[str, dict[str, str]] = {}  # site -> its spider arguments as last read
        self._lock = threading.Lock()
        self._published: dict[str, float] = {}
        self._conf_written: dict[str, tuple[float, tuple[object, ...]]] = {}  # site -> (when, what)
        self._site_proxies: dict[str, list[str]] = {}
        self._gate_hints: dict[str, str] = {}
        self._frontiers: dict[str, Frontier] = {}
        self._turns: dict[str, Turn] = {}
        self._unbatched: dict[str, float] = {}  # site -> until when (monotonic) its jobs carry one URL
        self._answer_times: dict[str, float] = {}  # site -> seconds its last answer took (``answered``)
        #: The process's stats and metrics not yet written to Redis (``counters``).
        self.counters = Counters(connection)
        self._pipelines: dict[str, Pipelines] = {}
        self._retired_pipelines: list[Pipelines] = []
        self._pipelines_lock = threading.Lock()  # guards the two collections above and ``_opening``
        #: One lock a site: a site's pipelines open once, and a slow open holds up no other site's pages.
        self._opening: dict[str, threading.Lock] = {}

    @cached_property
    def scheduler(self) -> Scheduler:
        return Scheduler(self.connection)

    @cached_property
    def record_writer(self) -> RecordWriter:
        """Writes the records of paced batches together (``jobs.SoonRecords``)."""
        return RecordWriter(self)

    @cached_property
    def fetcher(self) -> Fetcher:
        """The process's HTTP pool; wrapped in the development cache when ``http_cache`` is on."""
        fetcher = Fetcher(self.settings.timeout, self.settings.max_body_bytes, self.settings.user_agent)
        if not self.settings.http_cache:
            return fetcher
        from ..http.cache import CachingFetcher

        return CachingFetcher(fetcher, self.settings.state_dir, on_result=self._count_cache)  # type: ignore[return-value]

    @cached_property
    def renderer(self) -> Renderer:
        """The process's browser for rendered pages; nothing starts until the first one (``render``)."""
        return Renderer(self.settings.browser_path)

    def _count_cache(self, site: str, hit: bool) -> None:
        self.counters.add(site, {"cache_hits" if hit else "cache_misses": 1})

    @cached_property
    def proxies(self) -> ProxyPool:
        """This process's proxy rotation and bench, shared by its worker threads."""
        return ProxyPool()

    def proxy(self, site: str) -> str | None:
        """The proxy the next request to ``site`` goes through (None: direct)."""
        listed = self._site_proxies.get(site)
        if listed is None:
            listed = self._site_proxies[site] = site_proxies(self.spider(site), self.settings)
        return self.proxies.choose(listed)

    @cached_property
    def store(self) -> Store:
        return Store(self.settings.database_url)

    @cached_property
    def robots(self) -> RobotsCache:
        return RobotsCache(self.connection, self.fetcher, self.proxies)

    def spider(self, site: str) -> Spider:
        """The instance of ``site``'s spider in this process, built with the crawl's spider arguments.

        The arguments are read from Redis at most once per ARGS_REFRESH seconds; when they
        changed, a new instance is built with them (``spiderargs``), which later calls get.
        """
        # A dict's get is atomic: no lock to read, so look-ups of many sites' threads never queue.
        held = self._spiders.get(site)
        if held is not None and time.monotonic() - held[0] < ARGS_REFRESH:
            return held[2]
        self.spider_set.get(site)  # ConfigError for a site with no spider, before anything is read
        self._read_site(site)
        return self._spiders[site][2]

    def held_policy(self, site: str) -> SitePolicy:
        """``site``'s policy as last read here, however old (``policy`` when none is held): for what
        may lag a read, asked where a re-read would be a round trip of its own."""
        return self.policies.held(site) or self.policy(site)

    def held_spider(self, site: str) -> Spider:
        """``site``'s spider instance as last built here, however old its arguments (``spider`` when none is)."""
        held = self._spiders.get(site)
        return held[2] if held is not None else self.spider(site)

    def _read_site(self, site: str, fresh: bool = False) -> None:
        """Read ``site``'s live settings and spider arguments from Redis, in one round trip, and keep
        both: the policy (``policies.put``) and the spider instance (``_put_args``). Each is read
        once a second at most, a site and process; read together, the two cost one call. Not read
        when no change was announced since the last read (``_still_holds``), unless ``fresh``."""
        if not fresh and self._still_holds(site):
            return
        with self.connection.pipeline(transaction=False) as pipe:
            keep = self._read_site_in(pipe, site)
            keep(pipe.execute())

    def has_spider(self, site: str) -> bool:
        """Whether this process has a spider for ``site`` (one lookup: no dict of every spider built)."""
        return site in self.policies.spiders

    def read_site_along(self, pipe: Any, site: str, always: bool = False) -> Callable[[list[Any]], None] | None:
        """Queue in ``pipe`` the reads ``_read_site`` makes, if ``site``'s are due within READ_ALONG_AHEAD
        seconds (the job about to run would read them); what to call with the replies to the commands
        it queued, else None. A download job's claim carries them (``joblife.claim``), which saves a
        round trip a job. ``always``: whether due or not (a pipeline that goes anyway, some time
        before the reads are used).
        """
        if site not in self.policies.spiders:
            return None  # no spider here: the job is handed back unread
        now = time.monotonic()
        held = self._spiders.get(site)
        policy_at = self.policies.read_at(site)
        if (
            not always
            and held is not None
            and policy_at is not None
            and now - held[0] < ARGS_REFRESH - READ_ALONG_AHEAD
            and now - policy_at < LIVE_REFRESH - READ_ALONG_AHEAD
        ):
            return None
        if self._still_holds(site):  # nothing changed since the last read: none is needed
            return None
        return self._read_site_in(pipe, site)

    def read_sites_due(self, sites: Iterable[str]) -> None:
        """``read_site_along`` for each of ``sites``, in one round trip (none if none is due): a parse
        worker's batch of pages, read before its pages are parsed, each needing its site's spider."""
        with self.connection.pipeline(transaction=False) as pipe:
            kept: list[tuple[int, Callable[[list[Any]], None]]] = []
            for site in dict.fromkeys(sites):
                start = len(pipe)
                keep = self.read_site_along(pipe, site)
                if keep is not None:
                    kept.append((start, keep))
            if not kept:
                return
            replies = pipe.execute()
        for start, keep in kept:
            keep(replies[start : start + 2])

    def _read_site_in(self, pipe: Any, site: str) -> Callable[[list[Any]], None]:
        """Queue ``_read_site``'s two reads in ``pipe``; what keeps them, given their two replies."""
        seen, _ = self.changes.token(TOKEN_AGE * LIVE_REFRESH)  # before the reads: a change after it, after it
        now = time.monotonic()
        pipe.hgetall(keys.live_settings(site))
        pipe.hgetall(keys.spider_args(site))

        def keep(replies: list[Any]) -> None:
            live, args = replies
            self.policies.put(site, text_map(live), now)
            self._put_args(site, text_map(args), now)
            self._site_reads[site] = (now, seen)

        return keep

    def _still_holds(self, site: str) -> bool:
        """Whether ``site``'s live settings and spider arguments held here still hold, as no change was
        announced since they were read (``changes``): if so they count as read when the token was
        last seen unchanged (at most TOKEN_AGE of LIVE_REFRESH ago), and are not read."""
        read = self._site_reads.get(site)
        held = self._spiders.get(site)
        if read is None or held is None or self.policies.held(site) is None:
            return False
        confirmed = self.changes.confirms(read[1], read[0], TOKEN_AGE * min(LIVE_REFRESH, ARGS_REFRESH))
        if confirmed is None:
            return False
        # As of when the token was read, not now: a change announced since is in force within LIVE_REFRESH.
        self.policies.touch(site, confirmed)
        self._spiders[site] = (max(confirmed, held[0]), held[1], held[2])
        return True

    def _put_args(self, site: str, raw: dict[str, str], read_at: float) -> None:
        """Keep ``site``'s spider built with ``raw`` arguments (those that hold): the instance held
        when they did not change, else a new one (``build_spider``)."""
        held = self._spiders.get(site)
        if held is not None and self._raw_args.get(site) == raw:  # the usual case: nothing changed
            self._spiders[site] = (read_at, held[1], held[2])
            return
        cls = self.spider_set.get(site)
        args = usable_args(cls, raw)
        self._raw_args[site] = dict(raw)
        if held is not None and held[1] == args:  # the arguments that hold did not change
            self._spiders[site] = (read_at, args, held[2])
            return
        with self._lock:  # built under the lock: two threads reading at once build one instance
            held = self._spiders.get(site)
            spider = held[2] if held is not None and held[1] == args else build_spider(cls, args)
            self._spiders[site] = (read_at, args, spider)

    def pipelines(self, site: str) -> Pipelines:
        """``site``'s ``process_item`` and pipelines, opened on first use, once per process and spider instance.

        A spider built again for new spider arguments gets its own, opened then; those of
        the instance before are closed by ``close``, with the others.

        ItemError if one fails to open: nothing is kept, the next page tries again.
        """
        with self._pipelines_lock:
            opening = self._opening.setdefault(site, threading.Lock())
        with opening:
            spider = self.spider(site)
            held = self._pipelines.get(site)
            if held is not None and held.spider is spider:
                return held
            opened = Pipelines.open(spider)  # first use, or new spider arguments
            with self._pipelines_lock:
                self._pipelines[site] = opened
                if held is not None:  # another thread may be using it: closed with the runtime
                    self._retired_pipelines.append(held)
            return opened

    def policy(self, site: str) -> SitePolicy:
        return self.policies.get(site)

    @cached_property
    def pacer(self) -> Pacer:
        return Pacer(self.connection)

    @cached_property
    def addresses(self) -> AddressCache:
        return AddressCache()

    def gate_name(self, site: str, url: str | None = None, fresh: bool = True, policy: SitePolicy | None = None) -> str:
        """The name of the gate that spaces ``site``'s request for ``url`` (see ``keys.gate``).

        The site's own; a gate shared by name (``Spider.gate``); or with ``gate_by = "ip"``
        the gate of the address ``url``'s host resolves to (the site's own when it does
        not resolve: the request will fail anyway). Not ``fresh``: by the policy as last read
        here, however old (nothing is read unless none is held). By ``policy`` when given (a job's,
        as read once for its URL).
        """
        if policy is None:
            policy = self.policy(site) if fresh else self.held_policy(site)
        if policy.gate:
            return keys.shared_gate_name(policy.gate)
        if policy.gate_by == "ip" and url:
            address = self.addresses.address(urlsplit(url).hostname or "")
            if address is not None:
                name = keys.ip_gate_name(address)
                if self._gate_hints.get(site) != name:  # tell NEXT_JOB which gate to look at
                    self._gate_hints[site] = name
                    self.connection.hset(keys.conf(site), "gate", keys.gate(name))
                return name
        return site

    def gate(self, site: str, url: str | None = None, policy: SitePolicy | None = None) -> Gate:
        """The gate for ``site``'s request for ``url``, with the interval in force now (``effective_interval``).

        For an adaptive interval the gate reads the site's pace from Redis itself, each
        time it sets its lifetime, so a pace another host has just raised applies. By ``policy``
        when given (a job's, as read once for its URL), else the site's as held here.
        """
        if policy is None:
            policy = self.policy(site)
        interval, _ = effective_interval(policy, self.robots.crawl_delay(site))
        return site_gate(
            self.connection,
            self.gate_name(site, url, policy=policy),
            interval,
            self.settings.gate_margin,
            pace_key=keys.conf(site) if policy.auto else None,
            ready_member=site,
        )

    def close_gate(
        self, site: str, url: str | None, seconds: float, why: str, policy: SitePolicy | None = None
    ) -> None:
        """Close the gate ``site``'s request for ``url`` takes (by ``policy``, when given), for every
        worker, for ``seconds``."""
        gate_key = keys.gate(self.gate_name(site, url, policy=policy))
        self.scheduler.close_gate(site, seconds, why, gate_key=gate_key)

    def observe(
        self, site: str, gate: Gate, elapsed: float, status: int | None = None, error: str | None = None
    ) -> Pace | None:
        """Tell the site's adaptive interval how a request through ``gate`` went (no-op for a fixed one).

        ``status`` is the HTTP status, None with ``error`` ('timeout', 'connection') when
        there was no answer.
        """
        # The policy the request went with, not one read again (a round trip after each response).
        auto = self.held_policy(site).auto
        if auto is None:
            return None
        sent = gate.rearmed_at or gate.acquired_at or time.monotonic()
        return self.pacer.observe(
            keys.conf(site),
            gate.key,
            auto,
            elapsed=elapsed,
            status=status,
            error=error,
            margin=self.settings.gate_margin,
            since_send=time.monotonic() - sent,
        )

    def answered(self, site: str, elapsed: float | None) -> None:
        """A request to ``site`` took ``elapsed`` seconds to answer in full (None: no answer)."""
        self._answer_times[site] = float("inf") if elapsed is None else elapsed

    def rearms_late(self, site: str, gate: Gate) -> bool:
        """Whether a request of ``site``'s through ``gate`` may leave its rearm to the page's record
        (``Gate.sent``): when the site's last answer came within REARM_LATE_WITHIN of its interval.
        The record then comes before the gate would have opened had it been rearmed at the send, so
        the rearm costs no round trip of its own and opens the gate when it would have. Not for an
        adaptive interval (its pace is read by the rearm), nor with the development cache."""
        if self.settings.http_cache or gate.pace_key is not None:  # a cache's gate is a stand-in (``DeferredGate``)
            return False
        last = self._answer_times.get(site)
        return last is not None and last < REARM_LATE_WITHIN * gate.rearm_expire

    def frontier(self, site: str) -> Frontier:
        """The site's frontier; also (re)publishes the site's politeness for the scheduler.

        One per site and process, shared by its threads; its batch size follows the
        site's policy in force (``batch_size``).
        """
        spider = self.spider(site)
        self.publish(site)
        frontier = self._frontiers.get(site)
        if frontier is None:
            frontier = self._frontiers[site] = Frontier(
                self.connection,
                site,
                spider.domains(),
                self.settings.failure_ttl,
                DEFAULT_DOWNLOAD_TIMEOUT,
                refresh=spider.refresh_for,
                revisit_after=spider.revisit_after,
                max_url_length=self.settings.max_url_length,
                max_request_body_bytes=self.settings.max_request_body_bytes,
                max_pages=spider.max_pages,
            )
        frontier.batch = self.batch_size(site)
        return frontier

    def batch_size(self, site: str) -> int:
        """URLs one download job of ``site`` carries (``batching``)."""
        return self.batching(site).size

    def batching(self, site: str, policy: SitePolicy | None = None) -> Batching:
        """How ``site``'s download jobs carry its URLs: MAX_BATCH for a fast site, a span's worth for a slow one.

        Fast: a fixed interval whose value in force (robots.txt Crawl-delay and margin
        included) is at most BATCH_BELOW, so the gate is seldom what a worker waits for, and
        per-job costs (RQ's bookkeeping, the scheduler's call) are shared by the batch's URLs.
        Slow: a fixed interval from PACED_MIN_INTERVAL to PACED_MAX_INTERVAL; a job carries as
        many URLs as fit in PACED_BATCH_SPAN (at most MAX_BATCH), fetched in turn by one thread
        that waits on the gate between them (``Batching.paced``). One URL a job: any other
        interval, an adaptive interval (which may grow at any time), the development cache
        (which takes the gate only on a miss), a site allowed several requests in flight
        (``concurrency``: its requests overlap, a batch's would not), and a site whose responses
        came slower than its interval (``batch_paced``: for UNBATCHED_FOR seconds). By ``policy``
        when given (a job's, as read once for its URL).
        """
        if policy is None:
            policy = self.policy(site)
        if policy.auto is not None or self.settings.http_cache:
            return Batching()
        interval, _ = effective_interval(policy, self.robots.crawl_delay(site))
        interval += self.settings.gate_margin
        if interval <= BATCH_BELOW:
            return Batching(MAX_BATCH, False, interval)
        if (
            not PACED_MIN_INTERVAL <= interval <= PACED_MAX_INTERVAL
            or (policy.concurrency or 1) > 1
            or self._unbatched.get(site, 0.0) > time.monotonic()
        ):
            return Batching(1, False, interval)
        size = max(1, min(MAX_BATCH, int(PACED_BATCH_SPAN // interval)))
        return Batching(size, size > 1, interval)

    def batch_paced(self, site: str, steps: int, seconds: float, batching: Batching) -> None:
        """A paced batch of ``site`` took ``seconds`` for ``steps`` URLs after its first: one URL a job
        for a while if that is more than LATE_SPACING intervals each (``batching``) and the site's
        last answer took SLOW_ANSWER of an interval or more (no answer counts as slow)."""
        late = steps and seconds / steps > LATE_SPACING * batching.interval
        if late and self._answer_times.get(site, float("inf")) >= SLOW_ANSWER * batching.interval:
            self._unbatched[site] = time.monotonic() + UNBATCHED_FOR

    def publish(self, site: str, force: bool = False) -> None:
        """Write the site's policy in force where the scheduler reads it.

        Looked at once a second at most; written when it changed since this process last
        wrote it, or REPUBLISH_EVERY after (a conf hash lost with a Redis restart, or
        written by a process that resolves the policy differently, is put right), or when
        ``force``d.
        """
        now = time.monotonic()
        if not force and now - self._published.get(site, -LIVE_REFRESH) < LIVE_REFRESH:
            return
        self._published[site] = now
        policy = self.policies.get(site, fresh=force)
        shared = keys.gate(keys.shared_gate_name(policy.gate)) if policy.gate else None
        batching = self.batching(site)
        batch = batching.size if batching.paced else 1
        auto = policy.auto is not None
        conf = (policy.interval, policy.paused, policy.concurrency, auto, shared, policy.gate_by, batch)
        written = self._conf_written.get(site)
        if not force and written is not None and written[1] == conf and now - written[0] < REPUBLISH_EVERY:
            return
        self._conf_written[site] = (now, conf)
        publish_conf(
            self.connection,
            site,
            policy.interval,
            self.settings.gate_margin,
            policy.paused,
            policy.concurrency,
            auto=policy.auto is not None,
            gate_key=shared,
            gate_by_ip=policy.gate_by == "ip",
            batch=batch,
        )

    def take_gate(self, site: str, url: str | None = None, policy: SitePolicy | None = None) -> Gate:
        """Wait for the gate of ``site``'s request for ``url`` and take it: one request may start now.

        Pass the gate's ``rearm`` as the fetch's ``on_sent``, so the interval counts
        from the moment the request is on the wire, and call its ``let_go`` once the fetch
        is over: the other threads of this process wait for the gate until then (``gate.Turn``).
        ``policy``: the job's, as read once for its URL (``gate``).
        """
        if self.settings.http_cache:  # taken only if the fetch misses the cache and sends (httpcache)
            return self.fetcher.defer(site, lambda: self._acquire(site, url, policy=policy))  # type: ignore[attr-defined]
        gate = self._acquire(site, url, policy=policy)
        assert gate is not None  # taken: no time limit
        return gate

    def take_gate_within(
        self,
        site: str,
        url: str | None,
        max_wait: float,
        unless: Unless | None = None,
        policy: SitePolicy | None = None,
    ) -> Gate | None:
        """``take_gate``, waiting at most ``max_wait`` seconds: None if the gate stayed closed that long,
        or if ``unless``, asked along with each try, said to give the take up (``Gate.acquire``)."""
        if self.settings.http_cache:
            return self.take_gate(site, url, policy)
        return self._acquire(site, url, max_wait, unless, policy)

    def gate_opens_at(self, site: str) -> float:
        """When (``time.monotonic()``) ``site``'s own gate opens as far as this process knows: rearmed
        by its last send from here (``Turn.opens_at``); 0 when it knows nothing of it."""
        # By the policy as last read: a hint to time a wait by, asked after each response (a re-read
        # would be a round trip each).
        turn = self._turns.get(keys.gate(self.gate_name(site, fresh=False)))
        return turn.opens_at if turn is not None else 0.0

    def _acquire(
        self,
        site: str,
        url: str | None,
        max_wait: float | None = None,
        unless: Unless | None = None,
        policy: SitePolicy | None = None,
    ) -> Gate | None:
        """Take the gate in this process's turn at it (``gate.Turn``), which passes on at the send."""
        gate = self.gate(site, url, policy)
        turn = self._turns.get(gate.key) or self._turns.setdefault(gate.key, Turn())  # atomic: no lock
        started = time.monotonic()
        ticket = turn.take(max_wait)
        if ticket is None:
            return None
        try:
            left = None if max_wait is None else max(0.0, max_wait - (time.monotonic() - started))
            closed_for = turn.opens_at - time.monotonic()  # known closed: no need to ask Redis before
            if closed_for > 0 and (left is None or closed_for < left):
                time.sleep(closed_for)
                left = None if left is None else left - closed_for
            taken = gate.acquire(timeout=left, unless=unless)
        except BaseException:
            turn.give(ticket)
            raise
        if not taken:
            turn.give(ticket)
            return None
        turn.hold(ticket, gate.expire - gate.rearm_expire)  # lapses with the send grace
        gate.turn = (turn, ticket)
        return gate

    def close(self) -> None:
        with self._pipelines_lock:
            opened, self._pipelines = [*self._retired_pipelines, *self._pipelines.values()], {}
            self._retired_pipelines = []
        for pipelines in opened:  # the workers have stopped: no item is in a pipeline now
            pipelines.close()
        if "record_writer" in self.__dict__:
            self.record_writer.close()
        self.counters.close()
        if "renderer" in self.__dict__:
            self.renderer.close()
        if "fetcher" in self.__dict__:
            self.fetcher.close()
        if "store" in self.__dict__:
            self.store.close()


_current: Runtime | None = None


def install(runtime: Runtime) -> None:
    """Make ``runtime`` the one jobs and workers called without one use in this process."""
    global _current
    _current = runtime


def current() -> Runtime:
    """The installed runtime; RuntimeError outside a worker process."""
    if _current is None:
        raise RuntimeError("no crawler runtime installed: jobs run inside crawler workers")
    return _current
