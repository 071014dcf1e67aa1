"""Where the throughput crawl's CPU and Redis commands go: ``python -m bench.profile``.

Runs the throughput benchmark's crawl (ours only, same shop and workers) with py-spy
(``pip install py-spy`` into the bench venv) sampling every worker process, and prints,
per worker kind, the share of CPU samples under the functions that matter (inclusive),
plus every Redis command by name per page (``INFO commandstats`` deltas). Options:
``--products N`` (default 2,000), ``--out DIR`` (keeps the collapsed stacks, one file
per process, for flame graphs).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from unittest import mock

from crawler.coord.frontier import seed
from crawler.demo import ShopSite
from crawler.work.launcher import WorkerSpec, start_workers
from crawler.work.runtime import Runtime

from . import throughput
from .common import (
    bench_redis,
    command_delta,
    command_stats,
    compile_crawler,
    crawl_settings,
    format_table,
    run_until_exit,
)

#: Frames whose inclusive share is shown (a substring of py-spy's ``function (file:line)``).
WATCHED = (
    ("job function: download", "download (crawler/work/jobs/__init__.py"),
    ("job function: parse", "parse (crawler/work/parse_job.py"),
    ("  robots check", "allowed (crawler/work/robots.py"),
    ("  gate take", "take_gate (crawler/work/runtime.py"),
    ("  HTTP GET (httpx)", "get (crawler/http/fetch.py"),
    ("  hand to parser (zlib + enqueue)", "hand_to_parser (crawler/work/jobs/outcomes.py"),
    ("  spider callback (selectolax)", "parse_product (crawler/demo/spider.py"),
    ("  spider callback, listing", "parse (crawler/demo/spider.py"),
    ("  upsert items", "upsert_items (crawler/store/database.py"),
    ("  frontier.add", "add (crawler/coord/frontier.py"),
    ("  job_done (fetch record + metrics)", "job_done (crawler/work/events.py"),
    ("    record_fetches (SQLAlchemy)", "record_fetches (crawler/store/database.py"),
    ("    metrics pipeline", "count_job (crawler/ops/metrics.py"),
    ("RQ perform_job (all of a job's life)", "perform_job (rq/worker/base.py"),
    ("ours: perform_job (all of a job's life)", "perform_job (crawler/work/crawl_worker.py"),
    ("  ours: one-step success (joblife.finish)", "finish (crawler/coord/joblife.py"),
    ("ours: claim (joblife.claim)", "claim (crawler/coord/joblife.py"),
    ("  RQ prepare_job_execution", "prepare_job_execution (rq/worker/base.py"),
    ("  RQ _finalize_success", "_finalize_success (rq/worker/base.py"),
    ("    RQ handle_job_success", "handle_job_success (rq/worker/base.py"),
    ("RQ prepare_execution", "prepare_execution (rq/worker/base.py"),
    ("thread starts (per-job heartbeat, timers)", "start (threading.py"),
    ("dequeue loop (next job)", "dequeue_job_and_maintain_ttl (crawler/work/download_worker.py"),
    ("  PICK_SITE, NEXT_JOB / scheduler", "next (crawler/coord/scheduler.py"),
    ("  Job.fetch", "fetch (rq/job.py"),
    ("  refill", "refill (crawler/coord/frontier.py"),
    ("  drain check", "crawl_drained (crawler/work/drain.py"),
    ("  promote / reap", "_periodic (crawler/work/crawl_worker.py"),
    ("worker heartbeat", "heartbeat (crawler/work/crawl_worker.py"),
    ("redis-py: send + read (all callers)", "execute_command (redis/client.py"),
    ("redis-py: pipelines (all callers)", "execute (redis/client.py"),
    ("SQLAlchemy execute (all callers)", "execute (sqlalchemy/engine/base.py"),
    ("logging (all callers)", "(logging/__init__.py"),
)


def collapsed(path: Path) -> Counter[str]:
    """Samples per stack from a py-spy ``--format raw`` file."""
    stacks: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            stacks[stack] += int(count)
    return stacks


def shares(stacks: Counter[str]) -> list[list[object]]:
    """Per watched frame: samples whose stack holds it (inclusive), and their share."""
    total = sum(stacks.values()) or 1
    rows: list[list[object]] = []
    for label, needle in WATCHED:
        n = sum(c for stack, c in stacks.items() if needle in stack)
        rows.append([label, n, f"{100 * n / total:.1f}%"])
    rows.append(["all samples", total, "100%"])
    return rows


def top_self(stacks: Counter[str], n: int = 25) -> list[list[object]]:
    """The frames most samples end in (self time), with their share."""
    total = sum(stacks.values()) or 1
    leaf: Counter[str] = Counter()
    for stack, count in stacks.items():
        leaf[stack.rsplit(";", 1)[-1]] += count
    return [[frame[:110], count, f"{100 * count / total:.1f}%"] for frame, count in leaf.most_common(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=throughput.PRODUCTS)
    parser.add_argument("--out", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    args = parser.parse_args(argv)
    compile_crawler()  # as installed (see bench.throughput)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    with (
        bench_redis() as redis,
        ShopSite(products=args.products, per_page=throughput.PER_PAGE, faults=False) as shop,
        tempfile.TemporaryDirectory(prefix="bench-prof-") as tmp,
    ):
        site = f"thr_{redis.tag}"
        settings = crawl_settings(
            Path(tmp), redis.url, [site], {site: throughput.INTERVAL}, gate_margin=throughput.GATE_MARGIN
        )
        rt = Runtime(redis.connection, settings)
        seed(rt.frontier(site), [shop.url + "/"])
        rt.close()
        specs = [
            WorkerSpec("download", (site,), threads=throughput.DOWNLOAD_THREADS, burst=True)
        ] * throughput.DOWNLOAD_PROCESSES
        specs += [
            WorkerSpec("parse", (site,), threads=throughput.PARSE_THREADS, burst=True)
        ] * throughput.PARSE_PROCESSES
        first = len(shop.requests)
        before = command_stats(redis.connection)
        # Forked, as ``crawler crawl`` starts them (this process runs the shop's threads, so
        # ``start_workers`` would spawn): no import in the samples, the work alone.
        with mock.patch("crawler.work.launcher.start_method", return_value="fork"):
            procs = start_workers(specs, settings, redis.url)
        spies = []
        for spec, proc in zip(specs, procs, strict=True):
            raw = out / f"{proc.name}.txt"
            spies.append(
                (
                    spec.kind,
                    raw,
                    subprocess.Popen(
                        [
                            py_spy,
                            "record",
                            "--pid",
                            str(proc.pid),
                            "--rate",
                            str(args.rate),
                            "--format",
                            "raw",
                            "--output",
                            str(raw),
                            "--threads",
                            "--gil",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    ),
                )
            )
        wall, drained = run_until_exit(procs, throughput.CRAWL_TIMEOUT)
        for _, _, spy in spies:
            spy.wait(30)
        time.sleep(0.2)
        commands = command_delta(before, command_stats(redis.connection))
        pages = len(shop.requests) - first
    print(f"{pages} pages in {wall:.1f} s (drained: {drained}); stacks in {out}")
    for kind in ("download", "parse"):
        stacks: Counter[str] = Counter()
        for spy_kind, raw, _ in spies:
            if spy_kind == kind and raw.exists():
                stacks.update(collapsed(raw))
        # Thread names are the first frame with --threads; drop them so stacks of all threads pool.
        stacks = Counter({s.split(";", 1)[-1]: c for s, c in stacks.items()})
        print(f"\n{kind} worker processes: inclusive share of CPU samples")
        print(format_table(["frame", "samples", "share"], shares(stacks)))
        print(f"\n{kind} worker processes: self time, top frames")
        print(format_table(["frame", "samples", "share"], top_self(stacks)))
    total = sum(commands.values())
    ranked = sorted(commands.items(), key=lambda kv: -kv[1])
    rows = [[name, n, n / pages, f"{100 * n / total:.1f}%"] for name, n in ranked]
    print(f"\nRedis commands: {total / pages:.1f} per page")
    print(format_table(["command", "calls", "per page", "share"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
