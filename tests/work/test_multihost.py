"""Download workers on several hosts, at different network distances, keep a site's spacing.

Each host is a network namespace with its own addresses, linked to a server namespace
(a private redis-server and the demo shop) by veth pairs; every path has its own one-way
latency (tc netem, or a userspace delay relay where the kernel has no netem: see
``netns.py``). Real ``crawler worker download`` processes run on each host; a parse
worker runs in the test's own namespace. The shop logs each request's arrival and the
address it came from, so every gap at the site's server is attributed to the two hosts
that sent the requests.

Why the margin (see docs/GATE.md): a host takes the gate, sends, and rearms the gate at
the moment of sending, so the gate opens interval + margin after the rearm reached Redis.
If A sends at s, its request reaches the site at s + site(A) and its rearm reaches Redis
at s + redis(A); the next holder B takes the gate no sooner than s + redis(A) + interval
+ margin, hears so redis(B) later, and its request needs site(B) more. So the gap at the
server is at least

    interval + margin - shrink(A, B),   shrink(A, B) = site(A) - redis(A) - redis(B) - site(B)

with one-way latencies: A to the site, A to Redis, Redis to B, B to the site. The worst
pair here is a host near Redis but far from the site followed by a host near both. The
margin that covers it is the largest shrink plus the default 10 ms for timing noise at
the two ends.

The same hosts also crawl into PostgreSQL, the production shape of the database: the
machine's server (``CRAWLER_TEST_POSTGRES_URL``) is bridged into the server namespace as
a service with its own latency per host, and download and parse worker processes on
every host write to it at once, creating its schema as they start.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import netns
import pytest
from crawling import items_by_key, postgres_server_url
from netns import HostSpec, Service, Topology
from redis import Redis
from rq import Worker
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import Engine, make_url

from crawler.coord import keys, pages
from crawler.coord.connection import connect, redis_server_binary
from crawler.coord.frontier import seed
from crawler.coord.policy import set_live
from crawler.demo import ShopSite
from crawler.ops.status import workers_by_host
from crawler.settings import DEFAULT_GATE_MARGIN, load_settings
from crawler.store.database import Store, engine_url
from crawler.store.migrations import PG_LOCK_KEY
from crawler.store.schema import SCHEMA_VERSION, items, schema_versions
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers
from crawler.work.runtime import Runtime

SITE = "multihost"
REDIS = Service("redis", "10.231.0.1", 6379)
SHOP = Service("site", "10.231.0.2", 8080)
#: The machine's PostgreSQL server, bridged in (only while a test uses it).
POSTGRES = Service("postgres", "10.231.0.3", 5432)
#: One-way latencies in ms. h1 is the dangerous one: next to Redis, far from the site.
HOSTS = (
    HostSpec("h1", {"redis": 1, "site": 45, "postgres": 5}, threads=1),
    HostSpec("h2", {"redis": 1, "site": 1, "postgres": 1}, threads=1),
    HostSpec("h3", {"redis": 2, "site": 20, "postgres": 3}, threads=2),
)
INTERVAL_MS = 60.0
#: Timing noise at the two ends (the server's own scheduling, the relays): the default margin.
NOISE_MS = DEFAULT_GATE_MARGIN * 1000
PRODUCTS = 60
#: How much longer than configured a path's fastest round trip may be (a loaded machine's scheduling).
RTT_SLACK_MS = 15.0
#: Seconds for the workers of every host to start, and for the crawl to drain.
START_TIMEOUT = 60.0
CRAWL_TIMEOUT = 60.0
#: Crawls without a margin run at most until one has h1's request followed by h2's at once.
NO_MARGIN_CRAWLS = 4
#: Ms after the gate allowed it within which a request counts as sent at once (its thread was waiting).
PROMPT_MS = 20.0

SPIDER = f"""
from crawler.demo.spider import DemoShop


class MultiHost(DemoShop):
    name = {SITE!r}
    allowed_domains = [{SHOP.address!r}]
    interval = {INTERVAL_MS / 1000!r}
"""


def shrink_ms(a: HostSpec, b: HostSpec) -> float:
    """How much sooner than interval + margin B's request may reach the site after A's."""
    return a.latency_ms["site"] - a.latency_ms["redis"] - b.latency_ms["redis"] - b.latency_ms["site"]


MAX_SHRINK_MS = max(shrink_ms(a, b) for a in HOSTS for b in HOSTS)
#: The margin that covers the hosts' difference in distance, plus the default for noise.
COVERING_MARGIN_MS = MAX_SHRINK_MS + NOISE_MS


class ServiceShop(ShopSite):
    """The demo shop on every address of its namespace, named by the site's service address.

    ``clients`` maps each logged request (by ``id``) to the address and port it came from,
    taken in ShopSite's per-connection hooks (the request log itself has no client field).
    """

    def __init__(self, address: str, port: int, **kwargs: Any):
        super().__init__(host="0.0.0.0", port=port, **kwargs)
        self.address = address
        self.clients: dict[int, tuple[str, int]] = {}
        self._peer = threading.local()

    @property
    def url(self) -> str:
        """``http://ADDRESS:PORT``, as every host reaches the shop."""
        return f"http://{self.address}:{self.port}"

    def _track(self, conn: socket.socket, open_: bool) -> None:
        # Called in the connection's handler thread before it reads any request.
        if open_:
            self._peer.address = conn.getpeername()[:2]
        super()._track(conn, open_)

    def _record(self, arrival: float, method: str, path: str) -> Any:
        entry = super()._record(arrival, method, path)
        self.clients[id(entry)] = getattr(self._peer, "address", ("?", 0))
        return entry


@dataclass
class Net:
    topology: Topology
    redis_url: str  # the unix socket: the test's own namespace has no route to the hosts' network
    connection: Redis


@dataclass(frozen=True)
class Arrival:
    """One request at the shop's server: when it arrived, from which host, when that host
    started it (the worker's own clock, right before the send; None for robots.txt), and how
    much later than its configured latency the host's relay sent it on (ms; 0 with netem).
    """

    time: float
    host: str
    path: str
    started: float | None
    relay_late: float = 0.0


@dataclass(frozen=True)
class Gap:
    """Two consecutive arrivals, their bound, and the two parts of the gap beyond it.

    ``late`` = start B - start A - interval - margin - redis(A) - redis(B): how much later
    than the gate allowed B started (its own way from the gate opening to the send).
    ``residual`` = gap - (start B - start A) - (site(B) - site(A)): what the configured
    distances do not explain, the timing noise at the two ends (plus any delay of A's send
    after its start stamp, which ``late`` counts the other way). gap = bound + late + residual.
    ``relay_late``: how late A's relay sent A's request on (ms), a part of the residual that
    is the relay's own scheduling, not the crawler's: it shortens the gap as a slower path
    to the site would.
    """

    ms: float
    a: str
    b: str
    bound: float
    late: float | None
    residual: float | None
    relay_late: float = 0.0


@dataclass
class Crawl:
    """What one crawl did, as seen at the shop's server."""

    margin_ms: float
    method: str
    arrivals: list[Arrival]  # in order of arrival
    items: dict[str, Any]
    expected: dict[str, Any]
    expected_paths: set[str]
    #: When each host's workers exited (time.time(), the clock of the arrivals' stamps).
    exits: dict[str, float]
    #: The tail of each host's worker log.
    logs: str

    def gaps(self) -> list[Gap]:
        """Each consecutive pair of arrivals (both from known hosts)."""
        spec = {h.name: h for h in HOSTS}
        gaps = []
        for x, y in pairwise(self.arrivals):
            a, b = spec[x.host], spec[y.host]
            ms = (y.time - x.time) * 1000
            late = residual = None
            if x.started is not None and y.started is not None:
                started = (y.started - x.started) * 1000
                late = started - INTERVAL_MS - self.margin_ms - a.latency_ms["redis"] - b.latency_ms["redis"]
                residual = ms - started - (b.latency_ms["site"] - a.latency_ms["site"])
            bound = INTERVAL_MS + self.margin_ms - shrink_ms(a, b)
            gaps.append(Gap(ms, a.name, b.name, bound, late, residual, x.relay_late))
        return gaps

    def by_pair(self) -> dict[tuple[str, str], list[Gap]]:
        pairs: dict[tuple[str, str], list[Gap]] = {}
        for gap in self.gaps():
            pairs.setdefault((gap.a, gap.b), []).append(gap)
        return pairs

    def summary(self) -> str:
        lines = [
            f"latency method: {self.method}; interval {INTERVAL_MS:g} ms, margin {self.margin_ms:g} ms; "
            f"{len(self.arrivals)} requests; per host {dict(Counter(a.host for a in self.arrivals))}",
            self.timeline(),
            "  pair    n  min gap    bound   (late, residual, relay late of the closest pair)"
            "  residuals min..max  relay late max",
        ]
        for (a, b), gaps in sorted(self.by_pair().items()):
            closest = min(gaps, key=lambda g: g.ms)
            residuals = [g.residual for g in gaps if g.residual is not None]
            parts = f"({_ms(closest.late)}, {_ms(closest.residual)}, {_ms(closest.relay_late)})"
            spread = f"{min(residuals):6.1f}..{max(residuals):.1f} ms" if residuals else "-"
            relay_late = max(g.relay_late for g in gaps)
            lines.append(
                f"  {a}->{b} {len(gaps):3d} {closest.ms:6.1f} ms {closest.bound:6.1f} ms   {parts:44s} {spread}"
                f"  {relay_late:.1f} ms"
            )
        return "\n".join(lines)

    def timeline(self) -> str:
        """Each host's first and last request at the site, and its workers' exit, in s after the first request."""
        start = self.arrivals[0].time if self.arrivals else 0.0
        parts = []
        for name in sorted(self.exits):
            times = [a.time - start for a in self.arrivals if a.host == name]
            span = f"{min(times):.2f}..{max(times):.2f} s" if times else "no request"
            parts.append(f"{name} {span}, exited {self.exits[name] - start:.2f} s")
        return "  " + "; ".join(parts)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    """Three host namespaces and a server namespace running a private redis-server."""
    reason = netns.unavailable_reason()
    if reason is not None:
        if os.environ.get(netns.REQUIRE_VARIABLE) == "1":
            pytest.fail(f"{reason} ({netns.REQUIRE_VARIABLE}=1)")
        pytest.skip(reason)
    with netns.topology([REDIS, SHOP, POSTGRES], HOSTS) as topology:
        directory = tmp_path_factory.mktemp("netredis")
        sock = directory / "redis.sock"
        server = topology.run(
            topology.server_ns,
            [
                redis_server_binary(),
                "--port",
                str(REDIS.port),
                "--bind",
                "0.0.0.0",
                "--protected-mode",
                "no",
                "--unixsocket",
                str(sock),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(directory),
            ],
            stdout=subprocess.DEVNULL,
        )
        url = f"unix://{sock}?db=0"
        wait_until(lambda: sock.exists() and _answers(url), 10, "the server namespace's redis-server", alive=[server])
        check_latencies(topology)
        connection = connect(url)
        try:
            yield Net(topology, url, connection)
        finally:
            connection.close()


def check_latencies(topology: Topology) -> None:
    """Each host's round trip to each service: twice its one-way latency, or a little more.

    Echo servers stand in for the site and PostgreSQL, which are not running yet.
    """
    measured = []
    with (
        netns.echo_server(topology, topology.server_ns, SHOP.port),
        netns.echo_server(topology, topology.server_ns, POSTGRES.port),
    ):
        for host in topology.hosts:
            for service, request in ((REDIS, b"PING\r\n"), (SHOP, b"ping"), (POSTGRES, b"ping")):
                expected = 2 * host.spec.latency_ms[service.name]
                rtt = topology.round_trip_ms(host, service, request)
                measured.append(f"{host.name}->{service.name} {rtt:.1f} ms (expected {expected:g})")
                assert expected - 0.5 <= rtt <= expected + RTT_SLACK_MS, (
                    f"{host.name}'s round trip to {service.name} is {rtt:.1f} ms, not {expected:g} ms"
                )
    print(f"latency method: {topology.method}; round trips: {', '.join(measured)}")


def _answers(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_timeout=0.5).ping())
    except Exception:
        return False


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    alive: Sequence[subprocess.Popen[bytes]] = (),
    state: Callable[[], object] = lambda: "",
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        dead = [p.args for p in alive if p.poll() is not None]
        assert not dead, f"exited while waiting for {what}: {dead}"
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what} {state()}"
        time.sleep(0.05)


def crawler_command() -> list[str]:
    """The ``crawler`` entry point of this interpreter's environment."""
    script = Path(sys.executable).with_name("crawler")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from crawler.cli.app import main; main()"]


def start_on_host(
    topology: Topology,
    host: netns.Host,
    kind: str,
    site: str,
    sites: Path,
    options: Sequence[str],
    env: Mapping[str, str],
    log: Path,
) -> subprocess.Popen[bytes]:
    """``crawler worker KIND --burst`` for ``site`` on ``host`` (its namespace and hostname), output to ``log``."""
    with open(log, "wb") as out:
        return topology.run(
            host.netns,
            [*crawler_command(), "--sites", str(sites), "worker", kind, "--sites", site, *options, "--burst"],
            env=env,
            hostname=host.hostname,
            stdout=out,
        )


def wait_for_exits(
    processes: Mapping[str, subprocess.Popen[bytes]], deadline: float, exits: dict[str, float] | None = None
) -> dict[str, int | None]:
    """Each process's exit code, None for those still running at ``deadline`` (time.monotonic).

    ``exits``: filled with when each process was seen to have exited (time.time(), within 10 ms).
    """
    codes: dict[str, int | None] = {}
    while len(codes) < len(processes) and time.monotonic() < deadline:
        for name, process in processes.items():
            if name not in codes and process.poll() is not None:
                codes[name] = process.returncode
                if exits is not None:
                    exits[name] = time.time()
        time.sleep(0.01)
    return {name: codes.get(name) for name in processes}


def log_tails(paths: Sequence[Path]) -> str:
    return "\n".join(f"--- {path.stem}\n{path.read_text()[-2000:]}" for path in paths if path.exists())


def start_shop() -> ServiceShop:
    """The shop, served by threads of raised priority (they inherit this thread's nice value).

    It stands for a site on another machine: its threads waiting for a CPU behind the
    crawl's own processes would be noise this test adds, not the crawler's.
    """
    os.nice(-10)  # per thread on Linux; the caller's thread ends right after
    return ServiceShop(SHOP.address, SHOP.port, products=PRODUCTS, faults=False).start()


def run_crawl(net: Net, tmp_path: Path, margin_ms: float) -> Crawl:
    """Crawl the shop with every host's download workers, all started before the first request."""
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / f"{SITE}.py").write_text(SPIDER)
    database_url = f"sqlite:///{tmp_path / 'crawl.db'}"
    settings = load_settings(
        database_url=database_url, sites_dir=str(sites), state_dir=str(tmp_path / "state"), gate_margin=margin_ms / 1000
    )
    net.connection.flushdb()
    Store(database_url).close()  # the schema, before several hosts race to make it
    topology = net.topology
    env = {
        **os.environ,
        "REDIS_URL": f"redis://{REDIS.address}:{REDIS.port}/0",
        "DATABASE_URL": database_url,
        "CRAWLER_GATE_MARGIN": repr(margin_ms / 1000),
    }
    hosts: dict[str, subprocess.Popen[bytes]] = {}
    parsers: list[Any] = []
    shop = topology.in_netns(topology.server_ns, start_shop)
    rt: Runtime | None = None
    try:
        rt = Runtime(net.connection, settings)
        # Paused until every host's workers are up, so all of them take part from the first request.
        set_live(net.connection, SITE, paused=True)
        rt.publish(SITE, force=True)
        seed(rt.frontier(SITE), [shop.url + "/"])
        for host in topology.hosts:
            hosts[host.name] = start_on_host(
                topology,
                host,
                "download",
                SITE,
                sites,
                ["--threads", str(host.spec.threads)],
                env,
                tmp_path / f"{host.name}.log",
            )
        parsers = start_workers([WorkerSpec("parse", (SITE,), burst=True)], settings, net.redis_url)
        expected_workers = {host.hostname: host.spec.threads for host in topology.hosts}
        expected_workers[socket.gethostname()] = 1  # the parse worker, in the test's own namespaces

        def counts() -> dict[str, int]:
            return {name: sum(states.values()) for name, states in workers_by_host(net.connection).items()}

        wait_until(
            lambda: all(counts().get(name, 0) >= n for name, n in expected_workers.items()),
            START_TIMEOUT,
            f"workers {expected_workers}",
            alive=list(hosts.values()),
            state=lambda: f"(running: {counts()})",
        )
        set_live(net.connection, SITE, paused=False)
        rt.publish(SITE, force=True)
        deadline = time.monotonic() + CRAWL_TIMEOUT
        exits: dict[str, float] = {}
        exit_codes = wait_for_exits(hosts, deadline, exits)
        for process in parsers:
            process.join(max(0.1, deadline - time.monotonic()))
            exit_codes["parse"] = process.exitcode
        expected = shop.expected_items()
    finally:
        if rt is not None:
            rt.close()
        stop_workers(parsers, timeout=10)
        for process in hosts.values():
            topology.stop(process)
        shop.stop()
    logs = log_tails([tmp_path / f"{name}.log" for name in hosts])
    assert all(code == 0 for code in exit_codes.values()), f"workers did not drain the crawl: {exit_codes}\n{logs}"
    store = Store(database_url)
    try:
        started = {
            _path(row["url"]): row["started"].replace(tzinfo=UTC).timestamp()
            for row in store.fetch_rows(SITE)
            if row["kind"] == "download" and row["url"].startswith(shop.url)
        }
    finally:
        store.close()
    arrivals = []
    for entry in shop.requests:
        address, port = shop.clients.get(id(entry), ("?", 0))
        sender = topology.host_of(address)
        assert sender is not None, f"{entry.path} came from an unknown address {address}"
        arrivals.append(
            Arrival(
                entry.time,
                sender.name,
                entry.path,
                None if entry.path == "/robots.txt" else started.get(entry.path),
                sender.relay_lateness(port, entry.time) * 1000,
            )
        )
    paths = {
        "/robots.txt",
        "/",
        *(f"/products?page={n}" for n in range(1, shop.pages + 1)),  # page 1's /catalogue.pdf: not followed
        *(f"/product/{n}" for n in range(1, PRODUCTS + 1)),
    }
    items = items_by_key(database_url, site=SITE)
    return Crawl(margin_ms, topology.method, arrivals, items, expected, paths, exits, logs)


def _path(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


def check_complete_and_within_bound(crawl: Crawl) -> None:
    """Every page fetched once, every item stored, no host's burst over before the crawl;
    no gap below the bound, less the noise allowance and how late the relay sent the first
    request of the two on (its scheduling, not the crawler's: 0 with netem)."""
    fetched = Counter(arrival.path for arrival in crawl.arrivals)
    assert fetched == dict.fromkeys(crawl.expected_paths, 1), f"pages fetched: {sorted(fetched.items())}"
    assert crawl.items == crawl.expected
    # The host of the last request holds its job until the response, after the request's
    # arrival; every other host's drain look sees it busy until then (``drain.crawl_drained``).
    last = crawl.arrivals[-1].time
    early = {name: round(last - at, 3) for name, at in crawl.exits.items() if at < last}
    assert not early, f"burst workers exited while the crawl had work (s before its last request): {early}\n" + (
        f"{crawl.summary()}\n{crawl.logs}"
    )
    for gap in crawl.gaps():
        assert gap.ms >= gap.bound - NOISE_MS - gap.relay_late, (
            f"{gap.a}->{gap.b} {gap.ms:.1f} ms apart, below the bound {gap.bound:g} ms "
            f"(relay {gap.relay_late:.1f} ms late)\n{crawl.summary()}"
        )


def report(crawl: Crawl, request: pytest.FixtureRequest) -> None:
    """Record the latency method and the closest gap of each pair of hosts (test properties, stdout)."""
    properties = request.node.user_properties
    properties.append(("latency_method", crawl.method))
    properties.append(("min_gap_ms", round(min(g.ms for g in crawl.gaps()), 1)))
    for (a, b), gaps in sorted(crawl.by_pair().items()):
        properties.append((f"min_gap_ms_{a}_{b}", round(min(g.ms for g in gaps), 1)))
    print(crawl.summary())


def test_hosts_at_different_distances_keep_the_interval_at_the_site_with_a_covering_margin(
    net: Net, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    crawl = run_crawl(net, tmp_path, COVERING_MARGIN_MS)
    report(crawl, request)
    check_complete_and_within_bound(crawl)
    dangerous = crawl.by_pair().get(("h1", "h2"), [])
    assert len(dangerous) >= 3, f"the far-then-near sequence hardly occurred, so proves little\n{crawl.summary()}"
    closest = min(crawl.gaps(), key=lambda g: g.ms)
    assert closest.ms >= INTERVAL_MS, (
        f"{closest.a}->{closest.b}: two requests {closest.ms:.1f} ms apart at the site\n{crawl.summary()}"
    )


def test_without_a_margin_a_far_host_then_a_near_one_reach_the_site_closer_than_the_interval(
    net: Net, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Which host takes each turn is the scheduling's chance: a crawl in which h1 was never
    # followed by h2 shows nothing either way, so another is run (each one checked in full).
    summaries = []
    for attempt in range(NO_MARGIN_CRAWLS):
        (tmp_path / str(attempt)).mkdir()
        crawl = run_crawl(net, tmp_path / str(attempt), 0.0)
        report(crawl, request)
        check_complete_and_within_bound(crawl)
        # h2 at the gate as it opened after h1 (started within PROMPT_MS of when it could): an h2
        # that came later anyway (seen: 186 ms) shows nothing of the margin either way.
        dangerous = [g for g in crawl.by_pair().get(("h1", "h2"), []) if g.late is not None and g.late < PROMPT_MS]
        if dangerous:
            break
        summaries.append(f"{crawl.summary()}\n{crawl.logs}")
    assert dangerous, "the far-then-near sequence, h2 at once, never occurred, in {} crawls:\n{}".format(
        NO_MARGIN_CRAWLS, "\n".join(summaries)
    )
    closest = min(g.ms for g in dangerous)
    assert closest < INTERVAL_MS, f"no shortfall without a margin: h1->h2 at least {closest:.1f} ms\n{crawl.summary()}"


# -- PostgreSQL: download and parse workers on every host, writing at once --------------------

PG_SITE = "multihost_pg"
#: Parse worker processes each host runs in the PostgreSQL crawl, and worker threads in each.
PARSE_PROCESSES, PARSE_THREADS = 2, 2
#: Download worker threads of each host in the PostgreSQL crawl (one process).
PG_DOWNLOAD_THREADS = 2

PG_SPIDER = f"""
import time

from crawler.demo.spider import DemoShop
from crawler.spiders.spider import Request


class EveryProductTwice(DemoShop):
    name = {PG_SITE!r}
    allowed_domains = [{SHOP.address!r}]
    interval = 0.01

    def parse(self, page):
        for request in super().parse(page):
            yield request
            if request.callback == "parse_product":
                # The same page again at once, past the seen-set: two parse jobs for one item key
                # at about the same time, for parse workers that may be on different hosts.
                yield Request(request.url, callback="parse_product", dont_filter=True)

    def parse_product(self, page):
        # Long enough that two copies parsed on two hosts overlap in time: without it, the
        # concurrent upserts of one key this test is about did not happen in 3 runs of 15
        # (12 to 20 keys of 60 overlap with it, in 10 runs of 10).
        time.sleep(0.05)
        yield from super().parse_product(page)
"""


@dataclass(frozen=True)
class PgSchema:
    """A private schema on the machine's PostgreSQL server, as this process and the hosts reach it."""

    local_url: str  # from the test's own namespace
    host_url: str  # the hosts' DATABASE_URL: a bare postgresql:// to the POSTGRES service
    server: tuple[str, int]  # the server's address and port, for the bridge


@pytest.fixture
def pg_schema() -> Iterator[PgSchema]:
    """An empty schema of its own on ``CRAWLER_TEST_POSTGRES_URL``'s server, dropped after.

    Skips without that variable (fails under ``CRAWLER_REQUIRE_POSTGRES=1``), and when it
    names no TCP host: the hosts reach the server through a TCP bridge.
    """
    server = make_url(postgres_server_url())
    if not server.host or server.host.startswith("/"):  # skip (or fail in CI), saying why
        postgres_server_url(f"CRAWLER_TEST_POSTGRES_URL names no TCP host ({server}): the hosts reach it over TCP")
    name = f"crawler_multihost_{os.getpid()}_{secrets.token_hex(4)}"
    in_schema = {"options": f"-csearch_path={name}"}
    admin = create_engine(engine_url(server.render_as_string(hide_password=False)))
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    try:
        yield PgSchema(
            server.update_query_dict(in_schema).render_as_string(hide_password=False),
            server.set(drivername="postgresql", host=POSTGRES.address, port=POSTGRES.port)
            .update_query_dict(in_schema)
            .render_as_string(hide_password=False),
            (server.host, server.port or POSTGRES.port),
        )
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()


@contextmanager
def schema_lock_held(engine: Engine) -> Iterator[Callable[[], int]]:
    """Hold the lock every crawler process takes to create or migrate the schema (``migrations``).

    Yields a function that counts the sessions waiting for it. On release they go through
    it one after another, as processes that open the database at the same moment do.
    """
    waiting = text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND classid::bigint = :high AND objid::bigint = :low AND objsubid = 1"
    )
    halves = {"high": PG_LOCK_KEY >> 32, "low": PG_LOCK_KEY & 0xFFFFFFFF}

    def count() -> int:
        with engine.connect() as conn:
            return int(conn.execute(waiting, halves).scalar_one())

    with engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": PG_LOCK_KEY})
        try:
            yield count
        finally:
            # A session lock outlives transactions: give it back before the connection goes back to the pool.
            holder.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": PG_LOCK_KEY})


def worker_hosts(connection: Redis, topology: Topology) -> dict[str, str]:
    """Each live worker's host, by name: the hostname it registered (RQ's download workers) or
    put in its consumer name (parse workers), checked against the address Redis saw its
    connection come from."""
    hosts = {}
    addresses = {client["name"]: client["addr"] for client in connection.client_list() if client.get("name")}
    registered = [(w.name, w.hostname, w.ip_address) for w in Worker.all(connection=connection)]
    registered += [(c.name, c.host, addresses.get(c.name)) for c in pages.live_consumers(connection)]
    for name, hostname, address in registered:
        named = next((h.name for h in topology.hosts if h.hostname == hostname), None)
        came_from = topology.host_of((address or "").rpartition(":")[0])
        assert named is not None and came_from is not None and came_from.name == named, (
            f"worker {name} registered hostname {hostname} but came from {address}"
        )
        hosts[name] = named
    return hosts


@dataclass
class PgCrawl:
    """What the PostgreSQL crawl left, besides the database."""

    expected: dict[str, Any]  # the shop's items by SKU
    pages: set[str]  # paths of the shop's HTML pages
    worker_hosts: dict[str, str]  # RQ worker name -> host
    logs: str  # the tails of the hosts' worker logs


def run_pg_crawl(net: Net, pg: PgSchema, tmp_path: Path) -> PgCrawl:
    """Crawl the shop into ``pg`` with download and parse workers on every host.

    The workers' launchers all reach the schema lock before any has the schema, so they
    create it at the same moment; the site stays paused until every worker is up.
    """
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / f"{PG_SITE}.py").write_text(PG_SPIDER)
    settings = load_settings(database_url=pg.local_url, sites_dir=str(sites), state_dir=str(tmp_path / "state"))
    net.connection.flushdb()
    topology = net.topology
    env = {**os.environ, "REDIS_URL": f"redis://{REDIS.address}:{REDIS.port}/0", "DATABASE_URL": pg.host_url}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs: list[Path] = []
    admin = create_engine(engine_url(pg.local_url))
    shop = topology.in_netns(topology.server_ns, start_shop)
    bridge: subprocess.Popen[bytes] | None = None
    rt: Runtime | None = None
    try:
        bridge = topology.bridge(POSTGRES, pg.server)
        rt = Runtime(net.connection, settings)  # for Redis only: the test never opens the database before the hosts
        set_live(net.connection, PG_SITE, paused=True)
        rt.publish(PG_SITE, force=True)
        seed(rt.frontier(PG_SITE), [shop.url + "/"])
        parse_options = ["--processes", str(PARSE_PROCESSES), "--threads", str(PARSE_THREADS)]
        with schema_lock_held(admin) as waiting:
            for host in topology.hosts:
                for kind, options in (("download", ["--threads", str(PG_DOWNLOAD_THREADS)]), ("parse", parse_options)):
                    logs.append(tmp_path / f"{host.name}-{kind}.log")
                    processes[logs[-1].stem] = start_on_host(
                        topology, host, kind, PG_SITE, sites, options, env, logs[-1]
                    )
            wait_until(
                lambda: waiting() >= len(processes),
                START_TIMEOUT,
                "every launcher at the schema lock",
                alive=list(processes.values()),
                state=lambda: f"({waiting()} waiting)",
            )
        expected_workers = {h.hostname: PG_DOWNLOAD_THREADS + PARSE_PROCESSES * PARSE_THREADS for h in topology.hosts}

        def counts() -> dict[str, int]:
            return {name: sum(states.values()) for name, states in workers_by_host(net.connection).items()}

        wait_until(
            lambda: counts() == expected_workers,
            START_TIMEOUT,
            f"workers {expected_workers}",
            alive=list(processes.values()),
            state=lambda: f"(running: {counts()})",
        )
        hosts_of = worker_hosts(net.connection, topology)
        set_live(net.connection, PG_SITE, paused=False)
        rt.publish(PG_SITE, force=True)
        exit_codes = wait_for_exits(processes, time.monotonic() + CRAWL_TIMEOUT)
        expected = shop.expected_items()
        pages = {
            "/",
            *(f"/products?page={n}" for n in range(1, shop.pages + 1)),
            *(f"/product/{n}" for n in range(1, PRODUCTS + 1)),
        }
    finally:
        if rt is not None:
            rt.close()
        for process in processes.values():
            topology.stop(process)
        if bridge is not None:
            topology.stop(bridge)
        shop.stop()
        admin.dispose()
    tails = log_tails(logs)
    assert all(code == 0 for code in exit_codes.values()), f"workers did not drain the crawl: {exit_codes}\n{tails}"
    return PgCrawl(expected, pages, hosts_of, tails)


def overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two fetch records' runs overlapped in time."""
    return bool(a["started"] < b["finished"] and b["started"] < a["finished"])


def test_parse_workers_on_several_hosts_store_every_item_once_in_postgresql(
    net: Net, pg_schema: PgSchema, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    crawl = run_pg_crawl(net, pg_schema, tmp_path)
    # A write that failed (a deadlock, a lost connection) would be retried by its parse worker, which
    # says so in its log, and leave no trace in the tables.
    assert "Traceback" not in crawl.logs, f"a job raised\n{crawl.logs}"
    assert "database unavailable" not in crawl.logs, f"a write failed and was retried\n{crawl.logs}"
    assert net.connection.xlen(keys.pages()) == 0, "pages were left unparsed"
    engine = create_engine(engine_url(pg_schema.local_url))
    try:
        with engine.connect() as conn:
            versions = [
                tuple(row) for row in conn.execute(select(schema_versions.c.version, schema_versions.c.description))
            ]
            twice = conn.execute(
                select(items.c.site, items.c.key).group_by(items.c.site, items.c.key).having(func.count() > 1)
            ).all()
    finally:
        engine.dispose()
    assert versions == [(SCHEMA_VERSION, "schema created")], (
        f"the launchers that waited at the schema lock together left these versions: {versions}"
    )
    assert not twice, f"(site, key) stored more than once: {twice[:5]}"
    assert items_by_key(pg_schema.local_url, site=PG_SITE) == crawl.expected

    store = Store(pg_schema.local_url)
    try:
        fetches = store.fetch_rows(PG_SITE)
        item_rows = store.item_rows(PG_SITE)
    finally:
        store.close()
    bad = [
        (r["kind"], r["url"], r["outcome"], r["error"])
        for r in fetches
        if r["outcome"] not in ("ok", "skipped", "refused") or (r["kind"] == "parse" and r["outcome"] != "ok")
    ]
    assert not bad, f"records of trouble: {bad[:5]}"
    done = {
        kind: Counter(_path(r["url"]) for r in fetches if r["kind"] == kind and r["outcome"] == "ok")
        for kind in ("download", "parse")
    }
    for kind, paths in done.items():
        assert crawl.pages <= set(paths), f"pages without an ok {kind}: {sorted(crawl.pages - set(paths))[:5]}"
    downloaded = {path: n for path, n in done["download"].items() if path in crawl.pages}
    assert done["parse"] == downloaded, "a downloaded copy of a page was parsed other than once"
    products = [f"/product/{n}" for n in range(1, PRODUCTS + 1)]
    assert all(done["parse"][path] >= 2 for path in products), "a product was not parsed twice"

    # Every sighting counted: an item's history spans the fetches of all its page's copies.
    fetched: dict[str, list[datetime]] = {}
    for r in fetches:
        if r["kind"] == "download" and r["outcome"] == "ok":
            fetched.setdefault(_path(r["url"]), []).append(r["started"])
    for row in item_rows:
        seen = fetched[_path(row["url"])]
        assert (row["first_seen"], row["last_seen"]) == (min(seen), max(seen)), f"{row['key']}: a sighting was lost"

    parses = [r for r in fetches if r["kind"] == "parse"]
    unknown = {r["worker"] for r in parses} - set(crawl.worker_hosts)
    assert not unknown, f"parse records by workers on no known host: {unknown}"
    by_host = Counter(crawl.worker_hosts[r["worker"]] for r in parses)
    assert len(by_host) >= 2, f"parsing did not spread over hosts: {dict(by_host)}"
    copies: dict[str, list[dict[str, Any]]] = {}
    for r in parses:
        copies.setdefault(_path(r["url"]), []).append({**r, "host": crawl.worker_hosts[r["worker"]]})
    across = [path for path in products if len({r["host"] for r in copies[path]}) >= 2]
    at_once = [
        path
        for path in across
        if any(overlap(a, b) for a in copies[path] for b in copies[path] if a["host"] != b["host"])
    ]
    assert at_once, f"no item key was written from two hosts at the same time ({len(across)} from two hosts)"
    properties = request.node.user_properties
    properties += [
        ("parses_by_host", dict(by_host)),
        ("keys_from_two_hosts", len(across)),
        ("keys_from_two_hosts_at_once", len(at_once)),
    ]
    print(
        f"parse records per host {dict(by_host)}; of {PRODUCTS} item keys, {len(across)} were written from "
        f"two hosts, {len(at_once)} of them by parse jobs that overlapped in time"
    )
