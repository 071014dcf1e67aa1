"""``crawler stats``: latency percentiles, statuses, pages per minute, slowest pages; the time
series ``--plot`` draws (downloads per bucket by outcome, p50/p95 latency per bucket)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from crawler.cli.app import cli
from crawler.ops import stats as stats_module
from crawler.ops.stats import (
    bucket_seconds,
    percentile,
    recent_rates,
    site_stats,
    sites_with_downloads,
    time_series,
)
from crawler.store.database import FAILED, OK, REDIRECT, REFUSED, RETRY, SKIPPED, FetchRecord, Store

START = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)


def record(i: int, elapsed: float, status: int | None, outcome: str, kind: str = "download") -> FetchRecord:
    finished = START + timedelta(seconds=20 * i)
    return FetchRecord(
        site="demo",
        url=f"http://shop/{i}",
        outcome=outcome,
        started=finished - timedelta(seconds=1),
        finished=finished,
        kind=kind,
        status=status,
        elapsed=elapsed,
    )


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
    assert stats.per_minute == [
        ("2026-11-21 12:00", 3),
        ("2026-11-21 12:01", 3),
        ("2026-11-21 12:02", 3),
        ("2026-11-21 12:03", 3),
    ]
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


# -- the time series of --plot ---------------------------------------------------------------


def test_time_series_counts_each_download_in_the_bucket_its_request_started_in(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    fill(store)
    rows = store.fetch_rows("demo")  # from the database, so SQLite's naive datetimes are handled
    store.close()
    series = time_series("demo", rows, size=60)
    # Requests start at 11:59:59 + 20 s * i: one in the minute before noon, then three a minute.
    assert [b.start for b in series.buckets] == [START + timedelta(minutes=m) for m in range(-1, 4)]
    assert [b.requests for b in series.buckets] == [
        {OK: 1, RETRY: 0, FAILED: 0, "other": 0},
        {OK: 3, RETRY: 0, FAILED: 0, "other": 0},
        {OK: 3, RETRY: 0, FAILED: 0, "other": 0},
        {OK: 3, RETRY: 0, FAILED: 0, "other": 0},
        {OK: 0, RETRY: 1, FAILED: 1, "other": 0},  # the parse record in this minute is not a download
    ]
    # Latency of answered downloads only: the timeout (no status) in the last minute is left out.
    assert [(b.p50, b.p95) for b in series.buckets] == [
        (0.01, 0.01),
        (0.03, 0.04),
        (0.06, 0.07),
        (0.09, 0.1),
        (2.5, 2.5),
    ]
    assert (series.first, series.last) == (START - timedelta(seconds=1), START + timedelta(seconds=220))


def test_time_series_picks_buckets_that_give_a_short_crawl_at_least_twenty_points(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    fill(store)
    rows = store.fetch_rows("demo")
    store.close()
    series = time_series("demo", rows)  # starts span 220 s: 10 s buckets give 22 points, 15 s only 14
    assert series.bucket_seconds == 10
    assert series.buckets[0].start == START - timedelta(seconds=10)  # buckets start on whole multiples
    assert len(series.buckets) == 23  # empty buckets between the requests are kept, as zeros
    busy = [i for i, b in enumerate(series.buckets) if sum(b.requests.values())]
    assert busy == list(range(0, 23, 2))
    assert series.buckets[1].requests == {OK: 0, RETRY: 0, FAILED: 0, "other": 0}
    assert (series.buckets[1].p50, series.buckets[1].p95) == (None, None)


def test_time_series_p95_is_the_nearest_rank_and_rare_outcomes_count_as_other() -> None:
    rows = [
        {
            "kind": "download",
            "outcome": OK,
            "status": 200,
            "elapsed": float(v),
            "started": START + timedelta(seconds=v),
            "finished": START + timedelta(seconds=v + 1),
        }
        for v in range(1, 21)
    ]
    rows += [
        {"kind": "download", "outcome": outcome, "status": None, "elapsed": 0.5, "started": START, "finished": START}
        for outcome in (REDIRECT, REFUSED, SKIPPED)
    ]
    (bucket,) = time_series("shop", rows, size=60).buckets
    assert bucket.requests == {OK: 20, RETRY: 0, FAILED: 0, "other": 3}
    assert (bucket.p50, bucket.p95) == (10.0, 19.0)  # of 1..20: the 10th and the 19th value, not the max


def test_time_series_of_no_downloads_is_an_error() -> None:
    parse = {"kind": "parse", "outcome": OK, "status": 200, "elapsed": 0.1, "started": START, "finished": START}
    with pytest.raises(ValueError, match="no downloads recorded for site 'shop'"):
        time_series("shop", [parse])


@pytest.mark.parametrize(
    ("span", "size"),
    [
        (0, 1),
        (19, 1),
        (40, 2),
        (599, 15),
        (600, 30),
        (1199, 30),  # short: at least 20 points, 1 s at the least
        (1200, 60),
        (6 * 3600 - 1, 60),  # a minute from 20 minutes to 6 hours
        (6 * 3600, 120),
        (30 * 3600, 600),
        (10**9, 86400),  # long: under 360 points, a day at the most
    ],
)
def test_bucket_size_is_a_minute_unless_the_crawl_is_short_or_long(span: float, size: int) -> None:
    assert bucket_seconds(span) == size


def test_sites_with_downloads_leaves_out_sites_with_parses_only(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    fill(store)
    store.record_fetches(
        [
            FetchRecord(site="other", url="http://o/", outcome=OK, started=START, finished=START, kind="parse"),
            FetchRecord(site="alpha", url="http://a/", outcome=FAILED, started=START, finished=START),
        ]
    )
    assert sites_with_downloads(store) == ["alpha", "demo"]
    store.close()


@pytest.mark.parametrize("named", [100, 1], ids=["sites named to the database", "every site counted, some kept"])
def test_recent_rates_count_the_last_minutes_downloads_of_the_sites_asked_for_only(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, named: int
) -> None:
    monkeypatch.setattr(stats_module, "RATES_NAMED", named)
    now = datetime.now(UTC)
    rows = [
        FetchRecord(site=site, url=f"http://{site}/{i}", outcome=OK, started=at, finished=at, kind=kind)
        for i, (site, at, kind) in enumerate(
            [("a", now, "download")] * 3
            + [("a", now - timedelta(minutes=5), "download"), ("a", now, "parse"), ("b", now, "download")]
            + [("c", now, "download")] * 6
        )
    ]
    store = Store(sqlite_url)
    store.record_fetches(rows)
    try:
        assert recent_rates(store, ["a", "b", "d"]) == {"a": 3 / 60, "b": 1 / 60, "d": 0.0}
    finally:
        store.close()
