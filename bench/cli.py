"""The every-site commands alone, at many sites: ``crawler seed --all``, ``crawler status``, ``crawler sites``.

``bench economy``'s seeding part (``economy.seeding``: a sites directory of one generated
module of N ``DemoShop`` spiders, one start URL and domain each, bytecode written; each
command the real one in a subprocess, timed inside for the import of the CLI and its own
work, and its CPU), without the memory measurements before it, ``ROUNDS`` times, each on a
Redis of its own: the medians of the rounds' first seeds and of their commands. The machine
may be shared: the load average is noted.

Targets (issue 46, 10,000 sites): ``seed --all`` under 5 s, ``status`` and ``sites`` within 1 s, wall.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from .common import BenchRedis, BenchResult, Check, bench_redis, compile_crawler
from .economy import seeding

SITES = 10_000
QUICK_SITES = 1_000
ROUNDS = 3
#: Target seconds, wall, at 10,000 sites.
TARGETS = {"seed --all": 5.0, "status": 1.0, "sites": 1.0}
FIELDS = ("wall", "import", "work", "cpu")


def run(redis: BenchRedis, quick: bool = False, sites: int | None = None) -> BenchResult:
    """``redis`` (the runner's) is left alone: each round starts a Redis of its own."""
    count = sites or (QUICK_SITES if quick else SITES)
    result = BenchResult("cli", {"sites": count, "rounds": ROUNDS, "redis": "a fresh bench_redis per round"})
    compile_crawler()  # as installed: from bytecode (see bench.throughput)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in TARGETS}
    loads = [os.getloadavg()[0]]
    for _ in range(ROUNDS):
        with bench_redis() as fresh, tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
            found = seeding(fresh, count, Path(tmp), runs=1)
        runs["seed --all"].append(found["seeds"][0])
        runs["status"] += found["commands"]["status"]
        runs["sites"] += found["commands"]["sites"]
        loads.append(os.getloadavg()[0])
    rows = []
    for name, done in runs.items():
        median = {field: statistics.median(r[field] for r in done) for field in FIELDS}
        walls = " / ".join(f"{r['wall']:.2f}" for r in done)
        rows.append([f"crawler {name}", *(f"{median[field]:.2f}" for field in FIELDS), walls])
        met = median["wall"] < TARGETS[name] if count >= SITES else None
        result.checks.append(
            Check(f"crawler {name} wall s ({count:,} sites)", f"{median['wall']:.2f}", f"< {TARGETS[name]}", met)
        )
    result.table(
        f"{count:,} sites, medians of {ROUNDS} rounds (seconds)",
        ["command", "wall", "import of the CLI", "own work", "CPU", "walls"],
        rows,
    )
    seeds = runs["seed --all"]
    commands = statistics.median(r["redis commands"] for r in seeds)
    result.notes.append(
        f"seed --all: {commands:,.0f} Redis commands ({commands / count:.1f} a site, scripts' inner calls included), "
        f"Redis CPU {statistics.median(r['redis cpu'] for r in seeds):.2f} s (medians)"
    )
    result.notes.append("load average (1 min) before and after each round: " + ", ".join(f"{x:.1f}" for x in loads))
    return result
