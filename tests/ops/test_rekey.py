"""``crawler migrate-keys``: a crawl kept under the key names of before hash tags carries on
under today's, its queued downloads handed back to the frontier, nothing lost."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error
from redis import Redis
from rq import Queue

from crawler.cli.app import cli
from crawler.coord import keys
from crawler.coord.frontier import Frontier, seed
from crawler.coord.scheduler import Scheduler
from crawler.coord.seen import stored
from crawler.ops.rekey import migrate_keys, new_name, old_sites


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)


def fill(connection: Redis, site: str) -> Frontier:
    """A crawl in progress: seen URLs, compact entries at two priorities, RQ jobs, a retry, counters."""
    frontier = Frontier(connection, site, ["127.0.0.1"], 60, 60)
    seed(frontier, [f"http://127.0.0.1:9/{site}/{i}" for i in range(10)], priority=0)
    seed(frontier, [f"http://127.0.0.1:9/{site}/urgent"], priority=50)
    frontier.refill(4)  # the urgent one and three others become RQ jobs
    connection.hset(keys.stats(site), mapping={"fetched": 5, "items": 9})
    connection.hset(keys.conf(site), mapping={"interval_ms": 1, "gate": keys.gate(keys.ip_gate_name("127.0.0.1"))})
    connection.set(keys.gate(keys.ip_gate_name("127.0.0.1")), "token", px=60_000)
    connection.set(keys.robots(site, "http://127.0.0.1:9"), b"User-agent: *\n")
    Scheduler(connection).schedule(site, f'["http://127.0.0.1:9/{site}/retry"]', 60)
    return frontier


def as_before_hash_tags(connection: Redis) -> None:
    """Every key, queue name and job origin as the version before hash tags wrote them."""
    untag = re.compile(r"\{([^}]*)\}")
    for key in list(connection.scan_iter(match="*", count=1000)):
        name = key.decode()
        if untag.search(name):
            connection.rename(name, untag.sub(r"\1", name, count=1))
        if name.startswith("rq:job:") and connection.type(name) == b"hash":
            connection.hset(name, "origin", untag.sub(r"\1", connection.hget(name, "origin").decode()))
    for member in connection.smembers(Queue.redis_queues_keys):
        connection.srem(Queue.redis_queues_keys, member)
        connection.sadd(Queue.redis_queues_keys, untag.sub(r"\1", member.decode()))
    for conf in connection.scan_iter(match="crawler:conf:*"):
        gate = connection.hget(conf, "gate")
        if gate:
            connection.hset(conf, "gate", untag.sub(r"\1", gate.decode()))


def test_old_names_map_to_tagged_ones() -> None:
    assert new_name("crawler:seen:shop") == keys.seen("shop")
    assert new_name("crawler:seen:shop:29012345") == keys.seen_bucket("shop", 29012345)
    assert new_name("crawler:frontier:shop:-10") == keys.frontier("shop", -10)
    assert new_name("crawler:robots-outage:shop:https://a.example:443") == keys.robots_outage(
        "shop", "https://a.example:443"
    )
    assert new_name("crawler:gate:shop") == keys.gate("shop")
    assert new_name("crawler:gate:ip:2001:db8::1") == keys.gate(keys.ip_gate_name("2001:db8::1"))
    assert new_name("crawler:gate:shared:srv-1") == keys.gate(keys.shared_gate_name("srv-1"))
    for kept in ("crawler:ready", "crawler:delayed", "crawler:pages", "crawler:group:ab12", "crawler:lock:refill:shop"):
        assert new_name(kept) is None
    assert new_name(keys.seen("shop")) is None  # tagged already


def test_a_crawl_under_the_old_names_carries_on_under_the_new_ones(redis_conn: Redis) -> None:
    fill(redis_conn, "shop")
    as_before_hash_tags(redis_conn)
    assert redis_conn.exists("crawler:seen:shop:i", "rq:queue:download:shop", "crawler:gate:ip:127.0.0.1") == 3
    assert old_sites(redis_conn) == ["shop"]

    report = migrate_keys(redis_conn)

    assert (report.sites, report.jobs_back, report.left, report.quarantined) == (["shop"], 4, 0, 0)
    assert old_sites(redis_conn) == []
    assert not [k for k in redis_conn.scan_iter(match="*shop*") if b"{" not in k]  # no key left under an old name
    assert redis_conn.smembers(Queue.redis_queues_keys) == set()  # the old queue is gone
    waiting = Frontier(redis_conn, "shop", ["127.0.0.1"], 60, 60).waiting()
    assert len(waiting) == 11 and waiting[0].url == "http://127.0.0.1:9/shop/urgent"  # its job, first again
    assert stored(redis_conn, "shop")[1] == 11
    assert redis_conn.hget(keys.stats("shop"), "fetched") == b"5"
    assert redis_conn.get(keys.robots("shop", "http://127.0.0.1:9")) == b"User-agent: *\n"
    assert redis_conn.hget(keys.conf("shop"), "gate") == keys.gate("ip:127.0.0.1").encode()
    assert 0 < redis_conn.pttl(keys.gate("ip:127.0.0.1")) <= 60_000  # renamed with its lifetime
    assert redis_conn.zcard(keys.delayed()) == 1 and redis_conn.zscore(keys.ready(), "shop") is not None

    redis_conn.delete(keys.gate("ip:127.0.0.1"))
    frontier = Frontier(redis_conn, "shop", ["127.0.0.1"], 60, 60)
    frontier.refill(4)
    step = Scheduler(redis_conn).next()
    assert step.site == "shop" and step.job_id is not None
    assert frontier.queue.fetch_job(step.job_id).args[0]["url"] == "http://127.0.0.1:9/shop/urgent"

    assert migrate_keys(redis_conn).summary() == "no keys under the old names: nothing to do"


def test_commands_that_crawl_refuse_to_start_on_old_names_until_migrated(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "sites").mkdir()
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(cli, [*base, *args])

    fill(redis_conn, "demo")
    as_before_hash_tags(redis_conn)
    for args in (["seed", "demo"], ["worker", "download", "--burst"], ["crawl", "demo"]):
        assert_one_line_error(invoke(*args), "demo", "earlier version", "crawler migrate-keys")
    migrated = invoke("migrate-keys")
    assert migrated.exit_code == 0, migrated.output
    assert "1 sites" in migrated.output and "4 queued downloads handed back" in migrated.output
    seeded = invoke("seed", "demo", "http://127.0.0.1:9/demo/0", "http://127.0.0.1:9/demo/new")
    assert seeded.exit_code == 0 and "1 enqueued, 1 already seen" in seeded.output, seeded.output
