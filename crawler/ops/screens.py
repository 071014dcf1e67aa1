"""What ``crawler status`` and ``crawler failed`` print: readable at 80 columns, plain in a pipe.

On a terminal: ``status`` is a table when it fits the width, else one short block per
site; ``failed`` gives each page its URL on a line of its own (never folded) and its
details indented under it. Off a terminal (a pipe, a file, CI): one tab-separated row
per site or page under a header row, every value on one line, so ``cut``, ``awk`` and
``sort`` work and the columns never change with the width.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .status import ParseBacklog, SiteStatus, state

if TYPE_CHECKING:  # not imported for ``crawler status``: the failures bring the store and HTTP
    from .failures import FailedPage

#: Columns of the plain (tab-separated) status rows, in order.
STATUS_COLUMNS = (
    "site",
    "queued",
    "in_flight",
    "retrying",
    "refreshes",
    "fetched",
    "parsed",
    "items",
    "failed",
    "refused",
    "req_per_s",
    "interval",
    "from",
    "state",
)
#: Columns of the plain (tab-separated) failed-page rows, in order.
FAILED_COLUMNS = ("site", "url", "kind", "status", "attempt", "finished_utc", "reason")


def _rate(status: SiteStatus) -> str:
    return "-" if status.rate is None else f"{status.rate:.2f}"


def _interval(status: SiteStatus) -> str:
    return f"{status.interval:g}" if status.interval else "-"


def status_row(status: SiteStatus, suspended: bool = False) -> list[str]:
    """One site's values in the order of ``STATUS_COLUMNS``."""
    s = status
    return [
        s.site,
        str(s.queued),
        str(s.in_flight),
        str(s.scheduled),
        str(s.refreshes),
        str(s.fetched),
        str(s.parsed),
        str(s.items),
        str(s.failed),
        str(s.refused),
        _rate(s),
        _interval(s),
        s.interval_why or s.interval_source or "-",
        state(s, suspended),
    ]


def plain(values: Iterable[str]) -> str:
    """Values as one tab-separated line (tabs and line breaks inside a value become spaces, runs of
    them one space; an empty value ``-``)."""
    values = [str(v) if v else "-" for v in values]
    line = "\t".join(values)
    if line.count("\t") == len(values) - 1 and not _SPACE_BUT_TAB.search(line):
        return line  # no value holds a space, tab or line break: most rows, joined once (some 40 ms at 10,000)
    return "\t".join(" ".join(v.split()) if v != "-" else v for v in values)


#: Whitespace but the tab (``str.split``'s: ``\s`` of a str pattern is ``str.isspace``).
_SPACE_BUT_TAB = re.compile(r"[^\S\t]")


def _write(console: Console, line: str) -> None:
    """``line`` as is: rich would expand its tabs to spaces."""
    _write_lines(console, [line])


def _write_lines(console: Console, lines: Iterable[str]) -> None:
    """``lines``, each as is (``_write``), written and flushed together."""
    console.file.write("".join(line + "\n" for line in lines))
    console.file.flush()


def print_status(
    console: Console,
    statuses: Sequence[SiteStatus],
    parsing: ParseBacklog,
    hosts: dict[str, dict[str, int]],
    suspended: bool = False,
) -> None:
    """``crawler status``: the sites, then the parse backlog and the workers per host."""
    if not console.is_terminal:
        rows = [plain(status_row(s, suspended)) for s in statuses]
        _write_lines(console, [plain(STATUS_COLUMNS), *rows, ""])
    else:
        table = _status_table(statuses, suspended)
        if _natural_width(console, table) <= console.width:
            console.print(table)
        else:
            for s in statuses:
                _status_block(console, s, suspended)
    cached = [s for s in statuses if s.cache_hits or s.cache_misses]
    if cached:
        console.print(
            "development cache: " + ", ".join(f"{s.site} {s.cache_hits} hits, {s.cache_misses} misses" for s in cached),
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    if suspended:
        console.print("workers suspended (`rq suspend`): none takes a job until `rq resume`", highlight=False)
    console.print(
        f"pages to parse (all sites): {parsing.queued} queued, {parsing.in_flight} in flight",
        highlight=False,
        markup=False,
    )
    for host, states in sorted(hosts.items()):
        console.print(
            f"workers on {host}: " + ", ".join(f"{n} {name}" for name, n in sorted(states.items())),
            highlight=False,
            soft_wrap=True,
            markup=False,
        )


def _natural_width(console: Console, table: Table) -> int:
    """Columns ``table`` takes with no cell folded or cut short."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(1_000_000), table).maximum


def _status_table(statuses: Sequence[SiteStatus], suspended: bool) -> Table:
    from rich import box

    table = Table(
        "site",
        "queued",
        "in flight",
        "retrying",
        "refreshes",
        "fetched",
        "parsed",
        "items",
        "failed",
        "refused",
        "req/s (1 min)",
        "interval (s)",
        "from",
        "state",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    for s in statuses:
        table.add_row(*(Text(value) for value in status_row(s, suspended)))
    return table


def _status_block(console: Console, s: SiteStatus, suspended: bool) -> None:
    """One site in three short lines, for a terminal too narrow for the table."""
    why = s.interval_why or s.interval_source
    source = f" ({why})" if why else ""
    console.print(
        Text(s.site, style="bold")
        + Text(f"  {state(s, suspended)}, interval {_interval(s)} s{source}, {_rate(s)} req/s (1 min)"),
        soft_wrap=True,
    )
    console.print(
        f"  queued {s.queued}, in flight {s.in_flight}, retrying {s.scheduled}, refreshes {s.refreshes}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    console.print(
        f"  fetched {s.fetched}, parsed {s.parsed}, items {s.items}, failed {s.failed}, refused {s.refused}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )


def failed_row(page: FailedPage) -> list[str]:
    """One failed page's values in the order of ``FAILED_COLUMNS``."""
    return [
        page.site,
        page.url,
        page.kind,
        str(page.status or "-"),
        str(page.attempt),
        page.finished.strftime("%Y-%m-%d %H:%M:%S"),
        page.reason,
    ]


def print_failed(console: Console, pages: Sequence[FailedPage], show_error: bool) -> None:
    """``crawler failed``: each page's URL whole on its line, then its details (or plain rows off a terminal)."""
    if not console.is_terminal:
        _write(console, plain(FAILED_COLUMNS))
        for page in pages:
            _write(console, plain(failed_row(page)))
    else:
        for i, page in enumerate(pages):
            if i:
                console.print()
            # soft_wrap: the URL is never folded by us, so a terminal shows it whole and it copies whole.
            console.print(Text(page.url, style="bold"), soft_wrap=True)
            site, _, kind, status, attempt, finished, reason = failed_row(page)
            http = "" if status == "-" else f", HTTP {status}"
            detail = f"  {site}, {kind} failed{http}, attempt {attempt}, {finished} UTC"
            console.print(Text(detail), soft_wrap=True)
            console.print(Text(f"  {reason}"), soft_wrap=True)
    if show_error:
        for page in pages:
            console.print(Text(f"\n{page.site} {page.url} ({page.kind}):", style="bold"), soft_wrap=True)
            console.print(Text((page.error or page.reason).rstrip()), soft_wrap=True)  # copyable: no wrapping
