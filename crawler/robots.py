"""robots.txt: fetched through the site's gate, cached in Redis, parsed with protego.

One worker at a time fetches an origin's robots.txt (a short lock); the others wait
for the cached copy. A 4xx means no rules (allow all); an unreachable robots.txt or
a 5xx also allows all but is cached only briefly, so it is asked again soon.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit

from protego import Protego
from redis import Redis

from . import keys
from .errors import CrawlerError
from .fetch import Fetcher
from .gate import Gate

TakeTurn = Callable[[], Gate]

#: Seconds a fetched robots.txt is trusted.
ROBOTS_TTL = 24 * 3600
#: Seconds an unreachable robots.txt (5xx, timeout) is treated as "allow all".
ROBOTS_ERROR_TTL = 600
#: Largest robots.txt read (Google reads 500 KiB).
ROBOTS_MAX_BYTES = 500 * 1024


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class RobotsCache:
    """robots.txt rules per origin for one process, backed by the Redis copy."""

    def __init__(self, connection: Redis, fetcher: Fetcher):
        self.connection = connection
        self.fetcher = fetcher
        self._parsed: dict[str, tuple[float, Protego]] = {}
        self._published_delay: dict[str, float] = {}

    def allowed(self, site: str, url: str, user_agent: str, take_turn: TakeTurn,
                on_fetch: Callable[[str, int | None, str | None], None] | None = None) -> bool:
        """Whether robots.txt lets ``user_agent`` fetch ``url``.

        When the rules are not cached, robots.txt is fetched after ``take_turn()`` (the
        site's gate); ``on_fetch(url, status, error)`` is told about that request. A
        ``Crawl-delay`` longer than the site's interval becomes its interval.
        """
        rules = self._rules(site, origin_of(url), take_turn, on_fetch)
        delay = rules.crawl_delay(user_agent)
        if delay and self._published_delay.get(site) != delay:  # once per process and value
            self._published_delay[site] = delay
            self.connection.hset(keys.conf(site), "robots_delay_ms", int(float(delay) * 1000))
        return bool(rules.can_fetch(url, user_agent))

    def crawl_delay(self, site: str) -> float:
        """The site's robots.txt Crawl-delay for our user agent as this process last read it (0 if none)."""
        return float(self._published_delay.get(site) or 0.0)

    def _rules(self, site: str, origin: str, take_turn: TakeTurn,
               on_fetch: Callable[[str, int | None, str | None], None] | None) -> Protego:
        now = time.monotonic()
        cached = self._parsed.get(origin)
        if cached is not None and cached[0] > now:
            return cached[1]
        key = keys.robots(site, origin)
        text = self.connection.get(key)
        if text is None:
            lock = Gate(self.connection, f"robots:{site}:{origin}", expire=60, auto_release=True,
                        namespace=keys.PREFIX + "lock")
            with lock:
                text = self.connection.get(key)
                if text is None:
                    body, ttl = self._download(origin, take_turn, on_fetch)
                    self.connection.set(key, body, ex=ttl)
                    text = body.encode()
        rules = Protego.parse(text.decode("utf-8", errors="replace"))
        ttl = self.connection.ttl(key)
        self._parsed[origin] = (now + max(1, min(int(ttl), 300)), rules)
        return rules

    def _download(self, origin: str, take_turn: TakeTurn,
                  on_fetch: Callable[[str, int | None, str | None], None] | None) -> tuple[str, int]:
        url = origin + "/robots.txt"
        gate = take_turn()
        try:
            response = self.fetcher.get(url, on_sent=gate.rearm)
        except CrawlerError as exc:
            if on_fetch:
                on_fetch(url, None, str(exc))
            return "", ROBOTS_ERROR_TTL
        if on_fetch:
            on_fetch(url, response.status, None)
        if 200 <= response.status < 300:
            return response.body[:ROBOTS_MAX_BYTES].decode("utf-8", errors="replace"), ROBOTS_TTL
        if 400 <= response.status < 500:
            return "", ROBOTS_TTL
        return "", ROBOTS_ERROR_TTL
