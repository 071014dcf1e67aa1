"""Proxies: which proxy a request goes through, rotated per request, a failing one benched a while.

A site's proxies come from, highest first: the config file's ``sites.NAME.proxy``, the
spider's ``proxy`` attribute, the ``proxy`` setting (``CRAWLER_PROXY``, for every site).
Each is one proxy URL (``http://user:pass@host:port``, or ``https://``) or several
(a list, or a comma-separated string), used in turn, one per request. An empty value
(``proxy = ""`` on a spider) means direct, whatever the setting says.

Politeness does not change with the proxy: the gate is the site's, so requests to a site
are spaced by its interval whichever proxies they go through. A proxy that cannot be
reached (connection refused or dropped, connect timeout, a refused CONNECT or
credentials: ``errors.ProxyError``) is benched for ``BENCH_SECONDS`` in this process;
the others take its turns. When every proxy of a site is benched, the one back soonest
is tried (its failure benches it again, and the site's run of errors closes its gate, as
for a site that is down).

Proxy URLs hold credentials: they are shown only through ``settings.redact_url``
(``http://***@host:port``), in logs, errors and fetch records alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..settings import parse_proxies, redact_url

log = logging.getLogger("crawler.proxies")

#: Seconds a proxy that failed is left out of the rotation (per process).
BENCH_SECONDS = 60.0


def site_proxies(spider: Any, settings: Any) -> list[str]:
    """The proxies of ``spider``'s site: config ``sites.NAME.proxy`` > spider ``proxy`` > the ``proxy`` setting."""
    overrides: Mapping[str, Any] = settings.sites.get(spider.name, {})
    if "proxy" in overrides:
        return parse_proxies(overrides["proxy"], f"sites.{spider.name}.proxy")
    own = getattr(spider, "proxy", None)
    if own is not None:
        return parse_proxies(own, f"{type(spider).__name__}.proxy")
    return parse_proxies(settings.proxy, "proxy")


class ProxyPool:
    """Per-process rotation and bench of proxies, safe to share between a process's worker threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._benched: dict[str, float] = {}  # proxy -> when it may be used again
        self._turns: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def choose(self, proxies: Sequence[str]) -> str | None:
        """The proxy for the next request among ``proxies`` (None: none, go direct).

        Takes those not benched in turn (so they share the requests evenly); if all are
        benched, the one back soonest.
        """
        if not proxies:
            return None
        key = tuple(proxies)
        with self._lock:
            now = self._clock()
            turn = self._turns.get(key, 0)
            self._turns[key] = turn + 1
            ready = [proxy for proxy in proxies if self._benched.get(proxy, 0.0) <= now]
            if ready:
                return ready[turn % len(ready)]
            return min(proxies, key=lambda proxy: self._benched[proxy])

    def bench(self, proxy: str, reason: str, seconds: float = BENCH_SECONDS) -> None:
        """Leave ``proxy`` out of the rotation for ``seconds`` (logged, credentials hidden)."""
        with self._lock:
            self._benched[proxy] = self._clock() + seconds
        log.warning("proxy %s benched for %gs: %s", redact_url(proxy), seconds, reason)

    def benched(self) -> list[str]:
        """The proxies benched now."""
        with self._lock:
            now = self._clock()
            return sorted(proxy for proxy, until in self._benched.items() if until > now)
