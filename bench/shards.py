"""Shards: slow sites over three Redis shards, a site moved live, a primary killed behind Sentinel (issue 44).

Invocation: ``python -m bench shards [--quick]``.

Every site is a fleet shop (``bench.fleet``: robots.txt, home, listing pages of
``fleet.PER_PAGE`` products, the products; latency uniform 0.2-0.8 s a site plus 0-0.1 s a
response) on its own loopback address, served by ``fleet.FleetServer`` (one wildcard socket on
``lo``, each request's arrival the kernel's stamp of its first segment). Ours is the CLI as
users run it: ``crawler seed --all``, then ``crawler worker download --burst`` and ``crawler
worker parse --burst`` (``fleet.worker_commands``: the default processes, or
``BENCH_FLEET_DOWNLOAD_ARGS`` / ``BENCH_FLEET_PARSE_ARGS``) as subprocesses reading one config
file, with this checkout first on their ``PYTHONPATH``. The Redis servers are this benchmark's
own (the one ``python -m bench`` hands in is not used): ``EmbeddedRedis`` for the shards and
the single Redis, Debian's ``redis-server`` and ``redis-sentinel`` for the failover.

1. **Spread** (``SPREAD``: 600 sites x 10 products, 13 requests a site, interval 1 s as
   ``fleet --config 200``; ``--quick`` 60 x 5, 0.5 s): the crawl on three shards
   (``REDIS_URL=a=...,b=...,c=...``, sites placed by rendezvous hashing), then the same crawl
   on one Redis, in the same run. Per shard: its sites (``SCARD crawler:sites`` after
   seeding), the requests that reached its sites, its Redis commands (``INFO commandstats``
   delta, INFO left out) and its Redis CPU (``used_cpu_user + used_cpu_sys`` delta) a page
   (a request on the wire), against the single Redis's. Targets: every item; no request
   closer than the interval at any site; each shard 1/3 of the sites and of the commands
   within 20 % (0.267-0.400); each shard's Redis CPU a page at most the single Redis's.
2. **Moves** (``MOVES``: 30 sites x 40 products, interval 0.5 s; ``--quick`` 10 x 20, 0.25 s)
   on three shards: once the first site has stored an item, ``crawler move SITE --to X``
   (a subprocess, the next shard in turn) three times, ``MOVE_GAP`` s of crawling between
   them, while the workers run. Figures: pages lost (expected items missing), pages fetched
   twice (a path requested twice at one site, on the wire), early requests, each move's pause
   (as ``crawler move`` reports it, and the longest gap of the site on the wire across it), the
   site's keys left on the other shards.
3. **Failover** (``FAILOVER``: 30 sites x 20 products, interval 1 s; ``--quick`` 10 x 10,
   0.5 s): a primary, its replica and one Sentinel (quorum 1, down-after ``DOWN_AFTER_MS``,
   failover-timeout ``FAILOVER_TIMEOUT_MS``), the crawl through
   ``redis+sentinel://127.0.0.1:PORT/SERVICE/0``; once a third of the items are stored the
   primary is ``kill -9``ed. Figures: whether the workers finished by themselves, items,
   early requests, the time from the kill to the Sentinel's promotion, to the first worker's
   finding of the new server (``crawler:server``, where the crawler keeps it) and to the first
   request after the kill at any site, and each site's gap across the kill. Needs a crawler
   with Sentinel URLs (``crawler.coord.connection.SentinelURL``) and Debian's binaries; without
   either the scenario is reported as not run.

``BENCH_SHARDS_ONLY=spread`` (or ``moves``, ``failover``, comma-separated) runs those scenarios alone.
``BENCH_SHARDS_ORDER=single-first`` crawls the single Redis before the shards (on a shared
machine the first crawl may meet another load than the second); ``BENCH_SHARDS_KEEP=1`` keeps
the working directory (the workers' logs, each crawl's wire log as ``server-log.json``).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis import Redis

from crawler.coord import connection as coord_connection
from crawler.coord import keys
from crawler.coord.connection import EmbeddedRedis
from crawler.coord.shards import rendezvous
from crawler.demo.sentinel import DOWN_AFTER_MS, LocalSentinel, find_binaries
from crawler.store.database import Store

from .common import (
    BenchRedis,
    BenchResult,
    Check,
    command_delta,
    command_stats,
    compile_crawler,
    crawl_settings,
    crawler_command,
    write_config,
)
from .fleet import (
    ROOT,
    SITE_CLASS,
    SITES_MODULE,
    FleetConfig,
    FleetServer,
    PssSampler,
    _children_cpu,
    _terminate,
    _wait_all,
    arrival_figures,
    site_host,
    worker_commands,
)

#: The scenarios, full and ``--quick``.
SPREAD = FleetConfig("600 sites over 3 shards", 600, 10, 1.0)
QUICK_SPREAD = FleetConfig("60 sites over 3 shards", 60, 5, 0.5)
MOVES = FleetConfig("30 sites, one moved 3 times", 30, 40, 0.5)
QUICK_MOVES = FleetConfig("10 sites, one moved 3 times", 10, 16, 0.25)
FAILOVER = FleetConfig("30 sites behind Sentinel", 30, 20, 1.0)
QUICK_FAILOVER = FleetConfig("10 sites behind Sentinel", 10, 10, 0.5)
#: The shards' names in ``REDIS_URL``.
SHARD_NAMES = ("a", "b", "c")
#: A shard's share of sites and of commands may be this far (relative) from 1/n.
SHARE_TOLERANCE = 0.2
#: Moves: how many, seconds of crawling between two, and how much longer the moved site's interval is
#: than the others' (its crawl outlasts three moves of some 6 s each, the others' does not need to).
MOVE_COUNT = 3
MOVE_GAP = 2.0
MOVED_SLOWER = 2.0
QUICK_MOVED_SLOWER = 4.0
#: The failover: the primary is killed once this fraction of the items is stored (the Sentinel's
#: settings: ``crawler.demo.sentinel``).
KILL_AT = 1 / 3
#: ``single-first``: the spread crawls the single Redis first, then the shards (by default the shards first).
#: The scenarios to run, comma-separated (``spread``, ``moves``, ``failover``); all when unset.
ONLY_ENV = "BENCH_SHARDS_ONLY"
ORDER_ENV = "BENCH_SHARDS_ORDER"
#: Set: the working directory (config, logs, wire logs, databases) is kept, and named at the end.
KEEP_ENV = "BENCH_SHARDS_KEEP"
#: Seconds between two samples of each shard's CPU and commands; the crawl's figures end this long
#: after its last request (its last pages parsed and stored).
SAMPLE_EVERY = 0.5
SETTLED = 1.0
#: A crawl is stopped after max(this, 4 x its ideal wall, its requests / TIMEOUT_RATE) seconds.
MIN_TIMEOUT = 180.0
TIMEOUT_RATE = 30.0


# -- Redis servers ------------------------------------------------------------------------------


@contextmanager
def private_redises(directory: Path, names: tuple[str, ...]) -> Iterator[dict[str, EmbeddedRedis]]:
    """One private ``EmbeddedRedis`` a name, each in its own directory; stopped afterwards."""
    servers = {name: EmbeddedRedis(directory / f"redis-{name}") for name in names}
    try:
        for server in servers.values():
            if not server.start():
                raise RuntimeError(f"a Redis already answers at {server.url}")
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def read_calls(pid: int) -> int:
    """The read system calls process ``pid`` made so far (``/proc/PID/io`` ``syscr``): for a Redis
    server, about one a round trip of a client, the cost a command's own work is small against."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    return 0


def redis_cpu(client: Redis) -> float:
    """The server's CPU seconds so far (``used_cpu_user + used_cpu_sys``)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class RedisSampler:
    """Each shard's Redis CPU and commands (INFO left out) every ``SAMPLE_EVERY`` s, in a thread, so a
    crawl's figures can stop where its requests do, before the burst workers' end (``until``)."""

    def __init__(self, clients: dict[str, Redis]):
        self.clients = clients
        self.samples: list[tuple[float, dict[str, tuple[float, int]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redis-sampler", daemon=True)
        self._take()
        self._thread.start()

    def _take(self) -> None:
        taken = {
            name: (redis_cpu(c), sum(command_delta({}, command_stats(c)).values())) for name, c in self.clients.items()
        }
        self.samples.append((time.time(), taken))

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            try:
                self._take()
            except Exception:  # a server gone: what was sampled stands
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def until(self, moment: float) -> dict[str, tuple[float, int]]:
        """Each shard's (CPU s, commands) from the first sample to the first one at or after ``moment``."""
        first = self.samples[0][1]
        last = next((taken for at, taken in self.samples if at >= moment), self.samples[-1][1])
        return {name: (last[name][0] - first[name][0], last[name][1] - first[name][1]) for name in first}


def sentinel_supported() -> bool:
    """Whether this crawler takes ``redis+sentinel://`` URLs (the ``failover`` work)."""
    return hasattr(coord_connection, "SentinelURL")


# -- one crawl ----------------------------------------------------------------------------------


@dataclass
class Crawl:
    """One crawl of a fleet: its sites, the wire log, what was stored, and each shard's Redis work."""

    config: FleetConfig
    names: list[str]
    intervals: dict[int, float]
    log: list[list[Any]] = field(default_factory=list)
    started_wall: float = 0.0
    ended_wall: float = 0.0
    wall: float = 0.0
    finished: bool = False
    exit_codes: list[int | None] = field(default_factory=list)
    items: dict[str, int] = field(default_factory=dict)
    sites_by_shard: dict[str, int] = field(default_factory=dict)
    commands: dict[str, dict[str, int]] = field(default_factory=dict)
    redis_cpu: dict[str, float] = field(default_factory=dict)
    #: Each shard's read system calls over the crawl (``read_calls``): its round trips, about.
    reads: dict[str, int] = field(default_factory=dict)
    #: Each shard's (Redis CPU s, commands) from the workers' start to ``SETTLED`` s after the last request.
    crawling: dict[str, tuple[float, int]] = field(default_factory=dict)
    workers_cpu: float = 0.0
    pss_mib: float = 0.0
    stderr: list[str] = field(default_factory=list)
    during: Any = None
    arrivals: dict[str, Any] = field(default_factory=dict)

    @property
    def expected(self) -> int:
        return self.config.sites * self.config.products

    @property
    def stored(self) -> int:
        return sum(self.items.values())

    @property
    def lost(self) -> int:
        """Expected items missing, over all sites."""
        return sum(max(0, self.config.products - self.items.get(name, 0)) for name in self.names)

    @property
    def last_request(self) -> float | None:
        """Seconds from the workers' start to the last request on the wire."""
        return max((arrival for arrival, _, _, _ in self.log), default=self.started_wall) - self.started_wall

    def twice(self, site: int | None = None) -> list[tuple[str, str]]:
        """(site, path) requested more than once, at ``site`` or at any."""
        seen = Counter((self.names[s], target) for _, s, _, target in self.log if site is None or s == site)
        return sorted(key for key, n in seen.items() if n > 1)

    def early(self, site: int | None = None) -> int:
        """Requests closer than their site's interval to the site's previous one (kernel stamps), at ``site`` or any."""
        sites = range(len(self.names)) if site is None else [site]
        by_site: dict[int, list[float]] = {s: [] for s in sites}
        for arrival, s, _, _ in self.log:
            if s in by_site:
                by_site[s].append(arrival)
        count = 0
        for s, times in by_site.items():
            times.sort()
            count += sum(1 for a, b in zip(times, times[1:]) if b - a < self.intervals[s])
        return count

    def arrivals_of(self, site: int) -> list[float]:
        return sorted(arrival for arrival, s, _, _ in self.log if s == site)


def child_env() -> dict[str, str]:
    """This environment for the crawler's subprocesses: this checkout first on ``PYTHONPATH``, and no
    ``REDIS_URL``, ``DATABASE_URL`` or ``CRAWLER_*`` (they would override the config file)."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("REDIS_URL", "DATABASE_URL") and not name.startswith("CRAWLER_")
    }
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def timeout_of(config: FleetConfig) -> float:
    return max(MIN_TIMEOUT, 4 * config.ideal, config.requests / TIMEOUT_RATE)


def site_names(prefix: str, count: int) -> list[str]:
    """The sites' names: fixed, so the shards they hash to are the same every run."""
    return [f"{prefix}{i:04d}" for i in range(count)]


@dataclass
class Running:
    """What a crawl hands the code that acts while it runs (``during``)."""

    base: list[str]
    env: dict[str, str]
    workdir: Path
    database_url: str
    names: list[str]


def crawl(
    config: FleetConfig,
    names: list[str],
    redis_url: str,
    clients: dict[str, Redis],
    workdir: Path,
    during: Callable[[Running], Any] | None = None,
    extra_pids: list[int] | None = None,
    intervals: dict[int, float] | None = None,
) -> Crawl:
    """Seed ``names`` (site i at ``site_host(i)``), run the burst workers until they exit, and measure.

    ``clients``: each shard's client, for its commands and CPU (none: not measured, as behind a
    Sentinel whose primary dies). ``during(running)`` runs in a thread once the workers are started;
    what it returns is kept as ``Crawl.during``. ``intervals``: sites whose interval is not ``config``'s.
    """
    result = Crawl(config, names, {i: (intervals or {}).get(i, config.interval) for i in range(len(names))})
    workdir.mkdir(parents=True, exist_ok=True)
    settings = crawl_settings(workdir, redis_url, [], {})
    server = FleetServer(config, workdir)
    workers: list[subprocess.Popen[Any]] = []
    try:
        classes = "".join(
            SITE_CLASS.format(index=i, name=name, interval=result.intervals[i], url=server.url(i), host=site_host(i))
            for i, name in enumerate(names)
        )
        (Path(settings.sites_dir) / "fleet_sites.py").write_text(SITES_MODULE.format(classes=classes))
        config_file = write_config(workdir / "config.yaml", settings)
        base, env = crawler_command(config_file), child_env()
        seeded = subprocess.run(
            [*base, "seed", "--all"], cwd=workdir, env=env, capture_output=True, text=True, timeout=600
        )
        if seeded.returncode != 0:
            raise RuntimeError(f"crawler seed --all failed: {seeded.stderr[-2000:]}")
        result.sites_by_shard = {name: int(client.scard(keys.sites())) for name, client in clients.items()}
        stats = {name: command_stats(client) for name, client in clients.items()}
        cpu0 = {name: redis_cpu(client) for name, client in clients.items()}
        server_pids = {name: int(client.info("server")["process_id"]) for name, client in clients.items()}
        reads0 = {name: read_calls(pid) for name, pid in server_pids.items()}
        shard_sampler = RedisSampler(clients)
        children0 = _children_cpu()
        result.started_wall, started = time.time(), time.monotonic()
        logs = [workdir / f"{kind}.log" for kind in ("download", "parse")]
        for args, log_path in zip(worker_commands(config_file, burst=True), logs, strict=True):
            with log_path.open("w") as log_file:
                workers.append(
                    subprocess.Popen(
                        args, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True
                    )
                )
        pids = [*server_pids.values(), *(extra_pids or [])]
        sampler = PssSampler([w.pid for w in workers], pids)
        action = _in_thread(during, Running(base, env, workdir, settings.database_url, names))
        result.finished = _wait_all(workers, timeout_of(config))
        result.ended_wall, result.wall = time.time(), time.monotonic() - started
        if not result.finished:
            _terminate(workers)
        result.exit_codes = [w.returncode for w in workers]
        result.pss_mib = sampler.stop()
        result.workers_cpu = _children_cpu() - children0
        result.redis_cpu = {name: redis_cpu(client) - cpu0[name] for name, client in clients.items()}
        result.commands = {name: command_delta(stats[name], command_stats(client)) for name, client in clients.items()}
        result.reads = {name: read_calls(pid) - reads0[name] for name, pid in server_pids.items()}
        shard_sampler.stop()
        result.during = action()
        result.stderr = [tail for tail in (_tail(path) for path in logs) if tail]
        result.log = server.stop("crawler")["log"]
    except BaseException:
        _terminate(workers, timeout=10)
        server.process.kill()
        raise
    result.items = items_by_site(settings.database_url, names)
    if clients:
        result.crawling = shard_sampler.until(result.started_wall + (result.last_request or 0.0) + SETTLED)
    result.arrivals = arrival_figures(
        result.log, config, result.started_wall, result.ended_wall, config.requests_per_site, cut=not result.finished
    )
    return result


def _in_thread(during: Callable[[Running], Any] | None, running: Running) -> Callable[[], Any]:
    """Start ``during(running)`` in a thread; returns a function that waits for it and hands back its result."""
    if during is None:
        return lambda: None
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = during(running)
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="bench-shards-during", daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(120)
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    return join


def _tail(path: Path, lines: int = 3) -> str:
    text = path.read_text(errors="replace").strip()
    return " | ".join(text.splitlines()[-lines:]) if text else ""


def items_by_site(database_url: str, names: list[str]) -> dict[str, int]:
    store = Store(database_url)
    try:
        return {name: store.count_items(name) for name in names}
    finally:
        store.close()


def shard_url(servers: dict[str, EmbeddedRedis]) -> str:
    return ",".join(f"{name}={server.url}" for name, server in servers.items())


def wait_for_items(database_url: str, names: list[str], at_least: int, timeout: float) -> int:
    """Poll the database until ``names`` have ``at_least`` items stored (or ``timeout`` s); the count."""
    deadline = time.monotonic() + timeout
    while True:
        count = sum(items_by_site(database_url, names).values())
        if count >= at_least or time.monotonic() > deadline:
            return count
        time.sleep(0.2)


# -- 1. sites spread over three shards, against one Redis -----------------------------------------


def run_spread(result: BenchResult, config: FleetConfig, tmp: Path) -> None:
    names = site_names("spread", config.sites)
    single_first = os.environ.get(ORDER_ENV) == "single-first"
    if single_first:
        single = spread_on(config, names, tmp, ("default",))
    sharded = spread_on(config, names, tmp, SHARD_NAMES)
    if not single_first:
        single = spread_on(config, names, tmp, ("default",))
    runs = [("3 shards", sharded), ("1 Redis", single)]
    result.notes.append(f"spread: {'the single Redis' if single_first else 'the 3 shards'} crawled first ({ORDER_ENV})")
    result.table(
        f"1. {config.label}: {config.products} products a site, {config.requests_per_site} requests, "
        f"interval {config.interval:g} s",
        [
            "Redis",
            "finished",
            "wall s",
            "ramp mean / max s",
            "last request s",
            "requests",
            "items",
            "early requests",
            "smallest gap ms",
            "utilization",
            "workers CPU ms/request",
            "Redis CPU s",
            "Redis commands/request",
            "peak PSS MiB",
        ],
        [
            [
                label,
                run.finished,
                run.wall,
                f"{run.arrivals['ramp_mean']:.2f} / {run.arrivals['ramp_max']:.2f}",
                run.last_request,
                len(run.log),
                f"{run.stored} / {run.expected}",
                run.early(),
                _ms(run.arrivals["smallest_gap"]),
                run.arrivals["utilization"],
                run.workers_cpu * 1000 / max(1, len(run.log)),
                sum(run.redis_cpu.values()),
                sum(sum(c.values()) for c in run.commands.values()) / max(1, len(run.log)),
                run.pss_mib,
            ]
            for label, run in runs
        ],
    )
    shares = shard_shares(sharded, names)
    single_per_page = single.redis_cpu["default"] * 1000 / max(1, len(single.log))
    single_crawling = single.crawling["default"][0] * 1000 / max(1, len(single.log))
    result.table(
        "1. each shard's share, and its Redis CPU a page against the single Redis's (whole run; and from the "
        f"start to {SETTLED:g} s after the last request, the burst workers' end left out)",
        [
            "shard",
            "sites",
            "share",
            "requests",
            "share",
            "commands",
            "share",
            "Redis CPU s",
            "Redis CPU ms/page",
            "reads/page",
            "to the last request: commands/page",
            "Redis CPU ms/page",
        ],
        [
            [
                name,
                s["sites"],
                s["site_share"],
                s["pages"],
                s["page_share"],
                s["commands"],
                s["command_share"],
                s["cpu"],
                s["cpu_per_page"],
                s["reads_per_page"],
                s["crawling_commands"] / max(1, s["pages"]),
                s["crawling_cpu_per_page"],
            ]
            for name, s in shares.items()
        ]
        + [
            [
                "single Redis",
                single.sites_by_shard["default"],
                1.0,
                len(single.log),
                1.0,
                sum(single.commands["default"].values()),
                1.0,
                single.redis_cpu["default"],
                single_per_page,
                single.reads["default"] / max(1, len(single.log)),
                single.crawling["default"][1] / max(1, len(single.log)),
                single_crawling,
            ]
        ],
    )
    result.table(
        "1. the commands a page that differ most, 3 shards (summed) against 1 Redis",
        ["command", "3 shards /page", "1 Redis /page", "difference"],
        command_difference(sharded, single),
    )
    _tails(result, "spread, 3 shards", sharded)
    _tails(result, "spread, 1 Redis", single)
    low, high = (1 - SHARE_TOLERANCE) / len(SHARD_NAMES), (1 + SHARE_TOLERANCE) / len(SHARD_NAMES)
    band = f"each {low:.3f}-{high:.3f}"
    result.checks += [
        Check(
            "spread: items stored (3 shards)",
            f"{sharded.stored} of {sharded.expected} (1 Redis: {single.stored})",
            f"{sharded.expected}",
            sharded.finished and sharded.stored == sharded.expected,
        ),
        Check(
            "spread: requests closer than the interval (3 shards)",
            f"{sharded.early()} (1 Redis: {single.early()})",
            "0",
            sharded.early() == 0 and bool(sharded.log),
        ),
        Check(
            "spread: each shard's share of the sites",
            ", ".join(f"{n} {s['site_share']:.3f}" for n, s in shares.items()),
            band,
            all(low <= s["site_share"] <= high for s in shares.values()),
        ),
        Check(
            "spread: each shard's share of the Redis commands",
            ", ".join(f"{n} {s['command_share']:.3f}" for n, s in shares.items()),
            band,
            all(low <= s["command_share"] <= high for s in shares.values()),
        ),
        Check(
            "spread: Redis CPU ms a page, each shard vs the single Redis",
            ", ".join(f"{n} {s['cpu_per_page']:.3f}" for n, s in shares.items()) + f" vs {single_per_page:.3f}",
            "each <= the single Redis's",
            all(s["cpu_per_page"] <= single_per_page for s in shares.values()),
        ),
        Check(
            "spread: the same, to the last request (the burst workers' end left out)",
            ", ".join(f"{n} {s['crawling_cpu_per_page']:.3f}" for n, s in shares.items())
            + f" vs {single_crawling:.3f}",
            "each <= the single Redis's",
            all(s["crawling_cpu_per_page"] <= single_crawling for s in shares.values()),
        ),
        Check(
            "spread: the burst workers' end, from the last request to their exit",
            f"{sharded.wall - (sharded.last_request or 0):.1f} s on 3 shards, "
            f"{single.wall - (single.last_request or 0):.1f} s on 1 Redis",
            "reported",
            None,
        ),
    ]


def spread_on(config: FleetConfig, names: list[str], tmp: Path, shards: tuple[str, ...]) -> Crawl:
    """The spread crawl on private Redis servers, one a name of ``shards`` (one: a plain URL, no shards)."""
    with private_redises(tmp / "-".join(shards), shards) as servers:
        clients = {name: coord_connection.connect(server.url) for name, server in servers.items()}
        url = shard_url(servers) if len(shards) > 1 else servers[shards[0]].url
        try:
            return crawl(config, names, url, clients, tmp / f"crawl-{'-'.join(shards)}")
        finally:
            for client in clients.values():
                client.close()


def command_difference(sharded: Crawl, single: Crawl, top: int = 12) -> list[list[Any]]:
    """The commands a page that differ most between the shards (summed) and the single Redis."""
    pages_sharded, pages_single = max(1, len(sharded.log)), max(1, len(single.log))
    summed: Counter[str] = Counter()
    for delta in sharded.commands.values():
        summed.update(delta)
    alone: Counter[str] = Counter()
    for delta in single.commands.values():
        alone.update(delta)
    rows = [[name, summed[name] / pages_sharded, alone[name] / pages_single] for name in set(summed) | set(alone)]
    rows.sort(key=lambda row: -abs(row[1] - row[2]))
    return [[name, a, b, a - b] for name, a, b in rows[:top]]


def shard_shares(run: Crawl, names: list[str]) -> dict[str, dict[str, float]]:
    """Per shard: its sites, the requests to them, its commands and CPU, each with its share of the whole."""
    home = {name: rendezvous(name, list(SHARD_NAMES)) for name in names}
    pages = Counter(home[names[site]] for _, site, _, _ in run.log)
    commands = {name: sum(delta.values()) for name, delta in run.commands.items()}
    totals = (sum(run.sites_by_shard.values()) or 1, sum(pages.values()) or 1, sum(commands.values()) or 1)
    return {
        name: {
            "sites": run.sites_by_shard[name],
            "site_share": run.sites_by_shard[name] / totals[0],
            "pages": pages[name],
            "page_share": pages[name] / totals[1],
            "commands": commands[name],
            "command_share": commands[name] / totals[2],
            "cpu": run.redis_cpu[name],
            "cpu_per_page": run.redis_cpu[name] * 1000 / max(1, pages[name]),
            "reads_per_page": run.reads[name] / max(1, pages[name]),
            "crawling_commands": run.crawling[name][1],
            "crawling_cpu_per_page": run.crawling[name][0] * 1000 / max(1, pages[name]),
        }
        for name in SHARD_NAMES
    }


# -- 2. one site moved three times mid-crawl -------------------------------------------------------


@dataclass
class Move:
    """One ``crawler move``: where from and to, when, how far the site was, and what it said."""

    source: str
    target: str
    began: float
    ended: float
    items_before: int
    said: str
    returncode: int

    @property
    def paused(self) -> float | None:
        """The pause ``crawler move`` reports (``paused 6.1s``)."""
        found = re.search(r"paused ([0-9.]+)s", self.said)
        return float(found.group(1)) if found else None


def move_around(site: str, products: int) -> Callable[[Running], list[Move]]:
    """The ``during`` of the moves: ``MOVE_COUNT`` moves of ``site`` to the next shard, once it has an item."""

    def run(running: Running) -> list[Move]:
        moves: list[Move] = []
        wait_for_items(running.database_url, [site], 1, 120)
        for _ in range(MOVE_COUNT):
            where = subprocess.run(
                [*running.base, "shards", site], env=running.env, capture_output=True, text=True, timeout=60
            )
            source = where.stdout.split("\t")[1] if where.returncode == 0 else "?"
            target = SHARD_NAMES[(SHARD_NAMES.index(source) + 1) % len(SHARD_NAMES)] if source in SHARD_NAMES else "a"
            before = items_by_site(running.database_url, [site])[site]
            began = time.time()
            moved = subprocess.run(
                [*running.base, "move", site, "--to", target],
                cwd=running.workdir,
                env=running.env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            said = (moved.stdout.strip() or moved.stderr.strip()).splitlines()
            moves.append(Move(source, target, began, time.time(), before, said[-1] if said else "", moved.returncode))
            if before >= products:
                break
            time.sleep(MOVE_GAP)
        return moves

    return run


def run_moves(result: BenchResult, config: FleetConfig, tmp: Path) -> None:
    names = site_names("moved", config.sites)
    mover, slower = names[0], (QUICK_MOVED_SLOWER if config is QUICK_MOVES else MOVED_SLOWER)
    with private_redises(tmp / "moves", SHARD_NAMES) as servers:
        clients = {name: coord_connection.connect(server.url) for name, server in servers.items()}
        run = crawl(
            config,
            names,
            shard_url(servers),
            clients,
            tmp / "moves",
            during=move_around(mover, config.products),
            intervals={0: slower * config.interval},
        )
        left = {
            name: sum(1 for _ in client.scan_iter(match=f"*{{{mover}}}*", count=1000))
            for name, client in clients.items()
        }
        for client in clients.values():
            client.close()
    moves: list[Move] = run.during or []
    arrivals = run.arrivals_of(0)
    early_mover = run.early(0)
    final = moves[-1].target if moves and moves[-1].returncode == 0 else "?"
    result.table(
        f"2. {config.label} ({config.products} products a site, {config.requests_per_site} requests, "
        f"interval {config.interval:g} s, {mover}'s {slower * config.interval:g} s): each move of {mover}",
        [
            "move",
            "from",
            "to",
            "at s",
            "items of the site before",
            "crawler move s",
            "paused s (its report)",
            "longest gap on the wire s",
            "exit",
        ],  # fmt: skip
        [
            [
                i + 1,
                m.source,
                m.target,
                m.began - run.started_wall,
                f"{m.items_before} / {config.products}",
                m.ended - m.began,
                m.paused,
                _longest_gap(arrivals, m.began, m.ended),
                m.returncode,
            ]
            for i, m in enumerate(moves)
        ],
    )
    twice_all, twice_mover = run.twice(), run.twice(0)
    result.table(
        "2. the crawl",
        [
            "sites",
            "finished",
            "wall s",
            "requests",
            "items",
            "pages lost",
            "fetched twice (the moved site)",
            "early requests (the moved site)",
            "smallest gap ms",
            "the moved site's keys left on other shards",
        ],  # fmt: skip
        [
            [
                config.sites,
                run.finished,
                run.wall,
                len(run.log),
                f"{run.stored} / {run.expected}",
                f"{run.lost} ({max(0, config.products - run.items[mover])})",
                f"{len(twice_all)} ({len(twice_mover)})",
                f"{run.early()} ({early_mover})",
                _ms(run.arrivals["smallest_gap"]),
                ", ".join(f"{n} {k}" for n, k in left.items() if n != final) or "-",
            ]
        ],
    )
    if twice_all:
        result.notes.append("moves: fetched twice: " + ", ".join(f"{s} {p}" for s, p in twice_all[:10]))
    _tails(result, "moves", run)
    done = [m for m in moves if m.returncode == 0]
    result.checks += [
        Check(
            "moves: moves made mid-crawl",
            f"{len(done)} of {MOVE_COUNT}, the site at "
            + ", ".join(f"{m.items_before}" for m in moves)
            + f" of {config.products} items, {sum(1 for m in moves if arrivals and arrivals[-1] > m.ended)} "
            "with requests of the site after it",
            f"{MOVE_COUNT}, each with requests of the site after it",
            len(done) == MOVE_COUNT and all(arrivals and arrivals[-1] > m.ended for m in moves),
        ),
        Check("moves: pages lost", f"{run.lost}", "0", run.finished and run.lost == 0),
        Check(
            "moves: pages fetched twice",
            f"{len(twice_all)} ({len(twice_mover)} at the moved site)",
            "0",
            not twice_all and bool(run.log),
        ),  # fmt: skip
        Check(
            "moves: requests closer than the interval",
            f"{run.early()} ({early_mover} at the moved site)",
            "0",
            run.early() == 0 and bool(run.log),
        ),
        Check(
            "moves: pause of each move",
            ", ".join("-" if m.paused is None else f"{m.paused:.1f} s" for m in moves),
            "reported",
            None,
        ),
    ]


def _longest_gap(arrivals: list[float], began: float, ended: float) -> float | None:
    """The longest gap between two requests of a site that spans any of [``began``, ``ended``]."""
    spans = [b - a for a, b in zip(arrivals, arrivals[1:]) if b >= began and a <= ended]
    return max(spans, default=None)


# -- 3. the primary killed behind Sentinel -------------------------------------------------------------


def kill_when_busy(trio: LocalSentinel, expected: int) -> Callable[[Running], dict[str, Any]]:
    """The ``during`` of the failover: once ``KILL_AT`` of the items are stored, ``kill -9`` the primary."""

    def run(running: Running) -> dict[str, Any]:
        stored = wait_for_items(running.database_url, running.names, int(expected * KILL_AT), 120)
        killed_at = trio.kill_primary()
        promoted: float | None = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if trio.primary_port() == trio.ports["replica"]:
                promoted = time.time()
                break
            time.sleep(0.05)
        return {"killed_at": killed_at, "promoted_at": promoted, "stored_at_kill": stored}

    return run


def run_failover(result: BenchResult, config: FleetConfig, tmp: Path) -> None:
    binaries = find_binaries()
    why_not = (
        "this crawler takes no redis+sentinel:// URL (the failover work is not merged here)"
        if not sentinel_supported()
        else "Debian's redis-server and redis-sentinel are not installed"
        if binaries is None
        else None
    )
    if why_not or binaries is None:
        result.notes.append(f"failover: not run: {why_not}")
        result.checks.append(Check("failover: the scenario ran", f"not run: {why_not}", "ran", False))
        return
    names = site_names("failover", config.sites)
    directory = tmp / "sentinel"
    directory.mkdir()
    trio = LocalSentinel(directory, *binaries).start()
    try:
        pids = [p.pid for p in trio.processes.values()]
        run = crawl(
            config,
            names,
            trio.url,
            {},
            tmp / "failover",
            during=kill_when_busy(trio, config.sites * config.products),
            extra_pids=pids,
        )
        found = _found_new_server(trio)
    finally:
        trio.stop()
    facts: dict[str, Any] = run.during or {}
    killed_at = facts.get("killed_at", run.ended_wall)
    after = sorted(arrival for arrival, _, _, _ in run.log if arrival > killed_at)
    across = []  # each site: from its last request before the kill to its first after
    for site in range(config.sites):
        times = run.arrivals_of(site)
        before = [t for t in times if t <= killed_at]
        later = [t for t in times if t > killed_at]
        if before and later:
            across.append(later[0] - before[-1])
    first_after = after[0] - killed_at if after else None
    promoted = facts.get("promoted_at")
    result.table(
        f"3. {config.label} ({config.products} products a site, {config.requests_per_site} requests, interval "
        f"{config.interval:g} s; quorum 1, down-after {DOWN_AFTER_MS} ms): the primary kill -9ed",
        [
            "finished by itself",
            "exit codes",
            "wall s",
            "requests (after the kill)",
            "items at the kill",
            "items",
            "early requests",
            "smallest gap ms",
            "kill to promotion s",
            "kill to found s",
            "kill to first request s",
            "gap across the kill, median / max s",
        ],  # fmt: skip
        [
            [
                run.finished and all(code == 0 for code in run.exit_codes),
                ", ".join(str(c) for c in run.exit_codes),
                run.wall,
                f"{len(run.log)} ({len(after)})",
                facts.get("stored_at_kill"),
                f"{run.stored} / {run.expected}",
                run.early(),
                _ms(run.arrivals["smallest_gap"]),
                None if promoted is None else promoted - killed_at,
                None if found is None else found - killed_at,
                first_after,
                f"{_median(across):.2f} / {max(across):.2f}" if across else "-",
            ]
        ],
    )
    _tails(result, "failover", run)
    result.checks += [
        Check(
            "failover: the crawl completes by itself with every item",
            f"{run.stored} of {run.expected}, workers exited {', '.join(str(c) for c in run.exit_codes)}",
            f"{run.expected}, exit 0",
            run.finished and all(code == 0 for code in run.exit_codes) and run.stored == run.expected,
        ),
        Check(
            "failover: requests closer than the interval",
            f"{run.early()}",
            "0",
            run.early() == 0 and bool(after),
        ),
        Check(
            "failover: kill -9 to the first request after it",
            "-"
            if first_after is None
            else f"{first_after:.2f} s" + ("" if promoted is None else f" (promotion {promoted - killed_at:.2f} s)"),
            "reported",
            None,
        ),
    ]


def _found_new_server(trio: LocalSentinel) -> float | None:
    """When the first process found the new primary (``crawler:server``'s since, ms), if the crawler keeps it."""
    name = getattr(keys, "server", None)
    if name is None:
        return None
    try:
        found = Redis(port=trio.ports["replica"], socket_timeout=2).get(name())
    except Exception:
        return None
    parts = found.split() if found else []
    return int(parts[1]) / 1000 if len(parts) == 2 and int(parts[1]) else None


# -- the benchmark ------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _tails(result: BenchResult, what: str, run: Crawl) -> None:
    for tail in run.stderr:
        result.notes.append(f"{what} stderr: {tail}")


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    """The three scenarios (see the module docstring); ``redis`` is not used: each starts its own."""
    compile_crawler()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection a site, several shards' pools
    spread, moves, failover = (QUICK_SPREAD, QUICK_MOVES, QUICK_FAILOVER) if quick else (SPREAD, MOVES, FAILOVER)
    result = BenchResult(
        "shards",
        {
            "spread": f"{spread.sites} sites x {spread.products} products, interval {spread.interval:g} s",
            "moves": f"{moves.sites} sites x {moves.products} products, interval {moves.interval:g} s, "
            f"{MOVE_COUNT} moves {MOVE_GAP:g} s apart",
            "failover": f"{failover.sites} sites x {failover.products} products, interval {failover.interval:g} s, "
            f"kill at {KILL_AT:.2f} of the items",
            "latency s": "uniform 0.2-0.8 per site + 0-0.1 per response (bench.fleet)",
            "ours": "crawler worker download --burst / crawler worker parse --burst (bench.fleet.worker_commands)",
            "shards": ",".join(SHARD_NAMES),
        },
    )
    started = time.monotonic()
    with _workdir() as tmp:
        scenarios = {"spread": (run_spread, spread), "moves": (run_moves, moves), "failover": (run_failover, failover)}
        only = [name for name in os.environ.get(ONLY_ENV, "").split(",") if name]
        for scenario, config in [scenarios[name] for name in only or scenarios]:
            begun = time.monotonic()
            scenario(result, config, tmp)
            print(f"  shards: {config.label} done in {time.monotonic() - begun:.0f} s", flush=True)
    result.notes.append(
        f"1-minute load average at the end {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (the machine is shared)"
    )
    result.seconds = time.monotonic() - started
    return result


@contextmanager
def _workdir() -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-shards-"))
    try:
        yield tmp
    finally:
        if os.environ.get(KEEP_ENV):
            print(f"  shards: working directory kept: {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
