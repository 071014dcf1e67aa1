"""A crawl over three Redis shards: seeding, status, workers serving every shard, and moving a site live.

Real ``redis-server`` processes (the embedded binary, each on its own unix socket), real
worker processes and loopback shops; politeness is timed on the wire (``demo.wire``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import items_by_key
from redis import Redis

from crawler.cli.app import cli
from crawler.coord.connection import EmbeddedRedis, connect
from crawler.coord.shards import rendezvous
from crawler.demo import ShopSite
from crawler.settings import load_settings
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers

pytestmark = pytest.mark.integration

NAMES = ("a", "b", "c")
INTERVAL = 0.25


@pytest.fixture
def shard_servers(tmp_path: Path) -> Iterator[dict[str, Redis]]:
    """Three private Redis servers, by shard name."""
    servers = {name: EmbeddedRedis(tmp_path / f"redis-{name}") for name in NAMES}
    for server in servers.values():
        server.start()
    clients = {name: connect(server.url) for name, server in servers.items()}
    try:
        yield clients
    finally:
        for client in clients.values():
            client.close()
        for server in servers.values():
            server.stop()


@pytest.fixture
def shard_url(shard_servers: dict[str, Redis]) -> str:
    urls = {name: client.connection_pool.connection_kwargs["path"] for name, client in shard_servers.items()}
    return ",".join(f"{name}=unix://{path}?db=0" for name, path in urls.items())


@pytest.fixture
def project(tmp_path: Path, shard_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a project whose ``REDIS_URL`` names the three shards."""
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)
    (tmp_path / "sites").mkdir()
    return {
        "REDIS_URL": shard_url,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'crawl.db'}",
        "CRAWLER_SITES_DIR": str(tmp_path / "sites"),
        "COLUMNS": "200",
    }


def invoke(env: dict[str, str], *args: str) -> Result:
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == 0, result.output + (result.stderr if result.stderr_bytes else "")
    return result


def write_spiders(env: dict[str, str], shops: dict[str, ShopSite] | list[str]) -> None:
    """A spider per shop (or per name, its start URL a closed port's: nothing is fetched)."""
    urls = (
        {name: shop.url for name, shop in shops.items()}
        if isinstance(shops, dict)
        else dict.fromkeys(shops, "http://127.0.0.1:9")
    )
    for name, url in urls.items():
        (Path(env["CRAWLER_SITES_DIR"]) / f"{name}.py").write_text(
            "from crawler.demo.spider import DemoShop\n\n"
            f"class Shop(DemoShop):\n    name = {name!r}\n    interval = {INTERVAL}\n"
            f"    start_urls = [{url + '/'!r}]\n"
        )


def run_workers(env: dict[str, str], sites: tuple[str, ...], timeout: float = 120) -> None:
    """One burst download process and one parse process for ``sites`` over every shard, until the crawl drains."""
    settings = load_settings(
        None, redis_url=env["REDIS_URL"], database_url=env["DATABASE_URL"], sites_dir=env["CRAWLER_SITES_DIR"]
    )
    processes = start_workers(
        [WorkerSpec("download", sites, burst=True), WorkerSpec("parse", sites, burst=True)], settings, env["REDIS_URL"]
    )
    try:
        for process in processes:
            process.join(timeout)
        assert not any(p.is_alive() for p in processes), "the burst did not end"
        assert [p.exitcode for p in processes] == [0, 0]
    finally:
        stop_workers(processes)


def site_keys(client: Redis, site: str) -> list[str]:
    return sorted(name.decode() for name in client.scan_iter(match=f"*{{{site}}}*"))


def test_sites_spread_over_three_shards_are_seeded_shown_and_crawled_each_on_its_own_shard(
    project: dict[str, str], shard_servers: dict[str, Redis]
) -> None:
    names = [f"shop{i}" for i in range(9)]
    shops = {name: ShopSite(products=4, latency=0.05, faults=False).start() for name in names}
    try:
        write_spiders(project, shops)
        seeded = invoke(project, "seed", "--all").stdout
        assert sorted(line.split(":")[0] for line in seeded.splitlines()) == names
        for name in names:  # every key of a site on the shard it hashes to, none elsewhere
            home = rendezvous(name, NAMES)
            for shard, client in shard_servers.items():
                assert bool(site_keys(client, name)) == (shard == home), (name, shard)
        listed = invoke(project, "shards", *names).stdout.splitlines()
        assert [line.split("\t")[:2] for line in listed] == [[name, rendezvous(name, NAMES)] for name in names]
        overview = invoke(project, "shards").stdout.splitlines()
        assert [line.split("\t")[0] for line in overview] == list(NAMES)
        assert sum(int(line.split("\t")[2].split()[0]) for line in overview) == len(names)

        run_workers(project, tuple(names))

        status = json.loads(invoke(project, "status", "--json").stdout)
        by_site = {s["site"]: s for s in status["sites"]}
        for name, shop in shops.items():
            assert items_by_key(project["DATABASE_URL"], name).keys() == shop.expected_items().keys()
            assert by_site[name]["items"] == len(shop.expected_items())
            gap = shop.min_gap()
            assert gap is not None and gap >= INTERVAL, f"{name}: two requests {gap} s apart"
            assert max(Counter(e.path for e in shop.requests).values()) == 1, f"{name}: a page fetched twice"
        assert status["parse"] == {"queued": 0, "in_flight": 0}
        assert "shard" in invoke(project, "sites").stdout  # the shard of each site, with several
    finally:
        for shop in shops.values():
            shop.stop()


def test_a_site_moved_three_times_mid_crawl_loses_no_page_fetches_none_twice_and_none_early(
    project: dict[str, str], shard_servers: dict[str, Redis]
) -> None:
    shops = {"mover": ShopSite(products=80, per_page=10, latency=0.05, faults=False).start()}
    shops["still"] = ShopSite(products=10, latency=0.05, faults=False).start()
    try:
        write_spiders(project, shops)
        invoke(project, "seed", "--all")
        moves: list[str] = []
        failures: list[BaseException] = []

        def move_around() -> None:
            try:
                for _ in range(3):
                    time.sleep(1.0)
                    here = invoke(project, "shards", "mover").stdout.split("\t")[1]
                    there = next(name for name in NAMES if name != here)
                    moves.append(invoke(project, "move", "mover", "--to", there).stdout.strip())
            except BaseException as exc:  # reported by the test's thread
                failures.append(exc)

        mover = threading.Thread(target=move_around)
        mover.start()
        run_workers(project, tuple(shops), timeout=180)
        mover.join(60)
        assert not failures, failures
        assert len(moves) == 3 and all("moved from shard" in line for line in moves), moves

        shop = shops["mover"]
        print(moves, f"{len(shop.requests)} requests, closest {shop.min_gap()} s apart")
        assert items_by_key(project["DATABASE_URL"], "mover").keys() == shop.expected_items().keys()
        assert max(Counter(e.path for e in shop.requests).values()) == 1, "a page fetched twice"
        gap = shop.min_gap()
        assert gap is not None and gap >= INTERVAL, f"two requests {gap} s apart"
        final = invoke(project, "shards", "mover").stdout.split("\t")[1]
        for shard, client in shard_servers.items():  # the site's keys on its last shard only
            assert bool(site_keys(client, "mover")) == (shard == final), shard
        status = {s["site"]: s for s in json.loads(invoke(project, "status", "--json").stdout)["sites"]}
        assert status["mover"]["items"] == len(shop.expected_items())  # the counters moved with it
        assert status["mover"]["queued"] == 0 and not status["mover"]["paused"]
        assert items_by_key(project["DATABASE_URL"], "still").keys() == shops["still"].expected_items().keys()
    finally:
        for shop in shops.values():
            shop.stop()


def test_commands_name_a_wrong_shard_in_one_line_and_each_shard_is_listed(
    project: dict[str, str], shard_servers: dict[str, Redis]
) -> None:
    write_spiders(project, ["shop"])
    bad = CliRunner().invoke(cli, ["worker", "download", "--shards", "a,z"], env=project)
    assert bad.exit_code == 1 and bad.stderr.strip() == "Error: no shard 'z'; the shards are: a, b, c"
    home = rendezvous("shop", NAMES)
    same = CliRunner().invoke(cli, ["move", "shop", "--to", home], env=project)
    assert same.exit_code == 1 and f"shop is on shard {home} already" in same.stderr
    listed = invoke(project, "redis", "list").stdout.splitlines()
    assert [line.split()[:2] for line in listed[:3]] == [["shard", name] for name in NAMES]
    assert all("answers" in line for line in listed[:3])


def test_metrics_of_three_shards_come_in_one_scrape_each_sample_labelled_with_its_shard(
    project: dict[str, str], shard_servers: dict[str, Redis]
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from crawler.ops.metrics import MetricsCollector, ShardedMetrics

    write_spiders(project, [f"shop{i}" for i in range(6)])
    invoke(project, "seed", "--all")
    registry = CollectorRegistry(auto_describe=False)
    collectors = [(name, MetricsCollector(client)) for name, client in shard_servers.items()]
    registry.register(ShardedMetrics(collectors))
    try:
        text = generate_latest(registry).decode()
    finally:
        for _, collector in collectors:
            collector.close()
    for name in NAMES:
        assert f'crawler_redis_up{{shard="{name}"}} 1.0' in text
    assert text.count("# TYPE crawler_redis_up ") == 1  # one family, a sample a shard
    for i in range(6):
        site = f"shop{i}"
        depth = [line for line in text.splitlines() if line.startswith("crawler_queue_depth{")]
        queued = [line for line in depth if f'site="{site}"' in line]
        assert len(queued) == 1 and f'shard="{rendezvous(site, NAMES)}"' in queued[0], queued


def test_status_with_a_shard_down_shows_the_others_sites_and_says_which_is_down_while_writes_refuse(
    project: dict[str, str], shard_servers: dict[str, Redis]
) -> None:
    import redis

    names = [f"shop{i}" for i in range(9)]
    write_spiders(project, names)
    invoke(project, "seed", "--all")
    down = rendezvous("shop0", NAMES)
    try:
        shard_servers[down].shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # the server closes the connection as it exits
    status = CliRunner().invoke(cli, ["status", "--json"], env=project)
    assert status.exit_code == 0, status.output
    assert f"warning: shard {down} (" in status.stderr and "is down" in status.stderr
    shown = {s["site"] for s in json.loads(status.stdout)["sites"]}
    assert shown == {name for name in names if rendezvous(name, NAMES) != down}
    seeding = CliRunner().invoke(cli, ["seed", "shop0"], env=project)  # a write must not guess where shop0 is
    assert seeding.exit_code == 1 and "cannot reach Redis" in seeding.stderr
