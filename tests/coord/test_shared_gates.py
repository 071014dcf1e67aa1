"""Sites that share a server: gates keyed by IP address (``gate_by = "ip"``) or shared by name.

Two spiders crawl one loopback shop, each with a gate of its own by default; spacing is
measured at the shop across both.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from crawling import installed_runtime, join_all, start_in_threads
from redis import Redis

from crawler.coord import keys
from crawler.coord.frontier import seed
from crawler.demo import ShopSite
from crawler.errors import ConfigError
from crawler.http.addresses import AddressCache, lowest
from crawler.settings import Settings
from crawler.work.runtime import Runtime

INTERVAL = 0.05

SPIDERS = """
from crawler.demo.spider import DemoShop


class ByNumber(DemoShop):
    name = "numeric"
    allowed_domains = ["127.0.0.1"]
    interval = {interval}
    {attribute}


class ByName(DemoShop):
    name = "named"
    allowed_domains = ["localhost"]
    interval = {interval}
    {attribute}
"""


class CountingResolver:
    def __init__(self, answers: dict[str, list[str]]):
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, host: str) -> list[str]:
        self.calls.append(host)
        return self.answers.get(host, [])


def test_an_address_is_resolved_once_per_ttl_and_the_lowest_keys_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    resolver = CountingResolver({"shop.test": ["2001:db8::1", "192.0.2.20", "192.0.2.3"]})
    clock = [100.0]
    monkeypatch.setattr("crawler.http.addresses.time.monotonic", lambda: clock[0])
    cache = AddressCache(ttl=60, resolve=resolver)
    assert cache.address("Shop.Test.") == "192.0.2.3"  # IPv4 first, then numerically (not "192.0.2.20")
    clock[0] += 59
    assert cache.address("shop.test") == "192.0.2.3" and resolver.calls == ["shop.test"]
    resolver.answers["shop.test"] = ["192.0.2.99"]  # the record changed
    clock[0] += 2
    assert cache.address("shop.test") == "192.0.2.99" and len(resolver.calls) == 2
    assert cache.address("nowhere.test") is None
    assert cache.address("nowhere.test") is None and resolver.calls.count("nowhere.test") == 1  # failures kept 5 s
    assert cache.address("[::1]") == "::1" and cache.address("127.0.0.1") == "127.0.0.1"  # no lookup for an address
    assert lowest(["::1", "not an address"]) == "::1"


def write_spiders(settings: Settings, attribute: str) -> None:
    text = SPIDERS.format(interval=INTERVAL, attribute=attribute)
    (Path(settings.sites_dir) / "pair.py").write_text(textwrap.dedent(text))


def test_gate_names_follow_the_spider_or_the_config(redis_conn: Redis, settings: Settings) -> None:
    write_spiders(settings, "pass")
    rt = Runtime(redis_conn, settings)
    assert rt.gate_name("named", "http://localhost:8000/x") == "named"  # default: the site's own
    configured = dataclasses.replace(settings, sites={"named": {"gate_by": "ip"}, "numeric": {"gate": "srv-1"}})
    rt = Runtime(redis_conn, configured)
    assert rt.gate_name("named", "http://localhost:8000/x") == "ip:127.0.0.1"
    assert redis_conn.hget(keys.conf("named"), "gate") is None  # naming it writes nothing
    taken = rt.take_gate("named", "http://localhost:8000/x")  # a take tells NEXT_JOB where to look
    taken.let_go()
    assert redis_conn.hget(keys.conf("named"), "gate") == b"crawler:gate:{ip:127.0.0.1}"
    assert rt.gate_name("numeric", "http://127.0.0.1:8000/x") == "shared:srv-1"
    assert rt.gate("numeric", "http://127.0.0.1:8000/x").key == "crawler:gate:{shared:srv-1}"  # a slot of its own
    with pytest.raises(ConfigError, match="gate_by must be 'site' or 'ip'"):
        dataclasses.replace(settings, sites={"named": {"gate_by": "host"}})
    with pytest.raises(ConfigError, match="gate must be a name"):
        dataclasses.replace(settings, sites={"named": {"gate": "a b"}})


def crawl_pair(redis_conn: Redis, settings: Settings, attribute: str) -> list[float]:
    """Both spiders crawl one shop, one as 127.0.0.1, one as localhost; the arrivals at the shop."""
    write_spiders(settings, attribute)
    with ShopSite(products=15, faults=False) as shop, installed_runtime(redis_conn, settings) as rt:
        seed(rt.frontier("numeric"), [f"http://127.0.0.1:{shop.port}/"])
        seed(rt.frontier("named"), [f"http://localhost:{shop.port}/"])
        threads, stop = start_in_threads(rt, downloads=3, parsers=1, sites=("numeric", "named"))
        join_all(threads, stop)
        assert len(shop.requests_for("/robots.txt")) == 2  # each site read it, through one shared gate
        return [entry.time for entry in shop.requests]


def closest(arrivals: list[float]) -> float:
    return min(b - a for a, b in zip(arrivals, arrivals[1:]))


@pytest.mark.parametrize("attribute", ['gate_by = "ip"', 'gate = "shop-server"'])
def test_two_host_names_of_one_server_are_spaced_as_one_site(
    redis_conn: Redis, settings: Settings, attribute: str
) -> None:
    arrivals = crawl_pair(redis_conn, settings, attribute)
    assert len(arrivals) >= 30
    assert closest(arrivals) >= INTERVAL, f"two requests {closest(arrivals) * 1000:.1f} ms apart across both sites"


def test_without_a_shared_gate_the_two_sites_are_spaced_each_on_its_own(redis_conn: Redis, settings: Settings) -> None:
    # The control: what the two tests above would see without gate_by / gate.
    arrivals = crawl_pair(redis_conn, settings, "pass")
    assert closest(arrivals) < INTERVAL / 2
