"""Every Redis key and RQ queue name the crawler writes, built in one place.

Every key of one site carries the site's name as a Redis Cluster hash tag, in braces
(``crawler:conf:{shop}``, ``crawler:seen:{shop}:123``, RQ's ``rq:queue:download:{shop}``),
so a site's whole state hashes to one Cluster slot and the scripts that touch one site
run within it. The other keys (the ready set, the retries waiting, the pages stream, …)
are global; a gate shared by several sites is tagged by its own name, so it is in a slot
of its own (``crawler:gate:{shared:NAME}``). docs/SCALING.md says what that allows.

RQ adds its own keys for the queues named here (``rq:queue:download:{SITE}`` and the
job hashes and registries, under ``RQ_KEY_PREFIX``), always read from RQ's own classes,
never spelled here; everything else lives under ``crawler:``. The Lua scripts
(``crawler/lua``) take every key they touch in ``KEYS``, named here (or by RQ).
"""

from __future__ import annotations

from collections.abc import Callable

PREFIX = "crawler:"

#: The consumer group of parse workers on the pages stream (``pages()``).
PARSERS = "parsers"


def _tag(site: str) -> str:
    """``site`` as a Redis Cluster hash tag: every key holding it hashes to the slot of ``site``."""
    return "{" + site + "}"


def download_queue(site: str) -> str:
    """RQ queue name holding ``site``'s download jobs, tagged: RQ's keys of the queue share the site's slot."""
    return f"download:{_tag(site)}"


def site_of_queue(name: str) -> str | None:
    """The site whose download queue is named ``name`` (``download_queue``), or None for another queue."""
    before, after = around_site(download_queue)
    if name.startswith(before) and name.endswith(after) and len(name) > len(before) + len(after):
        return name[len(before) : len(name) - len(after)]
    return None


def gate(name: str) -> str:
    """The time-limited mutex (``SET NX PX``) named ``name``: a site's own (``name`` = the site),
    or a gate several sites share (``shared_gate_name``, ``ip_gate_name``), tagged by its name.
    """
    return f"{PREFIX}gate:{_tag(name)}"


def shared_gate_name(name: str) -> str:
    """The gate name (for ``gate``) of a gate several spiders share (``Spider.gate``)."""
    return f"shared:{name}"


def ip_gate_name(address: str) -> str:
    """The gate name (for ``gate``) of every request to one IP address (``gate_by = "ip"``)."""
    return f"ip:{address}"


def seen(site: str) -> str:
    """``site``'s seen set of before seen tables (8-byte fingerprints): read while it exists (``coord.seen``)."""
    return f"{PREFIX}seen:{_tag(site)}"


def seen_bucket(site: str, index: int) -> str:
    """One time bucket of before seen tables (``revisit_after``): read while it lasts, never written."""
    return f"{seen(site)}:{index}"


def seen_table(site: str) -> str:
    """``site``'s seen table (``coord.seen``): a hash; its sub-sets are this name, ``:`` and a number."""
    return f"{seen(site)}:i"


def seen_window(site: str, index: int) -> str:
    """The seen table of one time bucket of ``site``'s seen URLs when they expire (``revisit_after``)."""
    return f"{seen(site)}:w:{index}"


def robots(site: str, origin: str) -> str:
    """Cached robots.txt body for one origin (scheme://host:port) of ``site``."""
    return f"{PREFIX}robots:{_tag(site)}:{origin}"


def robots_copy(site: str, origin: str) -> str:
    """The last robots.txt read for one origin of ``site``, kept for a long outage (60 days)."""
    return f"{PREFIX}robots-copy:{_tag(site)}:{origin}"


def robots_outage(site: str, origin: str) -> str:
    """Hash of an origin's unreadable robots.txt: since, failures, retry_at (epoch seconds), reason."""
    return f"{PREFIX}robots-outage:{_tag(site)}:{origin}"


def pages() -> str:
    """Stream of downloaded pages waiting for a parse worker, each with its compressed body (see ``pages``)."""
    return f"{PREFIX}pages"


def parsers() -> str:
    """Sorted set of parse workers (their consumer names) scored by their last sign of life (Unix time)."""
    return f"{PREFIX}parsers"


def parse_failed(site: str) -> str:
    """Set of fingerprints of ``site``'s pages whose last parse failed: refreshed whole, not conditionally."""
    return f"{PREFIX}parse-failed:{_tag(site)}"


def lastmod(site: str) -> str:
    """Hash of ``site``'s sitemap URLs' last <lastmod>: 8-byte fingerprint -> epoch seconds (see ``sitemaps``)."""
    return f"{PREFIX}lastmod:{_tag(site)}"


def sitemap_taken(site: str, read: str) -> str:
    """Set of the fingerprints one read (``read``) of a sitemap of ``site`` queued, so a URL the document
    lists again is not queued again; deleted when the read ends."""
    return f"{PREFIX}sitemap-taken:{_tag(site)}:{read}"


def stats(site: str) -> str:
    """Hash of counters for ``site``: fetched, failed, items, … (written through ``counters``)."""
    return f"{PREFIX}stats:{_tag(site)}"


def admitted(site: str) -> str:
    """Count of new pages admitted to ``site``'s frontier, for its ``max_pages`` (``Frontier.enqueue``)."""
    return f"{PREFIX}admitted:{_tag(site)}"


def reset_epoch() -> str:
    """How many site resets this Redis has seen: a process's counts carry the value it last saw (``counters``)."""
    return f"{PREFIX}reset-epoch"


def reset_at(site: str) -> str:
    """The ``reset_epoch`` of ``site``'s last reset: its counts carrying an older one are not written (``counters``)."""
    return f"{PREFIX}reset-at:{_tag(site)}"


def live_settings(site: str) -> str:
    """Hash of settings changed at run time (``crawler set``), read by every worker."""
    return f"{PREFIX}settings:{_tag(site)}"


def spider_args(site: str) -> str:
    """Hash of ``site``'s spider arguments (``crawl``/``seed -a``), read by every worker (``spiderargs``)."""
    return f"{PREFIX}args:{_tag(site)}"


def settings_changes() -> str:
    """A token renewed after every write of live settings or spider arguments (``changes``)."""
    return f"{PREFIX}settings-changed"


def sites() -> str:
    """Set of every site name that was ever seeded on this Redis."""
    return f"{PREFIX}sites"


def frontier(site: str, priority: int = 0) -> str:
    """List of compact entries of one priority: the bulk of ``site``'s queued URLs (see ``scheduler``);
    the list of priority P is that of priority 0 with ``:P`` appended."""
    base = f"{PREFIX}frontier:{_tag(site)}"
    return base if priority == 0 else f"{base}:{priority}"


def frontier_extra(site: str) -> str:
    """Hash of ``site``'s frontier lists (field: the priority) to the entries their packs hold beyond one
    each (``packs``): a list's entries are its length plus that."""
    return f"{PREFIX}frontier-extra:{_tag(site)}"


def levels(site: str) -> str:
    """Sorted set of the priorities whose frontier list of ``site`` holds entries (score = priority)."""
    return f"{PREFIX}levels:{_tag(site)}"


def queued(site: str) -> str:
    """Sorted set of the ids of ``site``'s RQ jobs made from its frontier, scored by priority."""
    return f"{PREFIX}queued:{_tag(site)}"


def ready() -> str:
    """Sorted set of sites with work, scored by when (ms, Redis clock) their gate opens."""
    return f"{PREFIX}ready"


def wake() -> str:
    """Pub/sub channel on which a site that got work is announced (its name): idle download workers look at once."""
    return f"{PREFIX}wake"


def more_work() -> str:
    """Pub/sub channel on which a site already in the ready set that got more work is announced (its name):
    a thread that follows the site is told (``IdleRoom.expect``); the idle ones need not look."""
    return f"{PREFIX}more-work"


def busy() -> str:
    """Sorted set of the download processes with jobs in hand, scored by when (ms, Redis clock) the note lapses."""
    return f"{PREFIX}busy"


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
    return f"{PREFIX}conf:{_tag(site)}"


def errors(site: str) -> str:
    """Count of consecutive transient errors from ``site`` (closes its gate when high)."""
    return f"{PREFIX}errors:{_tag(site)}"


def cookies(site: str) -> str:
    """``site``'s cookie jar (``cookies = True``): a hash, field ``[domain, path, name]`` (JSON) → the cookie (JSON)."""
    return f"{PREFIX}cookies:{_tag(site)}"


def session(site: str) -> str:
    """``site``'s login session (``login_url``): a hash of ``state`` (``ok`` or absent) and ``generation``."""
    return f"{PREFIX}session:{_tag(site)}"


def login_lease(site: str) -> str:
    """The lease of the one worker logging ``site`` in (``SET NX PX``; expires if that worker dies)."""
    return f"{PREFIX}login:{_tag(site)}"


def group(sites: list[str]) -> str:
    """Set of the sites a group of workers serves (``--sites``), named by its sorted members."""
    import hashlib

    digest = hashlib.blake2b("\n".join(sorted(sites)).encode(), digest_size=8).hexdigest()
    return f"{PREFIX}group:{digest}"


def drained() -> str:
    """The fleet's word, for a moment, that a crawl was found drained by an exact count: the name of its
    sites' ``group`` (``work.drain.crawl_drained``); deleted as a job is handed out (``NEXT_JOB``)."""
    return f"{PREFIX}drained"


def moving() -> str:
    """The sites moving to or from this shard (``crawler move``): a set, there while a move runs; burst
    workers take it as work left (``work.drain.pending_work``), so none ends while a site is in transit."""
    return f"{PREFIX}moving"


def claims() -> str:
    """Sorted set of sites whose RQ queues the reaper watches (jobs handed out, leases, retries), scored
    by when (ms, Redis clock) it next looks at each (``reaper.reap``)."""
    return f"{PREFIX}claims"


def stranded() -> str:
    """Hash of job ids seen in an RQ intermediate list without a lease, to when (epoch s) the reaper first saw them."""
    return f"{PREFIX}stranded"


def lock(name: str) -> str:
    """A short mutex of the whole crawl (reaper, outbox); see ``refill_lock`` and ``robots_lock`` for a site's."""
    return f"{PREFIX}lock:{name}"


def refill_lock(site: str) -> str:
    """The short mutex of a preemption of ``site``'s queued jobs by a higher priority (``Frontier.preempt``)."""
    return f"{PREFIX}lock:refill:{_tag(site)}"


def robots_lock(site: str, origin: str) -> str:
    """The short mutex of a fetch of one origin's robots.txt for ``site``."""
    return f"{PREFIX}lock:robots:{_tag(site)}:{origin}"


def metrics(site: str) -> str:
    """Hash of ``site``'s Prometheus counters and histogram buckets (see ``metrics``; written through ``counters``)."""
    return f"{PREFIX}metrics:{_tag(site)}"


def quarantine() -> str:
    """List of refused jobs and frontier entries, with their reasons (see ``quarantine``)."""
    return f"{PREFIX}quarantine"


def outbox() -> str:
    """List of fetch records (JSON) waiting for the database to come back (see ``events``)."""
    return f"{PREFIX}outbox"


def server() -> str:
    """The Redis server the fleet last saw serve this data: its ``run_id`` and since when (ms, its clock;
    0: from the start), so a process that connects after a failover knows of it (``failover``)."""
    return f"{PREFIX}server"


#: A stand-in site name that no key holds otherwise (``around_site``).
_MARKER = "\x00site\x00"


def around_site(key_of: Callable[[str], str]) -> tuple[str, str]:
    """What precedes and what follows a site's name in the key ``key_of(site)``.

    For reading a site back from a key (``site_of_queue``). ValueError if the key does not
    hold the site's name once.
    """
    key = key_of(_MARKER)
    if key.count(_MARKER) != 1:
        raise ValueError(f"{key_of!r} does not name a key by its site")
    before, _, after = key.partition(_MARKER)
    return before, after
