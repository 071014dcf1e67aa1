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
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import netns
import pytest
from crawling import items_by_key
from netns import HostSpec, Service, Topology
from redis import Redis

from crawler.connection import connect, redis_server_binary
from crawler.demo import ShopSite
from crawler.frontier import seed
from crawler.launcher import WorkerSpec, start_workers, stop_workers
from crawler.policy import set_live
from crawler.runtime import Runtime
from crawler.settings import DEFAULT_GATE_MARGIN, load_settings
from crawler.status import workers_by_host
from crawler.store import Store

SITE = "multihost"
REDIS = Service("redis", "10.231.0.1", 6379)
SHOP = Service("site", "10.231.0.2", 8080)
#: One-way latencies in ms. h1 is the dangerous one: next to Redis, far from the site.
HOSTS = (
    HostSpec("h1", {"redis": 1, "site": 45}, threads=1),
    HostSpec("h2", {"redis": 1, "site": 1}, threads=1),
    HostSpec("h3", {"redis": 2, "site": 20}, threads=2),
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

    ``clients`` maps each logged request (by ``id``) to the address it came from, taken in
    ShopSite's per-connection hooks (the request log itself has no client field).
    """

    def __init__(self, address: str, port: int, **kwargs: Any):
        super().__init__(host="0.0.0.0", port=port, **kwargs)
        self.address = address
        self.clients: dict[int, str] = {}
        self._peer = threading.local()

    @property
    def url(self) -> str:
        """``http://ADDRESS:PORT``, as every host reaches the shop."""
        return f"http://{self.address}:{self.port}"

    def _track(self, conn: socket.socket, open_: bool) -> None:
        # Called in the connection's handler thread before it reads any request.
        if open_:
            self._peer.address = conn.getpeername()[0]
        super()._track(conn, open_)

    def _record(self, arrival: float, method: str, path: str) -> Any:
        entry = super()._record(arrival, method, path)
        self.clients[id(entry)] = getattr(self._peer, "address", "?")
        return entry


@dataclass
class Net:
    topology: Topology
    redis_url: str  # the unix socket: the test's own namespace has no route to the hosts' network
    connection: Redis


@dataclass(frozen=True)
class Arrival:
    """One request at the shop's server: when it arrived, from which host, and when that host
    started it (the worker's own clock, right before the send; None for robots.txt)."""

    time: float
    host: str
    path: str
    started: float | None


@dataclass(frozen=True)
class Gap:
    """Two consecutive arrivals, their bound, and the two parts of the gap beyond it.

    ``late`` = start B - start A - interval - margin - redis(A) - redis(B): how much later
    than the gate allowed B started (its own way from the gate opening to the send).
    ``residual`` = gap - (start B - start A) - (site(B) - site(A)): what the configured
    distances do not explain, the timing noise at the two ends (plus any delay of A's send
    after its start stamp, which ``late`` counts the other way). gap = bound + late + residual.
    """

    ms: float
    a: str
    b: str
    bound: float
    late: float | None
    residual: float | None


@dataclass
class Crawl:
    """What one crawl did, as seen at the shop's server."""

    margin_ms: float
    method: str
    arrivals: list[Arrival]  # in order of arrival
    items: dict[str, Any]
    expected: dict[str, Any]
    expected_paths: set[str]

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
            gaps.append(Gap(ms, a.name, b.name, INTERVAL_MS + self.margin_ms - shrink_ms(a, b), late, residual))
        return gaps

    def by_pair(self) -> dict[tuple[str, str], list[Gap]]:
        pairs: dict[tuple[str, str], list[Gap]] = {}
        for gap in self.gaps():
            pairs.setdefault((gap.a, gap.b), []).append(gap)
        return pairs

    def summary(self) -> str:
        lines = [f"latency method: {self.method}; interval {INTERVAL_MS:g} ms, margin {self.margin_ms:g} ms; "
                 f"{len(self.arrivals)} requests; per host {dict(Counter(a.host for a in self.arrivals))}",
                 "  pair    n  min gap    bound   (late, residual of the closest pair)  residuals min..max"]
        for (a, b), gaps in sorted(self.by_pair().items()):
            closest = min(gaps, key=lambda g: g.ms)
            residuals = [g.residual for g in gaps if g.residual is not None]
            parts = f"({_ms(closest.late)}, {_ms(closest.residual)})"
            spread = f"{min(residuals):6.1f}..{max(residuals):.1f} ms" if residuals else "-"
            lines.append(f"  {a}->{b} {len(gaps):3d} {closest.ms:6.1f} ms {closest.bound:6.1f} ms   "
                         f"{parts:34s} {spread}")
        return "\n".join(lines)


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
    with netns.topology([REDIS, SHOP], HOSTS) as topology:
        directory = tmp_path_factory.mktemp("netredis")
        sock = directory / "redis.sock"
        server = topology.run(topology.server_ns, [
            redis_server_binary(), "--port", str(REDIS.port), "--bind", "0.0.0.0", "--protected-mode", "no",
            "--unixsocket", str(sock), "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
            "--dir", str(directory)], stdout=subprocess.DEVNULL)
        url = f"unix://{sock}?db=0"
        wait_until(lambda: sock.exists() and _answers(url), 10, "the server namespace's redis-server",
                   alive=[server])
        check_latencies(topology)
        connection = connect(url)
        try:
            yield Net(topology, url, connection)
        finally:
            connection.close()


def check_latencies(topology: Topology) -> None:
    """Each host's round trip to Redis and to the site's address: twice its one-way latency, or a little more."""
    measured = []
    with netns.echo_server(topology, topology.server_ns, SHOP.port):
        for host in topology.hosts:
            for service, request in ((REDIS, b"PING\r\n"), (SHOP, b"ping")):
                expected = 2 * host.spec.latency_ms[service.name]
                rtt = topology.round_trip_ms(host, service, request)
                measured.append(f"{host.name}->{service.name} {rtt:.1f} ms (expected {expected:g})")
                assert expected - 0.5 <= rtt <= expected + RTT_SLACK_MS, \
                    f"{host.name}'s round trip to {service.name} is {rtt:.1f} ms, not {expected:g} ms"
    print(f"latency method: {topology.method}; round trips: {', '.join(measured)}")


def _answers(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_timeout=0.5).ping())
    except Exception:
        return False


def wait_until(condition: Callable[[], bool], timeout: float, what: str,
               alive: Sequence[subprocess.Popen[bytes]] = (), state: Callable[[], object] = lambda: "") -> None:
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
    return [sys.executable, "-c", "from crawler.cli import main; main()"]


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
    settings = load_settings(database_url=database_url, sites_dir=str(sites), state_dir=str(tmp_path / "state"),
                             gate_margin=margin_ms / 1000)
    net.connection.flushdb()
    Store(database_url).close()  # the schema, before several hosts race to make it
    topology = net.topology
    env = {**os.environ, "REDIS_URL": f"redis://{REDIS.address}:{REDIS.port}/0", "DATABASE_URL": database_url,
           "CRAWLER_GATE_MARGIN": repr(margin_ms / 1000)}
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
            with open(tmp_path / f"{host.name}.log", "wb") as log:
                hosts[host.name] = topology.run(host.netns, [
                    *crawler_command(), "--sites", str(sites), "worker", "download", "--sites", SITE,
                    "--threads", str(host.spec.threads), "--burst"], env=env, hostname=host.hostname, stdout=log)
        parsers = start_workers([WorkerSpec("parse", (SITE,), burst=True)], settings, net.redis_url)
        expected_workers = {host.hostname: host.spec.threads for host in topology.hosts}
        expected_workers[socket.gethostname()] = 1  # the parse worker, in the test's own namespaces

        def counts() -> dict[str, int]:
            return {name: sum(states.values()) for name, states in workers_by_host(net.connection).items()}

        wait_until(lambda: all(counts().get(name, 0) >= n for name, n in expected_workers.items()), START_TIMEOUT,
                   f"workers {expected_workers}", alive=list(hosts.values()), state=lambda: f"(running: {counts()})")
        set_live(net.connection, SITE, paused=False)
        rt.publish(SITE, force=True)
        deadline = time.monotonic() + CRAWL_TIMEOUT
        exit_codes: dict[str, int | None] = {}
        for name, process in hosts.items():
            try:
                exit_codes[name] = process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                exit_codes[name] = None
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
    logs = "\n".join(f"--- {name}\n{(tmp_path / f'{name}.log').read_text()[-2000:]}" for name in hosts)
    assert all(code == 0 for code in exit_codes.values()), f"workers did not drain the crawl: {exit_codes}\n{logs}"
    store = Store(database_url)
    try:
        started = {_path(row["url"]): row["started"].replace(tzinfo=UTC).timestamp()
                   for row in store.fetch_rows(SITE) if row["kind"] == "download" and row["url"].startswith(shop.url)}
    finally:
        store.close()
    arrivals = []
    for entry in shop.requests:
        host = topology.host_of(shop.clients.get(id(entry), "?"))
        assert host is not None, f"{entry.path} came from an unknown address {shop.clients.get(id(entry))}"
        arrivals.append(Arrival(entry.time, host.name, entry.path,
                                None if entry.path == "/robots.txt" else started.get(entry.path)))
    paths = {"/robots.txt", "/", "/catalogue.pdf", *(f"/products?page={n}" for n in range(1, shop.pages + 1)),
             *(f"/product/{n}" for n in range(1, PRODUCTS + 1))}
    return Crawl(margin_ms, topology.method, arrivals, items_by_key(database_url, site=SITE), expected, paths)


def _path(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


def check_complete_and_within_bound(crawl: Crawl) -> None:
    """Every page fetched once, every item stored; no gap below the bound (less the noise allowance)."""
    fetched = Counter(arrival.path for arrival in crawl.arrivals)
    assert fetched == dict.fromkeys(crawl.expected_paths, 1), f"pages fetched: {sorted(fetched.items())}"
    assert crawl.items == crawl.expected
    for gap in crawl.gaps():
        assert gap.ms >= gap.bound - NOISE_MS, \
            f"{gap.a}->{gap.b} {gap.ms:.1f} ms apart, below the bound {gap.bound:g} ms\n{crawl.summary()}"


def report(crawl: Crawl, request: pytest.FixtureRequest) -> None:
    """Record the latency method and the closest gap of each pair of hosts (test properties, stdout)."""
    properties = request.node.user_properties
    properties.append(("latency_method", crawl.method))
    properties.append(("min_gap_ms", round(min(g.ms for g in crawl.gaps()), 1)))
    for (a, b), gaps in sorted(crawl.by_pair().items()):
        properties.append((f"min_gap_ms_{a}_{b}", round(min(g.ms for g in gaps), 1)))
    print(crawl.summary())


def test_hosts_at_different_distances_keep_the_interval_at_the_site_with_a_covering_margin(
        net: Net, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    crawl = run_crawl(net, tmp_path, COVERING_MARGIN_MS)
    report(crawl, request)
    check_complete_and_within_bound(crawl)
    dangerous = crawl.by_pair().get(("h1", "h2"), [])
    assert len(dangerous) >= 3, f"the far-then-near sequence hardly occurred, so proves little\n{crawl.summary()}"
    closest = min(crawl.gaps(), key=lambda g: g.ms)
    assert closest.ms >= INTERVAL_MS, \
        f"{closest.a}->{closest.b}: two requests {closest.ms:.1f} ms apart at the site\n{crawl.summary()}"


def test_without_a_margin_a_far_host_then_a_near_one_reach_the_site_closer_than_the_interval(
        net: Net, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    crawl = run_crawl(net, tmp_path, 0.0)
    report(crawl, request)
    check_complete_and_within_bound(crawl)
    dangerous = crawl.by_pair().get(("h1", "h2"), [])
    assert dangerous, f"the far-then-near sequence never occurred\n{crawl.summary()}"
    closest = min(g.ms for g in dangerous)
    assert closest < INTERVAL_MS, f"no shortfall without a margin: h1->h2 at least {closest:.1f} ms\n{crawl.summary()}"
