"""Fleet-wide metrics kept in Redis and served in the Prometheus text format.

Counting: every finished download and parse job adds a few fields (``events.job_fields``) to
its site's hash ``crawler:metrics:SITE``, through its process's ``counters.Counters``
(summed in memory, written about once a second), so the numbers are the whole fleet's,
whichever host did the work. Fields of that hash:

    req:KIND:OUTCOME:STATUS   jobs finished (STATUS is the HTTP status or ``none``)
    bytes:KIND                response body bytes
    dur:KIND:LE / dur:KIND:sum  duration histogram: count per bucket (not cumulative), sum
    gate:LE / gate:sum          gate-wait histogram of downloads

Exporting: ``MetricsCollector`` reads those hashes, plus the queue depths and worker
counts ``crawler status`` shows, on every scrape; ``serve`` puts it behind an HTTP
endpoint (``crawler metrics``, ``crawler worker --metrics-port``). See docs/METRICS.md.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from redis import Redis

from ..coord import keys
from ..coord.policy import resolve_policy
from ..coord.replies import text, text_map
from ..errors import ConfigError
from ..settings import Settings, check_live
from ..spiders.spider import Spider
from ..work.events import DURATION_BUCKETS, GATE_WAIT_BUCKETS
from .status import SiteStatus, known_sites, parse_backlog, site_status, workers_by_host

log = logging.getLogger("crawler.metrics")

#: Default port of the metrics endpoint (next to the node exporter's 9100 family of ports).
DEFAULT_PORT = 9108
#: Default address the endpoint listens on: loopback, so exposing it is a decision.
DEFAULT_HOST = "127.0.0.1"
#: Seconds a scrape waits for Redis before it reports ``crawler_redis_up 0``.
SCRAPE_TIMEOUT = 10.0


# -- exporting (on every scrape) -----------------------------------------------------------


class _Histogram:
    """Per-bucket counts and a sum read back from the hash, made cumulative for Prometheus."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def add(self, field: str, value: bytes) -> None:
        """Add one field of the hash (``sum`` or a bucket's bound); ValueError if it does not parse."""
        if field == "sum":
            self.sum += _amount(value)
            return
        bound = float(field)
        if math.isnan(bound):
            raise ValueError(f"bucket bound {field!r}")
        # A bucket from an older bound list lands in the first current bucket that holds it, so
        # changing the bounds never loses an observation (it only blurs the old ones).
        self.counts[bisect.bisect_left(self.bounds, bound)] += _count(value)

    def buckets(self) -> list[tuple[str, float]]:
        total = 0
        result: list[tuple[str, float]] = []
        for bound, count in zip(self.bounds, self.counts, strict=True):
            total += count
            result.append((floatToGoString(bound), total))
        return result


def _count(value: bytes) -> int:
    """A count of the hash: a whole number, 0 or more; ValueError otherwise."""
    count = int(value)
    if count < 0:
        raise ValueError(f"negative count {count}")
    return count


def _amount(value: bytes) -> float:
    """A sum of the hash (seconds): a finite number, 0 or more; ValueError otherwise."""
    amount = float(value)
    if not 0 <= amount < math.inf:  # NaN fails it too
        raise ValueError(f"sum {amount!r}")
    return amount


class _SiteCounters:
    """One site's ``crawler:metrics:SITE`` hash, decoded.

    A field that does not parse (written by hand, or by something else) is skipped and
    counted in ``bad``, with its name in ``bad_names``: the scrape shows every other value.
    """

    def __init__(self, raw: Mapping[bytes, bytes]):
        self.requests: dict[tuple[str, str, str], int] = {}
        self.bytes: dict[str, int] = {}
        self.durations: dict[str, _Histogram] = {}
        self.gate_wait = _Histogram(GATE_WAIT_BUCKETS)
        self.bad_names: list[str] = []
        for name, value in raw.items():
            try:
                self._add(name.decode(), value)
            except (ValueError, UnicodeDecodeError):  # int('x'), float('x'), an undecodable name
                self.bad_names.append(text(name))

    @property
    def bad(self) -> int:
        return len(self.bad_names)

    def _add(self, name: str, value: bytes) -> None:
        kind, _, rest = name.partition(":")
        if kind == "req":
            parts = rest.split(":", 2)
            if len(parts) != 3:
                raise ValueError(f"request field without kind, outcome and status: {name!r}")
            self.requests[(parts[0], parts[1], parts[2])] = _count(value)
        elif kind == "bytes":
            self.bytes[rest] = _count(value)
        elif kind == "dur":
            job, _, field = rest.partition(":")
            histogram = self.durations.get(job) or _Histogram(DURATION_BUCKETS)
            histogram.add(field, value)
            self.durations[job] = histogram  # only once a field of it parsed
        elif kind == "gate":
            self.gate_wait.add(rest, value)
        else:
            raise ValueError(f"not a metrics field: {name!r}")


class MetricsCollector(Collector):
    """Reads the fleet's metrics from Redis on every scrape (a ``prometheus_client`` collector).

    ``spiders`` and ``settings`` give the interval in force as ``crawler status`` shows it
    (spider < config < live); a site whose spider is not loaded here shows only a live
    interval. A Redis error or silence longer than ``timeout`` makes the scrape answer
    ``crawler_redis_up 0`` (and log one warning) instead of failing. A field of a metrics
    hash that does not parse (written by hand) is skipped, counted in
    ``crawler_metrics_bad_fields`` and named in one warning; a live setting that does not
    hold is not shown. Either way the scrape answers with everything else.
    """

    def __init__(
        self,
        connection: Redis,
        spiders: Mapping[str, type[Spider]] | None = None,
        settings: Settings | None = None,
        timeout: float = SCRAPE_TIMEOUT,
    ):
        pool = connection.connection_pool
        kwargs = dict(pool.connection_kwargs, socket_timeout=timeout, socket_connect_timeout=timeout)
        # Its own pool: the caller's client may wait forever on a silent server; a scrape must not.
        self.connection = Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))
        self.spiders = dict(spiders or {})
        self.settings = settings
        #: (site, field) of the metrics hashes already warned about as not parsing.
        self._warned: set[tuple[str, str]] = set()

    def describe(self) -> list[Metric]:
        return []  # names vary with the data; registering must not read Redis

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            families = list(self._families())
            up = 1
        except redis.RedisError as exc:
            log.warning("metrics scrape: Redis error: %s", str(exc).splitlines()[0] if str(exc) else repr(exc))
            families, up = [], 0
        yield from families
        yield GaugeMetricFamily("crawler_redis_up", "1 if this scrape could read Redis, else 0.", value=up)
        yield GaugeMetricFamily(
            "crawler_scrape_duration_seconds",
            "Seconds this scrape took to read Redis.",
            value=time.perf_counter() - started,
        )

    def close(self) -> None:
        self.connection.close()

    def _families(self) -> Iterator[Metric]:
        conn = self.connection
        sites = known_sites(conn)
        statuses = site_status(conn, sites)
        with conn.pipeline(transaction=False) as pipe:
            for site in sites:
                pipe.hgetall(keys.metrics(site))
                pipe.hgetall(keys.live_settings(site))
            replies = pipe.execute()
        counters = {site: _SiteCounters(replies[2 * i]) for i, site in enumerate(sites)}
        live = {site: text_map(replies[2 * i + 1]) for i, site in enumerate(sites)}
        refreshes = GaugeMetricFamily(
            "crawler_refreshes_scheduled", "Pages waiting for their scheduled refresh.", labels=["site"]
        )
        for status in statuses:
            refreshes.add_metric([status.site], status.refreshes)
        parse = parse_backlog(conn)
        yield from self._counter_families(counters)
        yield self._bad_fields(counters)
        yield from self._site_gauges(statuses, live)
        yield refreshes
        yield GaugeMetricFamily(
            "crawler_parse_queue_depth",
            "Pages waiting for a parse worker (stream crawler:pages, not yet read).",
            value=parse.queued,
        )
        yield GaugeMetricFamily(
            "crawler_parse_in_flight", "Pages read by a parse worker and not yet done with.", value=parse.in_flight
        )
        workers = GaugeMetricFamily(
            "crawler_workers", "Live workers (download and parse) by host and state.", labels=["host", "state"]
        )
        for host, states in sorted(workers_by_host(conn).items()):
            for state, count in sorted(states.items()):
                workers.add_metric([host, state], count)
        yield workers

    def _counter_families(self, counters: Mapping[str, _SiteCounters]) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "crawler_requests",
            "Finished downloads and parses (fetch records).",
            labels=["site", "kind", "outcome", "status"],
        )
        body_bytes = CounterMetricFamily(
            "crawler_response_bytes", "Response body bytes downloaded.", labels=["site", "kind"]
        )
        durations = HistogramMetricFamily(
            "crawler_request_duration_seconds",
            "Duration of each fetch record (its elapsed): the download, or the parse callback.",
            labels=["site", "kind"],
        )
        gate_wait = HistogramMetricFamily(
            "crawler_gate_wait_seconds", "Seconds a download waited for its site's politeness gate.", labels=["site"]
        )
        for site, counts in sorted(counters.items()):
            for (kind, outcome, status), n in sorted(counts.requests.items()):
                requests.add_metric([site, kind, outcome, status], n)
            for kind, n in sorted(counts.bytes.items()):
                body_bytes.add_metric([site, kind], n)
            for kind, histogram in sorted(counts.durations.items()):
                durations.add_metric([site, kind], histogram.buckets(), histogram.sum)
            if any(counts.gate_wait.counts):
                gate_wait.add_metric([site], counts.gate_wait.buckets(), counts.gate_wait.sum)
        yield from (requests, body_bytes, durations, gate_wait)

    def _bad_fields(self, counters: Mapping[str, _SiteCounters]) -> Metric:
        """How many fields of each site's metrics hash this scrape skipped; a warning the first time one is met."""
        bad = GaugeMetricFamily(
            "crawler_metrics_bad_fields",
            "Fields of the site's metrics hash that do not parse, skipped by the scrape (written by hand?).",
            labels=["site"],
        )
        for site, counts in sorted(counters.items()):
            bad.add_metric([site], counts.bad)
            new = [name for name in counts.bad_names if (site, name) not in self._warned]
            if new:
                self._warned.update((site, name) for name in new)
                log.warning("metrics scrape: %s: skipped fields that do not parse: %s", site, ", ".join(sorted(new)))
        return bad

    def _site_gauges(self, statuses: list[SiteStatus], live: Mapping[str, dict[str, str]]) -> Iterator[Metric]:
        labels = ["site"]
        queued = GaugeMetricFamily(
            "crawler_queue_depth", "Downloads queued: compact frontier and RQ queue.", labels=labels
        )
        in_flight = GaugeMetricFamily("crawler_in_flight", "Downloads being run.", labels=labels)
        retries = GaugeMetricFamily("crawler_retries_waiting", "Downloads waiting for a delayed retry.", labels=labels)
        items = CounterMetricFamily("crawler_items", "Items upserted (re-parses count again).", labels=labels)
        interval = GaugeMetricFamily(
            "crawler_site_interval_seconds", "Seconds between two requests to the site.", labels=labels
        )
        paused = GaugeMetricFamily("crawler_site_paused", "1 if the site is paused (crawler pause).", labels=labels)
        for status in statuses:
            site = [status.site]
            queued.add_metric(site, status.queued)
            in_flight.add_metric(site, status.in_flight)
            retries.add_metric(site, status.scheduled)
            items.add_metric(site, status.items)
            values = live[status.site]
            held, _ = check_live(values)  # a value written by hand that does not hold is not shown
            seconds = held.get("interval")
            if status.site in self.spiders and self.settings is not None:
                seconds = resolve_policy(self.spiders[status.site], self.settings, values).interval
            if seconds is not None:
                interval.add_metric(site, seconds)
            paused.add_metric(site, 1 if held.get("paused") else 0)
        yield from (queued, in_flight, retries, items, interval, paused)


class ShardedMetrics(Collector):
    """The metrics of several shards in one scrape: each family once, each sample labelled ``shard``.

    ``collectors``: each shard's name and ``MetricsCollector``. A site lives on one shard, so
    its samples come once; the fleet-wide ones (``crawler_redis_up``, the parse backlog, the
    workers) come once a shard.
    """

    def __init__(self, collectors: list[tuple[str, MetricsCollector]]):
        self.collectors = collectors

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for shard, collector in self.collectors:
            for family in collector.collect():
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                into.samples += [sample._replace(labels={**sample.labels, "shard": shard}) for sample in family.samples]
        yield from merged.values()

    def close(self) -> None:
        for _, collector in self.collectors:
            collector.close()


def serve(collector: Collector, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> Any:
    """Serve ``collector`` at ``http://host:port/metrics`` from a daemon thread; returns the server.

    Stop it with ``server.shutdown()`` and ``server.server_close()``; ``server.server_port``
    is the port bound (useful with port 0). ConfigError when the address cannot be bound
    (in use, not ours, unknown host).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ConfigError(f"cannot serve metrics on {address(host, port)}: {reason}") from None
    return server


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
