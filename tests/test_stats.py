"""``crawler stats``: latency percentiles, statuses, pages per minute, slowest pages."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from crawler.cli import cli
from crawler.stats import percentile, site_stats
from crawler.store import FAILED, OK, RETRY, FetchRecord, Store

START = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)


def record(i: int, elapsed: float, status: int | None, outcome: str, kind: str = "download") -> FetchRecord:
    finished = START + timedelta(seconds=20 * i)
    return FetchRecord(site="demo", url=f"http://shop/{i}", outcome=outcome, started=finished - timedelta(seconds=1),
                       finished=finished, kind=kind, status=status, elapsed=elapsed)


def fill(store: Store) -> None:
    rows = [record(i, elapsed=(i + 1) / 100, status=200, outcome=OK) for i in range(10)]
    rows += [record(10, elapsed=2.5, status=503, outcome=RETRY), record(11, elapsed=30.0, status=None, outcome=FAILED)]
    rows += [record(12, elapsed=9.0, status=200, outcome=OK, kind="parse")]  # parses are not downloads
    store.record_fetches(rows)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.9), percentile(values, 0.99)) == (50.0, 90.0, 99.0)
    assert percentile([], 0.5) == 0.0
    assert percentile([7.0], 0.99) == 7.0


def test_site_stats_summarizes_downloads(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    fill(store)
    stats = site_stats(store, "demo", slowest=2)
    store.close()
    assert stats.downloads == 12
    assert stats.outcomes == {OK: 10, RETRY: 1, FAILED: 1}
    assert stats.statuses == {"200": 10, "503": 1, "none": 1}
    # Latency of answered downloads only (the timeout without a status is left out).
    assert stats.latency == {"p50": 0.06, "p90": 0.1, "p99": 2.5, "max": 2.5}
    assert stats.per_minute == [("2026-11-21 12:00", 3), ("2026-11-21 12:01", 3), ("2026-11-21 12:02", 3),
                                ("2026-11-21 12:03", 3)]
    assert [row["url"] for row in stats.slowest] == ["http://shop/11", "http://shop/10"]


def test_stats_command_prints_a_summary_and_json(sqlite_url: str, redis_url: str, tmp_path: Path) -> None:
    store = Store(sqlite_url)
    fill(store)
    store.close()
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path)]
    runner = CliRunner()
    text = runner.invoke(cli, [*base, "stats", "demo"])
    assert text.exit_code == 0, text.output
    assert "12 downloads" in text.output and "p99 2500 ms" in text.output
    as_json = runner.invoke(cli, [*base, "stats", "demo", "--json"])
    assert json.loads(as_json.output)["statuses"]["503"] == 1
    unknown = runner.invoke(cli, [*base, "stats", "nosuch"])
    assert unknown.exit_code != 0 and "unknown site" in unknown.output
