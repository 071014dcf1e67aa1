"""The politeness in force for a site: spider attribute < config file < live setting.

Live settings (``crawler set``, ``pause``, ``resume``) live in a Redis hash per site;
workers re-read them at most once per ``LIVE_REFRESH`` seconds, so a change reaches
every worker on every host within that time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from . import keys
from .errors import ConfigError
from .settings import Settings, check_concurrency, check_interval
from .spider import Spider

#: Seconds a worker may use a cached live setting before reading Redis again.
LIVE_REFRESH = 1.0


@dataclass(frozen=True)
class SitePolicy:
    """What a worker obeys for one site, and where each value came from."""

    interval: float
    concurrency: int | None = None
    obey_robots: bool = True
    paused: bool = False
    sources: dict[str, str] = field(default_factory=dict)


def resolve_policy(spider: type[Spider], settings: Settings, live: dict[str, str]) -> SitePolicy:
    """Combine the spider's attributes, the config file's ``sites`` entry and live values."""
    values: dict[str, Any] = {
        "interval": float(spider.interval),
        "concurrency": getattr(spider, "concurrency", None),
        "obey_robots": bool(spider.obey_robots),
    }
    sources = {name: "spider" for name in values}
    for name, value in settings.sites.get(spider.name, {}).items():
        values[name] = value
        sources[name] = "config"
    if "interval" in live:
        values["interval"] = float(live["interval"])
        sources["interval"] = "live"
    if "concurrency" in live:
        values["concurrency"] = int(live["concurrency"]) or None
        sources["concurrency"] = "live"
    return SitePolicy(paused=live.get("paused") == "1", sources=sources, **values)


def read_live(connection: Redis, site: str) -> dict[str, str]:
    """The live settings stored for ``site`` (empty when none)."""
    raw = connection.hgetall(keys.live_settings(site))
    return {k.decode(): v.decode() for k, v in raw.items()}


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
    connection.hset(keys.live_settings(site), mapping=mapping)


def reset_live(connection: Redis, site: str) -> None:
    """Drop ``site``'s live interval and concurrency: config and spider values apply again.

    A pause is kept: ``crawler resume`` ends it.
    """
    connection.hdel(keys.live_settings(site), "interval", "concurrency")


class PolicyCache:
    """Per-process cache of site policies, refreshed from Redis every LIVE_REFRESH seconds."""

    def __init__(self, connection: Redis, settings: Settings, spiders: dict[str, type[Spider]]):
        self.connection = connection
        self.settings = settings
        self.spiders = spiders
        self._cache: dict[str, tuple[float, SitePolicy]] = {}

    def get(self, site: str, fresh: bool = False) -> SitePolicy:
        """The policy of ``site``, read from Redis again if older than LIVE_REFRESH (or ``fresh``)."""
        now = time.monotonic()
        cached = self._cache.get(site)
        if not fresh and cached is not None and now - cached[0] < LIVE_REFRESH:
            return cached[1]
        policy = resolve_policy(self.spiders[site], self.settings, read_live(self.connection, site))
        self._cache[site] = (now, policy)
        return policy
