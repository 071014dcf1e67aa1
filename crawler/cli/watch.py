"""What ``crawler crawl`` shows while it runs: a live table on a terminal, a log line per site elsewhere."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from redis import Redis

from ..ops.status import parse_backlog, site_status

if TYPE_CHECKING:
    from rich.table import Table

    from ..ops.progress import Snapshot


@contextmanager
def progress(connection: Redis, sites_: list[str], database_url: str | None = None) -> Iterator[Callable[[], None]]:
    """A live table on a terminal; a log line per site every 5 s otherwise (logs, CI, pipes).

    Both stages count: the parse backlog, downloads and parses per second, and an ETA
    over what is left to download and to parse. With ``database_url``, the first
    callback error of each kind is printed once, as it is recorded.
    """
    from rich.console import Console
    from rich.live import Live

    watch = _Watch(connection, sites_, database_url)
    console = Console(stderr=True)

    def plain(line: str) -> None:
        console.print(line, highlight=False, soft_wrap=True, markup=False)

    if console.is_terminal:
        with Live(watch.table(), console=console, refresh_per_second=4) as live:

            def above(line: str) -> None:
                live.console.print(line, highlight=False, soft_wrap=True, markup=False)

            def refresh() -> None:
                watch.report_errors(above)
                live.update(watch.table())

            yield refresh
    else:
        yield lambda: watch.log_lines(plain)
    watch.close(plain)


class _Watch:
    """What ``_progress`` shows of a running crawl: each site's progress (a table, or log lines)
    and the callback errors recorded meanwhile."""

    def __init__(self, connection: Redis, sites_: list[str], database_url: str | None):
        from ..ops.progress import ErrorWatch, Progress

        self.connection = connection
        self.sites = sites_
        self.progress = Progress()
        self.errors = ErrorWatch(database_url, sites_) if database_url else None
        self.last_poll = 0.0
        self.last_line = 0.0

    def snapshot(self) -> list[Snapshot]:
        return self.progress.update(site_status(self.connection, self.sites), parse_backlog(self.connection))

    def report_errors(self, print_line: Callable[[str], None]) -> None:
        """Print the callback errors recorded since the last look, at most once every ERRORS_POLL_EVERY."""
        if self.errors is not None and time.monotonic() - self.last_poll >= ERRORS_POLL_EVERY:
            self.last_poll = time.monotonic()
            for line in self.errors.poll():
                print_line(line)

    def table(self) -> Table:
        """The live table: a row a site."""
        from rich.table import Table
        from rich.text import Text

        columns = ("site", "done", "queued", "in flight", "retrying", "failed", "to parse", "parsed", "items")
        grid = Table(*columns, "pages/s", "parsed/s", "ETA")
        for p in self.snapshot():
            s = p.status
            grid.add_row(
                Text(s.site),
                *map(str, (s.done, s.queued, s.in_flight, s.scheduled, s.failed, p.to_parse, s.parsed, s.items)),
                f"{p.download_rate:.1f}",
                f"{p.parse_rate:.1f}",
                format_eta(p.eta),
            )
        return grid

    def log_lines(self, plain: Callable[[str], None]) -> None:
        """Off a terminal: new callback errors, and a line a site every PROGRESS_LOG_EVERY seconds."""
        self.report_errors(plain)
        if time.monotonic() - self.last_line >= PROGRESS_LOG_EVERY:
            self.last_line = time.monotonic()
            for p in self.snapshot():
                s = p.status
                plain(
                    f"{time.strftime('%H:%M:%S')} {s.site}: done {s.done}, queued {s.queued}, "
                    f"in flight {s.in_flight}, retrying {s.scheduled}, failed {s.failed}, "
                    f"to parse {p.to_parse}, parsed {s.parsed}, items {s.items}, "
                    f"{p.download_rate:.1f} pages/s, {p.parse_rate:.1f} parsed/s, ETA {format_eta(p.eta)}"
                )

    def close(self, plain: Callable[[str], None]) -> None:
        """The errors recorded since the last look, and the closing lines of the error watch."""
        if self.errors is not None:
            for line in [*self.errors.poll(), *self.errors.closing_lines()]:
                plain(line)


#: Seconds between two looks for new callback errors during ``crawl``.
ERRORS_POLL_EVERY = 1.0


#: Seconds between progress lines when the output is not a terminal.
PROGRESS_LOG_EVERY = 5.0


def format_eta(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``12s``; ``-`` while unknown (no rate yet)."""
    if seconds is None:
        return "-"
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
