"""Politeness: no two requests to a site closer than its interval, at any worker count.

What is measured: one demo shop (``ShopSite``, no faults) per configuration, crawled end
to end (robots.txt, home, listing pages, every product, the PDF) by W download workers
(threads) spread over P worker processes, plus one parse process, all burst workers
started with ``crawler.work.launcher.start_workers``. Each configuration has its own site
name (a ``DemoShop`` subclass written into a temporary sites dir) and its own shop, so
nothing carries over between runs. The site's interval comes from a config-style
override (``Settings(sites={name: {"interval": ...}})``); ``gate_margin`` is left at
its default.

At the server (``ShopSite.requests``, arrival time of every request line) we count
the gaps between consecutive arrivals that are shorter than the interval (target: 0),
the smallest gap, and the achieved rate over the steady part of the crawl (requests
between the 10th and 90th percentile of arrival time) against 1/interval and against
1/(interval + gate_margin), the most the gate allows.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from crawler.coord.frontier import seed
from crawler.demo import ShopSite
from crawler.work.launcher import WorkerSpec, start_workers
from crawler.work.runtime import Runtime

from .common import BenchRedis, BenchResult, Check, crawl_settings, gaps, run_until_exit, steady_rate, stored_items

#: Seconds between two requests to the site.
INTERVAL = 0.05
#: Products in the shop (a full crawl is about products + pages + 4 requests).
PRODUCTS = 200
QUICK_PRODUCTS = 40
PER_PAGE = 20
#: (download workers in all, worker processes) pairs; workers are split evenly over processes.
CONFIGS: list[tuple[int, int]] = [(1, 1), (4, 1), (4, 2), (4, 4), (16, 1), (16, 2), (16, 4)]
QUICK_CONFIGS: list[tuple[int, int]] = [(1, 1), (4, 2), (16, 4)]
#: A fast site's interval: with the default margin it is within ``batching.BATCH_BELOW``, so its
#: jobs carry batches of URLs, each through the gate; crawled with BATCH_CONFIGS.
BATCH_INTERVAL = 0.005
BATCH_CONFIGS: list[tuple[int, int]] = [(4, 2), (16, 4)]
#: Parse worker processes (one thread each).
PARSERS = 1
#: Longest one configuration may take before its workers are stopped.
CRAWL_TIMEOUT = 120.0


def run_config(
    redis: BenchRedis, workers: int, processes: int, products: int, interval: float = INTERVAL
) -> dict[str, object]:
    """Crawl a fresh shop with ``workers`` download workers over ``processes`` processes."""
    site = f"pol_w{workers}_p{processes}_{round(interval * 1000)}ms_{redis.tag}"
    with (
        tempfile.TemporaryDirectory(prefix="bench-pol-") as tmp,
        ShopSite(products=products, per_page=PER_PAGE, faults=False) as shop,
    ):
        settings = crawl_settings(Path(tmp), redis.url, [site], {site: interval})
        rt = Runtime(redis.connection, settings)
        seed(rt.frontier(site), [shop.url + "/"])
        rt.close()
        threads = workers // processes
        specs = [WorkerSpec("download", (site,), threads=threads, burst=True)] * processes
        specs += [WorkerSpec("parse", (site,), threads=1, burst=True)] * PARSERS
        procs = start_workers(specs, settings, redis.url)
        elapsed, drained = run_until_exit(procs, CRAWL_TIMEOUT)
        times = [entry.time for entry in shop.requests]
        spacing = gaps(times)
        items = stored_items(settings.database_url, site)
        margin = settings.gate_margin
    rate = steady_rate(times)
    return {
        "workers": workers,
        "processes": processes,
        "threads": threads,
        "requests": len(times),
        "items": items,
        "interval": interval,
        "too_close": sum(1 for g in spacing if g < interval),
        "min_gap_ms": min(spacing) * 1000 if spacing else None,
        "rate": rate,
        "vs_budget": rate * interval,
        "vs_gate": rate * (interval + margin),
        "seconds": elapsed,
        "drained": drained,
        "margin": margin,
    }


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    products = QUICK_PRODUCTS if quick else PRODUCTS
    configs = QUICK_CONFIGS if quick else CONFIGS
    result = BenchResult(
        "politeness",
        {
            "interval_s": INTERVAL,
            "batch interval_s": BATCH_INTERVAL,
            "batch configs (workers, processes)": BATCH_CONFIGS,
            "products": products,
            "per_page": PER_PAGE,
            "faults": False,
            "configs (workers, processes)": configs,
            "parse_processes": PARSERS,
            "steady window": "p10-p90 of arrivals",
        },
    )
    started = time.monotonic()
    rows = []
    worst = 0
    smallest: float | None = None
    runs = [(w, p, INTERVAL) for w, p in configs] + [(w, p, BATCH_INTERVAL) for w, p in BATCH_CONFIGS]
    for workers, processes, interval in runs:
        r = run_config(redis, workers, processes, products, interval)
        result.params["gate_margin_s"] = r["margin"]
        rows.append(
            [
                r["interval"] * 1000,
                r["workers"],
                r["processes"],
                r["threads"],
                r["requests"],
                r["items"],
                r["too_close"],
                r["min_gap_ms"],
                r["rate"],
                r["vs_budget"],
                r["vs_gate"],
                r["seconds"],
                r["drained"],
            ]
        )
        worst += int(r["too_close"])  # type: ignore[call-overload]
        gap = r["min_gap_ms"]
        if isinstance(gap, float):
            ratio = gap / (interval * 1000)
            smallest = ratio if smallest is None else min(smallest, ratio)
        print(
            f"  politeness {interval * 1000:g} ms, {workers} workers / {processes} processes: "
            f"{r['requests']} requests, {r['too_close']} too close, min gap {gap} ms, {r['rate']:.2f} req/s",
            flush=True,
        )
    result.table(
        f"one site, interval {INTERVAL * 1000:g} ms (and {BATCH_INTERVAL * 1000:g} ms: batch jobs), "
        "measured at the server",
        [
            "interval ms",
            "workers",
            "procs",
            "threads/proc",
            "requests",
            "items",
            "gaps < interval",
            "min gap ms",
            "steady req/s",
            "rate / (1/interval)",
            "rate / (1/(interval+margin))",
            "wall s",
            "drained",
        ],
        rows,
    )
    result.checks.append(Check("requests closer than the interval, all configurations", str(worst), "0", worst == 0))
    result.checks.append(
        Check(
            "smallest gap seen, over the interval",
            f"{smallest:.2f}" if smallest else "-",
            ">= 1",
            None if smallest is None else smallest >= 1,
        )
    )
    result.seconds = time.monotonic() - started
    return result
