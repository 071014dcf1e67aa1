"""Shared fixtures: a private Redis server per session, a clean database per test.

Redis: ``CRAWLER_TEST_REDIS_URL`` if given, else a private embedded redis-server on
a unix socket, so the suite never touches a Redis it does not own by accident.
PostgreSQL: ``CRAWLER_TEST_POSTGRES_URL``; without it PostgreSQL tests skip, unless
``CRAWLER_REQUIRE_POSTGRES=1`` (set by ``.ci/run``), which makes them fail instead.

Tiers: a test that uses a server fixture (``SERVER_FIXTURES``, directly or through another
fixture) or is marked ``integration`` is an integration test; one marked ``slow`` needs no
server but more time than a unit test; every other test is marked ``unit`` (``pytest -m
unit``, the fast loop). A unit test may open no socket, start no
process and spend at most ``UNIT_CPU_SECONDS`` of CPU and ``UNIT_WALL_SECONDS`` of wall
clock; one that does fails, in every run, with what to do instead.
"""

from __future__ import annotations

import multiprocessing.process
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from crawling import postgres_server_url
from redis import Redis

from crawler.coord.connection import EmbeddedRedis, connect
from crawler.demo import ShopSite
from crawler.settings import Settings, load_settings
from crawler.work.runtime import Runtime

#: Fixtures that start a server or a process, or reach one: a test that uses any of them is
#: an integration test: this file's, then test modules' (a fixture of that name anywhere counts).
SERVER_FIXTURES = frozenset(
    {"redis_url", "postgres_url", "shop"}
    | {"app", "api", "tree", "browser", "busy_port", "file_site", "locked_redis_url", "net", "pages"}
    | {"password_redis", "pg_url", "pg_schema", "proxy", "quiet_shop", "redirector", "restartable_redis"}
    | {"server", "site"}
)

#: A unit test's budget: CPU of the test's own thread (load does not inflate it), and wall
#: clock, which catches a test that sleeps or waits (generous, so a busy machine passes).
UNIT_CPU_SECONDS = 1.0
UNIT_WALL_SECONDS = 5.0
#: The clock the budget is read on, held here: a test may patch ``time.monotonic`` (a fake clock).
_wall_clock = time.perf_counter


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads ``-n``
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``-m unit`` runs in this process unless the command line says ``-n``: starting and
    collecting in the processes of ``addopts`` (pyproject.toml) takes longer than the tier."""
    given = config.invocation_params.args
    if config.option.markexpr.strip() == "unit" and not any(
        str(arg).startswith(("-n", "--numprocesses", "--dist")) for arg in given
    ):
        config.option.numprocesses = 0


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects on the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("integration") is None and (
            SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            item.add_marker("integration")
        if item.get_closest_marker("integration") is None and item.get_closest_marker("slow") is None:
            item.add_marker("unit")


class UnitTierViolation(RuntimeError):
    """A unit test tried to open a socket or start a process."""


@contextmanager
def _unit_guard(item: pytest.Item) -> Iterator[list[str]]:
    """Within: sockets, processes and forks refused; yields what was tried (code under test may
    catch the error, the test fails all the same)."""
    tried: list[str] = []

    def refuse(what: str) -> Callable[..., None]:
        def refused(*args: object, **kwargs: object) -> None:
            tried.append(what)
            raise UnitTierViolation(f"a unit test may not {what}")

        return refused

    with pytest.MonkeyPatch.context() as patch:
        for name in ("connect", "connect_ex", "bind"):
            patch.setattr(socket.socket, name, refuse(f"{name} a socket"))
        patch.setattr(subprocess.Popen, "_execute_child", refuse("start a process"))
        patch.setattr(os, "fork", refuse("fork"))
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse("start a process"))
        yield tried


def _fail_if_tried(item: pytest.Item, tried: list[str]) -> None:
    if tried:
        pytest.fail(
            f"{item.nodeid} is in the unit tier (it uses no server fixture) but tried to "
            f"{', '.join(sorted(set(tried)))}: use a server fixture ({', '.join(sorted(SERVER_FIXTURES))}) "
            "or mark it @pytest.mark.integration",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("unit") is None:
        return (yield)
    with _unit_guard(item) as tried:
        try:
            return (yield)
        finally:
            _fail_if_tried(item, tried)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("unit") is None:
        return (yield)
    wall, cpu = _wall_clock(), time.thread_time()
    with _unit_guard(item) as tried:
        try:
            result = yield
        finally:
            _fail_if_tried(item, tried)
    wall, cpu = _wall_clock() - wall, time.thread_time() - cpu
    if cpu > UNIT_CPU_SECONDS or wall > UNIT_WALL_SECONDS:
        pytest.fail(
            f"{item.nodeid} is in the unit tier but took {cpu:.1f} s of CPU, {wall:.1f} s in all "
            f"(at most {UNIT_CPU_SECONDS:.0f} and {UNIT_WALL_SECONDS:.0f}): make it smaller, "
            "or mark it @pytest.mark.slow",
            pytrace=False,
        )
    return result


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a Redis server this test session owns."""
    given = os.environ.get("CRAWLER_TEST_REDIS_URL")
    if given:
        yield given
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_conn(redis_url: str) -> Iterator[Redis]:
    """A client on an emptied database."""
    connection = connect(redis_url)
    connection.flushdb()
    yield connection
    connection.close()


#: Commands that run Lua: fakeredis runs scripts (lupa) but not with a server's atomicity and
#: timing, so a test of a script uses a real Redis (STYLE.md, Tests).
LUA_COMMANDS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "SCRIPT", "FCALL", "FCALL_RO", "FUNCTION"})


def _refuse_lua(command: object) -> None:
    name = command.decode() if isinstance(command, bytes) else str(command)
    if name.upper() in LUA_COMMANDS:
        raise AssertionError(f"{name} on fake_redis: a test of a Lua script uses redis_conn (a real server)")


class NoLuaFakeRedis(fakeredis.FakeRedis):
    """fakeredis refusing Lua, on its own client and on its pipelines."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        _refuse_lua(args[0])
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        queue = pipe.execute_command

        def execute_command(*args: Any, **options: Any) -> Any:
            _refuse_lua(args[0])
            return queue(*args, **options)

        pipe.execute_command = execute_command
        return pipe


@pytest.fixture
def fake_redis() -> Iterator[Redis]:
    """An empty in-memory Redis of its own (the test server's version), answering bytes as
    ``connect``'s client does: for storage logic that needs no Lua and no server-side timing."""
    connection = NoLuaFakeRedis(server=fakeredis.FakeServer(version=(6, 2)), decode_responses=False)
    yield connection
    connection.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of an empty PostgreSQL schema of this test's own, dropped after (skips, or fails in
    CI, when no server is given): tests in parallel processes (pytest-xdist) share one database."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    server = postgres_server_url()
    schema = f"crawler_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(server)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield (
            make_url(server)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        try:
            with admin.begin() as conn:  # a session left in a transaction would block this forever
                conn.execute(text("SET LOCAL lock_timeout = '60s'"))
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        except Exception as exc:
            with admin.connect() as conn:
                holders = conn.execute(
                    text("SELECT pid, state, query FROM pg_stat_activity WHERE pid <> pg_backend_pid()")
                ).all()
            raise AssertionError(f"schema {schema} could not be dropped ({exc}); sessions: {holders}") from exc
        finally:
            admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'crawl.db'}"


@pytest.fixture
def settings(sqlite_url: str, tmp_path: Path) -> Settings:
    """Settings for a fast test crawl: quick retries, an empty sites directory."""
    (tmp_path / "sites").mkdir(exist_ok=True)
    return load_settings(
        database_url=sqlite_url, backoff=0.2, sites_dir=str(tmp_path / "sites"), state_dir=str(tmp_path / "state")
    )


@pytest.fixture
def runtime(redis_conn: Redis, settings: Settings) -> Iterator[Runtime]:
    """The runtime a worker process builds, for jobs and workers run in this one."""
    rt = Runtime(redis_conn, settings)
    yield rt
    rt.close()


@pytest.fixture
def shop() -> Iterator[ShopSite]:
    """A small demo shop on loopback (60 products, with its faults)."""
    with ShopSite(products=60) as site:
        yield site
