"""Utilization: with just enough workers, the crawl runs at the sum of the sites' budgets.

What is measured: four demo shops, one slow (300 ms per response) and three fast
(10 ms), each with its own interval, every product URL seeded up front (so each site has
far more queued work than the run can use). Download workers run as burst workers over
several processes (``crawler.launcher.start_workers``), one parse process beside them.
After a warm-up (robots.txt, first refills, process start) the requests arriving at
each shop during a fixed window are counted: achieved rate = requests / window, and
utilization = achieved total rate / sum of 1/interval (target >= 0.95). The ratio
against sum of 1/(interval + gate_margin), the most the gates allow, is shown too,
as is the mean gap per site minus its interval: the time from one gate opening to the
next request leaving, which is what the rate loses.

The worker count is "just enough": the slow site alone keeps rate x latency =
1.5 workers busy, the fast ones ~0.3 more, so 3 workers reach the budget only if none
of them sits behind a closed gate while another site has budget.

For contrast (``naive``): the same shops, gates (``crawler.gate.site_gate``, rearmed
on send) and HTTP client (``crawler.fetch.Fetcher``), the same number of worker
threads, but each worker takes the next URL in round-robin order over the sites (as
an RQ worker over per-site queues would) and waits on that site's gate.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import threading
import time
from pathlib import Path

from crawler.demo import ShopSite
from crawler.fetch import Fetcher
from crawler.frontier import seed
from crawler.gate import site_gate
from crawler.launcher import WorkerSpec, start_workers, stop_workers
from crawler.runtime import Runtime

from .common import BenchRedis, BenchResult, Check, crawl_settings, gaps

#: (response latency s, interval s) of each site.
SITES: list[tuple[float, float]] = [(0.3, 0.2), (0.01, 0.1), (0.01, 0.15), (0.01, 0.2)]
#: Products per shop, all seeded: more than any run can fetch.
PRODUCTS = 2000
#: Download worker processes x threads per process ("just enough" workers).
PROCESSES = 3
THREADS = 1
#: A second run with twice the workers: if it is no faster, workers were not the limit.
AMPLE_THREADS = 2
#: Parse worker processes (one thread each).
PARSERS = 1
#: Seconds after the first request before counting starts, and seconds counted.
WARMUP = 6.0
WINDOW = 30.0
QUICK_WARMUP = 4.0
QUICK_WINDOW = 8.0
#: Seconds the naive contrast counts (after its own short warm-up).
NAIVE_WARMUP = 2.0
NAIVE_WINDOW = 15.0
QUICK_NAIVE_WINDOW = 5.0
#: Required ratio of achieved rate to the sum of the budgets.
TARGET = 0.95


def window_counts(shops: list[ShopSite], start: float, end: float) -> list[list[float]]:
    """Arrival times per shop within [start, end)."""
    return [[e.time for e in shop.requests if start <= e.time < end] for shop in shops]


def site_rows(names: list[str], per_site: list[list[float]], window: float, margin: float) -> list[list[object]]:
    rows: list[list[object]] = []
    for name, (latency, interval), times in zip(names, SITES, per_site, strict=True):
        spacing = gaps(times)
        mean_gap = statistics.fmean(spacing) if spacing else None
        rows.append([name, latency * 1000, interval * 1000, 1 / interval, len(times) / window,
                     len(times) / window * interval, sum(1 for g in spacing if g < interval),
                     min(spacing) * 1000 if spacing else None,
                     (mean_gap - interval) * 1000 if mean_gap else None])
    return rows


def run_crawler(redis: BenchRedis, warmup: float, window: float, threads: int,
                run_id: str) -> tuple[list[list[object]], float, float, float]:
    """Our workers on the four shops; returns per-site rows, total rate, ratio, ratio vs gate."""
    names = [f"util{run_id}{i}_{redis.tag}" for i in range(len(SITES))]
    shops = [ShopSite(products=PRODUCTS, latency=latency, faults=False).start() for latency, _ in SITES]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-util-") as tmp:
            settings = crawl_settings(Path(tmp), redis.url, names,
                                      {name: interval for name, (_, interval) in zip(names, SITES, strict=True)})
            rt = Runtime(redis.connection, settings)
            for name, shop in zip(names, shops, strict=True):
                seed(rt.frontier(name), [f"{shop.url}/product/{i}" for i in range(1, PRODUCTS + 1)])
            rt.close()
            specs = [WorkerSpec("download", tuple(names), threads=threads, burst=True)] * PROCESSES
            specs += [WorkerSpec("parse", tuple(names), threads=1, burst=True)] * PARSERS
            procs = start_workers(specs, settings, redis.url)
            try:
                deadline = time.monotonic() + 60
                while not any(shop.requests for shop in shops) and time.monotonic() < deadline:
                    time.sleep(0.05)
                first = min(shop.requests[0].time for shop in shops if shop.requests)
                start, end = first + warmup, first + warmup + window
                time.sleep(max(0.0, end - time.time()) + 0.5)
            finally:
                stop_workers(procs, timeout=20)
            per_site = window_counts(shops, start, end)
            margin = settings.gate_margin
    finally:
        for shop in shops:
            shop.stop()
    total = sum(len(t) for t in per_site) / window
    budget = sum(1 / interval for _, interval in SITES)
    gate_budget = sum(1 / (interval + margin) for _, interval in SITES)
    return site_rows(names, per_site, window, margin), total, total / budget, total / gate_budget


def run_naive(redis: BenchRedis, warmup: float, window: float, margin: float) -> tuple[float, float]:
    """Round-robin workers that wait on each URL's site gate. Returns total rate and ratio."""
    shops = [ShopSite(products=PRODUCTS, latency=latency, faults=False).start() for latency, _ in SITES]
    stop = threading.Event()
    urls = itertools.cycle(
        (i, f"{shops[i].url}/product/{n}") for n in range(1, PRODUCTS + 1) for i in range(len(SITES))
    )
    lock = threading.Lock()

    def worker() -> None:
        fetcher = Fetcher(timeout=10, max_body_bytes=1 << 20, user_agent="bench-naive")
        try:
            while not stop.is_set():
                with lock:
                    site, url = next(urls)
                gate = site_gate(redis.connection, f"naive{site}_{redis.tag}", SITES[site][1], margin)
                gate.acquire()
                fetcher.get(url, on_sent=gate.rearm)
        finally:
            fetcher.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(PROCESSES * THREADS)]
    started = time.time()
    for thread in threads:
        thread.start()
    time.sleep(warmup + window)
    stop.set()
    for thread in threads:
        thread.join(5)
    for shop in shops:
        shop.stop()
    per_site = window_counts(shops, started + warmup, started + warmup + window)
    total = sum(len(t) for t in per_site) / window
    return total, total / sum(1 / interval for _, interval in SITES)


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    warmup, window = (QUICK_WARMUP, QUICK_WINDOW) if quick else (WARMUP, WINDOW)
    naive_window = QUICK_NAIVE_WINDOW if quick else NAIVE_WINDOW
    budget = sum(1 / interval for _, interval in SITES)
    busy = sum(latency / interval for latency, interval in SITES)
    result = BenchResult("utilization", {
        "sites (latency s, interval s)": SITES, "products_per_site (all seeded)": PRODUCTS,
        "download processes x threads": f"{PROCESSES} x {THREADS}", "parse_processes": PARSERS,
        "warmup_s": warmup, "window_s": window, "budget req/s (sum 1/interval)": round(budget, 2),
        "worker-seconds/s spent waiting on responses at budget": round(busy, 2),
    })
    started = time.monotonic()
    rows, total, ratio, ratio_gate = run_crawler(redis, warmup, window, THREADS, "a")
    from crawler.settings import Settings

    margin = Settings().gate_margin
    result.params["gate_margin_s"] = margin
    result.table(
        f"per site, requests arriving in a {window:g} s window after {warmup:g} s warm-up",
        ["site", "latency ms", "interval ms", "budget req/s", "achieved req/s", "rate / budget",
         "gaps < interval", "min gap ms", "mean gap - interval ms"],
        rows,
    )
    summary = [["crawler (scheduler + gates)", PROCESSES * THREADS, budget, total, ratio, ratio_gate]]
    print(f"  utilization: {total:.2f} req/s of {budget:.2f} ({ratio:.3f})", flush=True)
    _, ample_total, ample_ratio, ample_gate = run_crawler(redis, warmup, window, AMPLE_THREADS, "b")
    summary.append([f"crawler, {AMPLE_THREADS}x the workers", PROCESSES * AMPLE_THREADS, budget, ample_total,
                    ample_ratio, ample_gate])
    print(f"  utilization, {PROCESSES * AMPLE_THREADS} workers: {ample_total:.2f} req/s ({ample_ratio:.3f})",
          flush=True)
    naive_total, naive_ratio = run_naive(redis, NAIVE_WARMUP, naive_window, margin)
    summary.append(["naive round-robin, wait on the gate", PROCESSES * THREADS, budget, naive_total, naive_ratio,
                    None])
    print(f"  naive: {naive_total:.2f} req/s ({naive_ratio:.3f})", flush=True)
    result.table("total", ["configuration", "workers", "budget req/s", "achieved req/s", "rate / budget",
                           "rate / sum 1/(interval+margin)"], summary)
    too_close = sum(int(r[6]) for r in rows)  # type: ignore[call-overload]
    result.checks.append(Check("achieved rate / sum of budgets", f"{ratio:.3f}", f">= {TARGET}", ratio >= TARGET))
    result.checks.append(Check("requests closer than their site's interval", str(too_close), "0", too_close == 0))
    result.checks.append(Check(f"same with {PROCESSES * AMPLE_THREADS} workers", f"{ample_ratio:.3f}", "-", None))
    result.checks.append(Check("naive round-robin for contrast", f"{naive_ratio:.3f}", "-", None))
    result.seconds = time.monotonic() - started
    return result
