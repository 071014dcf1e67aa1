"""Throughput per core with no politeness limit, against Scrapy on the same site, same run.

What is measured: one zero-latency demo shop (``ShopSite(faults=False)``) crawled end to
end -- robots.txt, home, every listing page, every product, the PDF -- first by our
workers (download + parse + store: download processes, a parse process, items upserted
into SQLite, a fetch record per request, Redis on a unix socket), then by Scrapy
(``scrapy runspider`` of a minimal spider with the same selectors and the same items,
written to a JSON lines feed, ``ROBOTSTXT_OBEY=True``), in a subprocess of a Python
that has Scrapy (``BENCH_SCRAPY_PYTHON``, this one, or /tmp/benchvenv). Same shop
instance, one after the other; the shop keeps no state between them.

Ours runs with the site's interval at 1 ms and ``gate_margin`` 0, so the gate is not
what limits it. Figures per crawler: requests the shop served, items, wall time (from
starting the processes until they exit), pages/s, CPU time, CPU ms per page, pages per
CPU-second ("pages/s per core": the rate one fully used core would give).

Fixed cost: each crawler also crawls an empty shop (no products: robots.txt, home,
catalogue), the same way; its CPU is what a crawl costs whatever its size (interpreter
and imports in every process, connections, the drain). The cost per page beyond it,
(CPU - fixed CPU) / (pages - fixed pages), is what a longer crawl tends to.

Both run from bytecode: the crawler's own modules are compiled first (``compile_crawler``),
as an installed copy has them and as pip wrote Scrapy's.

CPU time: the crawler's processes (worker processes or the Scrapy process, from
``getrusage(RUSAGE_CHILDREN)`` deltas once they are reaped), plus for ours the
redis-server process (psutil; else, on a Redis of another host, the ``used_cpu_user`` +
``used_cpu_sys`` deltas of ``INFO cpu``, which count any other client's load too). Redis
CPU per page, and the pages per Redis CPU-second it gives ("pages/s per Redis core": the
rate at which one fully used Redis core would be the limit), come from that figure.
The shop server runs in this (parent) process for both crawlers; its CPU
(``RUSAGE_SELF`` delta, parent's own waiting included) is shown apart and left out of
the ratio, since it is the same work for both. Redis commands
per page are ``INFO commandstats`` deltas (commands inside Lua scripts included).
"""

from __future__ import annotations

import json
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from crawler.demo import ShopSite

from .common import (
    BenchRedis,
    BenchResult,
    Check,
    command_delta,
    command_stats,
    compile_crawler,
    crawl_settings,
    crawler_command,
    scrapy_python,
    steady_rate,
    stored_items,
    write_config,
)

#: Products in the shop (a full crawl is products + products/per_page + 4 requests).
PRODUCTS = 2000
QUICK_PRODUCTS = 300
PER_PAGE = 20
#: Our site interval (s) and gate margin: no politeness limit to speak of.
INTERVAL = 0.001
GATE_MARGIN = 0.0
#: Our workers: download processes x threads, and parse processes x threads.
DOWNLOAD_PROCESSES = 2
DOWNLOAD_THREADS = 2
PARSE_PROCESSES = 1
PARSE_THREADS = 1
#: Scrapy's concurrency (its defaults are 16 overall and 8 per domain; one domain here).
SCRAPY_CONCURRENCY = 16
#: Rounds of both crawls, in turns (the ratio reported is the median round's); 1 with --quick.
ROUNDS = 3
#: Longest either crawl may take.
CRAWL_TIMEOUT = 170.0

SCRAPY_SPIDER = '''\
"""The demo shop spider for Scrapy: the same selectors and items as crawler.demo.spider."""

import scrapy
from scrapy.http import TextResponse

PRODUCT_LINKS = "a[href*='product/']"


class ShopSpider(scrapy.Spider):
    name = "shop"
    allowed_domains = ["127.0.0.1"]

    def __init__(self, start=None, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [start]

    def parse(self, response):
        if not isinstance(response, TextResponse):  # the PDF: nothing to parse
            return
        yield from response.follow_all(css=PRODUCT_LINKS, callback=self.parse_product)
        yield from response.follow_all(css="a[href]:not([href*='product/'])", callback=self.parse)

    def parse_product(self, response):
        yield {
            "sku": response.css(".sku::text").get("").strip(),
            "name": response.css("h1::text").get("").strip(),
            "price": float(response.css(".price::text").get()),
            "in_stock": response.css(".stock::text").get("").strip() == "in stock",
            "url": response.url,
        }
        yield from response.follow_all(css="a.related", callback=self.parse_product)
'''


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _info_cpu(redis: BenchRedis) -> float:
    """CPU seconds the Redis server has used (``INFO cpu``: user + system, every thread)."""
    info = redis.connection.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _process_cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def figures(
    name: str, pages: int, items: int, wall: float, cpu: float, server_cpu: float, steady: float, extra: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "pages": pages,
        "items": items,
        "wall": wall,
        "pages_per_s": pages / wall,
        "steady": steady,
        "cpu": cpu,
        "cpu_ms_per_page": cpu * 1000 / pages,
        "pages_per_cpu_s": pages / cpu,
        "server_cpu": server_cpu,
        **extra,
    }


def run_ours(redis: BenchRedis, shop: ShopSite, workdir: Path, name: str = "thr") -> dict[str, Any]:
    """``crawler crawl`` of the shop in a subprocess, as users run it (launcher + workers)."""
    site = f"{name}_{redis.tag}"
    settings = crawl_settings(workdir, redis.url, [site], {site: INTERVAL}, gate_margin=GATE_MARGIN)
    args = [
        *crawler_command(write_config(workdir / "config.yaml", settings)),
        "crawl",
        site,
        shop.url + "/",
        "--processes",
        str(DOWNLOAD_PROCESSES),
        "--threads",
        str(DOWNLOAD_THREADS),
        "--parsers",
        str(PARSE_PROCESSES),
    ]
    redis_pid = redis.server_pid()
    first = len(shop.requests)
    stats, children, parent, server, server_info = (
        command_stats(redis.connection),
        _children_cpu(),
        _self_cpu(),
        _process_cpu(redis_pid),
        _info_cpu(redis),
    )
    started = time.monotonic()
    try:
        completed = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=CRAWL_TIMEOUT)
        drained = completed.returncode == 0
    except subprocess.TimeoutExpired:
        drained = False
    wall = time.monotonic() - started
    workers_cpu = _children_cpu() - children
    parent_cpu = _self_cpu() - parent
    redis_after = _process_cpu(redis_pid)
    redis_cpu = redis_after - server if redis_after is not None and server is not None else None
    redis_info_cpu = _info_cpu(redis) - server_info
    commands = command_delta(stats, command_stats(redis.connection))
    requests = shop.requests[first:]
    pages = len(requests)
    cpu = workers_cpu + (redis_cpu or 0.0)
    return figures(
        "crawler",
        pages,
        stored_items(settings.database_url, site),
        wall,
        cpu,
        parent_cpu,
        steady_rate([e.time for e in requests]),
        {
            "workers_cpu": workers_cpu,
            "redis_cpu": redis_cpu,
            "redis_info_cpu": redis_info_cpu,
            "redis_cpu_ms_per_page": (redis_cpu if redis_cpu is not None else redis_info_cpu) * 1000 / pages,
            "drained": drained,
            "redis_commands_per_page": sum(commands.values()) / pages,
            "evalsha_per_page": commands.get("evalsha", 0) / pages,
            "top_commands": sorted(commands.items(), key=lambda kv: -kv[1])[:8],
        },
    )


def run_scrapy(python: str, shop: ShopSite, workdir: Path) -> dict[str, Any]:
    spider = workdir / "shop_spider.py"
    spider.write_text(SCRAPY_SPIDER)
    feed = workdir / "items.jsonl"
    args = [
        python,
        "-m",
        "scrapy",
        "runspider",
        str(spider),
        "-a",
        f"start={shop.url}/",
        "-O",
        str(feed),
        "-s",
        "ROBOTSTXT_OBEY=True",
        "-s",
        "LOG_LEVEL=WARNING",
        "-s",
        f"CONCURRENT_REQUESTS={SCRAPY_CONCURRENCY}",
        "-s",
        f"CONCURRENT_REQUESTS_PER_DOMAIN={SCRAPY_CONCURRENCY}",
        "-s",
        "DOWNLOAD_DELAY=0",
        "-s",
        "TELNETCONSOLE_ENABLED=False",
        "-s",
        "AUTOTHROTTLE_ENABLED=False",
    ]
    first = len(shop.requests)
    children, parent = _children_cpu(), _self_cpu()
    started = time.monotonic()
    completed = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=CRAWL_TIMEOUT)
    wall = time.monotonic() - started
    scrapy_cpu = _children_cpu() - children
    parent_cpu = _self_cpu() - parent
    if completed.returncode != 0:
        raise RuntimeError(f"scrapy failed ({completed.returncode}): {completed.stderr[-2000:]}")
    lines = feed.read_text().splitlines() if feed.exists() else []
    skus = {json.loads(line)["sku"] for line in lines if line.strip()}
    requests = shop.requests[first:]
    pages = len(requests)
    return figures(
        "Scrapy",
        pages,
        len(skus),
        wall,
        scrapy_cpu,
        parent_cpu,
        steady_rate([e.time for e in requests]),
        {"item_lines": len(lines), "stderr_tail": completed.stderr.strip().splitlines()[-3:]},
    )


def _fixed_costs(redis: BenchRedis, python: str | None) -> list[dict[str, Any]]:
    """Each crawler's run over an empty shop (no products): what a crawl costs whatever its size."""
    runs = []
    with ShopSite(products=0, faults=False) as empty, tempfile.TemporaryDirectory(prefix="bench-thr0-") as tmp:
        runs.append(run_ours(redis, empty, Path(tmp) / "ours", name="thr0"))
        if python is not None:
            (Path(tmp) / "scrapy").mkdir()
            runs.append(run_scrapy(python, empty, Path(tmp) / "scrapy"))
    return runs


def _marginal_ms(run: dict[str, Any], fixed: dict[str, Any]) -> float:
    """CPU ms per page beyond the fixed cost: (CPU - fixed CPU) / (pages - fixed pages)."""
    return (run["cpu"] - fixed["cpu"]) * 1000 / max(1, run["pages"] - fixed["pages"])


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    compile_crawler()  # as installed: Scrapy runs from the bytecode pip wrote
    products = QUICK_PRODUCTS if quick else PRODUCTS
    python = scrapy_python()
    result = BenchResult(
        "throughput",
        {
            "products": products,
            "per_page": PER_PAGE,
            "faults": False,
            "latency": 0,
            "ours": f"{DOWNLOAD_PROCESSES} download processes x {DOWNLOAD_THREADS} threads + "
            f"{PARSE_PROCESSES} parse process x {PARSE_THREADS}, interval {INTERVAL} s, gate_margin {GATE_MARGIN}, "
            "SQLite store",
            "scrapy": f"CONCURRENT_REQUESTS(_PER_DOMAIN)={SCRAPY_CONCURRENCY}, ROBOTSTXT_OBEY=True, "
            "LOG_LEVEL=WARNING, JSON lines feed",
            "scrapy python": python or "not found",
        },
    )
    started = time.monotonic()
    rounds = 1 if quick else ROUNDS
    ours_runs: list[dict[str, Any]] = []
    theirs_runs: list[dict[str, Any]] = []
    with (
        ShopSite(products=products, per_page=PER_PAGE, faults=False) as shop,
        tempfile.TemporaryDirectory(prefix="bench-thr-") as tmp,
    ):
        for n in range(1, rounds + 1):
            # Each round runs both, in turns, first one then the other: a machine that speeds up
            # or slows down during the run weighs on both alike.
            order = ["ours", "scrapy"] if n % 2 else ["scrapy", "ours"]
            for which in order:
                if which == "ours":
                    run_ = run_ours(redis, shop, Path(tmp) / f"ours{n}", name=f"thr{n}")
                    ours_runs.append(run_)
                elif python is not None:
                    (Path(tmp) / f"scrapy{n}").mkdir()
                    run_ = run_scrapy(python, shop, Path(tmp) / f"scrapy{n}")
                    theirs_runs.append(run_)
                else:
                    continue
                run_["round"] = n
                print(
                    f"  throughput round {n}: {run_['name']} {run_['pages']} pages in {run_['wall']:.1f} s, "
                    f"{run_['cpu_ms_per_page']:.2f} CPU ms/page",
                    flush=True,
                )
        if python is None:
            result.notes.append("Scrapy not found: set BENCH_SCRAPY_PYTHON (see bench/requirements.txt)")
    # The figures of the round whose ratio is the median (ours alone: its median CPU per page).
    ratios = [o["pages_per_cpu_s"] / t["pages_per_cpu_s"] for o, t in zip(ours_runs, theirs_runs, strict=False)]
    middle = sorted(range(len(ratios)), key=lambda i: ratios[i])[len(ratios) // 2] if ratios else None
    if middle is None:
        middle = sorted(range(len(ours_runs)), key=lambda i: ours_runs[i]["cpu_ms_per_page"])[len(ours_runs) // 2]
    ours = ours_runs[middle]
    runs = [ours] + ([theirs_runs[middle]] if theirs_runs else [])
    fixed = _fixed_costs(redis, python)
    result.table(
        "end to end on one zero-latency site, every round",
        [
            "round",
            "crawler",
            "pages",
            "items",
            "wall s",
            "pages/s (wall)",
            "pages/s (steady p10-p90)",
            "CPU s",
            "CPU ms/page",
            "pages per CPU-s",
            "shop server CPU s",
        ],
        [
            [
                r["round"],
                r["name"],
                r["pages"],
                r["items"],
                r["wall"],
                r["pages_per_s"],
                r["steady"],
                r["cpu"],
                r["cpu_ms_per_page"],
                r["pages_per_cpu_s"],
                r["server_cpu"],
            ]
            for r in sorted(ours_runs + theirs_runs, key=lambda r: (r["round"], r["name"]))
        ],
    )
    if ratios:
        result.table(
            "ours / Scrapy, pages per CPU-second, by round (the median round's figures are used below)",
            ["round", "ratio", "beyond the fixed cost"],
            [
                [n + 1, ratio, _marginal_ms(t, fixed[1]) / _marginal_ms(o, fixed[0]) if len(fixed) == 2 else None]
                for n, (ratio, o, t) in enumerate(zip(ratios, ours_runs, theirs_runs, strict=False))
            ],
        )
    result.table(
        f"our CPU and Redis use (round {ours['round']})",
        [
            "worker processes CPU s",
            "redis-server CPU s",
            "INFO cpu s",
            "Redis CPU ms/page",
            "pages/s per Redis core",
            "Redis commands/page",
            "EVALSHA/page",
            "top commands",
        ],
        [
            [
                ours["workers_cpu"],
                ours["redis_cpu"],
                ours["redis_info_cpu"],
                ours["redis_cpu_ms_per_page"],
                1000 / ours["redis_cpu_ms_per_page"] if ours["redis_cpu_ms_per_page"] else None,
                ours["redis_commands_per_page"],
                ours["evalsha_per_page"],
                ", ".join(f"{name} {n / ours['pages']:.1f}" for name, n in ours["top_commands"]),
            ]
        ],
    )
    if fixed:
        result.table(
            "fixed cost (the same crawl of an empty shop: start, robots.txt, home, drain, exit) and the cost per page "
            "beyond it",
            ["crawler", "pages", "CPU s (fixed)", "CPU ms/page beyond the fixed cost", "pages per CPU-s beyond it"],
            [
                [f["name"], f["pages"], f["cpu"], _marginal_ms(r, f), 1000 / _marginal_ms(r, f)]
                for r, f in zip(runs, fixed, strict=False)
            ],
        )
    if not ours["drained"]:
        result.notes.append("our workers did not drain the crawl within the time limit")
    result.checks.append(Check("ours: pages per CPU-second (per core)", f"{ours['pages_per_cpu_s']:.0f}", "-", None))
    result.checks.append(Check("ours: CPU ms per page", f"{ours['cpu_ms_per_page']:.1f}", "-", None))
    commands = ours["redis_commands_per_page"]
    result.checks.append(Check("ours: Redis commands per page", f"{commands:.1f}", "<= 30", commands <= 30))
    redis_ms = ours["redis_cpu_ms_per_page"]
    result.checks.append(Check("ours: Redis CPU ms per page", f"{redis_ms:.2f}", "-", None))
    if redis_ms:
        result.checks.append(Check("ours: pages/s one Redis core carries", f"{1000 / redis_ms:.0f}", "-", None))
    if len(runs) == 2:
        theirs = runs[1]
        ratio = ours["pages_per_cpu_s"] / theirs["pages_per_cpu_s"]
        shown = f"{ratio:.2f}" + (f" (median of {', '.join(f'{r:.2f}' for r in ratios)})" if len(ratios) > 1 else "")
        result.checks.append(Check("ours / Scrapy, pages per CPU-second", shown, ">= 1.0", ratio >= 1.0))
        if len(fixed) == 2:
            beyond = _marginal_ms(theirs, fixed[1]) / _marginal_ms(ours, fixed[0])
            result.checks.append(
                Check("ours / Scrapy, pages per CPU-second beyond the fixed cost", f"{beyond:.2f}", "reported", None)
            )
        wall_ratio = ours["pages_per_s"] / theirs["pages_per_s"]
        result.checks.append(Check("ours / Scrapy, pages per second (wall)", f"{wall_ratio:.2f}", "reported", None))
        stored = [r["items"] for r in ours_runs + theirs_runs]
        complete = all(n == products for n in stored)
        result.checks.append(
            Check("both stored every item, every round", " / ".join(map(str, stored)), f"{products} each", complete)
        )
    result.seconds = time.monotonic() - started
    return result
