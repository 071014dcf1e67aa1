"""Run the benchmarks and print their figures: ``python -m bench [NAME...] [--quick]``.

With no NAME every benchmark runs, in the order below; ``--quick`` runs each in a
smaller, faster smoke mode; ``--json FILE`` also writes every figure to FILE;
``--page FILE.html [--url URL]`` (repeatable) adds a real page to ``parse``;
``--config quick|200|1000|2000|10000`` picks ``fleet``'s scenario, ``--sites N`` ``cli``'s
number of sites. Each
benchmark runs on its own private Redis (``crawler.coord.connection.EmbeddedRedis``) unless
``BENCH_REDIS_URL`` names one (see ``bench/common.py``); ``shards`` (three shards against one
Redis, a site moved live, a primary killed behind Sentinel) starts the servers it needs itself.
Scrapy, for the throughput comparison, is looked for in ``BENCH_SCRAPY_PYTHON``, this Python, or
/tmp/benchvenv (install with ``pip install -r bench/requirements.txt``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
import time
import traceback
from typing import Any

from .common import BenchResult, Check, bench_redis, format_table, machine_info, print_result

#: Benchmark modules, in the order a full run takes them.
BENCHMARKS = (
    "politeness",
    "utilization",
    "intervals",
    "many_sites",
    "throughput",
    "memory",
    "economy",
    "parse",
    "seeding",
    "recrawl",
    "sitemaps",
    "render",
    "fleet",
    "models",
    "sending",
    "shards",
    "cli",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)} [all]")
    parser.add_argument("--quick", action="store_true", help="smaller, faster smoke runs")
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE as JSON")
    parser.add_argument(
        "--page", action="append", default=[], metavar="FILE", help="parse: also time this HTML file (repeatable)"
    )
    parser.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="URL",
        help="parse: the URL the --page of the same rank was served from",
    )
    parser.add_argument(
        "--config",
        choices=("quick", "200", "1000", "2000", "10000"),
        help="fleet: the scenario [200; quick with --quick]",
    )
    parser.add_argument("--sites", type=int, metavar="N", help="cli: the number of sites [10,000; 1,000 with --quick]")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r} (choose from {', '.join(BENCHMARKS)})")
    if len(args.url) > len(args.page):
        parser.error("--url needs a --page to go with")
    return args


def options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of one benchmark's ``run`` beyond ``quick`` (``parse``'s pages, ``fleet``'s scenario)."""
    if name == "parse":
        return {"pages": args.page, "urls": args.url}
    if name == "cli":
        return {"sites": args.sites}
    return {"config": args.config} if name == "fleet" else {}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    names = args.names or list(BENCHMARKS)
    command = "python -m bench " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    with bench_redis() as probe:
        machine = machine_info(probe.connection)
    print(f"command: {command.strip()}")
    print(format_table(["machine", "value"], [[k, v] for k, v in machine.items()]))
    sys.stdout.flush()
    results: list[BenchResult] = []
    failed: list[str] = []
    started = time.monotonic()
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        print(f"\n-- running {name}{' (quick)' if args.quick else ''} --", flush=True)
        begun = time.monotonic()
        try:
            with bench_redis() as redis:
                result: BenchResult = module.run(redis, quick=args.quick, **options(name, args))
        except Exception:
            traceback.print_exc()
            failed.append(name)
            result = BenchResult(name, {}, checks=[Check("benchmark ran", "crashed (see traceback)", "ran", False)])
            result.seconds = time.monotonic() - begun
        results.append(result)
        print_result(result)
    total = time.monotonic() - started
    print(f"\n== summary ({total:.0f} s{', quick' if args.quick else ''}) ==")
    rows = [
        [r.name, c.name, c.figure, c.target, "-" if c.met is None else ("met" if c.met else "MISSED")]
        for r in results
        for c in r.checks
    ]
    print(format_table(["benchmark", "figure", "value", "target", "result"], rows))
    if args.json:
        report: dict[str, Any] = {
            "command": command.strip(),
            "machine": machine,
            "quick": args.quick,
            "seconds": round(total, 1),
            "results": [r.as_dict() for r in results],
        }
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2, default=str)
        print(f"figures written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
