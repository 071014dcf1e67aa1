"""A site's fetch statistics from the ``fetches`` table: latency, statuses, rate, slowest pages."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from .store import Store


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


def site_stats(store: Store, site: str, slowest: int = 5) -> SiteStats:
    """Summarize ``site``'s download records."""
    rows = [r for r in store.fetch_rows(site) if r["kind"] == "download"]
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


def _minute(moment: datetime) -> str:
    if moment.tzinfo is None:  # SQLite hands back naive UTC
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
