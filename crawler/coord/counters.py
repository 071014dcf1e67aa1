"""Per-site counters and metrics: counted in each process's memory, written to Redis every second or few.

The one writer of ``crawler:stats:SITE`` and ``crawler:metrics:SITE``: a job ``add``s its
increments to its process's ``Counters``, which writes the sums in one transaction at most
FLUSH_EVERY after the first unwritten count (longer with many sites' counts waiting: those of
every shard the process serves, ``FlushPace``), the metrics METRICS_PERIODS times less often, and
everything at once on ``flush``/``flush_if_quiet``.
Counts made before a site's reset are never written after it (``keys.reset_at``; one read of the
reset epoch a write, a site's own only once some site was reset). Fields
program logic reads exact (``IMMEDIATE``, ``crawler:errors:SITE``) are written where they
are decided. The design and its price: docs/ARCHITECTURE.md ("Counters are summed in
memory") and docs/METRICS.md.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import redis
from redis import Redis

from . import keys, lua

log = logging.getLogger("crawler.counters")

#: Seconds between two writes of a process's counts (its first count not yet written is
#: never older): what a crash loses and what ``crawler status`` and a scrape lag, at most.
FLUSH_EVERY = 1.0

#: Sites whose counts one write of FLUSH_EVERY carries; with more waiting the period grows in
#: proportion, up to MOST_PERIODS (many slow sites' counts batched, not written a site a second).
SITES_PER_PERIOD = 50
MOST_PERIODS = 5.0

#: Periods between two writes of a process's metrics (a scrape's figures, never read by the crawl
#: itself): most of a slow site's fields are its metrics' (a histogram bucket and sum each for the
#: download's time and the gate's wait, bytes, a status count), written a quarter as often.
METRICS_PERIODS = 4.0

#: Seconds without a count after which a worker with no work writes its process's counts
#: at once (``flush_if_quiet``): the process is at rest, so waiting for the timer would
#: only delay exact totals. Shorter lulls, while other threads still count, are left to
#: the timer, so that a crawl starved for a moment does not write twice as often.
QUIET = 0.25

#: Sites one ``ADD_COUNTS`` call carries (a write of more is a transaction of such calls): a call holds
#: Redis for its sites' fields, some ten commands a site.
SITES_A_CALL = 100

#: Fields of the stats hash written where they are decided, never through ``Counters``.
IMMEDIATE = frozenset({"delayed", "recrawls"})

Number = int | float


class FlushPace:
    """The sites with counts waiting in every ``Counters`` of a process (one a shard it serves).

    Each shard's counters time their writes by this sum, not by their own sites: a process's
    counts spread over three shards are written as often as on one Redis, each write carrying
    only its shard's sites, so a shard's writes a page are not three times one Redis's. Likewise a
    shard's counters are quiet (``flush_if_quiet``) only once the whole process is.
    """

    def __init__(self) -> None:
        self._members: weakref.WeakSet[Counters] = weakref.WeakSet()

    def join(self, counters: Counters) -> None:
        self._members.add(counters)

    def sites_waiting(self) -> int:
        return sum(member.sites_waiting for member in list(self._members))

    def last_count(self) -> float:
        """When the process's latest count was made, on any shard (monotonic)."""
        return max((member.last_count for member in list(self._members)), default=0.0)


class Counters:
    """The counts of one process not yet written to Redis (see the module docstring). Thread-safe."""

    def __init__(self, connection: Redis, flush_every: float = FLUSH_EVERY, pace: FlushPace | None = None):
        self.connection = connection
        self.flush_every = flush_every
        #: Sites with counts not yet written (read by ``FlushPace`` without the lock: an int read is atomic).
        self.sites_waiting = 0
        self._pace = pace or FlushPace()
        self._pace.join(self)
        self._cond = threading.Condition()  # guards every attribute below but _writing
        self._stats: dict[str, dict[str, int]] = {}
        self._metrics: dict[str, dict[str, Number]] = {}
        self._counted_at: dict[str, int | None] = {}  # site -> reset epoch its pending stats were counted at
        self._epoch: int | None = None  # the reset epoch (``keys.reset_epoch``) last seen in Redis
        self._since: float | None = None  # when the oldest stats count not yet written was made (monotonic)
        self._metrics_since: float | None = None  # the same, of the metrics
        #: When the latest count was made (monotonic; read by ``FlushPace`` without the lock).
        self.last_count = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failing = False
        self._writing = threading.Lock()  # one write at a time
        self._add_counts = lua.script(connection, "add_counts")

    def add(
        self, site: str, stats: Mapping[str, int] | None = None, metrics: Mapping[str, Number] | None = None
    ) -> None:
        """Count ``stats`` (fields of the site's stats hash) and ``metrics`` (of its metrics hash).

        ValueError for a field of IMMEDIATE: those are written where they are decided.
        """
        if stats and not IMMEDIATE.isdisjoint(stats):
            raise ValueError(f"{sorted(IMMEDIATE & set(stats))} are written at once, not counted here")
        if stats and self._epoch is None:
            self._learn_epoch()
        with self._cond:
            if site not in self._stats and site not in self._metrics and (stats or metrics):
                self.sites_waiting += 1
            if stats:
                pending = self._stats.get(site)
                if pending is None:
                    pending = self._stats[site] = {}
                    self._counted_at[site] = self._epoch
                for name, n in stats.items():
                    pending[name] = pending.get(name, 0) + n
            if metrics:
                into = self._metrics.setdefault(site, {})
                for name, amount in metrics.items():
                    into[name] = into.get(name, 0) + amount
            self.last_count = time.monotonic()
            started = self._since is not None or self._metrics_since is not None
            if stats and self._since is None:
                self._since = self.last_count
            if metrics and self._metrics_since is None:
                self._metrics_since = self.last_count
            if not started:
                self._start()

    def pending(self) -> int:
        """Fields with counts not yet written (for tests and a closing warning)."""
        with self._cond:
            return sum(map(len, self._stats.values())) + sum(map(len, self._metrics.values()))

    def flush(self, metrics_too: bool = True) -> bool:
        """Write every count made so far (``metrics_too``: the metrics as well), in one transaction;
        whether it went (or nothing was left).

        On a Redis error the counts stay for the next try (logged once per outage); this
        never raises for one, so a worker can call it on its way out.
        """
        with self._writing:
            with self._cond:
                stats, self._stats = self._stats, {}
                metrics: dict[str, dict[str, Number]] = {}
                if metrics_too:
                    metrics, self._metrics = self._metrics, {}
                    self._metrics_since = None
                counted_at, self._counted_at = self._counted_at, {}
                self._since = None
                self.sites_waiting = len(self._metrics)
            if not stats and not metrics:
                return True
            try:
                epoch, dropped = self._write(stats, metrics, counted_at)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._put_back(stats, metrics, counted_at)
                if not self._failing:
                    self._failing = True
                    log.warning("counters not written (Redis: %s): kept for the next try", _first_line(exc))
                return False
            except redis.RedisError as exc:  # refused by the server: trying again would not help
                log.error("counters of %s dropped: %s", ", ".join(sorted({*stats, *metrics})), _first_line(exc))
                return False
        if self._failing:
            self._failing = False
            log.warning("counters written again")
        if epoch is not None:
            with self._cond:
                self._epoch = epoch
        for site in dropped:
            log.info("%s: %d counts made before its reset dropped", site, sum(stats[site].values()))
        return True

    def flush_if_quiet(self, quiet: float = QUIET) -> None:
        """``flush`` if counts wait and none was made in the process (on any shard) in the last ``quiet``
        seconds (a worker with no work calls it)."""
        waiting = self._since is not None or self._metrics_since is not None
        if waiting and time.monotonic() - self._pace.last_count() >= quiet:
            self.flush()

    def close(self) -> None:
        """Stop the writing thread and write what is left (a worker process's last step)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        if not self.flush():
            log.warning("counters: %d fields of counts lost (Redis unreachable at exit)", self.pending())

    def _learn_epoch(self) -> None:
        """Read the reset epoch before the first count (None, so counts go in anyway, if Redis fails); each
        write's reply says it since."""
        try:
            now = int(self.connection.get(keys.reset_epoch()) or 0)
        except redis.RedisError:
            return
        with self._cond:
            if self._epoch is None:
                self._epoch = now

    def _write(
        self,
        stats: dict[str, dict[str, int]],
        metrics: dict[str, dict[str, Number]],
        counted_at: dict[str, int | None],
    ) -> tuple[int | None, list[str]]:
        """Every count in one ``ADD_COUNTS`` call (atomic), or in a transaction of one a SITES_A_CALL sites;
        the reset epoch now (None if nothing was written) and the sites whose stats it dropped."""
        sites = [site for site in dict.fromkeys([*stats, *metrics]) if _any(stats.get(site)) or _any(metrics.get(site))]
        calls: list[tuple[list[str], list[Any]]] = []
        for start in range(0, len(sites), SITES_A_CALL):
            script_keys: list[str] = [keys.reset_epoch()]
            args: list[Any] = []
            for site in sites[start : start + SITES_A_CALL]:
                at = counted_at.get(site)
                counts = [(name, n) for name, n in (stats.get(site) or {}).items() if n]
                amounts = metrics.get(site) or {}
                whole = [(name, n) for name, n in amounts.items() if not isinstance(n, float) and n]
                fractional = [(name, repr(n)) for name, n in amounts.items() if isinstance(n, float)]
                script_keys += [keys.stats(site), keys.reset_at(site), keys.metrics(site)]
                args += ["" if at is None else at, len(counts), len(whole), len(fractional)]
                for pairs in (counts, whole, fractional):
                    for name, n in pairs:
                        args += [name, n]
            calls.append((script_keys, args))
        if not calls:
            return None, []
        if len(calls) == 1:
            replies = [self._add_counts(keys=calls[0][0], args=calls[0][1])]
        else:
            with self.connection.pipeline(transaction=True) as pipe:
                for script_keys, args in calls:
                    self._add_counts(keys=script_keys, args=args, client=pipe)
                replies = pipe.execute()
        dropped = [sites[n * SITES_A_CALL + int(at) - 1] for n, reply in enumerate(replies) for at in reply[1:]]
        return int(replies[-1][0]), dropped

    def _put_back(
        self,
        stats: dict[str, dict[str, int]],
        metrics: dict[str, dict[str, Number]],
        counted_at: dict[str, int | None],
    ) -> None:
        """Counts that could not be written, back with those made since (the older reset count wins)."""
        with self._cond:
            for site, fields in stats.items():
                pending = self._stats.setdefault(site, {})
                for name, n in fields.items():
                    pending[name] = pending.get(name, 0) + n
                self._counted_at[site] = counted_at.get(site)
            for site, amounts in metrics.items():
                into = self._metrics.setdefault(site, {})
                for name, amount in amounts.items():
                    into[name] = into.get(name, 0) + amount
            self.sites_waiting = len(self._stats.keys() | self._metrics.keys())
            self._since = time.monotonic()  # the next try in one interval
            if metrics:
                self._metrics_since = self._since
            self._start()

    def _period(self) -> float:
        """Seconds between two writes now: ``flush_every``, longer with counts of many sites waiting
        in the process (called holding the lock; see SITES_PER_PERIOD and ``FlushPace``)."""
        sites = self._pace.sites_waiting()
        return self.flush_every * min(MOST_PERIODS, max(1.0, sites / SITES_PER_PERIOD))

    def _start(self) -> None:
        """Start the writing thread if it is not running (called holding the lock)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="counters", daemon=True)
            self._thread.start()
        self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if self._since is None and self._metrics_since is None:
                        self._cond.wait()
                        continue
                    period, now = self._period(), time.monotonic()
                    stats_due = math.inf if self._since is None else self._since + period
                    metrics_due = (
                        math.inf if self._metrics_since is None else self._metrics_since + METRICS_PERIODS * period
                    )
                    left = min(stats_due, metrics_due) - now
                    if left <= 0:
                        metrics_too = metrics_due <= now
                        break
                    self._cond.wait(left)
            try:
                self.flush(metrics_too)
            except Exception:  # a bug: said, and the thread lives on (the workers' own writes still run)
                log.exception("counters: write failed")


def forget(pipe: Any, site: str) -> None:
    """Add to ``pipe`` (a transaction) what deletes ``site``'s stats for good: counts made before are dropped."""
    pipe.register_script(lua.source("forget_counts"))(
        keys=[keys.stats(site), keys.reset_at(site), keys.reset_epoch()], client=pipe
    )


def uncount(connection: Redis, site: str, field: str, n: int) -> None:
    """Take ``n`` from a stats field at once, never below zero (``crawler retry`` requeues failed pages)."""
    if n and int(connection.hincrby(keys.stats(site), field, -n)) < 0:
        connection.hset(keys.stats(site), field, 0)  # counted before the counter existed (or was reset)


def _any(fields: Mapping[str, Number] | None) -> bool:
    """Whether ``fields`` hold a count to write (a zero adds nothing; a float sum is written even at 0.0)."""
    return any(isinstance(n, float) or n for n in (fields or {}).values())


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
