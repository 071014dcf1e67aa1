"""Every Redis key and RQ queue name the crawler writes, built in one place.

RQ adds its own keys for the queues named here (``rq:queue:download:SITE`` and the job
hashes and registries, under ``RQ_KEY_PREFIX``), always read from RQ's own classes,
never spelled here; everything else lives under ``crawler:``. The Lua
scripts in ``scheduler`` build the same names from ``PREFIX``; keep them in step.
"""

from __future__ import annotations

PREFIX = "crawler:"

#: The consumer group of parse workers on the pages stream (``pages()``).
PARSERS = "parsers"


def download_queue(site: str) -> str:
    """RQ queue name holding ``site``'s download jobs."""
    return f"download:{site}"


def gate(site: str) -> str:
    """The site's time-limited mutex (``SET NX PX``); also a gate named by ``gate_name``."""
    return f"{PREFIX}gate:{site}"


def shared_gate_name(name: str) -> str:
    """The gate name (for ``gate``) of a gate several spiders share (``Spider.gate``)."""
    return f"shared:{name}"


def ip_gate_name(address: str) -> str:
    """The gate name (for ``gate``) of every request to one IP address (``gate_by = "ip"``)."""
    return f"ip:{address}"


def seen(site: str) -> str:
    """Set of fingerprints of canonical URLs already scheduled for ``site``."""
    return f"{PREFIX}seen:{site}"


def seen_bucket(site: str, index: int) -> str:
    """One time bucket of ``site``'s seen URLs when they expire (``revisit_after``; see ``frontier``)."""
    return f"{seen(site)}:{index}"


def robots(site: str, origin: str) -> str:
    """Cached robots.txt body for one origin (scheme://host:port) of ``site``."""
    return f"{PREFIX}robots:{site}:{origin}"


def robots_copy(site: str, origin: str) -> str:
    """The last robots.txt read for one origin of ``site``, kept for a long outage (60 days)."""
    return f"{PREFIX}robots-copy:{site}:{origin}"


def robots_outage(site: str, origin: str) -> str:
    """Hash of an origin's unreadable robots.txt: since, failures, retry_at (epoch seconds), reason."""
    return f"{PREFIX}robots-outage:{site}:{origin}"


def pages() -> str:
    """Stream of downloaded pages waiting for a parse worker, each with its compressed body (see ``pages``)."""
    return f"{PREFIX}pages"


def parsers() -> str:
    """Sorted set of parse workers (their consumer names) scored by their last sign of life (Unix time)."""
    return f"{PREFIX}parsers"


def parse_failed(site: str) -> str:
    """Set of fingerprints of ``site``'s pages whose last parse failed: refreshed whole, not conditionally."""
    return f"{PREFIX}parse-failed:{site}"


def lastmod(site: str) -> str:
    """Hash of ``site``'s sitemap URLs' last <lastmod>: 8-byte fingerprint -> epoch seconds (see ``sitemaps``)."""
    return f"{PREFIX}lastmod:{site}"


def stats(site: str) -> str:
    """Hash of counters for ``site``: fetched, failed, items, … (written through ``counters``)."""
    return f"{PREFIX}stats:{site}"


def resets(site: str) -> str:
    """How many times ``site``'s counters were reset: counts made before a reset are not written (``counters``)."""
    return f"{PREFIX}resets:{site}"


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
    """Hash of the politeness in force for ``site``, read by the scheduler and the gate.

    interval_ms (margin included), margin_ms, paused, concurrency (``publish_conf``);
    robots_delay_ms (``robots``); pace_ms, pace_why (the adaptive interval, ``pacing``);
    closed_until, closed_why (the last closure of the gate, ``Scheduler.close_gate``);
    gate (the key of the gate the site's requests take when it is not ``gate(site)``: a
    shared gate, or for ``gate_by = "ip"`` the last address a worker took it for).
    """
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
    """Hash of ``site``'s Prometheus counters and histogram buckets (see ``metrics``; written through ``counters``)."""
    return f"{PREFIX}metrics:{site}"


def quarantine() -> str:
    """List of refused jobs and frontier entries, with their reasons (see ``quarantine``)."""
    return f"{PREFIX}quarantine"


def outbox() -> str:
    """List of fetch records (JSON) waiting for the database to come back (see ``events``)."""
    return f"{PREFIX}outbox"
