"""Fleet: thousands of slow sites on a few cores (issue 21), against Scrapy in the same run.

Invocation: ``python -m bench fleet [--quick | --config quick|200|1000|2000|10000]``.

Configurations (``CONFIGS``), each site a demo shop (``crawler.demo.ShopSite``'s pages:
robots.txt, home, listing pages of ``PER_PAGE`` products, the products, the PDF) on its own
loopback address ``127.1.x.y`` (Linux routes all of 127/8 to ``lo``), one port for all. Ours
does not request the PDF (``Spider.deny_extensions``), Scrapy's spider does (``follow_all``
filters no extension): a site's full crawl is one request more for Scrapy.

- ``200``: 200 sites x 30 products (35 requests a site, Scrapy 36), interval 1 s: a budget
  of 200 requests/s, ideal wall time (35 - 1) x 1 s = 34 s (Scrapy 35 s) plus the last answer;
- ``1000``: 1,000 sites x 10 products (13 requests a site, Scrapy 14), interval 5 s: 200
  requests/s, 1,000 gates, ideal 60 s (Scrapy 65 s);
- ``2000`` and ``10000``: the first pass of a broad crawl over a list of hosts: 2,000 or
  10,000 sites of one product each, interval 2 s, each shop without its listing
  (``FleetConfig.listing``: the home links the product, which links no listing page, so
  there is no PDF either): robots.txt, home, product, 3 requests a site for both crawlers,
  ideal (3 - 1) x 2 s = 4 s plus the last answer. The budget (1,000 or 5,000 requests/s) is
  far more than a few cores send: the crawler's cost per host, not the interval, bounds
  the wall (6,000 or 30,000 requests). Scrapy's callbacks keep links to the page's own host
  (``FleetConfig.filter_hosts``) rather than an ``allowed_domains`` of 10,000 domains, whose
  regex would be the cost measured;
- ``quick`` (``--quick``): 20 sites x 5 products, interval 0.5 s.

Each site answers after its latency, drawn once per site from uniform ``LATENCY`` (0.2-0.8
s), plus uniform 0-``JITTER`` (0.1 s) per response. All sites are served by one asyncio
process (``serve_main``: raw non-blocking sockets, latency by ``call_later``; one listening
socket on the wildcard address bound to the ``lo`` device, a connection's site the address
it reached, so 10,000 sites take one descriptor, not 10,000), a subprocess of this one, not
counted as either crawler's; every request's arrival is the kernel's receive
stamp of its first segment (``SO_TIMESTAMPNS``, as ``crawler.demo.wire``), so gaps are those
the site saw, whatever the load. Its CPU over the run is reported. A fresh server serves each
crawler.

Ours: one spider module in a temporary sites directory (a ``DemoShop`` per site: its
interval, its address as start URL and allowed domain; URLs naming an IP address need no
``allow_private_addresses``), a private Redis (``bench_redis``), SQLite. ``crawler seed
--all`` in one process (its wall and CPU reported apart, not in the figures below), then
``crawler worker download --burst`` and ``crawler worker parse --burst``, the CLI as users
run it, as two subprocesses started together. The download worker's extra arguments come
from ``BENCH_FLEET_DOWNLOAD_ARGS`` (e.g. ``"-n 2 --threads 64"``), the parse worker's from
``BENCH_FLEET_PARSE_ARGS`` (e.g. ``"-n 2"``); by default none: the plain default commands.
Scrapy: one ``scrapy runspider`` process of the spider of ``bench throughput`` (same
selectors and items) with every site's home as start URL (read from a file),
``DOWNLOAD_DELAY`` = interval with no jitter (``DOWNLOAD_DELAY_JITTER=0``, or
``RANDOMIZE_DOWNLOAD_DELAY=False`` in a Scrapy without it; by default each delay is drawn
from 0.5-1.5 x, which breaks the interval by design), ``CONCURRENT_REQUESTS_PER_DOMAIN=1``,
``CONCURRENT_REQUESTS`` = 2 x sites, ``ROBOTSTXT_OBEY=True``, a JSON lines feed; found as
``bench throughput`` finds it (``BENCH_SCRAPY_PYTHON``). Ours runs first, then Scrapy
(``BENCH_FLEET_ROUNDS=N`` repeats both, alternating which goes first; the table shows every
round, the checks take the first; ``BENCH_FLEET_SCRAPY=0`` leaves Scrapy out, to look at ours
alone). Either is stopped after ``BENCH_FLEET_TIMEOUT`` seconds (default max(120, 4 x
ideal, our requests / ``TIMEOUT_RATE`` (50/s)): 120, 140, 260, 120 and 600 s for ``quick``,
``200``, ``1000``, ``2000``, ``10000``): a crawl cut short fails its wall check, its wall is
the timeout.

Figures, per crawler:

- wall: from starting the crawler's processes until they have all exited (ours: both burst
  workers; seeding before, not included);
- utilization: sum over sites of (requests - 1) / sum over sites of (window / interval),
  the window of a site being the time from the first request to reach it to the last (to
  the end of the run when the crawl was cut short and the site got fewer than all its
  requests: it still had work). Each gap spaced exactly one interval gives 1; the gate
  margin alone caps ours at interval / (interval + margin) (0.995 at 1 s). What it leaves
  out, the ramp (from the start to each site's first request), is shown apart, as is
  requests / (wall x budget). The same ratio for each site alone gives the worst site's and
  the 5th percentile site's (reported: a fleet's sum can hide a starved site);
- CPU per request: ours, the CPU seconds of every process the two worker commands ran
  (the launchers and their forked workers: ``RUSAGE_CHILDREN`` deltas once all are reaped)
  plus the Redis server's (``INFO cpu`` user + sys delta), over the requests that reached
  the sites; Scrapy, its process's CPU over its requests. Ours is also broken down by
  command (launcher, its workers: psutil samples) and by Redis command (per request);
- peak memory: PSS (``/proc/PID/smaps_rollup``, so pages forked workers share count once)
  summed over ours (launchers, workers, the Redis server) or over the Scrapy process,
  sampled every ``SAMPLE_EVERY`` s, the largest sum;
- violations: per site, requests arriving closer than its interval to the previous one
  (kernel stamps, sorted), those more than ``CLEAR_BY`` (10 ms) early apart, and the
  smallest gap of any site;
- items: ours, rows in the database against sites x products; Scrapy's, distinct
  (site, SKU) in its feed.

Idle: after our crawl, the same two worker commands without ``--burst`` (nothing left to do)
run ``IDLE_SETTLE`` s, then for ``IDLE_WINDOW`` s the Redis commands/s (``INFO commandstats``
delta, INFO itself left out) and each worker process's CPU as % of one core are taken.
After a crawl cut short, its sites are forgotten first (``crawler.ops.reset.reset_site``,
and the pages stream deleted), or the workers would go on crawling.

Checks (the issue's targets): our wall <= Scrapy's; utilization >= 0.97; CPU/request <=
Scrapy's; peak PSS <= 2 x Scrapy's; no violation; every item stored; idle < 1% of a core
per process.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crawler.coord import keys
from crawler.demo import ShopSite
from crawler.demo.wire import SO_TIMESTAMPNS
from crawler.ops.reset import reset_site

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
    write_config,
)
from .monitor import CommandTally, report
from .throughput import SCRAPY_SPIDER

#: Products per listing page.
PER_PAGE = 10
#: Per-site latency, drawn once from this uniform range (s), and the most jitter added per response.
LATENCY = (0.2, 0.8)
JITTER = 0.1
#: Seed of the latency draws (the same sites for both crawlers and every run).
SEED = 21
#: Seconds between two PSS samples.
SAMPLE_EVERY = 0.25
#: Idle measurement: seconds for the workers to settle, then seconds measured.
IDLE_SETTLE = 5.0
IDLE_WINDOW = 10.0
QUICK_IDLE_WINDOW = 5.0
#: Environment: extra arguments of ``crawler worker download``, of ``crawler worker parse``; seconds a
#: crawl may take; rounds.
DOWNLOAD_ARGS_ENV = "BENCH_FLEET_DOWNLOAD_ARGS"
PARSE_ARGS_ENV = "BENCH_FLEET_PARSE_ARGS"
#: ``0``: run ours only (a look at our figures, not a comparison).
SCRAPY_ENV = "BENCH_FLEET_SCRAPY"
TIMEOUT_ENV = "BENCH_FLEET_TIMEOUT"
#: The default timeout allows at least this slow a crawl (requests/s), for configurations whose
#: wall the crawler's CPU bounds rather than the interval (10,000 sites: 30,000 requests, ideal 4 s).
TIMEOUT_RATE = 50.0
ROUNDS_ENV = "BENCH_FLEET_ROUNDS"
#: Violations are also counted apart when they come this much (s) before the interval is up.
CLEAR_BY = 0.01
#: Targets.
TARGET_UTILIZATION = 0.97
TARGET_PSS_RATIO = 2.0
TARGET_IDLE_CPU = 1.0  # % of a core, per process
#: Repository root: the server subprocess imports this module from there.
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class FleetConfig:
    """One scenario: how many sites, products each, and the interval of every site."""

    label: str
    sites: int
    products: int
    interval: float
    #: False: the home links every product itself and no page links a listing (``_FleetShop``):
    #: robots.txt, home and the products only, no listing page, no PDF.
    listing: bool = True
    #: Scrapy's spider drops links to other hosts in its callbacks (``scrapy_spider``).
    filter_hosts: bool = False

    @property
    def requests_per_site(self) -> int:
        """robots.txt, home, listing pages, the products: what our full crawl of a site fetches."""
        pages = max(1, -(-self.products // PER_PAGE)) if self.listing else 0
        return 2 + pages + self.products

    @property
    def scrapy_requests_per_site(self) -> int:
        """Scrapy's full crawl of a site: ours and the PDF (linked from the first listing page)."""
        return self.requests_per_site + (1 if self.listing else 0)

    @property
    def requests(self) -> int:
        """Our full crawl of every site."""
        return self.sites * self.requests_per_site

    @property
    def budget(self) -> float:
        return self.sites / self.interval

    @property
    def ideal(self) -> float:
        """Seconds our crawl spacing every site's requests exactly one interval apart takes (last answer aside)."""
        return (self.requests_per_site - 1) * self.interval


#: A file for a MONITOR tally of our crawl by command and key (``bench.monitor``); off when unset.
MONITOR_ENV = "BENCH_FLEET_MONITOR"

CONFIGS = {
    "quick": FleetConfig("quick", 20, 5, 0.5),
    "200": FleetConfig("200", 200, 30, 1.0),
    "1000": FleetConfig("1000", 1000, 10, 5.0),
    "2000": FleetConfig("2000", 2000, 1, 2.0, listing=False, filter_hosts=True),
    "10000": FleetConfig("10000", 10000, 1, 2.0, listing=False, filter_hosts=True),
}


def site_host(index: int) -> str:
    """The loopback address of site ``index``: 127.1.0.1, 127.1.0.2, ... 250 to a /24."""
    return f"127.1.{index // 250}.{index % 250 + 1}"


def site_latencies(count: int) -> list[float]:
    """Each site's base latency (s), the same draw every run."""
    rng = random.Random(SEED)
    return [rng.uniform(*LATENCY) for _ in range(count)]


# -- the sites' server (a process of its own) ------------------------------------------


#: The link of a demo product page back to the first listing page (left out when there is no listing).
BACK_LINK = b'<p><a href="/products?page=1">Back to products</a></p>'


class _FleetShop(ShopSite):
    """A demo shop's pages for one fleet address, answered by the fleet server, not by a thread of its own.

    Without ``listing`` the home links every product itself (and, as the demo's, the
    robots-disallowed admin page) and the product pages lose their link back to the
    listing: a crawl is robots.txt, home and the products, no listing page, no PDF.
    """

    def __init__(self, host: str, port: int, products: int, listing: bool = True):
        super().__init__(products=products, per_page=PER_PAGE, faults=False, host=host, port=port)
        self.listing = listing
        if not listing and products and BACK_LINK not in super()._product("1").body:
            raise RuntimeError("crawler.demo's product page changed: its link back to the listing not found")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _home(self) -> bytes:
        if self.listing:
            return super()._home()
        links = "".join(f'<li><a href="/product/{i}">Product {i}</a></li>\n' for i in range(1, self.products + 1))
        return (
            '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Demo shop</title></head>\n<body>\n'
            f'<h1>Demo shop</h1>\n<ul>\n{links}<li><a href="/private/admin">Admin</a></li>\n</ul>\n</body></html>\n'
        ).encode()

    def _product(self, raw_id: str) -> Any:
        response = super()._product(raw_id)
        if not self.listing:
            response.body = response.body.replace(BACK_LINK, b"")
        return response


def _stamp(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            return int.from_bytes(data[:8], "little", signed=True) + int.from_bytes(data[8:16], "little") / 1e9
    return None


class _Connection:
    """One client connection: requests parsed from the stream, each answered after the site's latency."""

    def __init__(self, server: _FleetServer, sock: socket.socket, site: int):
        self.server, self.sock, self.site = server, sock, site
        self.buffer = bytearray()
        self.first: float | None = None  # stamp of the first segment of the request being read
        self.busy = False
        self.pending = b""
        self.closing = False
        server.loop.add_reader(sock.fileno(), self.readable)

    def readable(self) -> None:
        try:
            data, ancillary, _flags, _addr = self.sock.recvmsg(65536, socket.CMSG_SPACE(16))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        if not self.buffer:
            self.first = _stamp(ancillary) or time.time()
        self.buffer += data
        self.next_request()

    def next_request(self) -> None:
        if self.busy:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).decode("latin-1")
        del self.buffer[: end + 4]
        arrival = self.first or time.time()
        self.first = time.time() if self.buffer else None  # a pipelined request: no better stamp
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        target = parts[1] if len(parts) >= 2 else "/"
        close = any(line.lower().replace(" ", "") == "connection:close" for line in lines[1:])
        self.server.log.append((arrival, self.site, parts[0], target))
        self.busy = True
        delay = self.server.latencies[self.site] + self.server.rng.uniform(0, JITTER)
        self.server.loop.call_later(delay, self.answer, parts[0], target, close)

    def answer(self, method: str, target: str, close: bool) -> None:
        response = self.server.shops[self.site]._respond(target)
        head = (
            f"HTTP/1.1 {response.status} {'OK' if response.status == 200 else 'Not Found'}\r\n"
            f"Content-Type: {response.content_type}\r\nContent-Length: {len(response.body)}\r\n"
            f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n"
        ).encode("latin-1")
        self.closing = close
        self.send(head + (response.body if method != "HEAD" else b""))

    def send(self, data: bytes) -> None:
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.close()
            return
        self.pending = data[sent:]
        if self.pending:
            self.server.loop.add_writer(self.sock.fileno(), self.writable)
            return
        self.done()

    def writable(self) -> None:
        self.server.loop.remove_writer(self.sock.fileno())
        self.send(self.pending)

    def done(self) -> None:
        self.busy = False
        if self.closing:
            self.close()
        else:
            self.next_request()

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.server.loop.remove_reader(self.sock.fileno())
            self.server.loop.remove_writer(self.sock.fileno())
            self.sock.close()


class _FleetServer:
    """Every site in one event loop behind one listening socket; the request log, in arrival order of handling.

    The socket listens on the wildcard address, bound to the loopback device (``SO_BINDTODEVICE``:
    no other interface reaches it), so one descriptor serves every ``site_host`` (a socket
    per address would take 10,000 of them at 10,000 sites, before any connection); a
    connection's site is the address it was made to, a connection to any other is closed.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, spec: dict[str, Any]):
        self.loop = loop
        self.latencies: list[float] = spec["latencies"]
        self.rng = random.Random(spec.get("seed", SEED) + 1)
        self.log: list[tuple[float, int, str, str]] = []
        hosts = [site_host(i) for i in range(len(self.latencies))]
        self.sites = {host: index for index, host in enumerate(hosts)}
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
        if SO_TIMESTAMPNS is not None:  # inherited by accepted sockets, from their first segment on
            listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        listener.bind(("0.0.0.0", 0))
        listener.listen(65535)  # the kernel caps it at net.core.somaxconn
        listener.setblocking(False)
        loop.add_reader(listener.fileno(), self.accept, listener)
        self.listeners = [listener]
        self.port = listener.getsockname()[1]
        self.shops = [_FleetShop(host, self.port, spec["products"], spec.get("listing", True)) for host in hosts]

    def accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            site = self.sites.get(sock.getsockname()[0])
            if site is None:  # not a fleet address
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _Connection(self, sock, site)


def serve_main() -> None:
    """The fleet server process: a JSON spec on argv[1]; prints its port, serves until stdin closes.

    Then writes the request log and its own CPU time as JSON to argv[2] and exits.
    """
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    loop = asyncio.new_event_loop()
    server = _FleetServer(loop, spec)
    stopped = asyncio.Event()
    started = time.monotonic()

    def stdin_ready() -> None:
        if not os.read(sys.stdin.fileno(), 4096):
            loop.remove_reader(sys.stdin.fileno())
            stopped.set()

    loop.add_reader(sys.stdin.fileno(), stdin_ready)
    print(json.dumps({"port": server.port}), flush=True)
    loop.run_until_complete(stopped.wait())
    times = os.times()
    loop.remove_reader(server.listeners[0].fileno())  # the rest go with the process
    loop.close()
    out.write_text(
        json.dumps(
            {
                "log": server.log,
                "cpu": times.user + times.system,
                "wall": time.monotonic() - started,
            }
        )
    )


class FleetServer:
    """Starts the fleet server process; ``stop`` hands back its request log and CPU."""

    def __init__(self, config: FleetConfig, workdir: Path):
        self.config = config
        self.spec = workdir / "server.json"
        self.out = workdir / "server-log.json"
        self.spec.write_text(
            json.dumps(
                {"latencies": site_latencies(config.sites), "products": config.products, "listing": config.listing}
            )
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from bench.fleet import serve_main; serve_main()", str(self.spec), str(self.out)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(10)
            raise RuntimeError(f"the fleet server did not start (exit {self.process.returncode})")
        self.port = int(json.loads(line)["port"])

    def url(self, index: int) -> str:
        return f"http://{site_host(index)}:{self.port}/"

    def stop(self, crawler: str) -> dict[str, Any]:
        """Stop serving; returns {"log": [(arrival, site, method, target)...], "cpu": s, "wall": s}.

        With ``BENCH_FLEET_LOGS`` the log is also kept there as ``server-log-<crawler>.json``.
        """
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(60)
        data: dict[str, Any] = json.loads(self.out.read_text())
        if os.environ.get("BENCH_FLEET_LOGS"):  # kept with the workers' logs
            kept = Path(os.environ["BENCH_FLEET_LOGS"])
            kept.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.out, kept / f"server-log-{crawler}.json")
        return data


# -- measuring processes ------------------------------------------------------------------


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pss_kib(pid: int) -> int:
    """A process's proportional set size (KiB), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class PssSampler:
    """Sums the PSS of some processes and all their descendants every ``SAMPLE_EVERY`` s, in a thread.

    It also keeps the last CPU time seen of each process under a root, for a breakdown
    (``cpu_by_root``: a little short, the last ``SAMPLE_EVERY`` s of each process missing).
    """

    def __init__(self, roots: list[int], extra: list[int]):
        import psutil

        self.psutil = psutil
        self.roots, self.extra = roots, extra
        self.peak = 0
        self.samples = 0
        self.peak_by_process: dict[int, tuple[str, int]] = {}  # pid -> (its role, its PSS KiB in the peak sample)
        self.cpu: dict[int, tuple[int, float]] = {}  # pid -> (its root, CPU seconds last seen)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss-sampler", daemon=True)
        self._thread.start()

    def pids(self) -> dict[int, Any]:
        """Every process sampled: pid -> its psutil handle (None for ``extra``)."""
        found: dict[int, Any] = dict.fromkeys(self.extra)
        for root in self.roots:
            try:
                process = self.psutil.Process(root)
                found[root] = process
                found.update((child.pid, child) for child in process.children(recursive=True))
            except self.psutil.NoSuchProcess:
                continue
        return found

    def _run(self) -> None:
        while not self._stop.is_set():
            found = self.pids()
            each = {pid: pss_kib(pid) for pid in found}
            total = sum(each.values())
            if total > self.peak:
                self.peak_by_process = {pid: (self._role(found[pid]), kib) for pid, kib in each.items()}
            self.peak = max(self.peak, total)
            self.samples += 1
            for pid, process in found.items():
                if process is None:
                    continue
                try:
                    times = process.cpu_times()
                    root = pid if pid in self.roots else self.cpu.get(pid, (None, 0))[0] or self._root_of(process)
                    self.cpu[pid] = (root, times.user + times.system)
                except self.psutil.Error:
                    continue
            self._stop.wait(SAMPLE_EVERY)

    @staticmethod
    def _role(process: Any) -> str:
        """A short name of what a process is: its command line from ``worker`` on, or ``redis``."""
        if process is None:
            return "redis"
        try:
            line = process.cmdline()
        except Exception:  # gone between the listing and now
            return "?"
        return " ".join(line[line.index("worker") :] if "worker" in line else line[-2:])

    def by_role(self) -> list[tuple[str, int, float]]:
        """In the peak sample: each role, how many processes had it, and their PSS in MiB."""
        roles: dict[str, list[int]] = defaultdict(list)
        for role, kib in self.peak_by_process.values():
            roles[role].append(kib)
        return sorted(((role, len(k), sum(k) / 1024) for role, k in roles.items()), key=lambda r: -r[2])

    def _root_of(self, process: Any) -> int:
        for parent in process.parents():
            if parent.pid in self.roots:
                return int(parent.pid)
        return 0

    def cpu_by_root(self, root: int) -> tuple[float, float, int]:
        """CPU seconds of ``root`` itself, of its descendants, and how many descendants were seen."""
        own = sum(cpu for pid, (_, cpu) in self.cpu.items() if pid == root)
        children = [cpu for pid, (r, cpu) in self.cpu.items() if r == root and pid != root]
        return own, sum(children), len(children)

    def stop(self) -> float:
        """Stop sampling; the peak PSS sum in MiB."""
        self._stop.set()
        self._thread.join()
        return self.peak / 1024


def _terminate(processes: list[subprocess.Popen[Any]], timeout: float = 30.0) -> None:
    """SIGTERM each (a launcher stops its workers on it), then SIGKILL its group if it lingers."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_all(processes: list[subprocess.Popen[Any]], timeout: float) -> bool:
    """Wait for every process to exit, at most ``timeout`` s; True if they all did."""
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


# -- the arrivals -----------------------------------------------------------------------


def arrival_figures(
    log: list[list[Any]], config: FleetConfig, started_wall: float, ended_wall: float, full: int, cut: bool
) -> dict[str, Any]:
    """Utilization, ramp, violations and smallest gap from the server's log (see the module docstring).

    ``full``: the requests this crawler's full crawl of a site sends. A site's active window
    runs from its first request to its last, or to the end of the run (``ended_wall``) when
    the crawl was ``cut`` short and the site got fewer than ``full`` (it still had work); a
    site never reached adds nothing to it (its ramp is the run).
    """
    per_site: dict[int, list[float]] = defaultdict(list)
    for arrival, site, _method, _target in log:
        per_site[site].append(arrival)
    used = windows = 0.0
    violations = by_much = 0
    smallest: float | None = None
    ramps = [ended_wall - started_wall] * (config.sites - len(per_site))
    excess = []
    by_site = []  # each site's own utilization: the worst site is judged, not only the sum
    for times in per_site.values():
        times.sort()
        gaps = [b - a for a, b in zip(times, times[1:])]
        violations += sum(1 for gap in gaps if gap < config.interval)
        by_much += sum(1 for gap in gaps if gap < config.interval - CLEAR_BY)
        if gaps:
            smallest = min(gaps) if smallest is None else min(smallest, min(gaps))
            excess.append(statistics.fmean(gaps) - config.interval)
        end = max(ended_wall, times[-1]) if cut and len(times) < full else times[-1]
        used += len(times) - 1
        windows += (end - times[0]) / config.interval
        if end > times[0]:
            by_site.append((len(times) - 1) * config.interval / (end - times[0]))
        ramps.append(times[0] - started_wall)
    return {
        "requests": len(log),
        "sites_reached": len(per_site),
        "sites_complete": sum(1 for times in per_site.values() if len(times) >= full),
        "utilization": used / windows if windows else 0.0,
        "worst_site_utilization": min(by_site, default=None),
        "p5_site_utilization": _percentile(by_site, 0.05),
        "ramp_mean": statistics.fmean(ramps) if ramps else None,
        "ramp_max": max(ramps) if ramps else None,
        "excess_gap_ms": statistics.fmean(excess) * 1000 if excess else None,
        "violations": violations,
        "violations_by_much": by_much,
        "smallest_gap": smallest,
    }


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _percentile(values: list[float], fraction: float) -> float | None:
    """The value ``fraction`` of the way up ``values`` sorted (nearest rank); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# -- ours -----------------------------------------------------------------------------------

SITES_MODULE = '''\
"""Fleet benchmark sites (generated by bench.fleet): the demo shop spider, one per loopback address."""

from crawler.demo.spider import DemoShop

{classes}
'''

SITE_CLASS = """
class Fleet{index}(DemoShop):
    name = {name!r}
    interval = {interval!r}
    start_urls = [{url!r}]
    allowed_domains = [{host!r}]
"""


def download_args() -> list[str]:
    """Extra arguments of ``crawler worker download`` (``BENCH_FLEET_DOWNLOAD_ARGS``; none by default)."""
    return shlex.split(os.environ.get(DOWNLOAD_ARGS_ENV, ""))


def parse_args() -> list[str]:
    """Extra arguments of ``crawler worker parse`` (``BENCH_FLEET_PARSE_ARGS``; none by default)."""
    return shlex.split(os.environ.get(PARSE_ARGS_ENV, ""))


def worker_commands(config_file: Path, burst: bool) -> list[list[str]]:
    base = crawler_command(config_file)
    flag = ["--burst"] if burst else []
    return [
        [*base, "worker", "download", *flag, *download_args()],
        [*base, "worker", "parse", *flag, *parse_args()],
    ]


def run_ours(redis: BenchRedis, config: FleetConfig, workdir: Path, timeout: float, idle: float) -> dict[str, Any]:
    """Seed, then the two burst worker commands until they exit; then the idle measurement."""
    names = [f"fleet{i:04d}_{redis.tag}" for i in range(config.sites)]
    settings = crawl_settings(workdir, redis.url, [], {})
    server = FleetServer(config, workdir)
    try:
        classes = "".join(
            SITE_CLASS.format(index=i, name=name, interval=config.interval, url=server.url(i), host=site_host(i))
            for i, name in enumerate(names)
        )
        (Path(settings.sites_dir) / "fleet_sites.py").write_text(SITES_MODULE.format(classes=classes))
        config_file = write_config(workdir / "config.yaml", settings)
        base = crawler_command(config_file)

        cpu0, seed_started = _children_cpu(), time.monotonic()
        seeded = subprocess.run([*base, "seed", "--all"], cwd=workdir, capture_output=True, text=True, timeout=600)
        seed_wall, seed_cpu = time.monotonic() - seed_started, _children_cpu() - cpu0
        if seeded.returncode != 0:
            raise RuntimeError(f"crawler seed --all failed: {seeded.stderr[-2000:]}")

        tally = CommandTally(redis.url, r"fleet\d{4}_" + redis.tag) if os.environ.get(MONITOR_ENV) else None
        if tally is not None:
            tally.start()
        stats, redis_cpu0, cpu0 = command_stats(redis.connection), _info_cpu(redis), _children_cpu()
        started_wall, started = time.time(), time.monotonic()
        # Their logs go to files: a pipe read only at the end would fill and block a worker that logs much.
        logs = [workdir / f"{kind}.log" for kind in ("download", "parse")]
        workers = []
        for args, log_path in zip(worker_commands(config_file, burst=True), logs, strict=True):
            with log_path.open("w") as log_file:
                workers.append(
                    subprocess.Popen(
                        args, cwd=workdir, stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True
                    )
                )
        redis_pid = redis.server_pid()
        sampler = PssSampler([w.pid for w in workers], [redis_pid] if redis_pid else [])
        finished = _wait_all(workers, timeout)
        ended_wall, wall = time.time(), time.monotonic() - started  # a cut crawl: the timeout, not the stopping
        if not finished:
            _terminate(workers)
        peak = sampler.stop()
        cpu = _children_cpu() - cpu0
        redis_cpu = _info_cpu(redis) - redis_cpu0
        delta = command_delta(stats, command_stats(redis.connection))
        commands = sum(delta.values())
        breakdown = {kind: sampler.cpu_by_root(w.pid) for kind, w in zip(("download", "parse"), workers, strict=True)}
        errors = [log_path.read_text(errors="replace")[-1500:] for log_path in logs]
        if os.environ.get("BENCH_FLEET_LOGS"):  # a directory to keep the workers' whole logs in
            kept = Path(os.environ["BENCH_FLEET_LOGS"])
            kept.mkdir(parents=True, exist_ok=True)
            for log_path in logs:
                shutil.copy(log_path, kept / log_path.name)
        served = server.stop("crawler")
        if tally is not None:
            requests = len(served["log"])
            print("\n".join(report(tally.stop(), requests, Path(os.environ[MONITOR_ENV]))), file=sys.stderr)
    except BaseException:
        server.process.kill()
        raise
    figures = arrival_figures(
        served["log"], config, started_wall, ended_wall, config.requests_per_site, cut=not finished
    )
    items, outcomes = _stored(settings.database_url, names)
    figures.update(
        {
            "name": "crawler",
            "command": " / ".join(shlex.join(c[c.index("worker") :]) for c in worker_commands(config_file, True)),
            "finished": finished,
            "wall": wall,
            "cpu": cpu + redis_cpu,
            "workers_cpu": cpu,
            "redis_cpu": redis_cpu,
            "pss_mib": peak,
            "pss_by_role": sampler.by_role(),
            "items": items,
            "outcomes": outcomes,
            "server_cpu": served["cpu"],
            "server_wall": served["wall"],
            "seed_wall": seed_wall,
            "seed_cpu": seed_cpu,
            "redis_commands": commands,
            "top_commands": sorted(delta.items(), key=lambda kv: -kv[1])[:12],
            "breakdown": breakdown,
            "stderr": [e.strip().splitlines()[-3:] for e in errors if e.strip()],
        }
    )
    if not finished:  # work is left: idle workers would go on crawling it
        figures["idle_note"] = "the crawl was cut short: its work forgotten (crawler.ops.reset.reset_site) first"
        for name in names:
            reset_site(redis.connection, name)
        redis.connection.delete(keys.pages())
    figures.update(measure_idle(redis, config_file, workdir, idle))
    return figures


def _info_cpu(redis: BenchRedis) -> float:
    info = redis.connection.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _stored(database_url: str, sites: list[str]) -> tuple[int, dict[str, int]]:
    """Items stored over all ``sites``, and their fetch outcomes summed."""
    from crawler.store.database import Store

    store = Store(database_url)
    try:
        outcomes: dict[str, int] = defaultdict(int)
        items = 0
        for site in sites:
            items += store.count_items(site)
            for outcome, n in store.outcome_counts(site).items():
                outcomes[outcome] += n
        return items, dict(outcomes)
    finally:
        store.close()


def measure_idle(redis: BenchRedis, config_file: Path, workdir: Path, window: float) -> dict[str, Any]:
    """The worker commands without --burst on a drained crawl: Redis commands/s and CPU % per process."""
    import psutil

    workers = [
        subprocess.Popen(
            args, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        for args in worker_commands(config_file, burst=False)
    ]
    try:
        time.sleep(IDLE_SETTLE)
        processes: list[Any] = []
        for worker in workers:
            root = psutil.Process(worker.pid)
            processes += [root, *root.children(recursive=True)]
        before = {p.pid: sum(p.cpu_times()[:2]) for p in processes}
        stats, started = command_stats(redis.connection), time.monotonic()
        time.sleep(window)
        commands = sum(command_delta(stats, command_stats(redis.connection)).values())
        seconds = time.monotonic() - started
        cpu = {p.pid: (sum(p.cpu_times()[:2]) - before[p.pid]) / seconds * 100 for p in processes if p.is_running()}
        alive = all(w.poll() is None for w in workers)
    finally:
        _terminate(workers)
    return {
        "idle_commands_per_s": commands / seconds,
        "idle_cpu_percent": sorted(cpu.values(), reverse=True),
        "idle_processes": len(cpu),
        "idle_alive": alive,
    }


# -- Scrapy ---------------------------------------------------------------------------------


#: ``scrapy_spider`` with ``filter_hosts``: the links a callback follows, those to the page's own host only.
FOLLOW_OWN_HOST = '''
    def follow_own(self, response, **kwargs):
        """response.follow_all(**kwargs), links to other hosts left out (no allowed_domains regex)."""
        host = urlsplit(response.url).hostname
        return (r for r in response.follow_all(**kwargs) if urlsplit(r.url).hostname == host)
'''


def scrapy_spider(filter_hosts: bool = False) -> str:
    """``bench throughput``'s Scrapy spider, for many sites: the start URLs one a line in the file
    ``start`` names (10,000 of them are more than one command-line argument may hold), no
    ``allowed_domains``; with ``filter_hosts`` each callback drops links to other hosts itself
    (``FOLLOW_OWN_HOST``), the cost the issue prefers to OffsiteMiddleware's regex of 10,000 domains."""
    edits = [
        ('    allowed_domains = ["127.0.0.1"]\n', ""),
        ("self.start_urls = [start]", "self.start_urls = open(start, encoding='ascii').read().split()"),
    ]
    if filter_hosts:
        edits += [
            ("import scrapy\n", "from urllib.parse import urlsplit\n\nimport scrapy\n"),
            ("\n    def parse(self, response):", FOLLOW_OWN_HOST + "\n    def parse(self, response):"),
            ("response.follow_all(css=", "self.follow_own(response, css="),
        ]
    source = SCRAPY_SPIDER
    for old, new in edits:
        if old not in source:
            raise RuntimeError(f"bench.throughput's Scrapy spider changed: {old.strip()!r} not found")
        source = source.replace(old, new)
    return source


def no_jitter(python: str) -> str:
    """The setting that makes Scrapy wait exactly DOWNLOAD_DELAY: ``DOWNLOAD_DELAY_JITTER=0``, else
    ``RANDOMIZE_DOWNLOAD_DELAY=False`` (by default each delay is drawn from 0.5-1.5 x)."""
    probe = subprocess.run(
        [python, "-c", "from scrapy.settings import default_settings as d; print(hasattr(d, 'DOWNLOAD_DELAY_JITTER'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return "DOWNLOAD_DELAY_JITTER=0" if probe.stdout.strip() == "True" else "RANDOMIZE_DOWNLOAD_DELAY=False"


def run_scrapy(python: str, config: FleetConfig, workdir: Path, timeout: float) -> dict[str, Any]:
    server = FleetServer(config, workdir)
    try:
        spider = workdir / "fleet_spider.py"
        spider.write_text(scrapy_spider(config.filter_hosts))
        starts = workdir / "start_urls.txt"
        starts.write_text("".join(server.url(i) + "\n" for i in range(config.sites)))
        feed = workdir / "items.jsonl"
        concurrency = 2 * config.sites
        args = [
            python,
            "-m",
            "scrapy",
            "runspider",
            str(spider),
            "-a",
            f"start={starts}",
            "-O",
            str(feed),
            *("-s", "ROBOTSTXT_OBEY=True"),
            *("-s", "LOG_LEVEL=WARNING"),
            *("-s", f"CONCURRENT_REQUESTS={concurrency}"),
            *("-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1"),
            *("-s", f"DOWNLOAD_DELAY={config.interval}"),
            *("-s", f"{no_jitter(python)}"),
            *("-s", "TELNETCONSOLE_ENABLED=False"),
            *("-s", "AUTOTHROTTLE_ENABLED=False"),
        ]
        cpu0, started_wall, started = _children_cpu(), time.time(), time.monotonic()
        process = subprocess.Popen(
            args, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        sampler = PssSampler([process.pid], [])
        finished = _wait_all([process], timeout)
        ended_wall, wall = time.time(), time.monotonic() - started  # a cut crawl: the timeout, not the stopping
        if not finished:
            _terminate([process])
        peak = sampler.stop()
        cpu = _children_cpu() - cpu0
        stderr = process.stderr.read() if process.stderr else ""
        served = server.stop("scrapy")
    except BaseException:
        server.process.kill()
        raise
    lines = feed.read_text().splitlines() if feed.exists() else []
    items = {(urlsplit(row["url"]).hostname, row["sku"]) for row in map(json.loads, filter(str.strip, lines))}
    figures = arrival_figures(
        served["log"], config, started_wall, ended_wall, config.scrapy_requests_per_site, cut=not finished
    )
    figures.update(
        {
            "name": "Scrapy",
            "command": f"scrapy runspider, CONCURRENT_REQUESTS={concurrency}",
            "finished": finished and process.returncode == 0,
            "wall": wall,
            "cpu": cpu,
            "pss_mib": peak,
            "items": len(items),
            "server_cpu": served["cpu"],
            "server_wall": served["wall"],
            "stderr": [stderr.strip().splitlines()[-3:]] if stderr.strip() else [],
        }
    )
    return figures


# -- the benchmark ----------------------------------------------------------------------------


def _timeout(config: FleetConfig) -> float:
    given = os.environ.get(TIMEOUT_ENV)
    return float(given) if given else max(120.0, 4 * config.ideal, config.requests / TIMEOUT_RATE)


def run(redis: BenchRedis, quick: bool = False, config: str | None = None) -> BenchResult:
    compile_crawler()  # as installed: Scrapy runs from the bytecode pip wrote
    chosen = CONFIGS[config or ("quick" if quick else "200")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1,000 sites and up: more sockets than 1,024
    if hard != resource.RLIM_INFINITY and hard < chosen.sites + 1024:  # a connection a site, and the rest
        raise RuntimeError(f"{chosen.sites} sites need more file descriptors than RLIMIT_NOFILE's {hard}")
    timeout = _timeout(chosen)
    rounds = int(os.environ.get(ROUNDS_ENV, "1"))
    idle = QUICK_IDLE_WINDOW if chosen.label == "quick" else IDLE_WINDOW
    python = scrapy_python() if os.environ.get(SCRAPY_ENV, "1") != "0" else None
    result = BenchResult(
        "fleet",
        {
            "config": chosen.label,
            "sites": chosen.sites,
            "products per site": chosen.products,
            "requests per site": f"{chosen.requests_per_site} (Scrapy {chosen.scrapy_requests_per_site})",
            "interval s": chosen.interval,
            "budget req/s": chosen.budget,
            "ideal wall s": chosen.ideal,
            "latency s": f"uniform {LATENCY[0]}-{LATENCY[1]} per site + 0-{JITTER} per response",
            "ours": "crawler worker download --burst " + " ".join(download_args()) + " / crawler worker parse --burst",
            "scrapy": f"DOWNLOAD_DELAY={chosen.interval}, {no_jitter(python) if python else '-'}, "
            f"CONCURRENT_REQUESTS={2 * chosen.sites}, CONCURRENT_REQUESTS_PER_DOMAIN=1, "
            + ("links filtered by host in the callbacks" if chosen.filter_hosts else "no domain filter"),
            "timeout s": timeout,
            "scrapy python": python or "not found",
        },
    )
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for n in range(1, rounds + 1):
            order = ["ours", "scrapy"] if n % 2 else ["scrapy", "ours"]
            for which in order:
                workdir = Path(tmp) / f"{which}{n}"
                workdir.mkdir()
                if which == "ours":
                    figures = run_ours(redis, chosen, workdir, timeout, idle)
                    redis.reset()
                elif python is not None:
                    figures = run_scrapy(python, chosen, workdir, timeout)
                else:
                    continue
                figures["round"] = n
                figures["load"] = os.getloadavg()[0]
                runs.append(figures)
                print(
                    f"  fleet {chosen.label} round {n}: {figures['name']} {figures['requests']} requests in "
                    f"{figures['wall']:.1f} s{'' if figures['finished'] else ' (TIMED OUT)'}, utilization "
                    f"{figures['utilization']:.3f}, "
                    f"{figures['cpu'] * 1000 / max(1, figures['requests']):.2f} CPU ms/request",
                    flush=True,
                )
    if python is None:
        result.notes.append("Scrapy not found: set BENCH_SCRAPY_PYTHON (see bench/requirements.txt)")
    expected = chosen.sites * chosen.products
    result.table(
        "per crawler and round",
        [
            "round",
            "crawler",
            "finished",
            "requests",
            "sites reached / complete",
            "wall s",
            "req/s (wall)",
            "utilization",
            "worst site / 5th percentile site",
            "req / (wall x budget)",
            "ramp mean s",
            "ramp max s",
            "mean gap - interval ms",
            "CPU s",
            "CPU ms/request",
            "peak PSS MiB",
            "violations",
            f"of which > {CLEAR_BY * 1000:g} ms early",
            "smallest gap ms",
            "items",
            "server CPU s",
        ],
        [
            [
                r["round"],
                r["name"],
                r["finished"],
                r["requests"],
                f"{r['sites_reached']} / {r['sites_complete']}",
                r["wall"],
                r["requests"] / r["wall"],
                r["utilization"],
                f"{_fraction(r['worst_site_utilization'])} / {_fraction(r['p5_site_utilization'])}",
                r["requests"] / (r["wall"] * chosen.budget),
                r["ramp_mean"],
                r["ramp_max"],
                r["excess_gap_ms"],
                r["cpu"],
                r["cpu"] * 1000 / max(1, r["requests"]),
                r["pss_mib"],
                r["violations"],
                r["violations_by_much"],
                None if r["smallest_gap"] is None else r["smallest_gap"] * 1000,
                f"{r['items']} / {expected}",
                r["server_cpu"],
            ]
            for r in runs
        ],
    )
    ours_runs = [r for r in runs if r["name"] == "crawler"]
    theirs_runs = [r for r in runs if r["name"] == "Scrapy"]
    result.table(
        "ours: where the CPU and Redis go, seeding, idle",
        [
            "round",
            "workers CPU s",
            "of which (sampled) download launcher / processes, parse launcher / processes",
            "Redis CPU s",
            "Redis commands/request",
            "top commands /request",
            "seed wall s",
            "seed CPU s",
            "fetch outcomes",
            "idle Redis commands/s",
            "idle CPU % per process",
            "peak PSS MiB by process",
        ],
        [
            [
                r["round"],
                r["workers_cpu"],
                ", ".join(
                    f"{kind} {own:.1f} / {children:.1f} ({count})"
                    for kind, (own, children, count) in r["breakdown"].items()
                ),
                r["redis_cpu"],
                r["redis_commands"] / max(1, r["requests"]),
                ", ".join(f"{name} {n / max(1, r['requests']):.1f}" for name, n in r["top_commands"]),
                r["seed_wall"],
                r["seed_cpu"],
                ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items())),
                r["idle_commands_per_s"],
                ", ".join(f"{c:.2f}" for c in r["idle_cpu_percent"]),
                ", ".join(f"{role} ×{n} {mib:.0f}" for role, n, mib in r["pss_by_role"]),
            ]
            for r in ours_runs
        ],
    )
    for r in runs:
        if r.get("idle_note"):
            result.notes.append(f"{r['name']} round {r['round']} idle: {r['idle_note']}")
        for tail in r["stderr"]:
            result.notes.append(f"{r['name']} round {r['round']} stderr: " + " | ".join(tail))
        result.notes.append(
            f"{r['name']} round {r['round']}: site server CPU {r['server_cpu']:.1f} s over {r['server_wall']:.0f} s "
            f"({r['server_cpu'] / r['server_wall'] * 100:.0f}% of a core); 1-minute load average after it "
            f"{r['load']:.2f} on {os.cpu_count()} cores (the machine is shared)"
        )
    if not ours_runs:
        return result
    ours = ours_runs[0]
    theirs = theirs_runs[0] if theirs_runs else None
    per_request = ours["cpu"] / max(1, ours["requests"])
    if theirs is not None:
        theirs_per_request = theirs["cpu"] / max(1, theirs["requests"])
        result.checks.append(
            Check(
                "wall time, ours vs Scrapy",
                f"{ours['wall']:.1f} s{'' if ours['finished'] else ' (timed out)'} vs {theirs['wall']:.1f} s",
                "<= Scrapy's",
                ours["finished"] and ours["wall"] <= theirs["wall"],
            )
        )
    result.checks.append(
        Check(
            "utilization of the budget while sites are active",
            f"{ours['utilization']:.3f}" + (f" (Scrapy {theirs['utilization']:.3f})" if theirs else ""),
            f">= {TARGET_UTILIZATION}",
            ours["utilization"] >= TARGET_UTILIZATION,
        )
    )
    if theirs is not None:
        result.checks.append(
            Check(
                "CPU ms per request (ours with Redis) vs Scrapy",
                f"{per_request * 1000:.2f} vs {theirs_per_request * 1000:.2f}",
                "<= Scrapy's",
                per_request <= theirs_per_request,
            )
        )
        result.checks.append(
            Check(
                "peak PSS, ours (with Redis) vs Scrapy",
                f"{ours['pss_mib']:.0f} vs {theirs['pss_mib']:.0f} MiB",
                f"<= {TARGET_PSS_RATIO:g} x Scrapy's",
                ours["pss_mib"] <= TARGET_PSS_RATIO * theirs["pss_mib"],
            )
        )
    result.checks.append(
        Check(
            "requests closer than the interval",
            f"{ours['violations']}" + (f" (Scrapy {theirs['violations']})" if theirs else ""),
            "0",
            ours["violations"] == 0 and ours["requests"] > 0,
        )
    )
    result.checks.append(
        Check(
            "items stored",
            f"{ours['items']} of {expected}" + (f" (Scrapy {theirs['items']})" if theirs else ""),
            f"{expected}",
            ours["items"] == expected,
        )
    )
    worst = max(ours["idle_cpu_percent"], default=0.0)
    result.checks.append(
        Check(
            "idle: CPU per worker process",
            f"max {worst:.2f}% of a core over {ours['idle_processes']} processes, "
            f"{ours['idle_commands_per_s']:.1f} Redis commands/s",
            f"< {TARGET_IDLE_CPU:g}%",
            worst < TARGET_IDLE_CPU and ours["idle_alive"],
        )
    )
    result.seconds = time.monotonic() - started
    return result
