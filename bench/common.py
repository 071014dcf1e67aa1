"""Helpers shared by the benchmarks: a Redis to run on, machine facts, tables, spiders.

Redis: ``BENCH_REDIS_URL`` if set (the benchmarks then never flush it: they use site
names unique to the run and delete only keys carrying that run's tag), else a private
``redis-server`` started with ``crawler.coord.connection.EmbeddedRedis`` on a unix socket
in a temporary directory, stopped afterwards.
"""

from __future__ import annotations

import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from redis import Redis

from crawler.coord.connection import EmbeddedRedis, connect

#: Environment variable naming a Redis the benchmarks may use instead of a private one.
REDIS_URL_ENV = "BENCH_REDIS_URL"
#: Environment variable naming the Python that has Scrapy installed (throughput only).
SCRAPY_PYTHON_ENV = "BENCH_SCRAPY_PYTHON"
#: Where the Scrapy environment is looked for when that variable is not set.
DEFAULT_SCRAPY_PYTHON = "/tmp/benchvenv/bin/python"


# -- Bytecode -------------------------------------------------------------------------


def compile_crawler() -> None:
    """Write the bytecode of the crawler's own modules, as an installed package has it.

    Scrapy and every other installed package run from bytecode pip wrote; the crawler,
    installed editable from a checkout, is compiled from source in every process it
    starts when nothing writes its bytecode (``PYTHONDONTWRITEBYTECODE``, a read-only
    tree): some 0.15 s of CPU per process, measured, that no installed copy pays.
    """
    import compileall

    import crawler

    for package in crawler.__path__:
        compileall.compile_dir(package, quiet=1)


# -- Redis ----------------------------------------------------------------------------


@dataclass
class BenchRedis:
    """A Redis for one benchmark: its URL, a client, and whether we own (started) it."""

    url: str
    owned: bool
    tag: str
    connection: Redis
    server: EmbeddedRedis | None = None

    def reset(self) -> None:
        """Empty the database, but only on a server this benchmark started."""
        if self.owned:
            self.connection.flushdb()

    def server_pid(self) -> int | None:
        """PID of the redis-server process (for its CPU time), if it runs on this machine."""
        pid = int(self.connection.info("server").get("process_id", 0))
        try:
            import psutil

            return pid if pid and psutil.pid_exists(pid) and self.owned else None
        except ImportError:
            return None

    def cleanup(self) -> None:
        """Delete the keys this run created (those carrying its tag) on a shared Redis."""
        if self.owned:
            return
        batch: list[bytes] = []
        for key in self.connection.scan_iter(match=f"*{self.tag}*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                self.connection.delete(*batch)
                batch.clear()
        if batch:
            self.connection.delete(*batch)


@contextmanager
def bench_redis() -> Iterator[BenchRedis]:
    """A Redis to benchmark on (see the module docstring); cleaned up or stopped after."""
    tag = "b" + secrets.token_hex(3)
    given = os.environ.get(REDIS_URL_ENV)
    if given:
        connection = connect(given)
        bench = BenchRedis(given, owned=False, tag=tag, connection=connection)
        try:
            yield bench
        finally:
            bench.cleanup()
            connection.close()
        return
    state_dir = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    server = EmbeddedRedis(state_dir)
    if not server.start():
        raise RuntimeError(f"a Redis already answers at {server.url}; refusing to use it")
    connection = connect(server.url)
    try:
        yield BenchRedis(server.url, owned=True, tag=tag, connection=connection, server=server)
    finally:
        connection.close()
        server.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


def command_stats(connection: Redis) -> dict[str, int]:
    """Calls per command from ``INFO commandstats`` (commands run inside Lua included)."""
    stats = connection.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def command_delta(before: dict[str, int], after: dict[str, int], ignore: Sequence[str] = ("info",)) -> dict[str, int]:
    """Commands run between two ``command_stats`` snapshots, without the INFO calls themselves."""
    delta = {name: after[name] - before.get(name, 0) for name in after if name not in ignore}
    return {name: n for name, n in delta.items() if n}


def counting_client(url: str) -> tuple[Redis, list[int]]:
    """A Redis client whose round trips (packed sends: a command, a pipeline) are counted.

    Returns the client and a one-element list holding the count.
    """
    client = Redis.from_url(url)
    pool = client.connection_pool
    base: Any = pool.connection_class
    counter = [0]

    class Counting(base):  # type: ignore[misc, valid-type]
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            counter[0] += 1
            super().send_packed_command(command, check_health)

    pool.connection_class = Counting
    client.ping()
    counter[0] = 0
    return client, counter


# -- spiders --------------------------------------------------------------------------

SPIDER_MODULE = '''\
"""Benchmark spiders: the demo shop spider under other names (generated by bench.common)."""

from crawler.demo.spider import DemoShop

{classes}
'''

SPIDER_CLASS = """
class Spider_{ident}(DemoShop):
    name = {name!r}
    interval = {interval!r}
"""


def write_sites_dir(directory: Path, names: Sequence[str], interval: float = 1.0) -> Path:
    """A sites directory with one ``DemoShop`` subclass per name (same selectors)."""
    directory.mkdir(parents=True, exist_ok=True)
    classes = "".join(SPIDER_CLASS.format(ident=i, name=name, interval=interval) for i, name in enumerate(names))
    (directory / "bench_sites.py").write_text(SPIDER_MODULE.format(classes=textwrap.dedent(classes)))
    return directory


# -- machine --------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def scrapy_python() -> str | None:
    """A Python that can import Scrapy: ``BENCH_SCRAPY_PYTHON``, this one, or the bench venv."""
    candidates = [os.environ.get(SCRAPY_PYTHON_ENV), sys.executable, DEFAULT_SCRAPY_PYTHON]
    for python in candidates:
        if not python or not Path(python).exists():
            continue
        probe = subprocess.run(
            [python, "-c", "import scrapy; print(scrapy.__version__)"], capture_output=True, text=True, timeout=60
        )
        if probe.returncode == 0:
            return python
    return None


def machine_info(redis: Redis | None = None) -> dict[str, str]:
    """What the figures were measured on."""
    info = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nproc": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "ram": _ram_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "rq": _version("rq"),
        "redis-py": _version("redis"),
        "httpx": _version("httpx"),
        "selectolax": _version("selectolax"),
    }
    if redis is not None:
        server = redis.info("server")
        info["redis-server"] = f"{server.get('redis_version')} ({server.get('executable') or 'remote'})"
    python = scrapy_python()
    if python is not None:
        out = subprocess.run(
            [python, "-c", "import scrapy, twisted; print(scrapy.__version__, twisted.__version__)"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
        info["scrapy"] = f"{out[0]} (Twisted {out[1]}) in {python}" if len(out) == 2 else "unknown"
    else:
        info["scrapy"] = "not found"
    return info


# -- results and tables ---------------------------------------------------------------


@dataclass
class Check:
    """One target: what it is, the figure, and whether it was met."""

    name: str
    figure: str
    target: str
    met: bool | None  # None: informational, no target


@dataclass
class BenchResult:
    """What a benchmark hands back: parameters, one or more tables, checks, notes."""

    name: str
    params: dict[str, Any]
    tables: list[tuple[str, list[str], list[list[Any]]]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def table(self, title: str, header: list[str], rows: list[list[Any]]) -> None:
        self.tables.append((title, header, rows))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.params,
            "tables": [{"title": t, "header": h, "rows": r} for t, h, r in self.tables],
            "checks": [vars(c) for c in self.checks],
            "notes": self.notes,
            "seconds": round(self.seconds, 1),
        }


def fmt(value: Any) -> str:
    """A cell: floats with sensible precision, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (also valid Markdown)."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for row in cells:
        lines.append("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines)


def print_result(result: BenchResult) -> None:
    print(f"\n== {result.name} ({result.seconds:.1f} s) ==")
    print("parameters: " + ", ".join(f"{k}={v}" for k, v in result.params.items()))
    for title, header, rows in result.tables:
        print(f"\n{title}")
        print(format_table(header, rows))
    for note in result.notes:
        print(f"note: {note}")
    for check in result.checks:
        state = "info" if check.met is None else ("MET" if check.met else "MISSED")
        print(f"[{state}] {check.name}: {check.figure} (target {check.target})")
    sys.stdout.flush()


def steady_rate(times: Sequence[float], low: float = 0.1, high: float = 0.9) -> float:
    """Requests per second between the ``low`` and ``high`` quantiles of arrival times."""
    ordered = sorted(times)
    if len(ordered) < 10:
        return 0.0
    first, last = int(low * (len(ordered) - 1)), int(high * (len(ordered) - 1))
    span = ordered[last] - ordered[first]
    return (last - first) / span if span > 0 else 0.0


def gaps(times: Sequence[float]) -> list[float]:
    """Gaps between consecutive arrival times, sorted by time first."""
    ordered = sorted(times)
    return [b - a for a, b in zip(ordered, ordered[1:])]


def wait_until(predicate: Any, timeout: float, step: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass. Returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


# -- crawls ---------------------------------------------------------------------------


def crawl_settings(
    workdir: Path, redis_url: str, site_names: Sequence[str], intervals: dict[str, float], **overrides: Any
) -> Any:
    """Settings for a benchmark crawl: a sites dir with ``site_names``, SQLite in ``workdir``.

    ``intervals`` become config-file style per-site overrides (``Settings.sites``).
    """
    from crawler.settings import Settings

    sites_dir = write_sites_dir(workdir / "sites", site_names)
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "database_url": f"sqlite:///{workdir / 'crawl.db'}",
        "sites_dir": str(sites_dir),
        "state_dir": str(workdir / "state"),
        "backoff": 0.2,
        "sites": {name: {"interval": interval} for name, interval in intervals.items()},
    }
    values.update(overrides)
    settings = Settings(**values)
    # Create the schema once before any worker starts, as ``crawler crawl`` does: worker
    # processes creating it at the same moment race ("table items already exists").
    from crawler.store.database import Store

    Store(settings.database_url).close()
    return settings


def write_config(path: Path, settings: Any) -> Path:
    """A config file for the ``crawler`` command with ``settings``' locations, Redis, margin, backoff and sites."""
    import yaml

    fields = ("redis_url", "database_url", "sites_dir", "state_dir", "backoff", "gate_margin")
    values = {name: getattr(settings, name) for name in fields}
    values["sites"] = {site: dict(overrides) for site, overrides in settings.sites.items()}
    path.write_text(yaml.safe_dump(values))
    return path


def crawler_command(config: Path) -> list[str]:
    """The ``crawler`` command of this Python, reading ``config``."""
    return [sys.executable, "-c", "from crawler.cli.app import main; main()", "--config", str(config)]


def run_until_exit(processes: Sequence[Any], timeout: float) -> tuple[float, bool]:
    """Wait for burst workers to exit (at most ``timeout`` s, then stop them).

    Returns the seconds waited and whether they all exited on their own.
    """
    from crawler.work.launcher import stop_workers

    started = time.monotonic()
    deadline = started + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    finished = not any(p.is_alive() for p in processes)
    elapsed = time.monotonic() - started
    if not finished:
        stop_workers(processes, timeout=10)
    return elapsed, finished


def stored_items(database_url: str, site: str) -> int:
    """How many items ``site`` has in the database."""
    from crawler.store.database import Store

    store = Store(database_url)
    try:
        return sum(1 for _ in store.items(site))
    finally:
        store.close()
