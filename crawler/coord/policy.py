"""The politeness in force for a site: spider attribute < config file < live setting.

The interval in force is worked out in one place, ``effective_interval``: the interval
of that precedence (for an ``Auto`` interval, its adaptive pace from Redis, at least its
min), or the robots.txt ``Crawl-delay`` when longer; the gate margin is added on top by
whoever spaces requests (the gate, ``NEXT_JOB``), which apply the same maximum in Lua.

Live settings (``crawler set``, ``pause``, ``resume``) live in a Redis hash per site;
every write is announced (``changes``), and workers look for an announcement at most
once per ``LIVE_REFRESH`` seconds, so a change reaches every worker on every host within
that time (one written by hand, announced by no one, within ``changes.RECHECK``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis.exceptions import WatchError

from ..errors import ConfigError
from ..settings import Settings, check_concurrency, check_interval, check_live
from ..spiders.spider import Spider
from . import keys, quarantine
from .changes import announce
from .pacing import Auto, Pace
from .replies import text_map

#: Seconds a worker may use a cached live setting before reading Redis again.
LIVE_REFRESH = 1.0


@dataclass(frozen=True)
class SitePolicy:
    """What a worker obeys for one site, and where each value came from."""

    #: Seconds between requests; for an adaptive interval, its floor (``auto.min``).
    interval: float
    concurrency: int | None = None
    obey_robots: bool = True
    paused: bool = False
    sources: dict[str, str] = field(default_factory=dict)
    #: The adaptive interval's bounds and rule, when the interval in force is ``Auto``.
    auto: Auto | None = None
    #: What the site's gate spaces: "site", or "ip" (every request to one address).
    gate_by: str = "site"
    #: A gate shared by name with other sites (wins over ``gate_by``).
    gate: str | None = None

    @property
    def interval_text(self) -> str:
        """The interval as configured: ``1`` or ``auto 0.5-30s``."""
        return str(self.auto) if self.auto else f"{self.interval:g}"


def effective_interval(policy: SitePolicy, crawl_delay: float = 0.0, pace: Pace | None = None) -> tuple[float, str]:
    """The seconds between two requests to a site, margin not included, and why.

    The policy's interval (spider < config < live), or for an ``Auto`` one the site's
    pace when it has one (never under ``auto.min``), or the robots.txt ``Crawl-delay``
    when longer. Why: ``spider``, ``config``, ``live``, ``auto 2.4s (last 480 ms × 5)``
    or ``robots.txt Crawl-delay``.
    """
    seconds, why = policy.interval, policy.sources.get("interval", "spider")
    if policy.auto is not None:
        why = f"auto {seconds:g}s (min)"
        if pace is not None and pace.seconds >= seconds:
            seconds, why = pace.seconds, str(pace)
    if crawl_delay > seconds:
        seconds, why = crawl_delay, "robots.txt Crawl-delay"
    return seconds, why


def resolve_policy(spider: type[Spider], settings: Settings, live: dict[str, str]) -> SitePolicy:
    """Combine the spider's attributes, the config file's ``sites`` entry and live values.

    A live value that does not hold (``check_live``: ``interval nan``, ``concurrency ten``)
    is ignored: the config file's or spider's value applies. ``PolicyCache`` quarantines it.
    """
    values: dict[str, Any] = {
        "interval": spider.interval,
        "concurrency": getattr(spider, "concurrency", None),
        "obey_robots": bool(spider.obey_robots),
        "gate_by": getattr(spider, "gate_by", "site"),
        "gate": getattr(spider, "gate", None),
    }
    sources = {name: "spider" for name in values}
    for name, value in settings.sites.get(spider.name, {}).items():
        if name == "shard":  # where the site's keys live, not how it is crawled
            continue
        values[name] = value
        sources[name] = "config"
    live_values, _ = check_live(live)  # a value written by hand that does not hold is left out
    if "interval" in live_values:
        values["interval"] = live_values["interval"]  # a live interval is fixed: it replaces an Auto one
        sources["interval"] = "live"
    interval = values.pop("interval")
    if isinstance(interval, Mapping):  # the config file's form of an Auto interval
        interval = Auto(**interval)
    if isinstance(interval, Auto):
        values["interval"], values["auto"] = interval.min, interval
    else:
        values["interval"] = float(interval)
    if "concurrency" in live_values:
        values["concurrency"] = live_values["concurrency"]
        sources["concurrency"] = "live"
    return SitePolicy(paused=live_values.get("paused", False), sources=sources, **values)


def read_live(connection: Redis, site: str) -> dict[str, str]:
    """The live settings stored for ``site`` (empty when none), as written: check them with ``check_live``."""
    raw = connection.hgetall(keys.live_settings(site))
    return text_map(raw)


def quarantine_live(connection: Redis, site: str, bad: Mapping[str, str], live: Mapping[str, str]) -> None:
    """Move ``site``'s live values that do not hold (``bad``: field -> why) out of its hash, into the quarantine.

    Each is dropped only if it still holds what was read (``live``), in one transaction
    with its record: a value put right meanwhile stays, and of several workers that met
    the same junk one records it. After that the config file's or spider's value applies.
    """
    key = keys.live_settings(site)
    with connection.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            now = text_map(pipe.hgetall(key))
            gone = [name for name in bad if name in now and now[name] == live.get(name)]
            if not gone:
                return
            pipe.multi()
            pipe.hdel(key, *gone)
            for name in gone:
                reason = f"live setting {name} of {site}: {bad[name]}"
                quarantine.record(connection, key, reason, content={name: now[name]}, pipeline=pipe)
            pipe.execute()
            announce(connection)
        except WatchError:
            pass  # the hash changed meanwhile: the next read checks it again


def set_live(
    connection: Redis,
    site: str,
    interval: float | None = None,
    concurrency: int | None = None,
    paused: bool | None = None,
) -> None:
    """Store live settings for ``site``; ConfigError for an invalid value."""
    mapping: dict[str, str] = {}
    if interval is not None:
        mapping["interval"] = repr(check_interval("--interval", interval))
    if concurrency is not None:
        mapping["concurrency"] = str(check_concurrency("--concurrency", concurrency))
    if paused is not None:
        mapping["paused"] = "1" if paused else "0"
    if not mapping:
        raise ConfigError("nothing to set: give --interval or --concurrency (or --reset)")
    connection.hset(keys.live_settings(site), mapping=mapping)  # type: ignore[arg-type]  # str values are fine
    announce(connection)


def reset_live(connection: Redis, site: str) -> None:
    """Drop ``site``'s live interval and concurrency: config and spider values apply again (a pause is kept)."""
    connection.hdel(keys.live_settings(site), "interval", "concurrency")
    announce(connection)


class PolicyCache:
    """Per-process cache of site policies, refreshed from Redis every LIVE_REFRESH seconds.

    ``refresh(site, fresh)`` re-reads a site's live settings and hands them to ``put`` (``fresh``:
    asked for a read now, not one that may be skipped when nothing changed); by default
    it reads them alone (``read_live``). A worker's runtime reads them with the site's spider
    arguments, in one round trip (``Runtime``).
    """

    def __init__(
        self,
        connection: Redis,
        settings: Settings,
        spiders: dict[str, type[Spider]],
        refresh: Callable[[str, bool], None] | None = None,
    ):
        self.connection = connection
        self.settings = settings
        self.spiders = spiders
        self.refresh = refresh or (lambda site, fresh: self.put(site, read_live(connection, site)))
        self._cache: dict[str, tuple[float, SitePolicy]] = {}
        #: Per site, the live settings its held policy was resolved from (none that did not hold).
        self._resolved: dict[str, tuple[dict[str, str], SitePolicy]] = {}

    def get(self, site: str, fresh: bool = False) -> SitePolicy:
        """The policy of ``site``, read from Redis again if older than LIVE_REFRESH (or ``fresh``)."""
        cached = self._cache.get(site)
        if fresh or cached is None or time.monotonic() - cached[0] >= LIVE_REFRESH:
            self.refresh(site, fresh)
            cached = self._cache[site]
        return cached[1]

    def held(self, site: str) -> SitePolicy | None:
        """The policy of ``site`` as last read here, however old; None if none is held (nothing is read)."""
        cached = self._cache.get(site)
        return cached[1] if cached is not None else None

    def read_at(self, site: str) -> float | None:
        """When ``site``'s policy held here was read (``time.monotonic()``); None if none is held."""
        cached = self._cache.get(site)
        return cached[0] if cached is not None else None

    def touch(self, site: str, read_at: float) -> None:
        """Count ``site``'s policy held here as read at ``read_at`` (if later than it was): nothing changed
        since (``changes``)."""
        cached = self._cache.get(site)
        if cached is not None and read_at > cached[0]:
            self._cache[site] = (read_at, cached[1])

    def put(self, site: str, live: dict[str, str], read_at: float | None = None) -> None:
        """Resolve ``site``'s policy with ``live``, its live settings as read at ``read_at``
        (``time.monotonic()``; now when None), and keep it; values that do not hold are
        quarantined (``quarantine_live``)."""
        read_at = time.monotonic() if read_at is None else read_at
        cached, resolved = self._cache.get(site), self._resolved.get(site)
        if cached is not None and resolved is not None and resolved[0] == live and resolved[1] is cached[1]:
            # Unchanged, the usual case: re-read every second, so not resolved again.
            self._cache[site] = (read_at, cached[1])
            return
        policy = resolve_policy(self.spiders[site], self.settings, live)
        _, bad = check_live(live)
        if bad:
            quarantine_live(self.connection, site, bad, live)
            self._resolved.pop(site, None)  # checked again at the next read, however it reads
        else:
            self._resolved[site] = (dict(live), policy)
        self._cache[site] = (read_at, policy)
