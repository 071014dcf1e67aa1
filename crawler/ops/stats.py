"""A site's fetch statistics from the ``fetches`` table: latency, statuses, rate, slowest pages.

Also the time series that ``crawler stats SITE --plot`` draws (``time_series``): downloads
per time bucket by outcome, and the latency percentiles of each bucket.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from ..store.database import FAILED, OK, RETRY, Store
from ..store.schema import fetches

#: The groups a time series counts downloads in, in stacking order; any other outcome
#: (redirect, refused, skipped) counts as ``other``.
SERIES_OUTCOMES = (OK, RETRY, FAILED, "other")

#: Bucket sizes, in seconds, a time series chooses from.
BUCKET_SIZES = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)

#: A crawl shorter than this many minutes gets buckets under a minute, so its charts keep
#: at least this many points.
MIN_POINTS = 20

#: A crawl so long that per-minute buckets would exceed this many gets longer buckets.
MAX_POINTS = 360


@dataclass
class SiteStats:
    """What ``crawler stats SITE`` shows."""

    site: str
    downloads: int
    outcomes: dict[str, int]
    statuses: dict[str, int]
    latency: dict[str, float]  # p50, p90, p99, max in seconds, of downloads that got an answer
    per_minute: list[tuple[str, int]] = field(default_factory=list)  # (minute, downloads finished)
    slowest: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, round(fraction * len(sorted_values) + 0.5 - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class Bucket:
    """One time bucket of a site's downloads (those whose request started in it)."""

    start: datetime
    requests: dict[str, int]  # SERIES_OUTCOMES -> downloads, zeros included
    p50: float | None  # seconds, of downloads that got an answer; None when none did
    p95: float | None


@dataclass
class TimeSeries:
    """A site's downloads over time in equal buckets, empty buckets included."""

    site: str
    bucket_seconds: int
    buckets: list[Bucket]
    first: datetime  # the first download's start
    last: datetime  # the last download's finish


def site_stats(store: Store, site: str, slowest: int = 5) -> SiteStats:
    """Summarize ``site``'s download records."""
    return summarize(site, download_rows(store, site), slowest)


def download_rows(store: Store, site: str) -> list[dict[str, Any]]:
    """``site``'s download records (parses left out), oldest first."""
    return [r for r in store.fetch_rows(site) if r["kind"] == "download"]


def sites_with_downloads(store: Store) -> list[str]:
    """Every site with at least one download record, sorted."""
    query = select(fetches.c.site).where(fetches.c.kind == "download").distinct().order_by(fetches.c.site)
    with store.engine.connect() as conn:
        return list(conn.scalars(query))


def summarize(site: str, rows: list[dict[str, Any]], slowest: int = 5) -> SiteStats:
    """Summarize download records (rows of ``fetches``)."""
    answered = sorted(r["elapsed"] for r in rows if r["status"] is not None and r["elapsed"] is not None)
    minutes: Counter[str] = Counter(_minute(r["finished"]) for r in rows)
    by_time = sorted((r for r in rows if r["elapsed"] is not None), key=lambda r: r["elapsed"], reverse=True)
    return SiteStats(
        site=site,
        downloads=len(rows),
        outcomes=dict(Counter(r["outcome"] for r in rows)),
        statuses={str(k): v for k, v in sorted(Counter(r["status"] or "none" for r in rows).items(), key=str)},
        latency={name: percentile(answered, q) for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}
        | {"max": answered[-1] if answered else 0.0},
        per_minute=sorted(minutes.items()),
        slowest=[{"url": r["url"], "elapsed": r["elapsed"], "status": r["status"]} for r in by_time[:slowest]],
    )


def bucket_seconds(span: float) -> int:
    """The bucket size for a crawl whose downloads started over ``span`` seconds.

    A minute, unless the crawl is shorter than MIN_POINTS minutes (then the longest size
    under a minute that still gives MIN_POINTS buckets, at least 1 s) or so long that
    minutes would give MAX_POINTS buckets or more (then the shortest size that gives fewer).
    """
    if span < 60 * MIN_POINTS:
        return max((s for s in BUCKET_SIZES if s <= 60 and span / s >= MIN_POINTS), default=BUCKET_SIZES[0])
    return next((s for s in BUCKET_SIZES if s >= 60 and span / s < MAX_POINTS), BUCKET_SIZES[-1])


def time_series(site: str, rows: Iterable[dict[str, Any]], size: int | None = None) -> TimeSeries:
    """Downloads per bucket of ``size`` seconds (``bucket_seconds`` of the span when None).

    Each download counts in the bucket its request started in; buckets start at whole
    multiples of the size since the epoch (minutes on the minute). p50 and p95 are
    nearest-rank percentiles of ``elapsed`` of the bucket's downloads that got an HTTP
    status, as ``site_stats`` counts latency. ValueError when ``rows`` holds no download.
    """
    downloads = [r for r in rows if r["kind"] == "download"]
    if not downloads:
        raise ValueError(f"no downloads recorded for site {site!r}")
    starts = [_utc(r["started"]).timestamp() for r in downloads]
    size = size or bucket_seconds(max(starts) - min(starts))
    base = int(min(starts) // size)
    counts: list[Counter[str]] = [Counter() for _ in range(int(max(starts) // size) - base + 1)]
    latencies: list[list[float]] = [[] for _ in counts]
    for row, start in zip(downloads, starts, strict=True):
        index = int(start // size) - base
        counts[index][row["outcome"] if row["outcome"] in SERIES_OUTCOMES else "other"] += 1
        if row["status"] is not None and row["elapsed"] is not None:
            latencies[index].append(row["elapsed"])
    buckets = []
    for index, (counter, values) in enumerate(zip(counts, latencies, strict=True)):
        values.sort()
        buckets.append(
            Bucket(
                start=datetime.fromtimestamp((base + index) * size, UTC),
                requests={outcome: counter[outcome] for outcome in SERIES_OUTCOMES},
                p50=percentile(values, 0.5) if values else None,
                p95=percentile(values, 0.95) if values else None,
            )
        )
    return TimeSeries(
        site=site,
        bucket_seconds=size,
        buckets=buckets,
        first=min(_utc(r["started"]) for r in downloads),
        last=max(_utc(r["finished"]) for r in downloads),
    )


def recent_rates(store: Store, sites: Iterable[str], window: float = 60.0) -> dict[str, float]:
    """Downloads per second of each site over the last ``window`` seconds (observed, not configured).

    More than ``RATES_NAMED`` sites are not named to the database: every site's downloads of the
    window are counted and the others' left out here (``crawler status`` of 10,000 sites: a query
    of 10,000 bound parameters took 25-60 ms where the window's rows, none, took none).
    """
    sites = list(sites)
    since = datetime.now(UTC) - timedelta(seconds=window)
    conditions = [fetches.c.kind == "download", fetches.c.started >= since]
    if len(sites) <= RATES_NAMED:
        conditions.append(fetches.c.site.in_(sites))
    query = select(fetches.c.site, func.count()).where(*conditions).group_by(fetches.c.site)
    with store.engine.connect() as conn:
        counts = {site: int(n) for site, n in conn.execute(query)}
    return {site: counts.get(site, 0) / window for site in sites}


#: Most sites ``recent_rates`` names in its query (``site IN (...)``); more are counted all together.
RATES_NAMED = 100


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:  # SQLite hands back naive UTC
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _minute(moment: datetime) -> str:
    return _utc(moment).strftime("%Y-%m-%d %H:%M")
