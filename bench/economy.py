"""Economy (issue 46): Redis bytes per seen and per queued URL; seeding, ``status`` and ``sites`` at 10,000 sites.

What is measured, each on a Redis of its own (``bench_redis``: a fresh private server per
measurement, so no figure carries another's keys):

- **seen URL**: N URLs of one site (86 characters, ``memory.url_for``) through the dedup
  check as the crawler adds them, ``memory.seen_dedup`` (``mark_seen_together``, calls of
  ``SEEN_CHUNK``): bytes a URL by the ``used_memory`` delta (``INFO memory``, before and
  after, divided by N) and by the sum of ``MEMORY USAGE`` of the site's seen keys; the
  sub-sets' encodings and the largest; per link, wall and Redis CPU (``INFO cpu``) of the
  check of a new link (all N, added) and of a link seen before (a sample of 200,000 URLs,
  every k-th, checked again), fingerprints made in Python included in the wall time; and
  whether any URL checked again was taken for new;
- **queued URL**: N download tasks for the same URLs pushed into one site's compact
  frontier with ``Frontier.push`` in pipelined batches of ``memory.BATCH``, as the parse
  step queues them (what ``bench memory`` calls "queued URL"): bytes a URL by the
  ``used_memory`` delta and by the sum of ``MEMORY USAGE`` of the site's frontier lists and
  levels set; the mean entry length. Twice: plain GETs at priority 0, depth 0 (the
  ``bench memory`` figure), and a mix (``mixed_task``) of priorities (0, 5, 10), depths
  1-5, two callbacks, a refresh time on one task in four (a recrawl a day) and a form
  POST (a body and its Content-Type) on one in ten. The frontier packs a push's entries
  (``crawler.coord.packs``), and URLs that differ by a counter pack far better than links
  do, so the plain GETs are measured twice more: with varied URLs (``varied_url``: words,
  ids and a query drawn at random, 86 characters, the target's figure as much as the plain
  one's) and with random ones (a path of random letters: the least packing saves);
- **seeding 10,000 sites**: a sites directory of one generated module of 10,000 spiders
  (the demo shop spider under other names, one start URL and domain each; its bytecode
  written first, as a kept sites directory has it), seeded with the real command,
  ``crawler seed --all``, in a subprocess (``REDIS_URL`` and ``DATABASE_URL`` in its
  environment, ``--sites DIR``): its wall time, and the same command again (the second
  seed, every URL found seen); counts checked from its output lines and from Redis
  (``crawler.ops.status.site_status``: frontier entries plus RQ jobs per site), and the
  Redis commands (``INFO commandstats``) and Redis CPU each seed cost;
- **status and sites**: ``crawler status``, ``crawler status --json`` and ``crawler sites``
  as subprocesses against that Redis and sites directory, ``RUNS`` times each, alternated
  (median and least; once with ``--quick``). Every command run is wrapped (``TIMED``) to
  time, inside the process, the import of ``crawler.cli.app`` and the command's own work
  (``cli.main``: settings, loading the spiders, Redis, output); the rest of the wall time is
  the interpreter's start-up and exit.
  Loading the 10,000 spiders alone (``load_spiders``, in a process of its own) is timed too;
  one ``crawler --help`` runs first, untimed, so the first seed does not pay for a cold disk
  cache. The load average is noted: the machine may be shared.

Targets: at most 10 B a seen URL and 50 B a queued URL (plain GETs, ``used_memory`` delta)
at 1 and 10 million URLs; seeding 10,000 sites under 5 s; ``crawler status`` and ``crawler
sites`` under 1 s each with 10,000 sites (wall time, and the command's own work checked
apart). The mix's bytes are shown for information: its entries carry more than a URL.
``--quick``: 100,000 URLs and 1,000 sites, the same targets (set for the full sizes).
"""

from __future__ import annotations

import compileall
import json
import os
import random
import re
import resource
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crawler.coord import keys
from crawler.coord.frontier import DownloadTask, Frontier
from crawler.coord.scheduler import frontier_sizes
from crawler.ops.status import site_status
from crawler.settings import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_FAILURE_TTL
from crawler.spiders.spider import FORM_TYPE
from crawler.store.database import Store

from .common import BenchRedis, BenchResult, Check, bench_redis, command_delta, command_stats, compile_crawler
from .memory import BATCH, URL_LENGTH, redis_cpu, seen_dedup, url_for, used_memory

#: URLs of one site, seen and queued.
URL_COUNTS = (1_000_000, 10_000_000)
QUICK_URL_COUNTS = (100_000,)
#: Sites seeded.
SITES = 10_000
QUICK_SITES = 1_000
#: Runs of each of ``status``, ``status --json`` and ``sites``.
RUNS = 3
QUICK_RUNS = 1
#: Longest a command may take.
COMMAND_TIMEOUT = 600.0
#: Tasks whose frontier entries are measured for the mean entry length (the first ones).
ENTRY_SAMPLE = 10_000
#: Targets.
TARGET_SEEN = 10.0
TARGET_QUEUED = 50.0
TARGET_SEED_S = 5.0
TARGET_COMMAND_S = 1.0
#: The mix: priorities by ``n % 10`` (0 seven in ten, 5 two, 10 one), a refresh on one task in four,
#: a form POST on one in ten.
MIX_REFRESH = 86400.0
MIX_BODY = "page={page}&sort=price&order=asc"

#: Runs a ``crawler`` command (its arguments) and writes, at exit, the seconds of the CLI's import
#: and of the command's own work to stderr as one ``BENCH_TIMES {json}`` line.
TIMED = """\
import json, sys, time
started = time.perf_counter()
from crawler.cli.app import cli
imported = time.perf_counter()
try:
    cli.main(args=sys.argv[1:], prog_name="crawler")
finally:
    done = time.perf_counter()
    sys.stderr.write("\\nBENCH_TIMES " + json.dumps({"import": imported - started, "work": done - imported}) + "\\n")
"""
#: Loads the spiders of a sites directory and prints the seconds it took.
LOAD_SPIDERS = """\
import sys, time
from crawler.spiders.loading import load_spiders
started = time.perf_counter()
found = load_spiders(sys.argv[1])
print(time.perf_counter() - started, len(found.spiders), len(found.errors))
"""

SITES_MODULE = '''\
"""Economy benchmark sites (generated by bench.economy): the demo shop spider, one start URL each."""

from crawler.demo.spider import DemoShop

{classes}
'''

SITE_CLASS = """
class Site{index}(DemoShop):
    name = {name!r}
    interval = 1.0
    start_urls = [{url!r}]
    allowed_domains = [{host!r}]
"""

#: A line of ``crawler seed --all``.
SEED_LINE = re.compile(r"^(\S+): (\d+) enqueued, (\d+) already seen$")


# -- seen and queued URLs -----------------------------------------------------------------


def plain_task(site: str, n: int) -> DownloadTask:
    """A plain GET at priority 0, depth 0: ``bench memory``'s queued URL."""
    return DownloadTask(site, url_for(n))


#: Words of the varied URLs' paths (``varied_url``): a shop's categories and product names.
WORDS = (
    "kitchen dining garden outdoor bedroom bath lighting decor storage office kids toys sports fitness travel "
    "luggage shoes boots jackets shirts dresses denim knit wool linen cotton leather ceramic glass steel oak "
    "walnut bamboo vintage modern classic compact deluxe premium organic handmade limited edition large small "
    "blue green red black white grey navy sand olive rose"
).split()


def varied_url(n: int) -> str:
    """A product URL of exactly URL_LENGTH characters as a shop's links are: words, ids and a query drawn
    at random for each ``n`` (the same for the same ``n``), so packs hold no run of near-identical URLs."""
    rng = random.Random(n)
    words = "-".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4)))
    url = (
        f"https://www.example-shop.com/{rng.choice(WORDS)}/{rng.choice(WORDS)}-{rng.choice(WORDS)}/"
        f"{words}-{rng.randrange(10**9):09d}?ref={rng.choice(WORDS)}&v={rng.randrange(10**6)}"
    )
    return (url + "x" * URL_LENGTH)[:URL_LENGTH]


def varied_task(site: str, n: int) -> DownloadTask:
    """A plain GET at priority 0 of ``varied_url(n)``: what packs save on links that share less."""
    return DownloadTask(site, varied_url(n))


def random_task(site: str, n: int) -> DownloadTask:
    """A plain GET at priority 0 of a URL whose path is random letters and digits: the least packs save."""
    rng = random.Random(n)
    path = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(URL_LENGTH))
    return DownloadTask(site, ("https://www.example-shop.com/" + path)[:URL_LENGTH])


def mixed_task(site: str, n: int) -> DownloadTask:
    """A task of the mix: priority, depth, callback, refresh and method all by ``n``."""
    post = n % 10 == 3
    return DownloadTask(
        site,
        url_for(n),
        callback="parse_product" if n % 2 else "parse",
        depth=1 + n % 5,
        priority=(0, 0, 0, 0, 0, 0, 0, 5, 5, 10)[n % 10],
        refresh=MIX_REFRESH if n % 4 == 0 else None,
        method="POST" if post else "GET",
        headers={"Content-Type": FORM_TYPE} if post else {},
        body=MIX_BODY.format(page=n % 100).encode() if post else None,
    )


def frontier_keys(redis: BenchRedis, site: str) -> list[str]:
    """The site's frontier lists (one a priority, named by its levels set), its extra counts (``packs``)
    and the levels set, last."""
    levels = redis.connection.zrange(keys.levels(site), 0, -1)
    return [keys.frontier(site, int(level)) for level in levels] + [keys.frontier_extra(site), keys.levels(site)]


def queued_bytes(redis: BenchRedis, site: str, count: int, task: Callable[[str, int], DownloadTask]) -> dict[str, Any]:
    """Bytes a URL after ``Frontier.push`` of ``count`` tasks ``task(site, n)``, BATCH a push (as ``bench memory``)."""
    frontier = Frontier(redis.connection, site, ["example-shop.com"], DEFAULT_FAILURE_TTL, DEFAULT_DOWNLOAD_TIMEOUT)
    before = used_memory(redis)
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        frontier.push([task(site, n) for n in range(start, min(count, start + BATCH))])
    seconds = time.perf_counter() - started
    after = used_memory(redis)
    found = frontier_keys(redis, site)
    with redis.connection.pipeline(transaction=False) as pipe:
        for key in found:
            pipe.memory_usage(key, samples=0)
        usage = sum(size or 0 for size in pipe.execute())
    lists = found[:-2]
    with redis.connection.pipeline(transaction=False) as pipe:
        for key in lists:
            pipe.llen(key)
        elements = pipe.execute()
    sample = range(min(count, ENTRY_SAMPLE))  # consecutive: the mix repeats every 100 tasks, a stride would alias it
    entries = sum(len(task(site, n).to_entry().encode()) for n in sample)
    return {
        "count": count,
        "entries": frontier_sizes(redis.connection, [site])[0],
        "elements": sum(elements),
        "lists": len(lists),
        "delta": after - before,
        "per_url": (after - before) / count,
        "key_usage_per_url": usage / count,
        "mean entry bytes": entries / len(sample),
        "seconds": seconds,
    }


# -- seeding, status, sites ---------------------------------------------------------------


def write_sites(directory: Path, names: list[str]) -> Path:
    """A sites directory of one module: a spider per name, its own start URL and domain; bytecode written."""
    directory.mkdir(parents=True, exist_ok=True)
    classes = "".join(
        SITE_CLASS.format(index=i, name=name, url=f"https://www.site{i:05d}.example/", host=f"www.site{i:05d}.example")
        for i, name in enumerate(names)
    )
    path = directory / "economy_sites.py"
    path.write_text(SITES_MODULE.format(classes=classes))
    compileall.compile_file(path, quiet=1)
    return directory


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_command(args: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """One ``crawler`` command in a subprocess (``TIMED``): wall, start-up + exit, import, own work, CPU, output."""
    cpu, started = children_cpu(), time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", TIMED, *args],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:  # stopped: a failed run, shown as one
        done = subprocess.CompletedProcess(exc.cmd, -9, _text(exc.stdout), _text(exc.stderr) + "\n(timed out)")
    wall, cpu = time.perf_counter() - started, children_cpu() - cpu
    times: dict[str, float] = {}
    stderr = []
    for line in done.stderr.splitlines():
        if line.startswith("BENCH_TIMES "):
            times = json.loads(line.removeprefix("BENCH_TIMES "))
        elif line.strip():
            stderr.append(line)
    imported, work = times.get("import"), times.get("work")
    return {
        "returncode": done.returncode,
        "wall": wall,
        "cpu": cpu,
        "import": imported,
        "work": work,
        "startup": wall - imported - work if imported is not None and work is not None else None,
        "stdout": done.stdout,
        "stderr": "\n".join(stderr),
    }


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def seed_counts(stdout: str) -> tuple[int, int, int]:
    """Lines, URLs enqueued and URLs already seen, summed over ``crawler seed --all``'s lines."""
    lines = enqueued = seen = 0
    for line in stdout.splitlines():
        match = SEED_LINE.match(line.strip())
        if match:
            lines, enqueued, seen = lines + 1, enqueued + int(match[2]), seen + int(match[3])
    return lines, enqueued, seen


def queued_in_redis(redis: BenchRedis, names: list[str]) -> tuple[int, int]:
    """URLs queued over ``names`` (frontier entries and RQ jobs, ``site_status``), and sites with exactly one."""
    statuses = site_status(redis.connection, names)
    return sum(s.queued for s in statuses), sum(1 for s in statuses if s.queued == 1)


def seeding(redis: BenchRedis, count: int, workdir: Path, runs: int) -> dict[str, Any]:
    """Seed ``count`` sites with ``crawler seed --all``, twice; then time ``status``, ``status --json``, ``sites``."""
    names = [f"eco{i:05d}_{redis.tag}" for i in range(count)]
    sites_dir = write_sites(workdir / "sites", names)
    database_url = f"sqlite:///{workdir / 'crawl.db'}"
    Store(database_url).close()  # the schema, as ``crawler crawl`` makes it before anything else
    env = {
        **os.environ,
        "REDIS_URL": redis.url,
        "DATABASE_URL": database_url,
        "CRAWLER_STATE_DIR": str(workdir / "state"),
    }
    base = ["--sites", str(sites_dir)]
    load = subprocess.run(
        [sys.executable, "-c", LOAD_SPIDERS, str(sites_dir)], env=env, capture_output=True, text=True, timeout=600
    )
    load_s, loaded, load_errors = load.stdout.split() if load.returncode == 0 else ("nan", "0", "?")
    run_command(["--help"], env, workdir)  # a warm-up: the first process to import the CLI reads its files from disk
    seeds = []
    for _ in range(2):
        stats, cpu = command_stats(redis.connection), redis_cpu(redis)
        ran = run_command([*base, "seed", "--all"], env, workdir)
        ran["redis commands"] = sum(command_delta(stats, command_stats(redis.connection)).values())
        ran["redis cpu"] = redis_cpu(redis) - cpu
        ran["lines"], ran["enqueued"], ran["already seen"] = seed_counts(ran["stdout"])
        ran["queued in Redis"], ran["sites with one"] = queued_in_redis(redis, names)
        seeds.append(ran)
    commands: dict[str, list[dict[str, Any]]] = {"status": [], "status --json": [], "sites": []}
    for _ in range(runs):  # alternated, so that a busy moment of the machine weighs on all three alike
        for name in commands:
            commands[name].append(run_command([*base, *name.split()], env, workdir))
    listed = None
    try:
        report = json.loads(commands["status --json"][-1]["stdout"])
        listed = {s["site"]: s["queued"] for s in report["sites"]}
    except (ValueError, KeyError, TypeError):
        pass
    return {
        "names": names,
        "load spiders s": float(load_s),
        "spiders loaded": int(loaded),
        "spider load errors": load_errors,
        "seeds": seeds,
        "commands": commands,
        "status listed": listed,
        "sites lines": commands["sites"][-1]["stdout"].count("\n"),
    }


# -- the benchmark ------------------------------------------------------------------------


def median_of(done: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in done if r[field] is not None]
    return statistics.median(values) if values else None


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    """``redis`` (the runner's) is left alone: each measurement starts a Redis of its own."""
    counts = QUICK_URL_COUNTS if quick else URL_COUNTS
    sites = QUICK_SITES if quick else SITES
    runs = QUICK_RUNS if quick else RUNS
    result = BenchResult(
        "economy",
        {
            "URLs of one site": ", ".join(f"{n:,}" for n in counts),
            "URL length": URL_LENGTH,
            "example URL": url_for(1),
            "push batch": BATCH,
            "mix": "priority 0/5/10 (7:2:1), depth 1-5, callback parse|parse_product, refresh 1 day on 1 in 4, "
            f"form POST ({len(MIX_BODY.format(page=42))}-byte body + Content-Type) on 1 in 10",
            "sites seeded": sites,
            "command runs": runs,
            "redis": "a fresh bench_redis per measurement",
        },
    )
    started, load_before = time.monotonic(), os.getloadavg()
    compile_crawler()
    seen_rows, seen_time_rows, queued_rows = [], [], []
    for count in counts:
        with bench_redis() as fresh:
            seen = seen_dedup(fresh, f"ecoseen_{fresh.tag}", count)
        print(f"  economy: {seen['per_url']:.2f} B per seen URL at {count:,}", flush=True)
        seen_rows.append(
            [
                count,
                seen["new"],
                seen["delta"],
                seen["per_url"],
                seen["key_usage_per_url"],
                seen["keys"],
                ", ".join(f"{k} {v:,}" for k, v in seen["encodings"].items()),
                seen["largest set"],
            ]
        )
        seen_time_rows.append(
            [
                count,
                seen["add Redis CPU us/link"],
                seen["add us/link"],
                seen["seen again"],
                seen["re-check Redis CPU us/link"],
                seen["re-check us/link"],
                seen["false new on re-check"],
            ]
        )
        result.checks.append(
            Check(
                f"Redis bytes per seen URL at {count:,} (used_memory; MEMORY USAGE)",
                f"{seen['per_url']:.2f}; {seen['key_usage_per_url']:.2f}",
                f"<= {TARGET_SEEN:g}",
                seen["per_url"] <= TARGET_SEEN,
            )
        )
        result.checks.append(
            Check(
                f"seen URLs at {count:,}: new when added / new when checked again",
                f"{seen['new']:,} / {seen['false new on re-check']:,}",
                f"{count:,} / 0",
                seen["new"] == count and seen["false new on re-check"] == 0,
            )
        )
        result.checks.append(
            Check(
                f"dedup Redis CPU a link at {count:,}: seen before / new (us)",
                f"{seen['re-check Redis CPU us/link']:.2f} / {seen['add Redis CPU us/link']:.2f}",
                "-",
                None,
            )
        )
        kinds = (
            ("plain GET, priority 0", plain_task),
            ("varied URLs, GET, priority 0", varied_task),
            ("random URLs, GET, priority 0", random_task),
            ("mix", mixed_task),
        )
        for kind, task in kinds:
            with bench_redis() as fresh:
                queued = queued_bytes(fresh, f"ecoq_{fresh.tag}", count, task)
            print(f"  economy: {queued['per_url']:.1f} B per queued URL ({kind}) at {count:,}", flush=True)
            queued_rows.append(
                [
                    kind,
                    count,
                    queued["entries"],
                    queued["lists"],
                    queued["delta"],
                    queued["per_url"],
                    queued["key_usage_per_url"],
                    queued["mean entry bytes"],
                    queued["seconds"],
                ]
            )
            plain = task in (plain_task, varied_task)
            result.checks.append(
                Check(
                    f"Redis bytes per queued URL at {count:,}, {kind} (used_memory; MEMORY USAGE)"
                    + ("" if plain else ", for information"),
                    f"{queued['per_url']:.1f}; {queued['key_usage_per_url']:.1f}",
                    f"<= {TARGET_QUEUED:g}" if plain else "-",
                    queued["per_url"] <= TARGET_QUEUED if plain else None,
                )
            )
    result.table(
        "seen URLs of one site, added as the crawler adds them (memory.seen_dedup)",
        [
            "URLs",
            "new",
            "used_memory delta",
            "bytes per URL",
            "MEMORY USAGE per URL",
            "seen keys",
            "encodings",
            "largest set",
        ],
        seen_rows,
    )
    result.table(
        "dedup check a link (calls of SEEN_CHUNK; wall includes making fingerprints in Python)",
        [
            "URLs",
            "new: Redis CPU us",
            "new: wall us",
            "seen checked",
            "seen: Redis CPU us",
            "seen: wall us",
            "seen taken for new",
        ],
        seen_time_rows,
    )
    result.table(
        "queued URLs of one site (Frontier.push)",
        [
            "tasks",
            "count",
            "entries",
            "lists",
            "used_memory delta",
            "bytes per URL",
            "MEMORY USAGE per URL",
            "mean entry bytes",
            "push s",
        ],
        queued_rows,
    )

    with bench_redis() as fresh, tempfile.TemporaryDirectory(prefix="bench-economy-") as tmp:
        load_seeding = os.getloadavg()
        found = seeding(fresh, sites, Path(tmp), runs)
    first, second = found["seeds"]
    print(f"  economy: seeded {sites:,} sites in {first['wall']:.2f} s, again in {second['wall']:.2f} s", flush=True)
    result.table(
        f"crawler seed --all, {sites:,} sites of one start URL each (subprocess)",
        [
            "seed",
            "exit",
            "wall s",
            "start-up + exit s",
            "import s",
            "own work s",
            "CPU s",
            "Redis commands",
            "a site",
            "Redis CPU s",
            "lines",
            "enqueued",
            "already seen",
            "queued in Redis",
        ],
        [
            [
                label,
                s["returncode"],
                s["wall"],
                s["startup"],
                s["import"],
                s["work"],
                s["cpu"],
                s["redis commands"],
                s["redis commands"] / sites,
                s["redis cpu"],
                s["lines"],
                s["enqueued"],
                s["already seen"],
                s["queued in Redis"],
            ]
            for label, s in (("first", first), ("second (all seen)", second))
        ],
    )
    rows = []
    for name, done in found["commands"].items():
        rows.append(
            [
                f"crawler {name}",
                ", ".join(str(r["returncode"]) for r in done),
                median_of(done, "wall"),
                min(r["wall"] for r in done),
                median_of(done, "startup"),
                median_of(done, "import"),
                median_of(done, "work"),
                min((r["work"] for r in done if r["work"] is not None), default=None),
                median_of(done, "cpu"),
                len(done[-1]["stdout"]),
            ]
        )
    result.table(
        f"commands with {sites:,} seeded sites (subprocess; median of {runs}, alternated)",
        [
            "command",
            "exit",
            "wall s",
            "least wall s",
            "start-up + exit s",
            "import s",
            "own work s",
            "least own work s",
            "CPU s",
            "output chars",
        ],
        rows,
    )
    result.notes.append(
        f"loading the {found['spiders loaded']:,} spiders alone (load_spiders, own process, bytecode written): "
        f"{found['load spiders s']:.2f} s ({found['spider load errors']} errors); part of every command's own work"
    )
    load_after = os.getloadavg()
    result.notes.append(
        "load average (1, 5, 15 min) at the start, before the seeding, at the end: "
        + "; ".join(", ".join(f"{x:.2f}" for x in load) for load in (load_before, load_seeding, load_after))
    )
    result.notes.append(
        "start-up + exit = wall - (import of crawler.cli.app + the command's own work, timed inside the process)"
    )
    for label, s in (("first seed", first), ("second seed", second)):
        if s["returncode"] != 0:
            result.notes.append(f"{label} failed: {s['stderr'][-1000:]}")
    for name, done in found["commands"].items():
        if any(r["returncode"] != 0 for r in done):
            result.notes.append(f"crawler {name} failed: {done[-1]['stderr'][-1000:]}")

    result.checks.append(
        Check(
            f"first seed: lines / enqueued / queued in Redis / sites with one URL ({sites:,} sites)",
            f"{first['lines']:,} / {first['enqueued']:,} / {first['queued in Redis']:,} / {first['sites with one']:,}",
            f"{sites:,} each",
            first["returncode"] == 0
            and first["lines"] == first["enqueued"] == first["queued in Redis"] == first["sites with one"] == sites
            and first["already seen"] == 0,
        )
    )
    result.checks.append(
        Check(
            f"crawler seed --all wall time, {sites:,} sites (own work {first['work'] or 0:.2f} s)",
            f"{first['wall']:.2f} s",
            f"< {TARGET_SEED_S:g} s" + ("" if sites == SITES else f" (set for {SITES:,} sites)"),
            first["returncode"] == 0 and first["wall"] < TARGET_SEED_S,
        )
    )
    result.checks.append(
        Check(
            "second seed: enqueued / already seen / queued in Redis",
            f"{second['enqueued']:,} / {second['already seen']:,} / {second['queued in Redis']:,}",
            f"0 / {sites:,} / {sites:,}",
            second["returncode"] == 0
            and second["enqueued"] == 0
            and second["already seen"] == sites
            and second["queued in Redis"] == sites
            and second["sites with one"] == sites,
        )
    )
    result.checks.append(
        Check(
            f"second seed wall time, {sites:,} sites (own work {second['work'] or 0:.2f} s)",
            f"{second['wall']:.2f} s",
            f"< {TARGET_SEED_S:g} s" + ("" if sites == SITES else f" (set for {SITES:,} sites)"),
            second["returncode"] == 0 and second["wall"] < TARGET_SEED_S,
        )
    )
    listed = found["status listed"]
    ours = sum(1 for name in found["names"] if listed and listed.get(name) == 1)
    result.checks.append(
        Check(
            "crawler status --json lists every site, one URL queued each",
            f"{ours:,} of {sites:,}",
            f"{sites:,}",
            ours == sites,
        )
    )
    for name in ("status", "sites"):
        done = found["commands"][name]
        ok = all(r["returncode"] == 0 for r in done)
        wall, work = median_of(done, "wall"), median_of(done, "work")
        target = f"< {TARGET_COMMAND_S:g} s" + ("" if sites == SITES else f" (set for {SITES:,} sites)")
        result.checks.append(
            Check(
                f"crawler {name} wall time, {sites:,} sites (median of {runs})",
                f"{wall:.2f} s" if wall is not None else "-",
                target,
                ok and wall is not None and wall < TARGET_COMMAND_S,
            )
        )
        result.checks.append(
            Check(
                f"crawler {name} own work, without start-up and import (median of {runs})",
                f"{work:.2f} s" if work is not None else "-",
                target,
                ok and work is not None and work < TARGET_COMMAND_S,
            )
        )
    result.seconds = time.monotonic() - started
    return result
