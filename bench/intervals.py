"""Utilization at 0.1, 0.25 and 1 s intervals: the issue's setup, one interval per run.

Three demo shops, one slow (300 ms per response) and two fast (10 ms), all at the same
interval; 2 download processes x 3 threads and one parse process; the default
``gate_margin``. Every product URL is seeded up front. After a warm-up, each site's
rate is taken from its first to its last request arriving in the window (free of the
window's edges) and utilization is the mean over sites of rate x interval: 1.0 is one
request per interval at every site. The margin alone caps it at interval / (interval
+ margin) (0.995 at 1 s, 0.98 at 0.25 s, 0.95 at 0.1 s with the default 5 ms); what is
lost beyond that is the time from a gate opening to the next request leaving.
Targets: >= 0.98 at 1 s and >= 0.95 at 0.25 s, no request closer than the interval.
"""

from __future__ import annotations

from crawler.settings import DEFAULT_GATE_MARGIN

from .common import BenchRedis, BenchResult, Check
from .utilization import SITE_HEADER, Config, run_crawler

#: Intervals measured, with their targets (None: shown, no target).
INTERVALS: list[tuple[float, float | None]] = [(0.1, None), (0.25, 0.95), (1.0, 0.98)]
#: Response latency of each site.
LATENCIES = (0.3, 0.01, 0.01)
#: The issue's worker layout: 2 processes x 3 threads.
WORKERS = Config("2 processes x 3 workers, default gate_margin", 2, 3)
#: Warm-up seconds, and the window in intervals (at least MIN_WINDOW seconds).
WARMUP = 4.0
WINDOW_INTERVALS = 60
MIN_WINDOW = 12.0
QUICK_WINDOW_INTERVALS = 20
QUICK_MIN_WINDOW = 6.0


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    per_interval, minimum = (QUICK_WINDOW_INTERVALS, QUICK_MIN_WINDOW) if quick else (WINDOW_INTERVALS, MIN_WINDOW)
    result = BenchResult(
        "intervals",
        {
            "site latencies s": LATENCIES,
            "intervals s": [i for i, _ in INTERVALS],
            "workers": f"{WORKERS.processes} processes x {WORKERS.threads} threads, 1 parse process",
            "gate_margin s": DEFAULT_GATE_MARGIN,
            "window": f"max({minimum:g} s, {per_interval} intervals) after {WARMUP:g} s",
        },
    )
    summary: list[list[object]] = []
    for index, (interval, target) in enumerate(INTERVALS):
        sites = [(latency, interval) for latency in LATENCIES]
        window = max(minimum, per_interval * interval)
        outcome = run_crawler(redis, WORKERS, WARMUP, window, f"i{index}", sites)
        cap = interval / (interval + DEFAULT_GATE_MARGIN)
        summary.append([interval * 1000, window, outcome.spaced, outcome.ratio, cap, outcome.too_close])
        result.table(f"per site at {interval * 1000:g} ms, {window:g} s window", SITE_HEADER, outcome.rows)
        print(f"  utilization at {interval:g} s: {outcome.spaced:.3f} (margin caps it at {cap:.3f})", flush=True)
        if target is not None:
            result.checks.append(
                Check(
                    f"utilization at {interval:g} s", f"{outcome.spaced:.3f}", f">= {target}", outcome.spaced >= target
                )
            )
        result.checks.append(
            Check(f"requests closer than {interval:g} s", str(outcome.too_close), "0", outcome.too_close == 0)
        )
    result.table(
        "utilization by interval",
        ["interval ms", "window s", "utilization", "count / window / budget", "margin's cap", "gaps < interval"],
        summary,
    )
    return result
