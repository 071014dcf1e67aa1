"""Shards: ``REDIS_URL`` split into named instances, sites placed by rendezvous hashing, found where they are."""

from __future__ import annotations

from collections import Counter

import fakeredis
import pytest
from redis import Redis

from crawler.coord import keys
from crawler.coord.shards import Shard, ShardSet, rendezvous, shards_of
from crawler.errors import ConfigError
from crawler.settings import Settings, load_settings, redact_shards, secrets_of, split_shards

pytestmark = pytest.mark.unit


def test_a_plain_url_is_one_shard_called_default_and_a_sentinel_url_keeps_its_host_list() -> None:
    assert split_shards("redis://h:6379/0") == [("default", "redis://h:6379/0")]
    sentinel = "redis+sentinel://h1:26379,h2:26379,h3:26379/mymaster/0"
    assert split_shards(sentinel) == [("default", sentinel)]
    assert split_shards(None) == []
    assert shards_of("unix:///tmp/r.sock?db=0") == (Shard("default", "unix:///tmp/r.sock?db=0"),)


def test_named_shards_split_on_commas_and_a_sentinel_shard_keeps_its_hosts() -> None:
    value = "a=redis://h1:6379/0, b=redis+sentinel://s1:26379,s2:26379/svc,c=unix:///r.sock?db=2"
    assert split_shards(value) == [
        ("a", "redis://h1:6379/0"),
        ("b", "redis+sentinel://s1:26379,s2:26379/svc"),
        ("c", "unix:///r.sock?db=2"),
    ]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("a=redis://h1/0,a=redis://h2/0", "named twice"),
        ("a=,b=redis://h2/0", "has no URL"),
        ("redis://h1/0,b=redis://h2/0", "name every shard"),
    ],
)
def test_a_malformed_shard_list_is_one_clear_error(value: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        Settings(redis_url=value)


def test_every_shard_s_password_is_hidden_and_known_as_a_secret() -> None:
    value = "a=redis://:pw-alpha@h1:6379/0,b=redis://user:pw-bravo@h2:6379/0"
    shown = redact_shards(value)
    assert "pw-alpha" not in shown and "pw-bravo" not in shown
    assert shown == "a=redis://***@h1:6379/0,b=redis://***@h2:6379/0"
    assert {"pw-alpha", "pw-bravo"} <= set(secrets_of(Settings(redis_url=value)))


def test_the_config_file_may_name_a_site_s_shard_but_only_one_there_is(tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("redis_url: a=redis://h1/0,b=redis://h2/0\nsites:\n  shop:\n    shard: b\n    interval: 2\n")
    assert load_settings(config).sites["shop"]["shard"] == "b"
    config.write_text("redis_url: a=redis://h1/0,b=redis://h2/0\nsites:\n  shop:\n    shard: z\n")
    with pytest.raises(ConfigError, match="sites.shop.shard names no shard"):
        load_settings(config)
    config.write_text("sites:\n  shop:\n    shard: default\n")  # one Redis: its shard is ``default``
    assert load_settings(config).sites["shop"]["shard"] == "default"


def test_rendezvous_spreads_sites_evenly_and_a_new_shard_takes_only_its_share() -> None:
    sites = [f"site{i}" for i in range(3000)]
    three = {site: rendezvous(site, ["a", "b", "c"]) for site in sites}
    counts = Counter(three.values())
    assert all(800 <= n <= 1200 for n in counts.values()), counts
    four = {site: rendezvous(site, ["a", "b", "c", "d"]) for site in sites}
    moved = [site for site in sites if three[site] != four[site]]
    assert all(four[site] == "d" for site in moved)  # only to the new shard
    assert 600 <= len(moved) <= 900  # about a quarter
    assert rendezvous("site7", ["c", "b", "a"]) == three["site7"]  # the order of the names does not matter


def _shard_set(settings: Settings, names: list[str]) -> tuple[ShardSet, dict[str, Redis]]:
    clients = {name: fakeredis.FakeRedis(server=fakeredis.FakeServer()) for name in names}
    shards = [Shard(name, f"redis://{name}/0") for name in names]
    by_url = {f"redis://{name}/0": client for name, client in clients.items()}
    return ShardSet(shards, settings, by_url.__getitem__), clients


def test_a_site_is_found_where_its_keys_are_else_where_the_config_names_else_where_it_hashes() -> None:
    settings = Settings(redis_url="a=redis://a/0,b=redis://b/0,c=redis://c/0", sites={"named": {"shard": "c"}})
    shard_set, clients = _shard_set(settings, ["a", "b", "c"])
    hashed = rendezvous("moved", ["a", "b", "c"])
    elsewhere = next(name for name in "abc" if name != hashed)
    clients[elsewhere].sadd(keys.sites(), "moved")
    located = shard_set.locate(["moved", "named", "fresh"])
    assert located == {"moved": elsewhere, "named": "c", "fresh": rendezvous("fresh", ["a", "b", "c"])}
    grouped = shard_set.by_shard(["moved", "named", "fresh"])
    assert sorted(site for group in grouped.values() for site in group) == ["fresh", "moved", "named"]
    assert list(grouped) == [name for name in "abc" if name in grouped]  # in the order REDIS_URL names them


def test_a_site_left_on_two_shards_by_a_move_cut_short_is_taken_at_its_home() -> None:
    shard_set, clients = _shard_set(Settings(), ["a", "b"])
    home = rendezvous("shop", ["a", "b"])
    for client in clients.values():
        client.sadd(keys.sites(), "shop")
    assert shard_set.where("shop") == home


def test_one_shard_locates_without_asking_redis() -> None:
    asked: list[str] = []

    def connect(url: str) -> Redis:
        asked.append(url)
        raise AssertionError("no connection needed")

    shard_set = ShardSet([Shard("default", "redis://h/0")], Settings(), connect)
    assert shard_set.locate(["x", "y"]) == {"x": "default", "y": "default"}
    assert asked == []


def test_an_unknown_shard_name_says_which_there_are() -> None:
    shard_set, _ = _shard_set(Settings(), ["a", "b"])
    with pytest.raises(ConfigError, match="no shard 'z'; the shards are: a, b"):
        shard_set.shard("z")


def test_a_site_is_looked_up_once_for_the_life_of_the_set() -> None:
    shard_set, clients = _shard_set(Settings(), ["a", "b"])
    asked: list[str] = []
    for name, client in clients.items():
        original = client.pipeline
        client.pipeline = lambda *args, name=name, original=original, **kwargs: (
            asked.append(name) or original(*args, **kwargs)
        )  # type: ignore[method-assign]
    shard_set.where("shop")
    shard_set.where("shop")
    shard_set.client_for("shop")
    assert asked == ["a", "b"]  # one look a shard, then the answer kept
