"""The per-process state jobs run against: Redis, settings, spiders, HTTP pool, database.

A worker process builds one ``Runtime`` at start and installs it; job functions,
which RQ calls with plain-data arguments only, look it up with ``current()``.
Everything in it is safe to share between a process's worker threads.
"""

from __future__ import annotations

import threading
import time
from functools import cached_property

from redis import Redis

from .demo.spider import DemoShop
from .fetch import Fetcher
from .frontier import Frontier
from .gate import Gate, site_gate
from .policy import LIVE_REFRESH, PolicyCache, SitePolicy
from .robots import RobotsCache
from .scheduler import Scheduler, publish_conf
from .settings import DEFAULT_DOWNLOAD_TIMEOUT, Settings
from .spider import Spider, SpiderSet, load_spiders
from .store import Store

#: Spiders that ship with the package and are always available.
BUNDLED_SPIDERS: tuple[type[Spider], ...] = (DemoShop,)


class Runtime:
    """Shared state of one crawler process."""

    def __init__(self, connection: Redis, settings: Settings, spider_set: SpiderSet | None = None):
        self.connection = connection
        self.settings = settings
        self.spider_set = spider_set or load_spiders(settings.sites_dir, extra=BUNDLED_SPIDERS)
        self.policies = PolicyCache(connection, settings, self.spider_set.spiders)
        self._spiders: dict[str, Spider] = {}
        self._lock = threading.Lock()
        self._published: dict[str, float] = {}

    @cached_property
    def scheduler(self) -> Scheduler:
        return Scheduler(self.connection)

    @cached_property
    def fetcher(self) -> Fetcher:
        return Fetcher(self.settings.timeout, self.settings.max_body_bytes, self.settings.user_agent)

    @cached_property
    def store(self) -> Store:
        return Store(self.settings.database_url)

    @cached_property
    def robots(self) -> RobotsCache:
        return RobotsCache(self.connection, self.fetcher)

    def spider(self, site: str) -> Spider:
        """The one instance of ``site``'s spider in this process."""
        with self._lock:
            if site not in self._spiders:
                self._spiders[site] = self.spider_set.get(site)()
            return self._spiders[site]

    def policy(self, site: str) -> SitePolicy:
        return self.policies.get(site)

    def gate(self, site: str) -> Gate:
        """The site's gate with the interval in force now (a longer robots.txt Crawl-delay wins)."""
        interval = max(self.policy(site).interval, self.robots.crawl_delay(site))
        return site_gate(self.connection, site, interval, self.settings.gate_margin)

    def frontier(self, site: str) -> Frontier:
        """The site's frontier; also (re)publishes the site's politeness for the scheduler."""
        spider = self.spider(site)
        self.publish(site)
        return Frontier(self.connection, site, spider.domains(), self.settings.failure_ttl, DEFAULT_DOWNLOAD_TIMEOUT,
                        refresh=spider.refresh_for)

    def publish(self, site: str, force: bool = False) -> None:
        """Write the site's policy in force where the scheduler reads it (at most once a second)."""
        now = time.monotonic()
        if not force and now - self._published.get(site, -LIVE_REFRESH) < LIVE_REFRESH:
            return
        self._published[site] = now
        policy = self.policies.get(site, fresh=force)
        publish_conf(self.connection, site, policy.interval, self.settings.gate_margin, policy.paused,
                     policy.concurrency)

    def take_gate(self, site: str) -> Gate:
        """Wait for ``site``'s gate and take it: one request may start now.

        Pass the gate's ``rearm`` as the fetch's ``on_sent``, so the interval counts
        from the moment the request is on the wire.
        """
        gate = self.gate(site)
        gate.acquire()
        return gate

    def close(self) -> None:
        if "fetcher" in self.__dict__:
            self.fetcher.close()
        if "store" in self.__dict__:
            self.store.close()


_current: Runtime | None = None


def install(runtime: Runtime) -> None:
    """Make ``runtime`` the one jobs in this process use."""
    global _current
    _current = runtime


def current() -> Runtime:
    """The installed runtime; RuntimeError outside a worker process."""
    if _current is None:
        raise RuntimeError("no crawler runtime installed: jobs run inside crawler workers")
    return _current
