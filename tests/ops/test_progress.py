"""While ``crawler crawl`` runs: progress and ETA over both stages, and the first callback error of each kind once."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from redis import Redis

from crawler.cli.app import cli
from crawler.demo import ShopSite
from crawler.ops.progress import ErrorWatch, Progress, eta, exception_name
from crawler.ops.status import ParseBacklog, SiteStatus
from crawler.store.database import FAILED, OK, FetchRecord, Store, utcnow


def status(queued: int = 0, in_flight: int = 0, fetched: int = 0, parsed: int = 0) -> SiteStatus:
    return SiteStatus("demo", queued, in_flight, 0, fetched, parsed, 0, 0, 0)


def test_eta_while_only_parses_are_left_is_unknown_until_something_is_parsed_never_zero() -> None:
    downloads_done = status(fetched=100, parsed=90)
    backlog = ParseBacklog(queued=9, in_flight=1)
    assert eta(downloads_done, backlog, download_rate=0.0, parse_rate=0.0) is None
    assert eta(downloads_done, backlog, download_rate=0.0, parse_rate=2.0) == 5.0
    assert eta(status(fetched=100, parsed=100), ParseBacklog(0, 0), 0.0, 0.0) == 0.0


def test_eta_is_set_by_the_slower_stage() -> None:
    s = status(queued=20, fetched=10, parsed=5)
    backlog = ParseBacklog(queued=5, in_flight=0)
    assert eta(s, backlog, download_rate=10.0, parse_rate=100.0) == 2.0  # downloads: 20 / 10
    assert eta(s, backlog, download_rate=10.0, parse_rate=1.0) == 25.0  # parses: (5 + 20) / 1


def test_progress_rates_count_downloads_and_parses() -> None:
    progress = Progress()
    (first,) = progress.update([status(queued=10)], ParseBacklog(0, 0))
    assert (first.download_rate, first.parse_rate, first.eta) == (0.0, 0.0, None)
    time.sleep(0.6)
    (later,) = progress.update([status(queued=4, fetched=6, parsed=3)], ParseBacklog(3, 0))
    assert 6 < later.download_rate < 11 and 3 < later.parse_rate < 6
    assert later.to_parse == 3
    assert later.eta == pytest.approx(max(4 / later.download_rate, 7 / later.parse_rate))


def test_progress_rates_stay_steady_while_counts_arrive_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("crawler.ops.progress.time.monotonic", lambda: clock[0])
    progress = Progress()
    rates = []
    for tick in range(40):  # 10 s, sampled 4 times a second; 100 pages written at each whole second
        clock[0] = 1000.0 + tick / 4
        (snapshot,) = progress.update([status(queued=10_000, fetched=100 * (tick // 4))], ParseBacklog(0, 0))
        rates.append(snapshot.download_rate)
    assert all(80 <= rate <= 125 for rate in rates[20:]), rates  # a steady 100/s, once the window is full


def record_failure(database_url: str, url: str, error: str, site: str = "demo") -> None:
    store = Store(database_url)
    store.record_fetches(
        [FetchRecord(site, url, FAILED, utcnow(), utcnow(), kind="parse", error=error, callback="parse_product")]
    )
    store.close()


def traceback_of(line: str) -> str:
    return f'Traceback (most recent call last):\n  File "sites/shop.py", line 9, in parse_product\n{line}\n'


def test_error_watch_tells_the_first_error_of_each_kind_once(sqlite_url: str) -> None:
    record_failure(sqlite_url, "http://127.0.0.1:9/old", traceback_of("KeyError: 'before'"))
    watch = ErrorWatch(sqlite_url, ["demo"])
    assert list(watch.poll()) == []  # what failed before the crawl started is not news

    record_failure(sqlite_url, "http://127.0.0.1:9/p/1", traceback_of("ValueError: no price"))
    record_failure(sqlite_url, "http://127.0.0.1:9/p/2", traceback_of("ValueError: no price"))
    record_failure(sqlite_url, "http://127.0.0.1:9/x", traceback_of("ValueError: other"), site="other")
    store = Store(sqlite_url)
    store.record_fetches([FetchRecord("demo", "http://127.0.0.1:9/ok", OK, utcnow(), utcnow(), kind="parse")])
    store.close()
    assert list(watch.poll()) == [
        "error: demo: ValueError: no price",
        "  at http://127.0.0.1:9/p/1 (parse_product); the whole error: crawler failed demo --traceback",
    ]
    record_failure(sqlite_url, "http://127.0.0.1:9/p/3", traceback_of("ValueError: no price on p/3"))
    record_failure(sqlite_url, "http://127.0.0.1:9/p/4", traceback_of("AttributeError: 'NoneType' has no 'text'"))
    assert list(watch.poll()) == [
        "error: demo: AttributeError: 'NoneType' has no 'text'",
        "  at http://127.0.0.1:9/p/4 (parse_product); the whole error: crawler failed demo --traceback",
    ]
    assert list(watch.poll()) == []
    assert list(watch.closing_lines()) == ["demo: 2 more callback errors of the kinds shown: crawler failed demo"]


def test_exception_name() -> None:
    assert exception_name("ValueError: could not convert string to float: 'x'") == "ValueError"
    assert exception_name("json.decoder.JSONDecodeError: Expecting value") == "json.decoder.JSONDecodeError"
    assert exception_name("HTTP 500 (gave up after 4 attempts)") == "HTTP 500 (gave up after 4 attempts)"


BROKEN = """
from crawler import Spider


class Broken(Spider):
    name = "broken"
    allowed_domains = ["127.0.0.1"]
    interval = 0.01

    def parse(self, page):
        yield from page.follow_all("li.prod a", callback=self.parse_product)

    def parse_product(self, page):
        return {"price": float(page.text(".no-such-class"))}
"""


def test_crawl_prints_the_first_callback_error_of_each_kind_once(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "broken.py").write_text(BROKEN)
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]
    with ShopSite(products=5, faults=False) as shop:
        result = CliRunner().invoke(
            cli, [*base, "crawl", "broken", f"{shop.url}/products?page=1", "-n", "1", "--threads", "1"]
        )
    assert result.exit_code == 0, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: broken: ValueError: could not convert string to float: ''"]
    assert "(parse_product); the whole error: crawler failed broken --traceback" in result.stderr
    assert "broken: 4 more callback errors of the kinds shown: crawler failed broken" in result.stderr
    assert "broken: 6 fetched, 1 parsed, 0 items, 5 failed, 0 refused" in result.stdout
