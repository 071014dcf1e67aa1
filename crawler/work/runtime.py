"""The per-process state jobs run against: Redis, settings, spiders, HTTP pool, database.

A worker process builds one ``Runtime`` at start and gives it to its workers, which
give it to the jobs they run: the download job, which RQ calls with plain-data
arguments, receives it as ``rt`` (``CrawlerJob.bound``), the parse job from its parse
worker; a caller outside a worker (a test, a benchmark, ``crawler.testing``) builds its
own and passes it the same way. Everything in it is safe to share between a process's
worker threads.
"""

from __future__ import annotations

import threading
import time
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from redis import Redis

from ..coord import keys
from ..coord.counters import Counters, FlushPace
from ..coord.frontier import Frontier
from ..coord.gate import Gate, Unless, site_gate
from ..coord.pacing import Pace, Pacer
from ..coord.policy import LIVE_REFRESH, SitePolicy, effective_interval
from ..coord.scheduler import Scheduler, publish_conf
from ..demo.spider import DemoShop
from ..http.addresses import AddressCache
from ..http.fetch import Fetcher
from ..http.proxies import ProxyPool, site_proxies
from ..settings import DEFAULT_DOWNLOAD_TIMEOUT, Settings
from ..spiders.items import Pipelines
from ..spiders.loading import SpiderSet, load_spiders
from ..spiders.spider import Spider
from ..store.database import Store
from .batching import UNBATCHED_FOR, Batching, batching_for, late_batch
from .events import RecordSink, RecordWriter
from .render import Renderer
from .robots import RobotsCache
from .site_memory import SiteMemory
from .site_reads import SiteReads

#: Seconds after which a process writes a site's unchanged policy again (``Runtime.publish``).
REPUBLISH_EVERY = 30.0
#: A request leaves its gate's rearm to its record (``rearms_late``) when the site's last answer
#: took less than this share of the interval: a later answer would hold the gate shut past it
#: (at most the send grace, ``gate.SEND_GRACE``), so such a site's gate is rearmed at the send.
REARM_LATE_WITHIN = 0.75


#: Spiders that ship with the package and are always available.
BUNDLED_SPIDERS: tuple[type[Spider], ...] = (DemoShop,)


class Runtime:
    """Shared state of one crawler process."""

    def __init__(
        self, connection: Redis, settings: Settings, spider_set: SpiderSet | None = None, pace: FlushPace | None = None
    ):
        self.connection = connection
        self.settings = settings
        self.spider_set = spider_set or load_spiders(settings.sites_dir, extra=BUNDLED_SPIDERS)
        #: Each site's policy and spider instance, read from Redis when due.
        self.sites = SiteReads(connection, settings, self.spider_set)
        self.policies = self.sites.policies
        self._site_proxies: dict[str, list[str]] = {}
        self._frontiers: dict[str, Frontier] = {}
        #: What this process remembers of each site between its jobs: turns, answer times.
        self.memory = SiteMemory()
        #: The process's stats and metrics not yet written to Redis (``counters``), written at the
        #: ``pace`` of every shard's counts in the process.
        self.counters = Counters(connection, pace=pace)
        self._pipelines: dict[str, Pipelines] = {}
        self._retired_pipelines: list[Pipelines] = []
        self._pipelines_lock = threading.Lock()  # guards the two collections above and ``_opening``
        #: One lock a site: a site's pipelines open once, and a slow open holds up no other site's pages.
        self._opening: dict[str, threading.Lock] = {}

    @cached_property
    def scheduler(self) -> Scheduler:
        return Scheduler(self.connection, lease=self.settings.job_lease)

    @cached_property
    def record_writer(self) -> RecordWriter:
        """Writes the records of paced batches together (``jobs.SoonRecords``)."""
        return RecordWriter(self.sink)

    @cached_property
    def sink(self) -> RecordSink:
        """Where jobs' records go: the database, their Redis pipeline, the process's counters."""
        return RecordSink(self.connection, self.store, self.counters)

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
        """``site``'s spider instance here, with the crawl's spider arguments (``SiteReads.spider``)."""
        return self.sites.spider(site)

    def policy(self, site: str) -> SitePolicy:
        """``site``'s politeness in force (``SiteReads.policy``)."""
        return self.sites.policy(site)

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
        as read once for its URL). Writes nothing (a take tells the scheduler: ``_tell_gate``).
        """
        if policy is None:
            policy = self.policy(site) if fresh else self.sites.held_policy(site)
        if policy.gate:
            return keys.shared_gate_name(policy.gate)
        if policy.gate_by == "ip" and url:
            address = self.addresses.address(urlsplit(url).hostname or "")
            if address is not None:
                return keys.ip_gate_name(address)
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
        auto = self.sites.held_policy(site).auto
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
        self.memory.answer_times[site] = float("inf") if elapsed is None else elapsed

    def rearms_late(self, site: str, gate: Gate) -> bool:
        """Whether a request of ``site``'s through ``gate`` may leave its rearm to the page's record
        (``Gate.sent``): when the site's last answer came within REARM_LATE_WITHIN of its interval.
        The record then comes before the gate would have opened had it been rearmed at the send, so
        the rearm costs no round trip of its own and opens the gate when it would have. Not for an
        adaptive interval (its pace is read by the rearm), nor with the development cache."""
        if self.settings.http_cache or gate.pace_key is not None:  # a cache's gate is a stand-in (``DeferredGate``)
            return False
        last = self.memory.answer_times.get(site)
        return last is not None and last < REARM_LATE_WITHIN * gate.rearm_expire

    def frontier(self, site: str) -> Frontier:
        """The site's frontier: one per site and process, shared by its threads; its batch size follows
        the site's policy in force (``batch_size``). Writes nothing: who adds work calls ``publish``."""
        spider = self.spider(site)
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
                scheduler=self.scheduler,
            )
        frontier.batch = self.batch_size(site)
        return frontier

    def batch_size(self, site: str) -> int:
        """URLs one download job of ``site`` carries (``batching``)."""
        return self.batching(site).size

    def batching(self, site: str, policy: SitePolicy | None = None) -> Batching:
        """How ``site``'s download jobs carry its URLs (``batching_for``), by ``policy`` when given (a job's,
        as read once for its URL), else the site's in force."""
        if policy is None:
            policy = self.policy(site)
        unbatched = self.memory.unbatched_until.get(site, 0.0) > time.monotonic()
        return batching_for(
            policy, self.robots.crawl_delay(site), self.settings.gate_margin, self.settings.http_cache, unbatched
        )

    def batch_paced(self, site: str, steps: int, seconds: float, batching: Batching) -> None:
        """A paced batch of ``site`` took ``seconds`` for ``steps`` URLs after its first: one URL a job for
        UNBATCHED_FOR seconds if it came late for the site's doing (``late_batch``)."""
        if late_batch(steps, seconds, batching, self.memory.answer_times.get(site)):
            self.memory.unbatched_until[site] = time.monotonic() + UNBATCHED_FOR

    def publish(self, site: str, force: bool = False, pipe: Any = None) -> None:
        """Write the site's policy in force where the scheduler reads it.

        Looked at once a second at most; written when it changed since this process last
        wrote it, or REPUBLISH_EVERY after (a conf hash lost with a Redis restart, or
        written by a process that resolves the policy differently, is put right), or when
        ``force``d. ``pipe``: a transaction the write is queued in (``publish_conf``), for the
        caller to send with other sites' (``crawler seed --all``).
        """
        now = time.monotonic()
        if not force and now - self.memory.published.get(site, -LIVE_REFRESH) < LIVE_REFRESH:
            return
        self.memory.published[site] = now
        policy = self.policies.get(site, fresh=force)
        shared = keys.gate(keys.shared_gate_name(policy.gate)) if policy.gate else None
        batching = self.batching(site)
        batch = batching.size if batching.paced else 1
        auto = policy.auto is not None
        conf = (policy.interval, policy.paused, policy.concurrency, auto, shared, policy.gate_by, batch)
        written = self.memory.conf_written.get(site)
        if not force and written is not None and written[1] == conf and now - written[0] < REPUBLISH_EVERY:
            return
        self.memory.conf_written[site] = (now, conf)
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
            pipe=pipe,
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
        turn = self.memory.turns.get(keys.gate(self.gate_name(site, fresh=False)))
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
        self._tell_gate(site, gate.key, policy)
        turn = self.memory.turn(gate.key)
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

    def _tell_gate(self, site: str, gate_key: str, policy: SitePolicy | None) -> None:
        """Tell NEXT_JOB which gate ``site``'s requests take, when it is an address's (``gate_by = "ip"``),
        which only a take that resolved the host knows: written when it changed since this process last did.
        (A gate shared by name is published with the site's conf.)"""
        policy = policy or self.sites.held_policy(site)
        if policy.gate_by != "ip" or policy.gate or gate_key == keys.gate(site):
            return
        if self.memory.gate_hints.get(site) == gate_key:
            return
        self.memory.gate_hints[site] = gate_key
        self.connection.hset(keys.conf(site), "gate", gate_key)

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
