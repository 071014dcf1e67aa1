"""The every-site commands at many sites: ``crawler seed --all``, ``crawler status``, ``crawler sites``.

What is measured: N sites as ``bench fleet`` makes them (one ``sites/`` module of ``DemoShop``
subclasses, each on its own loopback host, ``interval = 2``; no server is started, nothing
is fetched), then ``ROUNDS`` rounds of: an empty Redis, ``crawler seed --all``,
``crawler status``, ``crawler sites``, each the real command in a subprocess. For each
command: its wall time as the user sees it (interpreter start to exit), the import of the
command line (``crawler.cli.app``), the command's own work (``main()`` called to its
return: settings, spiders loaded, Redis, output, and any import a command makes itself), and
the CPU time of its process (user and system: less moved by a busy machine than the wall).
The medians of the rounds are reported. Every module runs from bytecode, the crawler's
(``compile_crawler``) and the sites' (as a user's first run writes it).

Targets (issue 46, 10,000 sites): ``seed --all`` under 5 s, ``status`` and ``sites`` within 1 s,
wall.
"""

from __future__ import annotations

import compileall
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import BenchRedis, BenchResult, Check, compile_crawler, crawl_settings, write_config
from .fleet import SITE_CLASS, SITES_MODULE, site_host

SITES = 10_000
QUICK_SITES = 1_000
ROUNDS = 3
#: A port no server listens on: the commands measured never fetch.
PORT = 9
INTERVAL = 2.0
#: Target seconds, wall, at 10,000 sites.
TARGETS = {"seed --all": 5.0, "status": 1.0, "sites": 1.0}

#: Run in the subprocess: times the import of the CLI and ``main()``, and writes them to stderr's last line.
TIMED = """\
import json, sys, time
started = time.perf_counter()
from crawler.cli.app import cli
imported = time.perf_counter()
try:
    cli(prog_name="crawler", standalone_mode=False)
finally:
    done = time.perf_counter()
    sys.stdout.flush()
    print(json.dumps({"import": imported - started, "own": done - imported}), file=sys.stderr)
"""


def write_fleet_sites(workdir: Path, redis_url: str, sites: int) -> Path:
    """A config file whose ``sites/`` holds ``sites`` fleet spiders; returns its path."""
    names = [f"fleet{i:04d}" for i in range(sites)]
    settings = crawl_settings(workdir, redis_url, [], {})
    classes = "".join(
        SITE_CLASS.format(
            index=i, name=name, interval=INTERVAL, url=f"http://{site_host(i)}:{PORT}/", host=site_host(i)
        )
        for i, name in enumerate(names)
    )
    (Path(settings.sites_dir) / "fleet_sites.py").write_text(SITES_MODULE.format(classes=classes))
    compileall.compile_dir(settings.sites_dir, quiet=1)  # as a user's first run leaves it
    return write_config(workdir / "config.yaml", settings)


def timed_command(config: Path, args: list[str], cwd: Path) -> dict[str, float]:
    """Run ``crawler --config CONFIG ARGS...``; its wall, import and own seconds, and its output's lines."""
    import time

    cpu0 = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", TIMED, "--config", str(config), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - started
    cpu = _children_cpu() - cpu0
    if done.returncode != 0:
        raise RuntimeError(f"crawler {' '.join(args)} failed: {done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stderr.strip().splitlines()[-1])
    figures["wall"] = wall
    figures["cpu"] = cpu
    figures["lines"] = len(done.stdout.splitlines())
    return figures


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(redis: BenchRedis, quick: bool = False, sites: int | None = None) -> BenchResult:
    count = sites or (QUICK_SITES if quick else SITES)
    result = BenchResult("cli", {"sites": count, "rounds": ROUNDS})
    compile_crawler()  # as installed: from bytecode (see bench.throughput)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in TARGETS}
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        workdir = Path(tmp)
        config = write_fleet_sites(workdir, redis.url, count)
        for _ in range(ROUNDS):
            redis.reset()
            for name in TARGETS:
                runs[name].append(timed_command(config, name.split(), workdir))
        keys = redis.connection.dbsize()
    rows: list[list[Any]] = []
    for name, figures in runs.items():
        median = {field: statistics.median(f[field] for f in figures) for field in ("wall", "import", "own", "cpu")}
        rows.append(
            [
                f"crawler {name}",
                f"{median['wall']:.2f}",
                f"{median['import']:.2f}",
                f"{median['own']:.2f}",
                f"{median['cpu']:.2f}",
                " / ".join(f"{f['wall']:.2f}" for f in figures),
            ]
        )
        target = TARGETS[name]
        met = median["wall"] < target if count >= SITES else None
        result.checks.append(
            Check(f"crawler {name} wall s ({count:,} sites)", f"{median['wall']:.2f}", f"< {target}", met)
        )
    result.table(
        f"{count:,} sites, medians of {ROUNDS} rounds (seconds)",
        ["command", "wall", "import of the CLI", "own work", "CPU", "walls"],
        rows,
    )
    result.notes.append(
        f"Redis keys after the last round: {keys:,}; lines printed by sites: {runs['sites'][-1]['lines']:.0f}"
    )
    return result
