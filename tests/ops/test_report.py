"""``crawler stats SITE --plot FILE``: the HTML report (inline SVG) and the PNG (matplotlib).

A real SQLite store holds a known crawl of 4 minutes; the charts drawn from it are parsed
back (bars, points, lines, labels) and the PNG's header and pixels are read.
"""

from __future__ import annotations

import struct
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from crawling import assert_one_line_error
from selectolax.lexbor import LexborHTMLParser

from crawler.cli.app import cli
from crawler.errors import ConfigError
from crawler.ops.charts import (
    NEEDS_MATPLOTLIB,
    check_plot_path,
    nice_ticks,
    render_html,
    site_reports,
    time_ticks,
    write_report,
)
from crawler.ops.stats import site_stats
from crawler.store.database import FAILED, OK, REDIRECT, RETRY, FetchRecord, Store

START = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)
ODD_URL = "http://shop/?q=<b>bold</b>&x=1"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

GOOD_SPIDER = """
from crawler import Spider


class Good(Spider):
    name = "good"
    start_urls = ["http://good.example/"]

    def parse(self, page):
        return []
"""


def download(
    site: str, second: float, outcome: str, status: int | None, elapsed: float, url: str | None = None
) -> FetchRecord:
    started = START + timedelta(seconds=second)
    return FetchRecord(
        site=site,
        url=url or f"http://shop/{second}",
        outcome=outcome,
        started=started,
        finished=started + timedelta(seconds=elapsed),
        status=status,
        elapsed=elapsed,
    )


def crawl(site: str = "demo") -> list[FetchRecord]:
    """Requests from 12:00:01 to 12:04:01, so 25 buckets of 10 s (12:00:00 to 12:04:00).

    One ok download a bucket except in buckets 12 (a timeout only), 15 and 16 (nothing);
    retries in buckets 3 and 7; a redirect in bucket 20; and a parse, which is no download.
    """
    rows = [download(site, 10 * k + 1, OK, 200, 0.05 * (k % 4 + 1)) for k in range(25) if k not in (12, 15, 16)]
    rows += [download(site, 35, RETRY, 503, 1.0), download(site, 75, RETRY, 503, 1.0)]
    rows += [download(site, 125, FAILED, None, 30.0, url=ODD_URL), download(site, 206, REDIRECT, 301, 0.01)]
    parse = download(site, 100, OK, 200, 9.0)
    parse.kind = "parse"
    return [*rows, parse]


@pytest.fixture
def store(sqlite_url: str) -> Iterator[Store]:
    store = Store(sqlite_url)
    store.record_fetches(crawl())
    yield store
    store.close()


@pytest.fixture
def page(store: Store) -> LexborHTMLParser:
    return LexborHTMLParser(render_html(site_reports(store, ["demo"])))


# -- the HTML report ----------------------------------------------------------------------------


def test_html_has_one_bar_per_outcome_and_bucket_stacked_from_the_axis(page: LexborHTMLParser) -> None:
    bars = page.css("svg.requests rect.bar")
    kinds = [bar.attributes["class"].split()[1] for bar in bars]
    assert (kinds.count(OK), kinds.count(RETRY), kinds.count(FAILED), kinds.count("other")) == (22, 2, 1, 1)
    assert len(bars) == 26
    # Bucket 3 (12:00:30): its retry sits on its ok download, which stands on the axis;
    # the y axis runs to 2 requests, so one request is half the plot's height.
    ok, retry = [bar for bar in bars if "12:00:30 UTC" in bar.css_first("title").text()]
    assert ok.attributes["class"] == "bar ok" and retry.attributes["class"] == "bar retry"
    ok_top, ok_height = float(ok.attributes["y"]), float(ok.attributes["height"])
    assert ok_top + ok_height == pytest.approx(234.0, abs=0.1)  # the x axis
    assert float(retry.attributes["y"]) + float(retry.attributes["height"]) == pytest.approx(ok_top, abs=0.1)
    assert ok_height == pytest.approx((234 - 40) / 2, abs=0.1)
    assert [t.text() for t in page.css("svg.requests text.tick.y")] == ["0", "1", "2"]


def test_html_latency_chart_has_a_point_per_answered_bucket_and_breaks_at_gaps(page: LexborHTMLParser) -> None:
    for name in ("p50", "p95"):
        assert len(page.css(f"svg.latency circle.{name}")) == 22  # not buckets 12 (timeout only), 15, 16
        runs = page.css(f"svg.latency polyline.{name}")
        assert [len(run.attributes["points"].split()) for run in runs] == [12, 2, 8]
    # Bucket 3 holds an ok download of 200 ms and a 503 of 1 s: nearest-rank p50 and p95.
    labels = [c.css_first("title").text() for c in page.css("svg.latency circle")]
    assert "2026-11-21 12:00:30 UTC: p50 200 ms" in labels and "2026-11-21 12:00:30 UTC: p95 1000 ms" in labels
    assert [t.text() for t in page.css("svg.latency text.tick.y")] == ["0", "200", "400", "600", "800", "1000"]


def test_html_has_a_title_with_the_time_range_axis_labels_and_the_summary(store: Store, page: LexborHTMLParser) -> None:
    assert page.css_first("h2").text() == "demo: 2026-11-21 12:00:01 to 12:04:01 UTC"
    assert [t.text() for t in page.css("svg.requests text.tick.x")] == ["12:00", "12:01", "12:02", "12:03", "12:04"]
    assert [t.text() for t in page.css("svg text.label.x")] == ["time (UTC)", "time (UTC)"]
    assert [t.text() for t in page.css("svg text.label.y")] == ["requests / 10 s", "latency (ms)"]
    assert [t.text() for t in page.css("svg.requests text.key")] == [OK, RETRY, FAILED, "other"]
    assert [t.text() for t in page.css("svg.latency text.key")] == ["p50", "p95"]
    summary = page.css_first("p.summary").text()
    stats = site_stats(store, "demo")
    lat = stats.latency
    assert f"{stats.downloads} downloads" in summary and stats.downloads == 26
    assert (
        f"p50 {lat['p50'] * 1000:.0f} ms, p90 {lat['p90'] * 1000:.0f} ms" in summary.replace("\n", " ")
        and f"max {lat['max'] * 1000:.0f} ms" in summary
    )
    assert "statuses: none 1, 200 22, 301 1, 503 2" in summary and "one bucket = 10 s" in summary


def test_html_is_self_contained_and_escapes_what_it_shows(page: LexborHTMLParser) -> None:
    assert not page.css("script, link, img, iframe, [src], [href]")
    assert not page.css("b")  # the URL's markup is shown as text, not parsed
    assert page.css_first("table.slowest td").text() == ODD_URL  # the 30 s timeout, slowest first
    for svg in page.css("svg.chart"):
        ET.fromstring(svg.html)  # each chart is well-formed XML, so it also stands as an .svg file


def test_html_of_several_sites_has_a_section_each(store: Store) -> None:
    store.record_fetches(crawl("good"))
    page = LexborHTMLParser(render_html(site_reports(store, ["good", "demo"])))
    assert [h.text().split(":")[0] for h in page.css("h2")] == ["good", "demo"]
    assert len(page.css("svg.chart")) == 4
    assert page.css_first("title").text() == "Crawl report: good, demo"


def test_a_site_without_downloads_has_no_report(store: Store) -> None:
    with pytest.raises(ConfigError, match="no downloads recorded for site 'empty'"):
        site_reports(store, ["empty"])


@pytest.mark.parametrize(
    ("peak", "whole", "ticks"),
    [
        (0, False, [0, 1]),
        (2, True, [0, 1, 2]),
        (7, True, [0, 2, 4, 6, 8]),
        (1000, False, [0, 200, 400, 600, 800, 1000]),
        (0.9, False, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (12, False, [0, 2.5, 5, 7.5, 10, 12.5]),
        (13, False, [0, 5, 10, 15]),
    ],
)
def test_axis_ticks_are_round_and_cover_the_peak(peak: float, whole: bool, ticks: list[float]) -> None:
    assert nice_ticks(peak, whole=whole) == (ticks, ticks[-1])


def test_time_ticks_fall_on_round_times_and_show_the_date_past_a_day() -> None:
    noon = START.timestamp()
    assert [label for _, label in time_ticks(noon - 3, noon + 12)] == [
        "11:59:58",
        "12:00:00",
        "12:00:02",
        "12:00:04",
        "12:00:06",
        "12:00:08",
        "12:00:10",
        "12:00:12",
    ]
    assert [label for _, label in time_ticks(noon, noon + 3 * 86400)][:2] == ["11-21 12:00", "11-22 00:00"]


# -- the PNG report -----------------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def pixels_of(path: Path, color: str) -> int:
    """How many pixels of ``path`` have ``color`` (``#rrggbb``)."""
    from matplotlib.image import imread

    image = imread(path)[:, :, :3]
    wanted = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return int((abs(image - wanted) < 0.02).all(axis=2).sum())


@pytest.mark.slow
def test_png_report_is_a_png_of_the_expected_size_with_the_bars_drawn(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "demo.png"
    write_report(path, site_reports(store, ["demo"]))
    assert png_size(path) == (1100, 700)
    assert pixels_of(path, "#009e73") > 2000  # ok bars
    assert pixels_of(path, "#d55e00") > 50  # the failed bar


@pytest.mark.slow
def test_png_report_of_two_sites_is_twice_as_tall(store: Store, tmp_path: Path) -> None:
    store.record_fetches(crawl("good"))
    path = tmp_path / "both.png"
    write_report(path, site_reports(store, ["demo", "good"]))
    assert png_size(path) == (1100, 1400)


def test_png_without_matplotlib_is_refused_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails, as when not installed
    with pytest.raises(ConfigError) as caught:
        check_plot_path("out.png")
    assert str(caught.value) == NEEDS_MATPLOTLIB and "crawler[plot]" in NEEDS_MATPLOTLIB
    assert check_plot_path("out.HTML") == ".html"


# -- the command --------------------------------------------------------------------------------


@pytest.fixture
def invoke(redis_url: str, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "good.py").write_text(GOOD_SPIDER)
    monkeypatch.chdir(tmp_path)
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]
    runner = CliRunner()
    yield lambda *args: runner.invoke(cli, [*base, "stats", *args])


def fill_database(sqlite_url: str, *sites: str) -> None:
    store = Store(sqlite_url)
    store.record_fetches([row for site in sites for row in crawl(site)])
    store.close()


def test_stats_plot_writes_an_html_report(invoke, sqlite_url: str, tmp_path: Path) -> None:
    fill_database(sqlite_url, "demo")
    result = invoke("demo", "--plot", "report.html")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "wrote report.html: demo"
    page = LexborHTMLParser((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert len(page.css("svg.requests rect.bar")) == 26


@pytest.mark.slow
def test_stats_plot_writes_a_png(invoke, sqlite_url: str, tmp_path: Path) -> None:
    fill_database(sqlite_url, "demo")
    result = invoke("demo", "--plot", "report.png")
    assert result.exit_code == 0, result.output
    assert png_size(tmp_path / "report.png") == (1100, 700)


def test_stats_plot_of_a_comma_list_or_all_sites(invoke, sqlite_url: str, tmp_path: Path) -> None:
    fill_database(sqlite_url, "demo", "good", "retired")  # retired: downloads recorded, spider gone
    listed = invoke("good,demo", "--plot", "two.html")
    assert listed.exit_code == 0, listed.output
    two = LexborHTMLParser((tmp_path / "two.html").read_text(encoding="utf-8"))
    assert [h.text().split(":")[0] for h in two.css("h2")] == ["good", "demo"]
    every = invoke("all", "--plot", "all.html")
    assert every.exit_code == 0, every.output
    assert every.stdout.strip() == "wrote all.html: demo, good, retired"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["demo", "--plot", "report.svg"], "--plot FILE must end in .html or .png, not 'report.svg'"),
        (["demo", "--plot", "report"], "must end in .html or .png"),
        (["nosuch", "--plot", "report.html"], "unknown site 'nosuch'"),
        (["demo,nosuch", "--plot", "report.html"], "unknown site 'nosuch'"),
        (["good", "--plot", "report.html"], "no downloads recorded for site 'good': nothing to plot"),
        (["demo", "--plot", "no/such/dir/report.html"], "cannot write 'no/such/dir/report.html'"),
        (["demo", "--plot", "report.html", "--json"], "give --json or --plot, not both"),
    ],
    ids=["svg", "no-suffix", "unknown-site", "unknown-in-list", "empty-site", "unwritable", "with-json"],
)
def test_stats_plot_bad_input_is_one_line_error(
    invoke, sqlite_url: str, tmp_path: Path, args: list[str], error: str
) -> None:
    fill_database(sqlite_url, "demo")
    assert_one_line_error(invoke(*args), error)
    assert not list(tmp_path.glob("report*"))


def test_stats_plot_of_all_with_an_empty_database_is_one_line_error(invoke) -> None:
    assert_one_line_error(invoke("all", "--plot", "report.html"), "no downloads recorded for any site")


def test_stats_plot_png_without_matplotlib_is_one_line_error(
    invoke, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_database(sqlite_url, "demo")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert_one_line_error(invoke("demo", "--plot", "report.png"), "pip install 'crawler[plot]'")
    assert not (tmp_path / "report.png").exists()
