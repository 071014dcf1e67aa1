"""Sentinel URLs, and a Redis found to be a new server (a failover, a restart): the gates' amnesty.

The URL and watch tests are unit tests (a fake connection stands for redis-py's); the rest run
real servers: a restarted redis-server, and a primary, replica and Sentinel (``sentinels``)
whose primary is ``kill -9``ed, with real worker processes crawling loopback shops.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from crawling import items_by_key
from redis import Redis
from redis.exceptions import ResponseError
from sentinels import SentinelSet, wait_until

from crawler.coord import failover, keys, pages, redisclock
from crawler.coord.connection import SentinelURL, answers, connect, redis_server_binary
from crawler.coord.frontier import seed
from crawler.coord.gate import SEND_GRACE, site_gate
from crawler.demo import ShopSite
from crawler.errors import ConfigError
from crawler.settings import Settings, redact_url, url_secrets
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers
from crawler.work.runtime import Runtime

# -- Sentinel URLs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "sentinels", "service", "db", "username", "password"),
    [
        ("redis+sentinel://h1:26379/crawl", [("h1", 26379)], "crawl", 0, None, None),
        ("redis+sentinel://h1:1,h2:2,h3/crawl/3", [("h1", 1), ("h2", 2), ("h3", 26379)], "crawl", 3, None, None),
        ("redis+sentinel://:s3cret@10.0.0.1:26379/svc/0", [("10.0.0.1", 26379)], "svc", 0, None, "s3cret"),
        (
            "redis+sentinel://ann:p%40ss@[::1]:26380,h2/my%20svc/",
            [("::1", 26380), ("h2", 26379)],
            "my svc",
            0,
            "ann",
            "p@ss",
        ),
        ("REDIS+SENTINEL://h/s/12", [("h", 26379)], "s", 12, None, None),
    ],
)
def test_a_sentinel_url_names_its_sentinels_service_database_and_the_primarys_credentials(
    url: str, sentinels: list[tuple[str, int]], service: str, db: int, username: str | None, password: str | None
) -> None:
    parsed = SentinelURL.parse(url)
    assert (list(parsed.sentinels), parsed.service, parsed.db) == (sentinels, service, db)
    assert (parsed.username, parsed.password, parsed.sentinel_password) == (username, password, None)


def test_the_sentinels_own_password_is_a_query_option_and_a_secret() -> None:
    url = "redis+sentinel://:primary-pw@h1:26379/crawl?sentinel_password=sentinel-pw"
    parsed = SentinelURL.parse(url)
    assert (parsed.password, parsed.sentinel_password) == ("primary-pw", "sentinel-pw")
    assert redact_url(url) == "redis+sentinel://***@h1:26379/crawl?sentinel_password=***"
    assert set(url_secrets(url)) == {"primary-pw", "sentinel-pw"}


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://:TOPSECRET@h1:26379", "no service name"),
        ("redis+sentinel://:TOPSECRET@h1:26379/", "no service name"),
        ("redis+sentinel://:TOPSECRET@h1:port/crawl", "Sentinel 1 (h1) has a port that is not a number"),
        ("redis+sentinel://:TOPSECRET@h1:1,:2/crawl", "Sentinel 2 has no host"),
        ("redis+sentinel://:TOPSECRET@h1:99999/crawl", "not a number from 1 to 65535"),
        ("redis+sentinel://:TOPSECRET@h1/crawl/zero", "the database after the service must be a number"),
        ("redis+sentinel://:TOPSECRET@h1/crawl/0/more", "the database after the service must be a number"),
        ("redis+sentinel://:TOPSECRET@h1/crawl?socket_timeout=1", "unknown option 'socket_timeout'"),
        ("redis+sentinel://:TOP/SECRET@h1/crawl", "percent-encode"),
    ],
)
def test_a_malformed_sentinel_url_is_a_one_line_config_error_that_quotes_no_secret(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        connect(url)
    message = str(raised.value)
    assert says in message and "\n" not in message
    assert "TOPSECRET" not in message and "SECRET" not in message.replace("***", "")
    assert message.startswith("invalid Redis URL redis+sentinel://***@")


# -- the watch, on a stand-in connection -------------------------------------------------------


class FakeConnection:
    """What ``ServerWatch`` uses of a redis-py connection being set up, answering as a server would."""

    def __init__(self, run_id: str, marker: bytes | None = None, now_ms: int = 1_700_000_000_000, info: Any = None):
        self.run_id, self.marker, self.now_ms = run_id, marker, now_ms
        self.info = info
        self.sent: list[tuple[Any, ...]] = []
        self._replies: list[Any] = []

    def on_connect(self) -> None:
        self.sent.append(("HANDSHAKE",))

    def pack_commands(self, commands: Any) -> list[tuple[Any, ...]]:
        return list(commands)

    def send_packed_command(self, commands: list[tuple[Any, ...]], check_health: bool = True) -> None:
        for command in commands:
            self.sent.append(command)
            self._replies.append(self._answer(command))

    def _answer(self, command: tuple[Any, ...]) -> Any:
        name = command[0]
        if name == "INFO":
            return (
                self.info
                if self.info is not None
                else f"# Server\r\nredis_version:7.0\r\nrun_id:{self.run_id}\r\n".encode()
            )
        if name == "GET":
            return self.marker
        if name == "TIME":
            return [str(self.now_ms // 1000).encode(), str(self.now_ms % 1000 * 1000).encode()]
        if name == "SET":
            if "NX" not in command or self.marker is None:
                self.marker = command[2].encode()
            return b"OK"
        return 0  # EVAL: HOLD_GATES

    def read_response(self) -> Any:
        reply = self._replies.pop(0)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def names(self) -> list[str]:
        return [command[0] for command in self.sent]


def test_a_first_connection_notes_its_server_and_holds_nothing() -> None:
    watch = failover.ServerWatch()
    connection = FakeConnection("a" * 40)
    watch(connection)
    assert connection.names() == ["HANDSHAKE", "INFO", "GET", "TIME", "SET"]
    assert connection.sent[-1] == ("SET", keys.server(), f"{'a' * 40} 0", "NX")
    assert (watch.run_id, watch.generation, watch.hold_left(5.0)) == ("a" * 40, 0, 0.0)
    again = FakeConnection("a" * 40, connection.marker)
    watch(again)  # another connection of the pool to the same server: one round trip, nothing written
    assert again.names() == ["HANDSHAKE", "INFO", "GET", "TIME"] and watch.generation == 0


def test_a_new_server_holds_every_gate_from_now_closes_the_known_ones_in_redis_and_says_so() -> None:
    watch = failover.ServerWatch()
    watch(FakeConnection("old"))
    watch.know(keys.gate("shop"), failover.HeldGate(1250))
    watch.know(keys.gate("auto"), failover.HeldGate(750, keys.conf("auto"), 350))
    promoted = FakeConnection("new", b"old 0", now_ms=1_700_000_123_456)
    watch(promoted)
    assert promoted.names() == ["HANDSHAKE", "INFO", "GET", "TIME", "EVAL", "SET"]
    _eval, _source, count, *rest = promoted.sent[4]
    assert count == 3 and rest[:3] == [keys.gate("shop"), keys.gate("auto"), keys.conf("auto")]
    assert rest[4:] == [2, 1250, 0, 0, 750, 3, 350]  # after the token: n, then (ms, pace key's index, extra)
    assert promoted.marker == b"new 1700000123456"
    assert watch.generation == 1 and 1.9 < watch.hold_left(2.0) <= 2.0
    assert not watch.first_hold(keys.gate("shop"))  # closed in Redis already
    assert watch.first_hold(keys.gate("other")) and not watch.first_hold(keys.gate("other"))
    later = failover.ServerWatch()  # a process that finds it after: holds from its own finding, keeps the date
    later(FakeConnection("old"))
    noted = FakeConnection("new", promoted.marker)
    later(noted)
    assert noted.names()[-1] == "TIME" and noted.marker == b"new 1700000123456" and later.hold_left(2.0) > 1.9


def test_a_process_connecting_within_a_hold_another_found_holds_for_what_is_left_of_it() -> None:
    watch = failover.ServerWatch()
    connection = FakeConnection("new", b"new 1700000000000", now_ms=1_700_000_000_300)
    watch(connection)
    assert "SET" not in connection.names() and watch.generation == 1
    assert 0.6 < watch.hold_left(1.0) <= 0.7  # found 300 ms ago by the fleet's clock
    stranger = failover.ServerWatch()
    watch_too = FakeConnection("newer", b"new 1700000000000")  # nobody noted this one yet
    stranger(watch_too)
    assert watch_too.sent[-1][:2] == ("SET", keys.server()) and stranger.hold_left(1.0) > 0.9
    assert watch_too.marker is not None and watch_too.marker.startswith(b"newer ")


def test_a_server_that_refuses_info_turns_the_watch_off_and_connects_all_the_same() -> None:
    watch = failover.ServerWatch()
    connection = FakeConnection("a", info=ResponseError("unknown command 'INFO'"))
    watch(connection)
    watch(connection)
    assert connection.names() == ["HANDSHAKE", "INFO", "GET", "TIME", "HANDSHAKE"]
    assert watch.run_id is None and watch.generation == 0


# -- a restarted Redis -------------------------------------------------------------------------


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A redis-server keeping its data in an fsync-always append-only file, and a function that
    ``kill -9``s and restarts it."""
    sock = tmp_path / "r.sock"
    args = [redis_server_binary(), "--port", "0", "--unixsocket", str(sock), "--dir", str(tmp_path)]
    args += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    state: dict[str, subprocess.Popen[bytes]] = {}

    def start() -> None:
        state["process"] = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        wait_until(lambda: sock.exists() and answers(f"unix://{sock}"), 10, "redis to start")

    def restart() -> None:
        state["process"].kill()
        state["process"].wait()
        start()

    start()
    yield f"unix://{sock}?db=0", restart
    state["process"].kill()
    state["process"].wait()


@pytest.mark.integration
def test_a_restarted_redis_holds_each_site_gate_one_lifetime_from_the_detection(restartable: tuple[str, Any]) -> None:
    url, restart = restartable
    connection = connect(url, max_connections=4)
    gate = site_gate(connection, "shop", 0.5)
    assert gate.try_acquire() == 0.0
    redisclock.now_ms(connection)
    before = connection.info("commandstats").get("cmdstat_info", {}).get("calls", 0)
    for _ in range(20):  # ordinary takes on open connections: no INFO, no extra command
        site_gate(connection, "other", 0.001).try_acquire()
    assert connection.info("commandstats")["cmdstat_info"]["calls"] == before + 1  # the read just made
    restart()
    found = time.monotonic()
    try:
        connection.ping()  # the pool's connections were cut: the first call may fail, or reconnect
    except redis.ConnectionError:
        pass
    fresh = site_gate(connection, "shop", 0.5)
    wait = fresh.try_acquire()
    assert 0.5 + SEND_GRACE - 0.35 < wait <= 0.5 + SEND_GRACE and fresh.token is None  # held, not taken
    assert failover.watch_of(connection).generation == 1  # type: ignore[union-attr]
    assert 0 < connection.pttl(keys.gate("shop")) <= (0.5 + SEND_GRACE) * 1000  # closed for the fleet too
    assert redisclock._offsets[connection][1] != 1 and redisclock.now_ms(connection) > 0
    assert redisclock._offsets[connection][1] == 1  # read again after the new server
    assert fresh.acquire(timeout=2.0)
    assert time.monotonic() - found >= 0.5 + SEND_GRACE - 0.05, "a gate was taken within its hold"
    run_id, since = connection.get(keys.server()).split()  # type: ignore[union-attr]
    assert run_id.decode() == connection.info("server")["run_id"] and int(since) > 0


# -- Sentinel ----------------------------------------------------------------------------------


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    """A primary, a replica and a Sentinel on loopback (skipped without Debian's binaries)."""
    servers = SentinelSet(tmp_path)
    try:
        yield servers.start()
    finally:
        servers.close()


@pytest.mark.integration
def test_connect_through_a_sentinel_reaches_the_primary_it_names(sentinel_set: SentinelSet) -> None:
    connection = connect(sentinel_set.url, max_connections=4)
    connection.set("crawler:probe", "1")
    primary = Redis(port=sentinel_set.ports["primary"])
    assert primary.get("crawler:probe") == b"1" and primary.info("replication")["role"] == "master"
    assert answers(sentinel_set.url)
    named = pages.named_client(connection, "crawler-test")  # a pool made from the client's, as parse workers do
    assert named.ping() and failover.watch_of(named) is failover.watch_of(connection)
    assert "crawler-test" in {client["name"] for client in primary.client_list()}
    unknown = sentinel_set.url.replace("/crawl/", "/nosuch/")
    assert not answers(unknown)
    with pytest.raises(ConfigError, match=r"no Sentinel at 127\.0\.0\.1:\d+ named a primary for 'nosuch'"):
        connect(unknown)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_failover_holds_the_gates_in_this_process_and_for_processes_started_after(
    sentinel_set: SentinelSet,
) -> None:
    connection = connect(sentinel_set.url, max_connections=4)
    assert site_gate(connection, "shop", 1.0).try_acquire() == 0.0
    sentinel_set.kill_primary()
    sentinel_set.wait_promoted()
    waits: list[float] = []
    wait_until(lambda: _take(connection, "late", waits), 30, "a take on the new primary")
    assert 1.0 + SEND_GRACE - 0.3 < waits[-1] <= 1.0 + SEND_GRACE, "a gate first taken after the failover was not held"
    assert connection.pttl(keys.gate("shop")) > 500, "the gate the process knew was not closed on the new primary"
    started_after = connect(sentinel_set.url)  # a process started just after: the marker tells it
    assert 0 < site_gate(started_after, "third", 1.0).try_acquire() <= 1.0 + SEND_GRACE


def _take(connection: Redis, site: str, waits: list[float]) -> bool:
    try:
        waits.append(site_gate(connection, site, 1.0).try_acquire())
        return True
    except (redis.ConnectionError, redis.TimeoutError):  # MasterNotFoundError too, while the Sentinel decides
        return False


INTERVAL = 0.4
SITES = ("slow0", "slow1", "slow2")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_crawl_rides_out_a_primary_killed_mid_crawl_with_every_item_and_no_early_request(
    sentinel_set: SentinelSet, settings: Settings
) -> None:
    url = sentinel_set.url
    connection = connect(url)
    for name in SITES:
        (Path(settings.sites_dir) / f"{name}.py").write_text(
            f"from crawler.demo.spider import DemoShop\n\nclass Slow(DemoShop):\n    name = {name!r}\n"
        )
    settings = dataclasses.replace(settings, sites={name: {"interval": INTERVAL} for name in SITES}, job_lease=3)
    shops = [ShopSite(products=24, latency=0.2, faults=False).start() for _ in SITES]
    try:
        rt = Runtime(connection, settings)
        for name, shop in zip(SITES, shops, strict=True):
            seed(rt.frontier(name), [shop.url + "/"])
        rt.close()
        specs = [WorkerSpec("download", SITES, burst=True), WorkerSpec("download", SITES, burst=True)]
        processes = start_workers([*specs, WorkerSpec("parse", SITES, burst=True)], settings, url)
        try:
            wait_until(lambda: all(len(shop.requests) >= 6 for shop in shops), 60, "every site to be crawled a while")
            killed_at = sentinel_set.kill_primary()
            assert all(code == 0 for code in _wait(processes, 180)), "a worker died instead of riding it out"
        finally:
            stop_workers(processes)
        after = [entry.time - killed_at for shop in shops for entry in shop.requests if entry.time > killed_at]
        for name, shop in zip(SITES, shops, strict=True):
            assert items_by_key(settings.database_url, name).keys() == shop.expected_items().keys()
        gaps = {name: shop.min_gap() for name, shop in zip(SITES, shops, strict=True)}
    finally:
        for shop in shops:
            shop.stop()
    assert all(gap is not None and gap >= INTERVAL for gap in gaps.values()), f"a request came early: {gaps}"
    assert sentinel_set.primary_port() == sentinel_set.ports["replica"]
    _run_id, since = connect(url).get(keys.server()).split()  # type: ignore[union-attr]
    found = int(since) / 1000 - killed_at  # when the first process found the new primary (same host's clock)
    # A request within the send grace of the kill may be of a take made before it, on the old primary.
    taken_after = [t for t in after if t > SEND_GRACE]
    assert 0 < found < min(taken_after), "no worker found the new primary, or a request went before"
    first = min(taken_after) - found
    assert first >= INTERVAL, f"a request {first:.3f} s after the failover was found"
    print(f"kill to found: {found:.2f} s, to the first request after it: {min(after):.2f} s; closest gaps: {gaps}")


def _wait(processes: list[Any], timeout: float) -> list[int | None]:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    if any(process.is_alive() for process in processes):
        stop_workers(processes, timeout=10)
        pytest.fail("the crawl did not finish by itself after the failover")
    return [process.exitcode for process in processes]
