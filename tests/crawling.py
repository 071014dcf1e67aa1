"""Helpers shared by the tests: a runtime, burst workers in threads, items by key, the PostgreSQL URL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis.connection
from click.testing import Result
from redis import Redis

from crawler.coord import joblife
from crawler.coord.frontier import Frontier
from crawler.coord.task import DownloadTask
from crawler.settings import Settings
from crawler.store.database import Store
from crawler.testing import join_burst_workers, start_burst_workers
from crawler.work.runtime import Runtime

#: Seconds an in-process crawl may take before the test fails.
CRAWL_TIMEOUT = 60.0


def waiting_tasks(connection: Redis, site: str) -> list[DownloadTask]:
    """Every task waiting for ``site``, in the order it is served: its RQ queue's jobs (a seed makes
    the first ones: ``cli.crawl._first_jobs``), then its compact frontier, highest priority first."""
    frontier = Frontier(connection, site, [], 60, 60)
    jobs = frontier.queue.get_jobs()
    return [DownloadTask.from_json(p) for job in jobs for p in joblife.tasks_left(job)] + frontier.waiting()


@contextmanager
def installed_runtime(connection: Redis, settings: Settings, **kwargs: Any) -> Iterator[Runtime]:
    """A Runtime built now (so it finds the spiders written so far), closed on the way out."""
    rt = Runtime(connection, settings, **kwargs)
    try:
        yield rt
    finally:
        rt.close()


def start_in_threads(
    rt: Runtime, downloads: int = 2, parsers: int = 1, sites: tuple[str, ...] = ("demo",)
) -> tuple[list[threading.Thread], threading.Event]:
    """Burst download and parse workers in threads of this process, running against ``rt`` (as a worker
    process runs them)."""
    return start_burst_workers(rt, sites, downloads, parsers)


def join_all(threads: list[threading.Thread], stop: threading.Event, timeout: float = CRAWL_TIMEOUT) -> None:
    """Wait for burst workers to drain; fail (after stopping them) if they do not."""
    try:
        join_burst_workers(threads, stop, timeout)
    except TimeoutError as exc:
        pytest.fail(str(exc))


def run_in_threads(rt: Runtime, sites: tuple[str, ...] = ("demo",), timeout: float = CRAWL_TIMEOUT) -> None:
    """Two download workers and a parse worker in threads, against ``rt``, until the crawl drains."""
    threads, stop = start_in_threads(rt, sites=sites)
    join_all(threads, stop, timeout)


def items_by_key(database_url: str, site: str = "demo", key: str = "sku") -> dict[str, dict[str, Any]]:
    """The site's items by ``key``; fails if any item is stored twice."""
    store = Store(database_url)
    try:
        rows = list(store.items(site))
    finally:
        store.close()
    by_key = {row[key]: row for row in rows}
    assert len(by_key) == len(rows), "an item was stored twice"
    return by_key


def postgres_server_url(reason: str | None = None) -> str:
    """``CRAWLER_TEST_POSTGRES_URL``; skips without it, or with ``reason`` (why it will not do).

    Under ``CRAWLER_REQUIRE_POSTGRES=1`` (set by ``.ci/run``) it fails instead of skipping,
    so CI always exercises the production database.
    """
    url = os.environ.get("CRAWLER_TEST_POSTGRES_URL")
    if not url:
        reason = "PostgreSQL not configured: set CRAWLER_TEST_POSTGRES_URL to run this test"
    if reason is not None:
        if os.environ.get("CRAWLER_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{reason} (CRAWLER_REQUIRE_POSTGRES=1)")
        pytest.skip(reason)
    assert url is not None
    return url


def assert_one_line_error(result: Result, *fragments: str) -> str:
    """A clean CLI failure: exit 1, no exception escaped, exactly one line on stderr holding ``fragments``."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # not an uncaught error
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# -- peak memory of child processes -------------------------------------------------------
# Not ``ru_maxrss`` (``wait4``, ``getrusage``): Linux carries it over from the parent across
# fork and exec, so a child of a test process of 200 MiB reports at least 200 MiB, and a
# bound checked on it fails for the test session's size, or passes for it.


def _peak_kib(pid: int | str) -> int:
    with open(f"/proc/{pid}/status") as status:
        found = re.search(r"VmHWM:\s+(\d+) kB", status.read())
    return int(found.group(1)) if found else 0


def _descendants(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found += [int(child) for child in children.read().split()]
        except FileNotFoundError:
            continue
    return found + [grandchild for child in found for grandchild in _descendants(child)]


def peak_rss_mib(pid: int) -> float:
    """The largest peak resident set (``VmHWM``) of ``pid`` and its live descendants, in MiB.

    Read it before they exit: each process's own high-water mark since its ``exec``.
    """
    peaks = []
    for process in [pid, *_descendants(pid)]:
        try:
            peaks.append(_peak_kib(process))
        except FileNotFoundError:  # exited meanwhile
            continue
    return max(peaks, default=0) / 1024


def cli_reporting_peak_rss(report: Path) -> list[str]:
    """A command line that runs the ``crawler`` CLI and, as it exits, writes its own peak
    resident set (``VmHWM``, KiB) to ``report``: append the CLI's arguments."""
    code = (
        "import atexit, re\n"
        "def _report():\n"
        "    with open('/proc/self/status') as status:\n"
        "        peak = re.search(r'VmHWM:\\s+(\\d+) kB', status.read()).group(1)\n"
        f"    with open({str(report)!r}, 'w') as out:\n"
        "        out.write(peak)\n"
        "atexit.register(_report)\n"
        "from crawler.cli.app import main\n"
        "main()\n"
    )
    return [sys.executable, "-c", code]


def run_console_script(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("crawler")
    command = [str(script)] if script.exists() else [sys.executable, "-c", "from crawler.cli.app import main; main()"]
    env = {
        k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and not k.startswith("CRAWLER_")
    }
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def count_round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Grows by one at each round trip a client starts: a command, a pipeline or a ``read_many`` sent."""
    sends: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self, command, check_health=True):  # type: ignore[no-untyped-def]
        sends.append(1)
        return send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    return sends
