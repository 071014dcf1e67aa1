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
+ margin, hears so redis(B) later and its request needs site(B) more. So the gap at the
server is at least

    interval + margin - shrink(A, B),   shrink(A, B) = site(A) - redis(A) - redis(B) - site(B)

(one-way latencies). The worst pair here is a host near Redis but far from the site
followed by a host near both. The margin that covers it is the largest shrink plus the
default 10 ms for timing noise at the two ends.
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
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

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
    HostSpec("h2", {"redis": 1, "site": 1}, threads=2),
    HostSpec("h3", {"redis": 12, "site": 20}, threads=2),
)
INTERVAL_MS = 60.0
#: Timing noise at the two ends (the server's own scheduling, the relays): the default margin.
NOISE_MS = DEFAULT_GATE_MARGIN * 1000
PRODUCTS = 60
#: Seconds for the workers of every host to start, and for the crawl to drain.
START_TIMEOUT = float(os.environ.get("DBG_START", 60))
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

    ``clients`` maps each logged request (by ``id``) to the address it came from.
    """

    def __init__(self, address: str, port: int, **kwargs: Any):
        super().__init__(host="0.0.0.0", port=port, **kwargs)
        self.address = address
        self.clients: dict[int, str] = {}
        self._peer = threading.local()

    @property
    def url(self) -> str:
        """``http://ADDRESS:PORT``, as every host reaches the shop."""
        _, _, port = super().url.rpartition(":")
        return f"http://{self.address}:{port}"

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


@dataclass
class Crawl:
    """What one crawl did, as seen at the shop's server."""

    margin_ms: float
    method: str
    arrivals: list[tuple[float, str, str]]  # (time, host, path), in order of arrival
    items: dict[str, Any]
    expected: dict[str, Any]
    expected_paths: set[str]
    exit_codes: dict[str, int | None] = field(default_factory=dict)

    def gaps(self) -> list[tuple[float, str, str]]:
        """(gap ms, earlier host, later host) for each consecutive pair of arrivals."""
        return [((b[0] - a[0]) * 1000, a[1], b[1]) for a, b in pairwise(self.arrivals)]

    def gaps_by_pair(self) -> dict[tuple[str, str], list[float]]:
        pairs: dict[tuple[str, str], list[float]] = {}
        for gap, a, b in self.gaps():
            pairs.setdefault((a, b), []).append(gap)
        return pairs

    def summary(self) -> str:
        spec = {h.name: h for h in HOSTS}
        lines = [f"latency method: {self.method}; interval {INTERVAL_MS:g} ms, margin {self.margin_ms:g} ms; "
                 f"{len(self.arrivals)} requests; per host {dict(Counter(a[1] for a in self.arrivals))}",
                 "  pair     n   min gap   bound (interval + margin - shrink)"]
        for (a, b), gaps in sorted(self.gaps_by_pair().items()):
            bound = INTERVAL_MS + self.margin_ms - shrink_ms(spec[a], spec[b]) if a in spec and b in spec else 0
            lines.append(f"  {a}->{b} {len(gaps):3d} {min(gaps):7.1f} ms {bound:7.1f} ms")
        return "\n".join(lines)


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
        connection = connect(url)
        try:
            yield Net(topology, url, connection)
        finally:
            connection.close()


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
    shop = topology.in_netns(topology.server_ns, lambda: ServiceShop(SHOP.address, SHOP.port, products=PRODUCTS,
                                                                     faults=False).start())
    env = {**os.environ, "REDIS_URL": f"redis://{REDIS.address}:{REDIS.port}/0", "DATABASE_URL": database_url,
           "CRAWLER_GATE_MARGIN": repr(margin_ms / 1000)}
    hosts: dict[str, subprocess.Popen[bytes]] = {}
    parsers: list[Any] = []
    rt = Runtime(net.connection, settings)
    try:
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
        local = socket.gethostname()

        expected_workers[local] = expected_workers.get(local, 0) + 1  # the parse worker

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
    finally:
        rt.close()
        stop_workers(parsers, timeout=10)
        for process in hosts.values():
            topology.stop(process)
        shop.stop()
    logs = "\n".join(f"--- {name}\n{(tmp_path / f'{name}.log').read_text()[-2000:]}" for name in hosts)
    assert all(code == 0 for code in exit_codes.values()), f"workers did not drain the crawl: {exit_codes}\n{logs}"
    arrivals = []
    for entry in shop.requests:
        host = topology.host_of(shop.clients.get(id(entry), "?"))
        arrivals.append((entry.time, host.name if host else "?", entry.path))
    paths = {"/robots.txt", "/", "/catalogue.pdf", *(f"/products?page={n}" for n in range(1, shop.pages + 1)),
             *(f"/product/{n}" for n in range(1, PRODUCTS + 1))}
    return Crawl(margin_ms, topology.method, arrivals, items_by_key(database_url, site=SITE), shop.expected_items(),
                 paths, exit_codes)


def check_complete_and_within_bound(crawl: Crawl) -> None:
    """Every page fetched once, every item stored; no gap below what the bound allows."""
    fetched = Counter(path for _, _, path in crawl.arrivals)
    assert fetched == dict.fromkeys(crawl.expected_paths, 1), f"pages fetched: {sorted(fetched.items())}"
    assert crawl.items == crawl.expected
    spec = {h.name: h for h in HOSTS}
    for gap, a, b in crawl.gaps():
        bound = INTERVAL_MS + crawl.margin_ms - shrink_ms(spec[a], spec[b])
        assert gap >= bound - NOISE_MS, f"{a}->{b} {gap:.1f} ms apart, below the bound {bound:g} ms\n{crawl.summary()}"


def report(crawl: Crawl, record_property: Callable[[str, object], None]) -> None:
    record_property("latency_method", crawl.method)
    record_property("min_gap_ms", round(min(g for g, _, _ in crawl.gaps()), 1))
    for (a, b), gaps in crawl.gaps_by_pair().items():
        record_property(f"min_gap_ms_{a}_{b}", round(min(gaps), 1))
    print(crawl.summary())


def test_hosts_at_different_distances_keep_the_interval_at_the_site_with_a_covering_margin(
        net: Net, tmp_path: Path, record_property: Callable[[str, object], None]) -> None:
    crawl = run_crawl(net, tmp_path, COVERING_MARGIN_MS)
    report(crawl, record_property)
    check_complete_and_within_bound(crawl)
    dangerous = crawl.gaps_by_pair().get(("h1", "h2"), [])
    assert len(dangerous) >= 3, f"the far-then-near sequence hardly occurred, so proves little\n{crawl.summary()}"
    gap, a, b = min(crawl.gaps())
    assert gap >= INTERVAL_MS, f"{a}->{b}: two requests {gap:.1f} ms apart at the site ({crawl.method})\n" \
                               f"{crawl.summary()}"


def test_without_a_margin_a_far_host_then_a_near_one_reach_the_site_closer_than_the_interval(
        net: Net, tmp_path: Path, record_property: Callable[[str, object], None]) -> None:
    crawl = run_crawl(net, tmp_path, 0.0)
    report(crawl, record_property)
    check_complete_and_within_bound(crawl)
    dangerous = crawl.gaps_by_pair().get(("h1", "h2"), [])
    assert dangerous, f"the far-then-near sequence never occurred\n{crawl.summary()}"
    assert min(dangerous) < INTERVAL_MS, f"no shortfall without a margin ({crawl.method})\n{crawl.summary()}"
