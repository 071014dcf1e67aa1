"""Rendering: pages rendered per second, CPU and memory per rendered page, against plain fetching.

Two crawls of the loopback shop of ``crawler.demo.spa``, each by one download worker
process (``THREADS`` threads: as many pages rendered at once) and one parse worker process,
to the end (burst):

- **rendered**: the single-page app (every page a shell whose script writes it from JSON),
  a spider with ``render = True``: each page is a document, a script and an XHR, each
  through the site's gate, in a page of the site's browser context in the process's one Chromium;
- **plain**: the server-rendered twin (``/ssr/``), the same pages written by the server,
  fetched without a browser.

The site's interval is 1 ms, so the figures are the worker's cost, not politeness. The
download process and everything under it (Playwright's driver, Chromium and its helper
processes) are sampled every ``SAMPLE_EVERY`` seconds with psutil: CPU seconds (user +
system, each process's last reading) and PSS (proportional set size: shared pages split
between the processes that share them, so the browser's processes add up honestly).
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

import psutil

from crawler.coord.frontier import seed
from crawler.demo.spa import SPIDER_SOURCE, SpaSite
from crawler.work.chromium import find_browser
from crawler.work.launcher import WorkerSpec, start_workers
from crawler.work.runtime import Runtime

from .common import BenchRedis, BenchResult, Check, crawl_settings, run_until_exit, stored_items

#: Products of the shop (pages crawled: one more, its home page).
PRODUCTS = 150
QUICK_PRODUCTS = 20
#: Threads of the download process (its pages rendered at once: ``render.RENDER_PAGES`` at most).
THREADS = 4
#: The site's interval (seconds): short, so that the figures are the workers' cost, not politeness.
INTERVAL = 0.001
#: Seconds between two samples of the download process tree.
SAMPLE_EVERY = 0.25
#: Longest a crawl may take.
CRAWL_TIMEOUT = 900.0


class TreeSampler:
    """Samples a process and its descendants in a thread: last CPU seconds and peak PSS (and RSS) per run."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.cpu: dict[int, float] = {}
        #: Each process's kind (``process_kind``), for where the CPU goes.
        self.kinds: dict[int, str] = {}
        self.peak_pss = 0
        self.peak_rss = 0
        self.browser_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_EVERY)

    def sample(self) -> None:
        pss = rss = 0
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        self.browser_processes = max(self.browser_processes, len(processes) - 1)
        for process in processes:
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    memory = process.memory_full_info()
            except psutil.Error:
                continue
            self.cpu[process.pid] = times.user + times.system
            if process.pid not in self.kinds:
                self.kinds[process.pid] = process_kind(process)
            pss += getattr(memory, "pss", memory.rss)
            rss += memory.rss
        self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)

    def cpu_by_kind(self) -> dict[str, float]:
        """CPU seconds of the processes sampled, summed by kind, most first."""
        by: dict[str, float] = {}
        for pid, seconds in self.cpu.items():
            by[self.kinds.get(pid, "?")] = by.get(self.kinds.get(pid, "?"), 0.0) + seconds
        return dict(sorted(by.items(), key=lambda kv: -kv[1]))


def process_kind(process: psutil.Process) -> str:
    """What a process of the download tree is: the worker (python), Playwright's driver (node), or
    Chromium's browser, renderer, GPU or utility process (its ``--type``)."""
    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return "?"
    if not cmdline:
        return "?"
    if cmdline[0].endswith("node"):
        return "playwright driver"
    if "python" in Path(cmdline[0]).name:
        return "worker (python)"
    kind = next((arg.removeprefix("--type=") for arg in cmdline if arg.startswith("--type=")), "browser")
    return f"chromium {kind}"


def crawl(redis: BenchRedis, workdir: Path, site: SpaSite, render: bool) -> dict[str, Any]:
    """One crawl of the shop (the app rendered, or its twin plain) and its figures."""
    start = site.url + ("/" if render else "/ssr/")
    settings = crawl_settings(workdir, redis.url, [], {"bench": INTERVAL})
    (Path(settings.sites_dir) / "bench.py").write_text(SPIDER_SOURCE.format(name="bench", url=start, render=render))
    redis.connection.flushdb()
    rt = Runtime(redis.connection, settings)
    try:
        seed(rt.frontier("bench"), [start])
    finally:
        rt.close()
    specs = [
        WorkerSpec(kind, ("bench",), threads=THREADS if kind == "download" else 1, burst=True)
        for kind in ("download", "parse")
    ]
    download, parse = start_workers(specs, settings, redis.url)
    site.arrivals.clear()
    with TreeSampler(download.pid) as sampler, TreeSampler(parse.pid) as parse_sampler:
        seconds, finished = run_until_exit([download, parse], CRAWL_TIMEOUT)
    pages = site.products + 1
    gap = site.min_gap()
    return {
        "pages": pages,
        "items": stored_items(settings.database_url, "bench"),
        "seconds": seconds,
        "finished": finished,
        "pages_per_s": pages / seconds,
        "cpu_s": sum(sampler.cpu.values()),
        "parse_cpu_s": sum(parse_sampler.cpu.values()),
        "min_gap_ms": None if gap is None else gap * 1000,
        "peak_pss_mib": sampler.peak_pss / 2**20,
        "peak_rss_mib": sampler.peak_rss / 2**20,
        "processes": sampler.browser_processes + 1,
        "cpu_s_by_kind": sampler.cpu_by_kind(),
    }


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    products = QUICK_PRODUCTS if quick else PRODUCTS
    browser = find_browser()
    parameters = {"products": products, "pages": products + 1, "download threads": THREADS, "browser": browser}
    result = BenchResult("render", parameters)
    figures: dict[str, dict[str, Any]] = {}
    with SpaSite(products=products) as site, tempfile.TemporaryDirectory(prefix="bench-render-") as tmp:
        for name, render in (("plain (server-rendered twin)", False), ("rendered (single-page app)", True)):
            workdir = Path(tmp) / ("rendered" if render else "plain")
            workdir.mkdir()
            figures[name] = crawl(redis, workdir, site, render)
    rows = [
        [
            name,
            f["pages"],
            f["items"],
            f["seconds"],
            f["pages_per_s"],
            f["cpu_s"],
            f["parse_cpu_s"],
            (f["cpu_s"] + f["parse_cpu_s"]) / f["pages"] * 1000,
            f["peak_pss_mib"],
            f["peak_rss_mib"],
            f["processes"],
        ]
        for name, f in figures.items()
    ]
    result.table(
        f"one download process ({THREADS} threads) + one parse process (1 thread), interval 1 ms",
        [
            "crawl",
            "pages",
            "items",
            "seconds",
            "pages/s",
            "download CPU s",
            "parse CPU s",
            "CPU ms/page (both)",
            "peak PSS MiB",
            "peak RSS MiB (sum)",
            "processes",
            "closest requests ms",
        ],
        [[*row, figures[row[0]]["min_gap_ms"]] for row in rows],
    )
    rendered = figures["rendered (single-page app)"]
    result.table(
        "where the rendered crawl's download CPU goes",
        ["process", "CPU s", "ms/page"],
        [[kind, cpu, cpu / rendered["pages"] * 1000] for kind, cpu in rendered["cpu_s_by_kind"].items()],
    )
    for name, f in figures.items():
        result.checks.append(Check(f"{name}: every item", f"{f['items']}", f"{products}", f["items"] == products))
        gap = f["min_gap_ms"]
        held = gap is not None and gap >= INTERVAL * 1000
        result.checks.append(
            Check(f"{name}: closest requests on the wire", f"{gap or 0:.2f} ms", f">= {INTERVAL * 1000:g} ms", held)
        )
    cpu_ms = (rendered["cpu_s"] + rendered["parse_cpu_s"]) / rendered["pages"] * 1000
    result.checks += [
        Check("rendered pages a second", f"{rendered['pages_per_s']:.2f}", ">= 4", rendered["pages_per_s"] >= 4),
        Check("rendered: CPU ms a page, every process", f"{cpu_ms:.0f}", "<= 250", cpu_ms <= 250),
        Check("rendered: peak PSS MiB", f"{rendered['peak_pss_mib']:.0f}", "<= 700", rendered["peak_pss_mib"] <= 700),
    ]
    result.notes.append(
        "download CPU and memory: the download worker process and its descendants (Playwright's driver, "
        "Chromium's processes); PSS splits shared pages between the processes that share them"
    )
    return result
