"""Every Redis key and RQ queue name the crawler writes, built in one place.

RQ adds its own ``rq:`` keys for the queues named here (``rq:queue:download:SITE``
and the job hashes and registries); everything else lives under ``crawler:``. The Lua
scripts in ``scheduler`` build the same names from ``PREFIX``; keep them in step.
"""

from __future__ import annotations

PREFIX = "crawler:"

#: Prefix RQ puts before a queue's name to make its list key.
RQ_QUEUE_PREFIX = "rq:queue:"

#: RQ queue that parse workers serve.
PARSE_QUEUE = "parse"


def download_queue(site: str) -> str:
    """RQ queue name holding ``site``'s download jobs."""
    return f"download:{site}"


def gate(site: str) -> str:
    """The site's time-limited mutex (``SET NX PX``)."""
    return f"{PREFIX}gate:{site}"


def seen(site: str) -> str:
    """Set of fingerprints of canonical URLs already scheduled for ``site``."""
    return f"{PREFIX}seen:{site}"


def robots(site: str, origin: str) -> str:
    """Cached robots.txt body for one origin (scheme://host:port) of ``site``."""
    return f"{PREFIX}robots:{site}:{origin}"


def body(page_id: str) -> str:
    """A downloaded page's compressed body, waiting to be parsed."""
    return f"{PREFIX}body:{page_id}"


def stats(site: str) -> str:
    """Hash of counters for ``site``: fetched, failed, items, …"""
    return f"{PREFIX}stats:{site}"


def live_settings(site: str) -> str:
    """Hash of settings changed at run time (``crawler set``), read by every worker."""
    return f"{PREFIX}settings:{site}"


def sites() -> str:
    """Set of every site name that was ever seeded on this Redis."""
    return f"{PREFIX}sites"


def frontier(site: str, priority: int = 0) -> str:
    """List of compact entries of one priority: the bulk of ``site``'s queued URLs (see ``scheduler``)."""
    return f"{PREFIX}frontier:{site}" if priority == 0 else f"{PREFIX}frontier:{site}:{priority}"


def levels(site: str) -> str:
    """Sorted set of the priorities whose frontier list of ``site`` holds entries (score = priority)."""
    return f"{PREFIX}levels:{site}"


def queued(site: str) -> str:
    """Sorted set of the ids of ``site``'s RQ jobs made from its frontier, scored by priority."""
    return f"{PREFIX}queued:{site}"


def ready() -> str:
    """Sorted set of sites with work, scored by when (ms, Redis clock) their gate opens."""
    return f"{PREFIX}ready"


def delayed() -> str:
    """Sorted set of retries (``site\\tpriority\\tnonce\\tentry``) scored by when they are due (ms)."""
    return f"{PREFIX}delayed"


def recrawls() -> str:
    """Sorted set of scheduled refreshes, members as in ``delayed``, scored by when they are due (ms)."""
    return f"{PREFIX}recrawl"


def conf(site: str) -> str:
    """Hash of the politeness the scheduler obeys for ``site``: interval_ms, paused, concurrency."""
    return f"{PREFIX}conf:{site}"


def errors(site: str) -> str:
    """Count of consecutive transient errors from ``site`` (closes its gate when high)."""
    return f"{PREFIX}errors:{site}"


def group(sites: list[str]) -> str:
    """Set of the sites a group of workers serves (``--sites``), named by its sorted members."""
    import hashlib

    digest = hashlib.blake2b("\n".join(sorted(sites)).encode(), digest_size=8).hexdigest()
    return f"{PREFIX}group:{digest}"


def lock(name: str) -> str:
    """A short mutex (refill, robots fetch)."""
    return f"{PREFIX}lock:{name}"


def metrics(site: str) -> str:
    """Hash of ``site``'s Prometheus counters and histogram buckets (see ``metrics``)."""
    return f"{PREFIX}metrics:{site}"
