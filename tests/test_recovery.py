"""Faults injected into running crawls: killed workers, SIGTERM, Redis restarts, database outages.

Each test crawls a ShopSite with real worker processes and checks the final database
against the shop's ground truth: every item once with the right values, and no two
requests to the site closer than its interval.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crawling import items_by_key
from redis import Redis

from crawler.connection import connect, redis_server_binary
from crawler.demo import ShopSite
from crawler.frontier import seed
from crawler.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.runtime import Runtime, install
from crawler.settings import Settings
from crawler.store import Store

INTERVAL = 0.05
LEASE = 3  # seconds: a killed worker's page comes back within LEASE + reaper period


def items_by_sku(database_url: str) -> dict[str, dict[str, Any]]:
    return items_by_key(database_url)


def crawl_settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, sites={"demo": {"interval": INTERVAL}}, job_lease=LEASE)


def seed_shop(connection: Redis, settings: Settings, shop: ShopSite) -> None:
    rt = Runtime(connection, settings)
    try:
        seed(rt.frontier("demo"), [shop.url + "/"])
    finally:
        rt.close()


def wait_drained(processes: list[Any], timeout: float = 120) -> int:
    done = threading.Event()

    def watchdog() -> None:
        if not done.wait(timeout):
            stop_workers(processes, timeout=10)

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        return wait_for(processes)
    finally:
        done.set()


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def assert_polite(shop: ShopSite) -> None:
    gap = shop.min_gap()
    assert gap is not None and gap >= INTERVAL, f"two requests {gap * 1000:.1f} ms apart"


def test_a_download_worker_killed_mid_request_loses_no_page(redis_url: str, redis_conn: Redis,
                                                            settings: Settings) -> None:
    settings = crawl_settings(settings)
    with ShopSite(products=40, slow_every=5, slow_seconds=1.5) as shop:
        seed_shop(redis_conn, settings, shop)
        victim, = start_workers([WorkerSpec("download", ("demo",), burst=True)], settings, redis_url)
        parser = start_workers([WorkerSpec("parse", ("demo",), burst=True)], settings, redis_url)
        # Kill it while it waits for a slow product page (every 5th product takes 1.5 s).
        wait_until(lambda: any(e.path == "/product/5" for e in shop.requests), 60, "a slow page to be requested")
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        killed_at = time.monotonic()
        others = start_workers([WorkerSpec("download", ("demo",), burst=True)], settings, redis_url)
        assert wait_drained(others + parser) == 0
        assert items_by_sku(settings.database_url) == shop.expected_items()
        refetched = [e.time for e in shop.requests_for("/product/5")]
        store = Store(settings.database_url)
        rows = [(r["kind"], r["outcome"], r["worker"], r["attempt"], (r["error"] or "")[-300:])
                for r in store.fetch_rows("demo") if r["url"].endswith("/product/5")]
        store.close()
        assert len(refetched) == 2, f"the killed worker's page was fetched {len(refetched)} times: {rows}"
        assert time.monotonic() - killed_at < 60
        assert_polite(shop)


def test_a_parse_worker_killed_mid_job_loses_no_item(redis_url: str, redis_conn: Redis, settings: Settings,
                                                     tmp_path: Path) -> None:
    # A spider whose product callback is slow, so a parse job is surely running when killed.
    (Path(settings.sites_dir) / "slowparse.py").write_text(
        "import time\n"
        "from crawler.demo.spider import DemoShop\n\n"
        "class SlowParse(DemoShop):\n"
        "    name = 'slowparse'\n"
        "    def parse_product(self, page):\n"
        "        time.sleep(0.3)\n"
        "        yield from super().parse_product(page)\n"
    )
    settings = dataclasses.replace(settings, sites={"slowparse": {"interval": 0.01}}, job_lease=LEASE)
    with ShopSite(products=20, faults=False) as shop:
        rt = Runtime(redis_conn, settings)
        seed(rt.frontier("slowparse"), [shop.url + "/"])
        rt.close()
        download = start_workers([WorkerSpec("download", ("slowparse",), burst=True)], settings, redis_url)
        victim, = start_workers([WorkerSpec("parse", ("slowparse",), burst=True)], settings, redis_url)
        store = Store(settings.database_url)
        wait_until(lambda: store.count_items("slowparse") >= 3, 60, "some items to be stored")
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        rescuer = start_workers([WorkerSpec("parse", ("slowparse",), burst=True)], settings, redis_url)
        assert wait_drained(download + rescuer) == 0
        rows = store.item_rows("slowparse")
        store.close()
        expected = shop.expected_items()
    assert sorted(r["data"]["sku"] for r in rows) == sorted(expected)  # each item once
    assert {r["data"]["sku"]: r["data"] for r in rows} == expected


def test_sigterm_finishes_the_current_page_and_leaves_the_rest_queued(redis_url: str, redis_conn: Redis,
                                                                      settings: Settings) -> None:
    settings = crawl_settings(settings)
    with ShopSite(products=20, slow_every=2, slow_seconds=1.0) as shop:
        seed_shop(redis_conn, settings, shop)
        worker, = start_workers([WorkerSpec("download", ("demo",))], settings, redis_url)
        parser = start_workers([WorkerSpec("parse", ("demo",), burst=True)], settings, redis_url)
        wait_until(lambda: any(e.path == "/product/2" for e in shop.requests), 60, "a slow page to be requested")
        os.kill(worker.pid, signal.SIGTERM)
        worker.join(30)
        assert worker.exitcode == 0, "the worker did not stop on SIGTERM"
        store = Store(settings.database_url)
        try:
            fetched = [r for r in store.fetch_rows("demo")
                       if r["url"] == f"{shop.url}/product/2" and r["kind"] == "download"]
        finally:
            store.close()
        assert [r["outcome"] for r in fetched] == ["ok"], "the page in flight was not finished"
        from crawler.status import site_status

        (status,) = site_status(redis_conn, ["demo"])
        assert status.in_flight == 0 and status.queued > 0  # the rest waits for the next worker
        finish = start_workers([WorkerSpec("download", ("demo",), burst=True)], settings, redis_url)
        assert wait_drained(finish + parser) == 0
        assert items_by_sku(settings.database_url) == shop.expected_items()
        assert len(shop.requests_for("/product/2")) == 1


@pytest.fixture
def restartable_redis(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A redis-server with an fsync-always append-only file, and a function that restarts it."""
    directory = tmp_path / "redis"
    directory.mkdir()
    sock = directory / "r.sock"
    args = [redis_server_binary(), "--port", "0", "--unixsocket", str(sock), "--dir", str(directory),
            "--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    state: dict[str, subprocess.Popen[bytes]] = {}

    def start() -> None:
        state["process"] = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        wait_until(lambda: sock.exists() and _answers(f"unix://{sock}"), 10, "redis to start")

    def restart(down_for: float) -> None:
        state["process"].kill()  # SIGKILL: nothing is flushed beyond what fsync already wrote
        state["process"].wait()
        time.sleep(down_for)
        start()

    start()
    yield f"unix://{sock}?db=0", restart
    state["process"].kill()
    state["process"].wait()


def _answers(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_timeout=0.5).ping())
    except Exception:
        return False


def test_workers_ride_out_a_redis_restart_and_stay_polite(restartable_redis: tuple[str, Any],
                                                          settings: Settings) -> None:
    url, restart = restartable_redis
    settings = crawl_settings(settings)
    connection = connect(url)
    with ShopSite(products=60) as shop:
        seed_shop(connection, settings, shop)
        processes = start_workers([WorkerSpec("download", ("demo",), threads=2, burst=True),
                                   WorkerSpec("parse", ("demo",), burst=True)], settings, url)
        wait_until(lambda: len(shop.requests) >= 15, 60, "the crawl to get going")
        restart(down_for=2.0)
        assert wait_drained(processes, timeout=150) == 0
        assert all(p.exitcode == 0 for p in processes), "a worker crashed instead of reconnecting"
        assert items_by_sku(settings.database_url) == shop.expected_items()
        assert_polite(shop)


class TcpProxy:
    """A loopback TCP forwarder that can be switched off (connections refused and cut)."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = _free_port()
        self.listener: socket.socket | None = None
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()

    def up(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        with self.lock:
            for conn in self.connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self.connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.connections += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.close()
            except OSError:
                pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_database_outage_delays_items_but_loses_none(redis_url: str, redis_conn: Redis, settings: Settings,
                                                       postgres_url: str) -> None:
    from sqlalchemy.engine import make_url

    real = make_url(postgres_url)
    proxy = TcpProxy((real.host or "127.0.0.1", real.port or 5432))
    proxy.up()
    through_proxy = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    settings = dataclasses.replace(crawl_settings(settings), database_url=through_proxy)
    Store(through_proxy).close()  # schema first
    with ShopSite(products=30, faults=False) as shop:
        seed_shop(redis_conn, settings, shop)
        processes = start_workers([WorkerSpec("download", ("demo",), burst=True),
                                   WorkerSpec("parse", ("demo",), burst=True)], settings, redis_url)
        wait_until(lambda: len(shop.requests) >= 8, 60, "the crawl to get going")
        proxy.down()
        time.sleep(3)  # jobs fail meanwhile and are scheduled for retry
        proxy.up()
        assert wait_drained(processes, timeout=150) == 0
        expected = shop.expected_items()
    proxy.down()
    assert items_by_sku(postgres_url) == expected
    store = Store(postgres_url)
    try:
        urls = {r["url"] for r in store.fetch_rows("demo") if r["outcome"] == "ok" and r["kind"] == "parse"}
    finally:
        store.close()
    assert {item["url"] for item in expected.values()} <= urls


def test_install_is_per_process() -> None:
    # Guard for the tests above: they rely on worker processes building their own runtime.
    with pytest.raises(RuntimeError):
        from crawler import runtime as runtime_module

        saved = runtime_module._current
        runtime_module._current = None
        try:
            runtime_module.current()
        finally:
            runtime_module._current = saved
    assert install is not None
