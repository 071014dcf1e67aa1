"""Utilization: with just enough workers, the crawl runs at the sum of the sites' budgets.

What is measured: four demo shops, one slow (300 ms per response) and three fast
(10 ms), each with its own interval, every product URL seeded up front (so each site has
far more queued work than a run can use). Download workers run as burst workers over
several processes (``crawler.work.launcher.start_workers``), one parse process beside them.
After a warm-up (process start, robots.txt, first refills) the requests arriving at
each shop during a fixed window are counted: achieved rate = requests / window, and
utilization = achieved total rate / sum of 1/interval (target >= 0.95). The ratio
against the sum of 1/(interval + gate_margin), the most the gates allow, is shown too,
as is each site's mean gap minus its interval: the time from one gate opening to the
next request arriving, which is what the rate loses.

Each site's robots.txt is fetched before the workers start (``Runtime.robots``, through
the site's gate), except in the "cold robots.txt" run: there the workers race for it
at start, and one that loses waits on the robots lock, which (``Gate.acquire`` sleeping
the lock's remaining PTTL) can keep it idle for up to the lock's 60 s lifetime.

The worker count is "just enough": the slow site alone keeps rate x latency = 1.5
workers busy and a fast-site job holds a worker ~20 ms (10 ms response + ~10 ms of
job overhead), so at the budget ~2 of the 3 workers are busy; 3 workers reach the
budget only if none of them sits behind a closed gate while another site has budget.
Further configurations (full run only): 3 workers with ``gate_margin`` 2 ms instead
of the default (what the margin costs), 4 workers, and 3 workers with a cold
robots.txt cache.

For contrast (``naive``): the same shops, gates (``crawler.coord.gate.site_gate``, rearmed
on send) and HTTP client (``crawler.http.fetch.Fetcher``), the same number of worker
threads, but each worker takes the next URL in round-robin order over the sites (as an
RQ worker over per-site queues would) and waits on that site's gate.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from crawler.coord.frontier import seed
from crawler.coord.gate import site_gate
from crawler.demo import ShopSite
from crawler.http.fetch import Fetcher
from crawler.settings import DEFAULT_GATE_MARGIN
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers
from crawler.work.runtime import Runtime

from .common import BenchRedis, BenchResult, Check, crawl_settings, gaps

#: (response latency s, interval s) of each site.
SITES: list[tuple[float, float]] = [(0.3, 0.2), (0.01, 0.1), (0.01, 0.15), (0.01, 0.2)]
#: Products per shop, all seeded: more than any run can fetch.
PRODUCTS = 2000
#: Parse worker processes (one thread each).
PARSERS = 1
#: Seconds after the first request before counting starts, and seconds counted.
WARMUP = 5.0
WINDOW = 15.0
QUICK_WARMUP = 4.0
QUICK_WINDOW = 8.0
#: Seconds the naive contrast counts (after its own short warm-up).
NAIVE_WARMUP = 2.0
NAIVE_WINDOW = 12.0
QUICK_NAIVE_WINDOW = 5.0
#: Required ratio of achieved rate to the sum of the budgets.
TARGET = 0.95


@dataclass(frozen=True)
class Config:
    """One run: download processes x threads, and the gate margin (None: the default)."""

    label: str
    processes: int
    threads: int
    margin: float | None = None
    #: Fetch each site's robots.txt (through the library's RobotsCache and the site's
    #: gate) before the workers start, as in a crawl that has been running for a while.
    warm_robots: bool = True

    @property
    def workers(self) -> int:
        return self.processes * self.threads


#: The target run: "just enough" workers, default settings.
MAIN = Config("3 workers, default gate_margin", 3, 1)
#: Further runs of a full benchmark.
EXTRA = [
    Config("3 workers, gate_margin 2 ms", 3, 1, 0.002),
    Config("4 workers, default gate_margin", 4, 1),
    Config("3 workers, default gate_margin, cold robots.txt", 3, 1, warm_robots=False),
]


@dataclass
class Outcome:
    """What one run achieved."""

    rows: list[list[object]]
    total: float
    ratio: float
    ratio_gate: float
    margin: float
    too_close: int
    #: Mean over sites of achieved rate x interval, the rate taken from first to last arrival.
    spaced: float = 0.0


def window_counts(shops: list[ShopSite], start: float, end: float) -> list[list[float]]:
    """Arrival times per shop within [start, end)."""
    return [[e.time for e in shop.requests if start <= e.time < end] for shop in shops]


def site_rows(
    names: list[str], per_site: list[list[float]], window: float, sites: list[tuple[float, float]] = SITES
) -> list[list[object]]:
    rows: list[list[object]] = []
    for name, (latency, interval), times in zip(names, sites, per_site, strict=True):
        spacing = gaps(times)
        mean_gap = statistics.fmean(spacing) if spacing else None
        rows.append(
            [
                name,
                latency * 1000,
                interval * 1000,
                1 / interval,
                len(times) / window,
                len(times) / window * interval,
                sum(1 for g in spacing if g < interval),
                min(spacing) * 1000 if spacing else None,
                (mean_gap - interval) * 1000 if mean_gap else None,
            ]
        )
    return rows


def run_crawler(
    redis: BenchRedis,
    config: Config,
    warmup: float,
    window: float,
    run_id: str,
    sites: list[tuple[float, float]] = SITES,
) -> Outcome:
    """Our workers on fresh shops (``sites``: latency, interval) for warm-up + window seconds."""
    names = [f"util{run_id}s{i}_{redis.tag}" for i in range(len(sites))]
    shops = [ShopSite(products=PRODUCTS, latency=latency, faults=False).start() for latency, _ in sites]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-util-") as tmp:
            overrides = {} if config.margin is None else {"gate_margin": config.margin}
            settings = crawl_settings(
                Path(tmp),
                redis.url,
                names,
                {name: interval for name, (_, interval) in zip(names, sites, strict=True)},
                **overrides,
            )
            rt = Runtime(redis.connection, settings)
            for name, shop in zip(names, shops, strict=True):
                seed(rt.frontier(name), [f"{shop.url}/product/{i}" for i in range(1, PRODUCTS + 1)])
                if config.warm_robots:
                    rt.robots.allowed(name, f"{shop.url}/", settings.user_agent, functools.partial(rt.take_gate, name))
            rt.close()
            specs = [WorkerSpec("download", tuple(names), threads=config.threads, burst=True)] * config.processes
            specs += [WorkerSpec("parse", tuple(names), threads=1, burst=True)] * PARSERS
            before = [len(shop.requests) for shop in shops]  # robots.txt fetched above
            procs = start_workers(specs, settings, redis.url)
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not any(
                    len(shop.requests) > n for shop, n in zip(shops, before, strict=True)
                ):
                    time.sleep(0.05)
                first = min(
                    (shop.requests[n].time for shop, n in zip(shops, before, strict=True) if len(shop.requests) > n),
                    default=time.time(),
                )
                start, end = first + warmup, first + warmup + window
                time.sleep(max(0.0, end - time.time()) + 0.5)
            finally:
                stop_workers(procs, timeout=20)
            per_site = window_counts(shops, start, end)
            margin = settings.gate_margin
    finally:
        for shop in shops:
            shop.stop()
        redis.reset()
    total = sum(len(t) for t in per_site) / window
    rows = site_rows(names, per_site, window, sites)
    return Outcome(
        rows=rows,
        total=total,
        ratio=total / sum(1 / interval for _, interval in sites),
        ratio_gate=total / sum(1 / (interval + margin) for _, interval in sites),
        margin=margin,
        too_close=sum(int(r[6]) for r in rows),  # type: ignore[call-overload]
        spaced=sum(_spaced_rate(times) * interval for times, (_, interval) in zip(per_site, sites, strict=True))
        / len(sites),
    )


def _spaced_rate(times: list[float]) -> float:
    """Requests per second from the first to the last arrival: free of the window's edge effects."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0


def run_naive(redis: BenchRedis, workers: int, warmup: float, window: float, margin: float) -> tuple[float, float]:
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

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
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


SITE_HEADER = [
    "site",
    "latency ms",
    "interval ms",
    "budget req/s",
    "achieved req/s",
    "rate / budget",
    "gaps < interval",
    "min gap ms",
    "mean gap - interval ms",
]


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    warmup, window = (QUICK_WARMUP, QUICK_WINDOW) if quick else (WARMUP, WINDOW)
    naive_window = QUICK_NAIVE_WINDOW if quick else NAIVE_WINDOW
    configs = [MAIN] if quick else [MAIN, *EXTRA]
    budget = sum(1 / interval for _, interval in SITES)
    busy = sum(latency / interval for latency, interval in SITES)
    result = BenchResult(
        "utilization",
        {
            "sites (latency s, interval s)": SITES,
            "products_per_site (all seeded)": PRODUCTS,
            "runs (download processes x threads, gate_margin)": [
                (c.processes, c.threads, DEFAULT_GATE_MARGIN if c.margin is None else c.margin) for c in configs
            ],
            "parse_processes": PARSERS,
            "warmup_s": warmup,
            "window_s": window,
            "budget req/s (sum 1/interval)": round(budget, 2),
            "worker-seconds/s waiting on responses at budget": round(busy, 2),
        },
    )
    started = time.monotonic()
    summary: list[list[object]] = []
    outcomes: list[Outcome] = []
    for i, config in enumerate(configs):
        outcome = run_crawler(redis, config, warmup, window, str(i))
        outcomes.append(outcome)
        summary.append(
            [
                f"crawler, {config.label}",
                config.workers,
                outcome.margin * 1000,
                outcome.total,
                outcome.ratio,
                outcome.ratio_gate,
                outcome.too_close,
            ]
        )
        result.table(
            f"per site, {config.label}: requests arriving in a {window:g} s window after {warmup:g} s",
            SITE_HEADER,
            outcome.rows,
        )
        print(
            f"  utilization, {config.label}: {outcome.total:.2f} req/s of {budget:.2f} ({outcome.ratio:.3f}; "
            f"{outcome.ratio_gate:.3f} of what the gates allow)",
            flush=True,
        )
    naive_total, naive_ratio = run_naive(redis, MAIN.workers, NAIVE_WARMUP, naive_window, DEFAULT_GATE_MARGIN)
    summary.append(
        [
            "naive round-robin, wait on the gate",
            MAIN.workers,
            DEFAULT_GATE_MARGIN * 1000,
            naive_total,
            naive_ratio,
            naive_total / sum(1 / (i + DEFAULT_GATE_MARGIN) for _, i in SITES),
            None,
        ]
    )
    print(f"  utilization, naive: {naive_total:.2f} req/s ({naive_ratio:.3f})", flush=True)
    result.table(
        "total",
        [
            "configuration",
            "workers",
            "gate_margin ms",
            "achieved req/s",
            "rate / budget",
            "rate / sum 1/(interval+margin)",
            "gaps < interval",
        ],
        summary,
    )
    main = outcomes[0]
    result.checks.append(
        Check(
            f"achieved rate / sum of budgets, {MAIN.label}", f"{main.ratio:.3f}", f">= {TARGET}", main.ratio >= TARGET
        )
    )
    for config, outcome in zip(configs[1:], outcomes[1:], strict=True):
        result.checks.append(
            Check(
                f"achieved rate / sum of budgets, {config.label}",
                f"{outcome.ratio:.3f}",
                f">= {TARGET}",
                outcome.ratio >= TARGET,
            )
        )
    too_close = sum(o.too_close for o in outcomes)
    result.checks.append(
        Check("requests closer than their site's interval, all runs", str(too_close), "0", too_close == 0)
    )
    result.checks.append(Check("naive round-robin for contrast", f"{naive_ratio:.3f}", "-", None))
    result.seconds = time.monotonic() - started
    return result
