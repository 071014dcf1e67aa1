"""No surprise Redis: which server a command uses is said, read-only commands never start one,
and the embedded server keeps its data under the state directory and is listed and stopped from the CLI.

"localhost" is pointed at an address where nothing listens (or at the session's own Redis),
so these tests never depend on, or touch, a Redis that happens to run on this machine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error
from redis import Redis

from crawler.cli import context as cli_module
from crawler.cli import redis_servers
from crawler.cli.app import cli
from crawler.coord import connection
from crawler.coord.connection import EmbeddedRedis

NOWHERE = "redis://127.0.0.1:1/0"

Invoke = Callable[..., Result]


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)


def point_localhost_at(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    for module in (connection, cli_module, redis_servers):
        monkeypatch.setattr(module, "LOCALHOST_URL", url)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "state"
    yield path
    EmbeddedRedis(path).shutdown()  # whatever a test left running


@pytest.fixture
def invoke(tmp_path: Path, state: Path, sqlite_url: str) -> Invoke:
    (tmp_path / "sites").mkdir()
    base = ["--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]

    def run(*args: str, redis_url: str | None = None) -> Result:
        env = {"CRAWLER_STATE_DIR": str(state), **({"REDIS_URL": redis_url} if redis_url else {})}
        return CliRunner().invoke(cli, [*base, *args], env=env)

    return run


def queued(result: Result) -> int:
    assert result.exit_code == 0, result.output
    (site,) = json.loads(result.stdout)["sites"]
    return int(site["queued"])


@pytest.mark.integration
def test_a_read_only_command_on_a_fresh_machine_starts_no_server(
    invoke: Invoke, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_localhost_at(monkeypatch, NOWHERE)
    assert_one_line_error(
        invoke("status"),
        "no Redis to read",
        "none configured (REDIS_URL)",
        "`crawler crawl` or `crawler seed` starts one",
    )
    assert not EmbeddedRedis(state).running()
    assert not EmbeddedRedis(state).socket.exists()


@pytest.mark.integration
def test_the_embedded_server_keeps_the_crawl_across_a_stop_and_is_listed_and_stopped(
    invoke: Invoke, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_localhost_at(monkeypatch, NOWHERE)
    seeded = invoke("seed", "demo", "http://127.0.0.1:9/a", "http://127.0.0.1:9/b")
    assert seeded.exit_code == 0, seeded.output
    assert f"started the embedded Redis server in {state.resolve()}" in seeded.stderr
    server = EmbeddedRedis(state)
    assert server.running()
    assert queued(invoke("status", "demo", "--json")) == 2

    listed = invoke("redis", "list")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].startswith(f"* embedded    {server.url}  running, pid {server.pid()}, ")
    assert lines[0].endswith(f" in {server.data_file}")
    assert lines[1] == f"  localhost   {NOWHERE}  does not answer"

    stopped = invoke("redis", "stop")
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout.startswith("stopped the embedded Redis server (pid ")
    assert not server.running() and server.data_file.exists()
    assert_one_line_error(
        invoke("status"), "the embedded server in", "is stopped, its data kept", "`crawler redis start`"
    )
    assert not server.running()
    assert invoke("redis", "list").stdout.splitlines()[0].startswith(f"* embedded    {server.url}  stopped, data kept")
    assert invoke("redis", "stop").stdout.startswith("no embedded Redis server is running")

    started = invoke("redis", "start")
    assert started.exit_code == 0 and started.stdout.startswith("started the embedded Redis server")
    assert queued(invoke("status", "demo", "--json")) == 2  # the crawl survived the server's stop
    assert invoke("redis", "start").stdout.startswith("the embedded Redis server is already running")


def test_a_redis_found_on_localhost_is_named_when_used(
    invoke: Invoke, state: Path, redis_url: str, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_localhost_at(monkeypatch, redis_url)  # the session's server plays the one on 127.0.0.1:6379
    seeded = invoke("seed", "demo", "http://127.0.0.1:9/a")
    assert seeded.exit_code == 0, seeded.output
    assert f"note: Redis {redis_url} (found answering on localhost; no REDIS_URL set)" in seeded.stderr
    assert not EmbeddedRedis(state).running()
    redis_conn.flushdb()  # a burst worker waits for queued downloads: give it nothing to wait for
    worker = invoke("worker", "parse", "--burst")
    assert worker.exit_code == 0, worker.output
    assert (
        f"1 parse worker process(es), 1 thread(s) each, on {redis_url} (found answering on localhost; no REDIS_URL set)"
        in worker.stderr
    )
    assert invoke("redis", "list").stdout.splitlines()[1] == f"* localhost   {redis_url}  answers"


@pytest.mark.integration
def test_a_configured_redis_is_listed_without_its_password(invoke: Invoke, monkeypatch: pytest.MonkeyPatch) -> None:
    point_localhost_at(monkeypatch, NOWHERE)
    result = invoke("redis", "list", redis_url="redis://:hunter2@127.0.0.1:1/0")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "* configured  redis://***@127.0.0.1:1/0  does not answer"
    assert "hunter2" not in result.output


def test_status_shows_workers_suspended_by_rq(redis_url: str, redis_conn: Redis, tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "sites").mkdir()
    base = [
        "--redis-url",
        redis_url,
        "--database-url",
        f"sqlite:///{tmp_path / 'db'}",
        "--sites",
        str(tmp_path / "sites"),
    ]
    rq = [str(Path(sys.executable).with_name("rq"))]  # RQ's own command line
    subprocess.run([*rq, "suspend", "--url", redis_url], check=True, capture_output=True, timeout=60)
    result = CliRunner().invoke(cli, [*base, "status", "demo"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].split("\t")[-1] == "suspended"
    assert "workers suspended (`rq suspend`): none takes a job until `rq resume`" in result.stdout
    data = json.loads(CliRunner().invoke(cli, [*base, "status", "demo", "--json"]).stdout)
    assert data["suspended"] is True and data["sites"][0]["state"] == "suspended"

    subprocess.run([*rq, "resume", "--url", redis_url], check=True, capture_output=True, timeout=60)
    data = json.loads(CliRunner().invoke(cli, [*base, "status", "demo", "--json"]).stdout)
    assert data["suspended"] is False and data["sites"][0]["state"] == "running"
