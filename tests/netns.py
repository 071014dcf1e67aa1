"""Network namespaces as separate hosts for tests: a server namespace, host namespaces
linked to it by veth pairs, and a one-way latency per host and path.

Layout (host N counts from 1, service k from 0)::

    server namespace: the services listen on every address of the namespace
        lo            each service's address (10.231.0.1, 10.231.0.2, ...)
        hN-k   ──── veth ────  host namespace N
        10.231.N.(4k+1)        link named after service k: 10.231.N.(4k+2)

Host N reaches service k at the service's address and port, over its own link k, with
the host's latency for that service added in each direction:

- ``netem``: ``tc qdisc add ... netem delay D`` on both ends of the link, and a route
  to the service address through it;
- ``relay``, for kernels without ``sch_netem``: the service address is on the host's
  own loopback, where a relay process (this file run as a script) accepts connections
  and forwards every chunk D later, in order, in each direction, to the service's
  address on the server side of the link. Unlike netem it delays the data only, not
  TCP's handshake and acknowledgements; for small requests and answers the two agree.

A server outside the namespaces (e.g. a database of the machine) becomes a service
with ``Topology.bridge``: a relay in the caller's own namespace listens in the server
namespace and forwards each connection to it, so hosts reach it over their links like
any other service (and nothing else outside).

The namespaces route nowhere else, so nothing in them can reach the internet. Names
carry the test process's id; ``Topology.close`` stops every process it started (in
them, and bridges), deletes the namespaces (their veths and qdiscs go with them), and
checks that they are gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")

#: ``setns`` flag for a network namespace (linux/sched.h).
CLONE_NEWNET = 0x40000000
#: Environment variable that forces a latency method: ``netem`` or ``relay`` (default: netem if the kernel has it).
METHOD_VARIABLE = "CRAWLER_TEST_LATENCY"
#: Environment variable that turns "namespaces cannot be made" from a skip into a failure.
REQUIRE_VARIABLE = "CRAWLER_REQUIRE_NETNS"
#: Seconds a relay process may take to start listening.
RELAY_START = 15.0


@dataclass(frozen=True)
class Service:
    """Something hosts reach over their links: its address (the same from every host) and port."""

    name: str
    address: str
    port: int


@dataclass(frozen=True)
class HostSpec:
    """A host: its name, its one-way latency (ms) to each service, and how many workers it runs."""

    name: str
    latency_ms: Mapping[str, float]
    threads: int = 1


@dataclass
class Host:
    """A host as built: its namespace, hostname, and the address it is seen from on each link."""

    spec: HostSpec
    number: int
    netns: str
    hostname: str
    addresses: dict[str, str] = field(default_factory=dict)  # service name -> this host's link address
    #: Relay method only: each chunk its relay sent on towards a service, as (the relay's port
    #: on the link, when it was sent, time.time(); how much later than its delay, s).
    relay_sends: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    def relay_lateness(self, port: int, arrival: float) -> float:
        """How late (s) the relay sent the last chunk from ``port`` sent by ``arrival`` (time.time()); 0 if none.

        The relay is a process, so it can be later than its delay (scheduling); netem is not.
        """
        sent = [late for relay_port, at, late in self.relay_sends if relay_port == port and at <= arrival]
        return sent[-1] if sent else 0.0


def unavailable_reason() -> str | None:
    """Why network namespaces with veth links cannot be made here, or None if they can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (platform {sys.platform})"
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found on PATH (iproute2 / util-linux needed for network namespaces)"
    probe = f"crwlprobe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` failed: {_stderr(exc)}"
    try:
        _ip("-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
    except subprocess.CalledProcessError as exc:
        return f"cannot make a veth pair in a namespace: {_stderr(exc)}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def netem_available(netns: str) -> bool:
    """Whether the kernel has sch_netem (tried on ``netns``'s loopback, then removed)."""
    added = subprocess.run(
        ["tc", "-n", netns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], capture_output=True
    )
    if added.returncode != 0:
        return False
    subprocess.run(["tc", "-n", netns, "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    return True


class Topology:
    """A server namespace and one namespace per host, linked with per-path latency.

    Build with ``build()`` (or use ``topology()``); always ``close()``, which also undoes
    a build that failed half-way.
    """

    def __init__(self, services: Sequence[Service], hosts: Sequence[HostSpec], method: str | None = None):
        self.services = list(services)
        self.specs = list(hosts)
        self.prefix = f"crwlmh-{os.getpid()}"
        self.server_ns = f"{self.prefix}-srv"
        self.hosts: list[Host] = []
        self.method = method or ""
        self._namespaces: list[str] = []
        self._processes: list[subprocess.Popen[bytes]] = []

    def build(self) -> Topology:
        """Make the namespaces, links, routes and latency; returns self."""
        self._add_netns(self.server_ns)
        _ip("-n", self.server_ns, "link", "set", "lo", "up")
        for service in self.services:
            _ip("-n", self.server_ns, "addr", "add", f"{service.address}/32", "dev", "lo")
        if not self.method:
            self.method = "netem" if netem_available(self.server_ns) else "relay"
        if self.method not in ("netem", "relay"):
            raise ValueError(f"latency method must be netem or relay, got {self.method!r}")
        if self.method == "netem" and not netem_available(self.server_ns):
            raise RuntimeError("netem was asked for but this kernel has no sch_netem")
        for number, spec in enumerate(self.specs, start=1):
            self.hosts.append(self._add_host(number, spec))
        return self

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)

    def _add_host(self, number: int, spec: HostSpec) -> Host:
        host = Host(spec, number, f"{self.prefix}-{spec.name}", f"crwl-{spec.name}")
        self._add_netns(host.netns)
        _ip("-n", host.netns, "link", "set", "lo", "up")
        routes = []
        for k, service in enumerate(self.services):
            inside, outside = service.name[:15], f"{spec.name}-{k}"[:15]
            server_side, host_side = f"10.231.{number}.{4 * k + 1}", f"10.231.{number}.{4 * k + 2}"
            _ip(
                "-n",
                host.netns,
                "link",
                "add",
                inside,
                "type",
                "veth",
                "peer",
                "name",
                outside,
                "netns",
                self.server_ns,
            )
            _ip("-n", host.netns, "addr", "add", f"{host_side}/30", "dev", inside)
            _ip("-n", self.server_ns, "addr", "add", f"{server_side}/30", "dev", outside)
            _ip("-n", host.netns, "link", "set", inside, "up")
            _ip("-n", self.server_ns, "link", "set", outside, "up")
            host.addresses[service.name] = host_side
            delay = float(spec.latency_ms.get(service.name, 0.0))
            if self.method == "netem":
                _ip("-n", host.netns, "route", "add", f"{service.address}/32", "via", server_side, "dev", inside)
                for netns, device in ((host.netns, inside), (self.server_ns, outside)):
                    if delay > 0:
                        _run(
                            "tc",
                            "-n",
                            netns,
                            "qdisc",
                            "add",
                            "dev",
                            device,
                            "root",
                            "netem",
                            "delay",
                            f"{delay:g}ms",
                            "limit",
                            "10000",
                        )
            else:
                _ip("-n", host.netns, "addr", "add", f"{service.address}/32", "dev", "lo")
                routes.append(f"{service.address}:{service.port}={server_side}:{service.port}@{delay:g}")
        if routes:
            self._start_relay(host.name, host.netns, routes, sends=host.relay_sends)
        return host

    def bridge(self, service: Service, target: tuple[str, int]) -> subprocess.Popen[bytes]:
        """Make ``target``, a server reachable from the caller's namespace, the topology's ``service``.

        A relay process in the caller's namespace listens on the service's port on every
        address of the server namespace and forwards each connection to ``target``, adding
        no delay (the hosts' links add theirs). The service must be one the topology was
        built with. Returns the relay process: ``stop`` it, or ``close`` does.
        """
        if service not in self.services:
            raise ValueError(f"{service.name} is not a service of this topology")
        route = f"0.0.0.0:{service.port}={target[0]}:{target[1]}@0"
        return self._start_relay(f"bridge to {service.name}", None, [route], listen_netns=self.server_ns)

    def _start_relay(
        self,
        name: str,
        netns: str | None,
        routes: list[str],
        listen_netns: str | None = None,
        sends: list[tuple[int, float, float]] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a relay process serving ``routes``; ``sends``: filled with what it reports it sent on."""
        options = ["--listen-netns", listen_netns] if listen_netns else []
        if sends is not None:
            options.append("--report-sends")
        process = self.run(
            netns, [sys.executable, str(Path(__file__).resolve()), "relay", *options, *routes], stdout=subprocess.PIPE
        )
        assert process.stdout is not None
        line = _read_line(process.stdout, RELAY_START)
        if line.strip() != b"ready":
            self.stop(process)
            raise RuntimeError(f"the relay of {name} did not start: {line!r}")
        # Keep reading whatever else it says, so a full pipe can never stall it.
        threading.Thread(
            target=_read_sends, args=(process.stdout, sends), name=f"relay-{name}-out", daemon=True
        ).start()
        return process

    def run(
        self,
        netns: str | None,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        hostname: str | None = None,
        stdout: int | IO[Any] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``netns`` (None: the caller's own); given a ``hostname``, as a host's init process.

        A host's process gets its own hostname (UTS namespace) and process ids (PID
        namespace, of which it is init): when it exits, the kernel ends and reaps whatever
        it left behind (e.g. multiprocessing's resource tracker), so no orphan outlives it.
        Every process leads a new session, so ``stop`` reaches it and anything it spawned.
        """
        command = ["ip", "netns", "exec", netns] if netns is not None else []
        if hostname:
            command += [
                "unshare",
                "--uts",
                "--pid",
                "--fork",
                "--kill-child",
                "sh",
                "-c",
                'hostname "$0" && exec "$@"',
                hostname,
            ]
        process = subprocess.Popen(
            [*command, *argv],
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._processes.append(process)
        return process

    def in_netns(self, netns: str, fn: Callable[[], T]) -> T:
        """``fn()`` run in a thread that has entered ``netns``: the sockets it opens live there."""
        return in_netns(netns, fn)

    def round_trip_ms(self, host: Host, service: Service, request: bytes, tries: int = 5) -> float:
        """Fastest of ``tries`` request/answer exchanges with ``service`` from ``host``, in ms.

        One connection (its set-up not counted); the service must answer each request.
        """

        def exchange() -> float:
            with socket.create_connection((service.address, service.port), timeout=10) as conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                best = float("inf")
                for _ in range(tries):
                    began = time.perf_counter()
                    conn.sendall(request)
                    if not conn.recv(1 << 16):
                        raise ConnectionError(f"{service.name} closed the connection")
                    best = min(best, time.perf_counter() - began)
                return best * 1000

        return self.in_netns(host.netns, exchange)

    def host_of(self, address: str) -> Host | None:
        """The host whose link has ``address``."""
        return next((h for h in self.hosts if address in h.addresses.values()), None)

    def stop(self, process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
        """SIGTERM ``process`` and its process group, then SIGKILL them if still there after ``timeout``.

        The group is signalled only while its leader is not yet reaped, so its id cannot
        belong to anyone else. A host's processes need no more: they die with their PID
        namespace (see ``run``); ``close`` sweeps the namespaces for anything else.
        """
        if process.poll() is not None:
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()

    def close(self) -> None:
        """Stop every process started here, delete the namespaces, and check they are gone."""
        for process in self._processes:
            self.stop(process)
        for netns in self._namespaces:
            # Anything still inside one of our namespaces was started by us (e.g. a worker's child).
            listed = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
            for pid in listed.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        for netns in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        remaining = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        left = [ns for ns in self._namespaces if any(line.split()[:1] == [ns] for line in remaining.splitlines())]
        self._namespaces.clear()
        if left:
            raise RuntimeError(f"network namespaces left behind: {left}")


def in_netns(netns: str, fn: Callable[[], T]) -> T:
    """``fn()`` run in a thread that has entered ``netns``: the sockets it opens live there."""
    result: list[T] = []
    errors: list[BaseException] = []

    def enter_and_call() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if _libc().setns(fd, CLONE_NEWNET) != 0:  # this thread only
                    raise OSError(ctypes.get_errno(), f"setns into {netns} failed")
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=enter_and_call, name=f"in-{netns}")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


@contextlib.contextmanager
def topology(services: Sequence[Service], hosts: Sequence[HostSpec]) -> Iterator[Topology]:
    """A built ``Topology`` (method from ``CRAWLER_TEST_LATENCY``, else netem if available), closed after."""
    built = Topology(services, hosts, os.environ.get(METHOD_VARIABLE) or None)
    try:
        yield built.build()
    finally:
        built.close()


@contextlib.contextmanager
def echo_server(topology: Topology, netns: str, port: int) -> Iterator[None]:
    """A TCP server on every address of ``netns`` that sends back what it receives."""
    listener = topology.in_netns(netns, lambda: socket.create_server(("0.0.0.0", port)))

    def echo(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()


def _ip(*args: str) -> None:
    _run("ip", *args)


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def _stderr(exc: subprocess.CalledProcessError) -> str:
    return (exc.stderr or "").strip() or f"exit status {exc.returncode}"


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _read_line(stream: IO[bytes], timeout: float) -> bytes:
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else b""


_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


# -- the delay relay (run as a script inside a host's namespace, or as a bridge) ------------------

#: How the relay reports a chunk it sent on towards the service: ``sent PORT AT LATE``.
SENT = b"sent"


def _read_sends(out: IO[bytes], sends: list[tuple[int, float, float]] | None) -> None:
    """Read a relay's output to its end; its ``sent`` lines go into ``sends`` (if given)."""
    for line in out:
        word, *fields = line.split()
        if sends is not None and word == SENT and len(fields) == 3:
            sends.append((int(fields[0]), float(fields[1]), float(fields[2])))


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def parse_route(text: str) -> tuple[tuple[str, int], tuple[str, int], float]:
    """``LISTEN_ADDR:PORT=TARGET_ADDR:PORT@DELAY_MS`` as (listen, target, delay in seconds)."""
    ends, _, delay = text.partition("@")
    listen, _, target = ends.partition("=")
    return _address(listen), _address(target), float(delay or 0) / 1000.0


async def _deliver(chunks: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter, report: bool) -> None:
    loop = asyncio.get_running_loop()
    port = writer.get_extra_info("sockname")[1] if report else 0
    while True:
        due, data = await chunks.get()
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        if not data:
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof():
                    writer.write_eof()
            return
        if report:  # stamped before the write: the receiver's stamp of these bytes comes after it
            sys.stdout.write(f"{SENT.decode()} {port} {time.time():.6f} {max(0.0, loop.time() - due):.6f}\n")
            sys.stdout.flush()
        writer.write(data)
        await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, report: bool = False) -> None:
    """Forward each chunk ``delay`` seconds after it was read, in order; end of stream likewise.

    ``report``: print a ``sent`` line (``SENT``) for each chunk as it is sent on.
    """
    loop = asyncio.get_running_loop()
    # One queue and one writer per direction: chunks leave in the order they came, each
    # held the same time (timers alone would not keep the order of equal deadlines).
    chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    delivery = asyncio.create_task(_deliver(chunks, writer, report))
    try:
        while data := await reader.read(1 << 16):
            chunks.put_nowait((loop.time() + delay, data))
    except OSError:
        pass
    chunks.put_nowait((loop.time() + delay, b""))
    await delivery


async def _relay_connection(
    target: tuple[str, int],
    delay: float,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    report: bool = False,
) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection(*target)
    except OSError:
        writer.close()
        return
    for end in (writer, up_writer):
        end.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(
        _pipe(reader, up_writer, delay, report), _pipe(up_reader, writer, delay), return_exceptions=True
    )
    for end in (writer, up_writer):
        end.close()


async def _serve(routes: list[str], listen_netns: str | None = None, report: bool = False) -> None:
    servers = []
    for route in routes:
        listen, target, delay = parse_route(route)

        async def handle(
            reader: asyncio.StreamReader,
            writer: asyncio.StreamWriter,
            target: tuple[str, int] = target,
            delay: float = delay,
        ) -> None:
            await _relay_connection(target, delay, reader, writer, report)

        if listen_netns:
            # Only the listening socket lives there; connections out leave from the relay's own namespace.
            listener = in_netns(listen_netns, functools.partial(socket.create_server, listen))
            servers.append(await asyncio.start_server(handle, sock=listener))
        else:
            servers.append(await asyncio.start_server(handle, *listen))
    print("ready", flush=True)
    await asyncio.Event().wait()  # until SIGTERM


def relay_main(argv: Sequence[str] | None = None) -> None:
    """``python netns.py relay ROUTE...``: serve each route until terminated."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["relay"])
    parser.add_argument("--listen-netns", metavar="NETNS", help="listen in this network namespace")
    parser.add_argument("--report-sends", action="store_true", help="print a line for each chunk sent on")
    parser.add_argument("routes", nargs="+", metavar="LISTEN_ADDR:PORT=TARGET_ADDR:PORT@DELAY_MS")
    args = parser.parse_args(argv)
    if os.geteuid() == 0:
        # The relay stands in for the kernel's qdisc: it must not wait behind the crawl's
        # processes. A real-time policy runs it as soon as it wakes (it only ever sleeps
        # or forwards: it cannot hog a core); where that is refused, a raised priority.
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            with contextlib.suppress(OSError):
                os.nice(-10)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.routes, args.listen_netns, args.report_sends))


if __name__ == "__main__":
    relay_main()
