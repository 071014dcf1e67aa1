"""``status`` and ``failed`` read at 80 columns on a terminal and come out as plain rows in a pipe."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from rich.console import Console

from crawler.ops.failures import FailedPage
from crawler.ops.screens import FAILED_COLUMNS, STATUS_COLUMNS, print_failed, print_status
from crawler.ops.status import ParseBacklog, SiteStatus

LONG_URL = "http://books.example.com/catalogue/category/books/historical-fiction_4/a-very-long-title_998/index.html"
TRACEBACK = (
    'Traceback (most recent call last):\n  File "sites/shop.py", line 9, in parse_product\n'
    "    price = page.css_first(\".price\").text()\nAttributeError: 'NoneType' object has no attribute "
    "'text'\n"
)


def statuses() -> list[SiteStatus]:
    busy = SiteStatus(
        "books-historical",
        queued=123456,
        in_flight=16,
        scheduled=42,
        fetched=9876543,
        parsed=9876000,
        failed=1234,
        refused=56,
        items=19750000,
        refreshes=1000,
        rate=12.5,
        interval=0.25,
        interval_source="config",
        paused=False,
    )
    idle = SiteStatus("quotes", 0, 0, 0, 40, 40, 0, 0, 130, interval=1.0, interval_source="spider", paused=True)
    return [busy, idle]


def pages() -> list[FailedPage]:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return [
        FailedPage("books", LONG_URL, "parse", 200, 1, when, TRACEBACK, "parse_product"),
        FailedPage(
            "books",
            "http://books.example.com/x[1]",
            "download",
            None,
            4,
            when,
            "ConnectError: connection refused (gave up after 4 attempts)",
            "parse",
        ),
    ]


def terminal(width: int) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=width, color_system=None), out


def pipe() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=80)
    assert not console.is_terminal
    return console, out


BACKLOG = ParseBacklog(queued=7, in_flight=2)
HOSTS = {"machine-a": {"busy": 2, "idle": 1}}


def test_status_at_80_columns_is_one_block_per_site_with_every_value_whole() -> None:
    console, out = terminal(80)
    print_status(console, statuses(), BACKLOG, HOSTS)
    text = out.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert "…" not in text
    assert lines[:3] == [
        "books-historical  running, interval 0.25 s (config), 12.50 req/s (1 min)",
        "  queued 123456, in flight 16, retrying 42, refreshes 1000",
        "  fetched 9876543, parsed 9876000, items 19750000, failed 1234, refused 56",
    ]
    assert lines[3].startswith("quotes  paused, interval 1 s (spider), - req/s")
    assert "pages to parse (all sites): 7 queued, 2 in flight" in lines
    assert "workers on machine-a: 2 busy, 1 idle" in lines


def test_status_on_a_wide_terminal_is_a_table() -> None:
    console, out = terminal(200)
    print_status(console, statuses(), BACKLOG, HOSTS)
    lines = out.getvalue().splitlines()
    assert "req/s (1 min)" in lines[0] and "refreshes" in lines[0]
    (row,) = [line for line in lines if line.strip().startswith("books-historical")]
    assert row.split() == [
        "books-historical",
        "123456",
        "16",
        "42",
        "1000",
        "9876543",
        "9876000",
        "19750000",
        "1234",
        "56",
        "12.50",
        "0.25",
        "config",
        "running",
    ]


def test_status_in_a_pipe_is_tab_separated_rows_under_a_header() -> None:
    console, out = pipe()
    print_status(console, statuses(), BACKLOG, HOSTS)
    lines = out.getvalue().splitlines()
    assert lines[0].split("\t") == list(STATUS_COLUMNS)
    assert lines[1].split("\t") == [
        "books-historical",
        "123456",
        "16",
        "42",
        "1000",
        "9876543",
        "9876000",
        "19750000",
        "1234",
        "56",
        "12.50",
        "0.25",
        "config",
        "running",
    ]
    assert lines[2].split("\t") == [
        "quotes",
        "0",
        "0",
        "0",
        "0",
        "40",
        "40",
        "130",
        "0",
        "0",
        "-",
        "1",
        "spider",
        "paused",
    ]
    assert lines[3] == ""  # the rows end at the first blank line
    assert lines[4] == "pages to parse (all sites): 7 queued, 2 in flight"


def test_suspended_workers_show_in_every_site_s_state() -> None:
    console, out = pipe()
    print_status(console, statuses(), BACKLOG, HOSTS, suspended=True)
    lines = out.getvalue().splitlines()
    assert [line.split("\t")[-1] for line in lines[1:3]] == ["suspended", "suspended"]
    assert "workers suspended (`rq suspend`): none takes a job until `rq resume`" in lines


def test_failed_at_80_columns_keeps_each_url_whole_on_its_line() -> None:
    console, out = terminal(80)
    print_failed(console, pages(), show_error=False)
    lines = out.getvalue().splitlines()
    assert len(LONG_URL) > 80
    assert lines[:3] == [
        LONG_URL,
        "  books, parse failed, HTTP 200, attempt 1, 2026-01-02 03:04:05 UTC",
        "  AttributeError: 'NoneType' object has no attribute 'text'",
    ]
    assert lines[3] == ""
    assert lines[4:] == [
        "http://books.example.com/x[1]",
        "  books, download failed, attempt 4, 2026-01-02 03:04:05 UTC",
        "  ConnectError: connection refused (gave up after 4 attempts)",
    ]


def test_failed_in_a_pipe_is_one_tab_separated_row_per_page() -> None:
    console, out = pipe()
    print_failed(console, pages(), show_error=False)
    lines = out.getvalue().splitlines()
    assert lines[0].split("\t") == list(FAILED_COLUMNS)
    assert lines[1].split("\t") == [
        "books",
        LONG_URL,
        "parse",
        "200",
        "1",
        "2026-01-02 03:04:05",
        "AttributeError: 'NoneType' object has no attribute 'text'",
    ]
    assert lines[2].split("\t")[:4] == ["books", "http://books.example.com/x[1]", "download", "-"]
    assert len(lines) == 3


def test_failed_with_traceback_prints_each_whole_error_after_the_list() -> None:
    console, out = pipe()
    print_failed(console, pages(), show_error=True)
    text = out.getvalue()
    assert f"books {LONG_URL} (parse):\n{TRACEBACK}" in text


def test_status_prints_names_from_redis_as_text_never_as_markup() -> None:
    site = "shop[/x]"  # a site name and a host name read from Redis, written by anyone
    status = SiteStatus(site, 1, 0, 0, 1, 1, 0, 0, 1, interval=1.0, interval_source="spider", cache_hits=3)
    for width in (80, 200):
        console, out = terminal(width)
        print_status(console, [status], BACKLOG, {"host[/bold]": {"busy": 1}})
        text = out.getvalue()
        assert "development cache: shop[/x] 3 hits" in text
        assert "workers on host[/bold]: 1 busy" in text
