"""Seeding: 1,000,000 URLs from a file while another site is crawled at its interval.

What is measured:

- a file of N URLs (``http://localhost/catalogue/item-N?page=..&ref=feed``, the query
  spelt unsorted, so every URL goes through canonicalization; 1% repeated, a few bad
  lines) is seeded for one site with the real command, ``crawler seed SITE --from FILE``,
  in a subprocess; its wall time, and its counts checked against the file;
- meanwhile a second site, a demo shop on loopback, is crawled by one download worker
  process (2 threads) and one parse process at ``INTERVAL``: its arrivals at the server
  during the seed, as a rate against the rate of the seconds before the seed and against
  its budget (1 / (interval + gate margin));
- Redis latency: a PING every ``PING_EVERY`` seconds from a process of its own, during the
  seed (max and p99 of the round trip), and for contrast during the ``CONTRAST`` seconds
  before it, with only the crawl running; and, on a Redis the
  benchmark started, the server's own slow log (every command of 1 ms or more): the
  longest single command of the seed.

Targets: seed under 30 s for 1,000,000 URLs; the other site keeps 95% or more of the
rate it had in the ``CONTRAST`` seconds before the seed (its rate against its budget is
shown too); Redis answering within 10 ms throughout.
"""

from __future__ import annotations

import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from crawler.coord import keys
from crawler.coord.connection import connect
from crawler.coord.frontier import SEED_PRIORITY, seed
from crawler.demo import ShopSite
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers
from crawler.work.runtime import Runtime

from .common import BenchRedis, BenchResult, Check, crawl_settings, fmt

URLS = 1_000_000
QUICK_URLS = 100_000
#: One URL in this many is written twice; this many lines are bad (off-domain, not http).
REPEAT_EVERY = 100
BAD_LINES = 10
#: Interval of the site crawled meanwhile, and its products (more than the seed lasts).
INTERVAL = 0.1
PRODUCTS = 3000
#: Seconds of crawl before the seed starts: a warm-up, then CONTRAST seconds measured for contrast.
WARM_UP = 3.0
CONTRAST = 5.0
#: Seconds between two PINGs.
PING_EVERY = 0.002
#: Longest the seed may take before it is stopped.
SEED_TIMEOUT = 300.0
#: Targets.
TARGET_SECONDS = 30.0
TARGET_LATENCY_MS = 10.0
TARGET_RATE = 0.95
#: Commands at least this long (us) go to the server's slow log during the seed.
SLOWLOG_US = 1000
#: Slow-log entries kept (the default 128 would hide how many there were).
SLOWLOG_LEN = 100_000


def write_urls(path: Path, count: int) -> int:
    """A seed file of ``count`` distinct URLs, some repeated, some bad. Returns its line count."""
    lines = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write("# benchmark seed file\n")
        for n in range(count):
            url = f"http://localhost/catalogue/item-{n}?ref=feed&page={n % 50}\n"
            out.write(url)
            lines += 1
            if n % REPEAT_EVERY == 0:
                out.write(url.replace("?ref=feed&page=", "?page=", 1).replace("\n", "&ref=feed\n"))
                lines += 1
        for n in range(BAD_LINES):
            out.write(f"http://elsewhere.example/{n}\n" if n % 2 else f"ftp://localhost/{n}\n")
            lines += 1
    return lines


def _ping_loop(url: str, stop: Any, out: Any) -> None:
    """In a process of its own (no GIL shared with the shop's server threads): PING until ``stop`` is set."""
    connection = connect(url)
    samples: list[float] = []
    while not stop.is_set():
        started = time.perf_counter()
        connection.ping()
        samples.append(time.perf_counter() - started)
        time.sleep(PING_EVERY)
    out.send(samples)


class Pinger:
    """PINGs Redis every ``PING_EVERY`` seconds from another process, keeping each round trip (s)."""

    def __init__(self, url: str):
        context = multiprocessing.get_context("spawn")
        self.stopping = context.Event()
        self.receive, send = context.Pipe(duplex=False)
        self.process = context.Process(target=_ping_loop, args=(url, self.stopping, send), name="pinger")
        self.process.start()

    def stop(self) -> list[float]:
        self.stopping.set()
        samples: list[float] = self.receive.recv()
        self.process.join()
        return samples


def seed_command(settings: Any, site: str, path: Path) -> list[str]:
    """``crawler seed SITE --from FILE`` against the benchmark's Redis, database and sites."""
    return [
        sys.executable,
        "-c",
        "from crawler.cli.app import main; main()",
        "--redis-url",
        settings.redis_url,
        "--database-url",
        settings.database_url,
        "--sites",
        settings.sites_dir,
        "seed",
        site,
        "--from",
        str(path),
    ]


def rate_between(times: list[float], start: float, end: float) -> float:
    """Arrivals per second in [start, end)."""
    return sum(1 for t in times if start <= t < end) / (end - start) if end > start else 0.0


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    count = QUICK_URLS if quick else URLS
    seeded, crawled = f"seed_big_{redis.tag}", f"seed_other_{redis.tag}"
    result = BenchResult(
        "seeding",
        {
            "urls": count,
            "repeated": count // REPEAT_EVERY,
            "bad_lines": BAD_LINES,
            "other_interval_s": INTERVAL,
            "other_workers": "1 download process x 2 threads + 1 parse process",
            "ping_every_ms": PING_EVERY * 1000,
            "command": "crawler seed SITE --from FILE (subprocess)",
        },
    )
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="bench-seed-") as tmp,
        ShopSite(products=PRODUCTS, per_page=50, faults=False) as shop,
    ):
        path = Path(tmp) / "urls.txt"
        lines = write_urls(path, count)
        settings = crawl_settings(Path(tmp), redis.url, [seeded, crawled], {crawled: INTERVAL})
        rt = Runtime(redis.connection, settings)
        seed(rt.frontier(crawled), [shop.url + "/"])
        rt.close()
        specs = [WorkerSpec("download", (crawled,), threads=2, burst=True), WorkerSpec("parse", (crawled,), 1, True)]
        workers = start_workers(specs, settings, redis.url)
        try:
            time.sleep(WARM_UP)
            quiet = Pinger(redis.url)
            time.sleep(CONTRAST)
            quiet_pings = quiet.stop()
            if redis.owned:
                redis.connection.config_set("slowlog-log-slower-than", SLOWLOG_US)
                redis.connection.config_set("slowlog-max-len", SLOWLOG_LEN)
                redis.connection.slowlog_reset()
            pinger = Pinger(redis.url)
            seed_started = time.time()
            done = subprocess.run(
                seed_command(settings, seeded, path), capture_output=True, text=True, timeout=SEED_TIMEOUT
            )
            seed_ended = time.time()
            pings = pinger.stop()
            slow = redis.connection.slowlog_get(SLOWLOG_LEN) if redis.owned else []
            if redis.owned:
                redis.connection.config_set("slowlog-log-slower-than", 10000)
            queued = redis.connection.llen(keys.frontier(seeded, SEED_PRIORITY))
        finally:
            stop_workers(workers, timeout=10)
        arrivals = [entry.time for entry in shop.requests]
        margin = settings.gate_margin
    seconds = seed_ended - seed_started
    during = rate_between(arrivals, seed_started, seed_ended)
    before = rate_between(arrivals, seed_started - CONTRAST, seed_started)
    budget = 1 / (INTERVAL + margin)
    pings_ms = sorted(p * 1000 for p in pings)
    p99 = pings_ms[int(0.99 * (len(pings_ms) - 1))] if pings_ms else None
    quiet_ms = sorted(p * 1000 for p in quiet_pings)
    longest = max((entry["duration"] for entry in slow), default=0) / 1000
    slowest = max(slow, key=lambda e: e["duration"], default=None)
    result.table(
        "seed",
        ["lines", "queued", "seed output", "wall s", "URLs/s"],
        [[lines, queued, done.stdout.strip() or done.stderr.strip()[-200:], seconds, count / seconds]],
    )
    result.table(
        "the other site during the seed (arrivals at its server)",
        [
            "budget req/s",
            f"{CONTRAST:g} s before the seed req/s",
            "during the seed req/s",
            "during / before",
            "during / budget",
        ],
        [[budget, before, during, during / before, during / budget]],
    )
    result.table(
        "Redis latency (PING round trips from another process; the server's slow log)",
        [
            "when",
            "pings",
            "median ms",
            "p99 ms",
            "max ms",
            "commands >= 1 ms (server)",
            "longest command ms",
            "longest is",
        ],
        [
            [
                f"{CONTRAST:g} s before the seed (crawl only)",
                len(quiet_ms),
                statistics.median(quiet_ms),
                quiet_ms[int(0.99 * (len(quiet_ms) - 1))],
                quiet_ms[-1],
                "-",
                "-",
                "-",
            ],
            [
                "during the seed",
                len(pings_ms),
                statistics.median(pings_ms) if pings_ms else None,
                p99,
                pings_ms[-1] if pings_ms else None,
                len(slow) if redis.owned else "n/a",
                longest if redis.owned else "n/a",
                _describe(slowest) if slowest else "-",
            ],
        ],
    )
    result.checks.append(
        Check(
            "every URL queued once", f"{queued:,} of {count:,}", f"{count:,}", queued == count and done.returncode == 0
        )
    )
    result.checks.append(
        Check(
            f"seed wall time, {count:,} URLs",
            f"{seconds:.1f} s",
            f"< {TARGET_SECONDS * count / URLS:g} s",
            seconds < TARGET_SECONDS * count / URLS,
        )
    )
    result.checks.append(
        Check(
            "other site's rate during the seed / before it",
            fmt(during / before),
            f">= {TARGET_RATE}",
            during / before >= TARGET_RATE,
        )
    )
    result.checks.append(Check("other site's rate during the seed / budget", fmt(during / budget), "-", None))
    if pings_ms:
        figure = f"{pings_ms[-1]:.1f} ms (p99 {p99:.1f})"
        result.checks.append(
            Check(
                "Redis PING round trip during the seed, max",
                figure,
                f"< {TARGET_LATENCY_MS:g} ms",
                pings_ms[-1] < TARGET_LATENCY_MS,
            )
        )
    result.seconds = time.monotonic() - started
    return result


def _describe(entry: dict[str, Any]) -> str:
    """A slow-log entry's command name and first argument."""
    command = entry["command"]
    words = (command.decode(errors="replace") if isinstance(command, bytes) else str(command)).split()
    return " ".join(words[:3])[:60]
