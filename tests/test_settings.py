"""Settings: precedence, validation of file, environment and flags, and URL redaction."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
from crawling import items_by_key
from redis import Redis

from crawler.coord import keys, quarantine
from crawler.coord.changes import announce
from crawler.coord.frontier import seed
from crawler.coord.policy import PolicyCache, quarantine_live
from crawler.demo import ShopSite
from crawler.demo.spider import DemoShop
from crawler.errors import ConfigError
from crawler.settings import (
    DEFAULT_DATABASE_URL,
    DEFAULT_TIMEOUT,
    Settings,
    check_live,
    load_settings,
    redact_url,
    scrub,
    url_secrets,
)
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.work.runtime import Runtime


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No crawler variable from the machine running the tests leaks in."""
    for field in dataclasses.fields(Settings):
        monkeypatch.delenv(field.name.upper(), raising=False)
        monkeypatch.delenv(f"CRAWLER_{field.name.upper()}", raising=False)


@pytest.fixture
def config(tmp_path: Path):  # type: ignore[no-untyped-def]
    def write(text: str) -> Path:
        path = tmp_path / "crawler.yaml"
        path.write_text(text)
        return path

    return write


# precedence ------------------------------------------------------------------------------


def test_defaults_apply_when_nothing_is_given() -> None:
    settings = load_settings()
    assert settings.timeout == DEFAULT_TIMEOUT
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.redis_url is None


def test_flag_beats_environment_beats_file_beats_default(config, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    path = config("timeout: 5\nredis_url: redis://file/0\ndatabase_url: sqlite:///file.db\n")
    assert load_settings(path).timeout == 5.0

    monkeypatch.setenv("CRAWLER_TIMEOUT", "7")
    monkeypatch.setenv("REDIS_URL", "redis://env/0")
    monkeypatch.setenv("DATABASE_URL", "sqlite:///env.db")
    from_env = load_settings(path)
    assert (from_env.timeout, from_env.redis_url, from_env.database_url) == (7.0, "redis://env/0", "sqlite:///env.db")

    flagged = load_settings(path, timeout=9, redis_url="redis://flag/0", database_url=None)
    assert (flagged.timeout, flagged.redis_url, flagged.database_url) == (9.0, "redis://flag/0", "sqlite:///env.db")


def test_empty_environment_variable_is_ignored(config, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CRAWLER_TIMEOUT", "")
    assert load_settings(config("timeout: 5\n")).timeout == 5.0


def test_environment_value_of_wrong_type_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLER_TIMEOUT", "abc")
    with pytest.raises(ConfigError, match=r"environment CRAWLER_TIMEOUT: timeout must be float, got 'abc'"):
        load_settings()


def test_environment_numbers_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLER_MAX_RETRIES", " 4 ")
    monkeypatch.setenv("CRAWLER_BACKOFF", "0.5")
    settings = load_settings()
    assert settings.max_retries == 4 and isinstance(settings.max_retries, int)
    assert settings.backoff == 0.5


def test_empty_config_file_gives_defaults(config) -> None:  # type: ignore[no-untyped-def]
    assert load_settings(config("")) == Settings()


# malformed config --------------------------------------------------------------------------


def test_malformed_yaml_names_the_line(config) -> None:  # type: ignore[no-untyped-def]
    path = config("timeout: 5\nbackoff: 1\nsites: [\n  a\n")
    with pytest.raises(ConfigError, match=r"not valid YAML \(line \d+\)") as info:
        load_settings(path)
    assert str(path) in str(info.value)


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "absent.yaml")


def test_unknown_key_is_named(config) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"unknown setting 'timout'"):
        load_settings(config("timout: 5\n"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('timeout: "abc"\n', r"timeout must be float, got 'abc'"),
        ("timeout: true\n", r"timeout must be float, got True"),
        ("max_retries: 1.5\n", r"max_retries must be int, got 1.5"),
        ("max_body_bytes: [1]\n", r"max_body_bytes must be int"),
        ("redis_url: 5\n", r"redis_url must be str, got 5"),
        ("user_agent: {a: 1}\n", r"user_agent must be str"),
    ],
)
def test_wrong_type_is_named_in_the_error(config, text: str, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=message):
        load_settings(config(text))


def test_number_strings_in_the_file_are_accepted(config) -> None:  # type: ignore[no-untyped-def]
    assert load_settings(config('max_retries: "2"\ntimeout: "2.5"\n')).max_retries == 2


@pytest.mark.parametrize("text", ["- timeout\n- 5\n", "just a string\n", "42\n"])
def test_non_mapping_file_is_refused(config, text: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_settings(config(text))


@pytest.mark.parametrize(
    ("values", "name"),
    [
        ({"timeout": 0}, "timeout"),
        ({"backoff": -1}, "backoff"),
        ({"gate_margin": -0.1}, "gate_margin"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_body_bytes": 0}, "max_body_bytes"),
        ({"timeout": float("inf")}, "timeout"),
        ({"backoff": float("nan")}, "backoff"),
        ({"gate_margin": float("inf")}, "gate_margin"),
        ({"gate_margin": float("nan")}, "gate_margin"),
    ],
)
def test_out_of_range_values_are_named(values: dict[str, float], name: str) -> None:
    with pytest.raises(ConfigError, match=rf"config: {name} must be"):
        Settings(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("agent", ["crawlér/1.0", "", "a\nb"])
def test_a_user_agent_that_cannot_be_sent_is_refused(agent: str) -> None:
    """httpx refuses a header outside ASCII: every fetch of the worker would have raised."""
    with pytest.raises(ConfigError, match="config: user_agent must be printable ASCII text"):
        Settings(user_agent=agent)


# per-site overrides --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sites", "message"),
    [
        ({"x": {"interval": 0}}, r"sites\.x\.interval must be a number of seconds greater than 0 .*, got 0"),
        ({"x": {"interval": float("nan")}}, r"sites\.x\.interval must be .*, got nan"),
        ({"x": {"interval": float("inf")}}, r"sites\.x\.interval must be .*, got inf"),
        ({"x": {"interval": 86_401}}, r"sites\.x\.interval must be .*, got 86401"),
        ({"x": {"concurrency": 0}}, r"sites\.x\.concurrency must be a whole number from 1 to 10000, got 0"),
        ({"x": {"concurrency": 10**6}}, r"sites\.x\.concurrency must be a whole number from 1 to 10000"),
        ({"x": {"interval": "fast"}}, r"sites\.x\.interval must be"),
        ({"x": {"concurrency": 1.5}}, r"sites\.x\.concurrency must be a whole number"),
        ({"x": {"obey_robots": "yes"}}, r"sites\.x\.obey_robots must be true or false"),
        ({"x": {"speed": 1}}, r"sites\.x\.speed is not a site setting"),
        ({"x": 3}, r"sites\.x must be a mapping"),
    ],
)
def test_site_overrides_are_validated_when_built(sites: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=message):
        Settings(sites=sites)


def test_site_overrides_in_the_file_are_validated(config) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"sites\.x\.interval"):
        load_settings(config("sites: {x: {interval: 0}}\n"))


def test_site_overrides_in_the_file_are_kept(config) -> None:  # type: ignore[no-untyped-def]
    settings = load_settings(config("sites:\n  shop: {interval: 0.5, concurrency: 2, obey_robots: false}\n"))
    assert settings.sites == {"shop": {"interval": 0.5, "concurrency": 2, "obey_robots": False}}


def test_sites_that_is_not_a_mapping_is_refused(config) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="sites must be a mapping"):
        load_settings(config("sites: [shop]\n"))


# redact_url -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("redis://:s3cret@cache:6379/0", "redis://***@cache:6379/0"),
        ("redis://user:s3cret@cache:6379/0", "redis://***@cache:6379/0"),
        ("rediss://default:s3cret@cache.example:6380", "rediss://***@cache.example:6380"),
        ("postgresql://crawler:s3cret@db:5432/crawl", "postgresql://***@db:5432/crawl"),
        (
            "postgresql+psycopg://crawler:s3cret@db/crawl?sslmode=require",
            "postgresql+psycopg://***@db/crawl?sslmode=require",
        ),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("unix:///tmp/redis.sock?db=0", "unix:///tmp/redis.sock?db=0"),
        ("sqlite:///crawl.db", "sqlite:///crawl.db"),
        ("redis://cache:6379/0?password=s3cret", "redis://cache:6379/0?password=***"),
        ("unix:///tmp/r.sock?db=0&password=s3cret", "unix:///tmp/r.sock?db=0&password=***"),
        (
            "postgresql://db/crawl?user=u&password=s3cret&sslmode=require",
            "postgresql://db/crawl?user=u&password=***&sslmode=require",
        ),
        ("postgresql://u@db/crawl?sslpassword=s3cret", "postgresql://***@db/crawl?sslpassword=***"),
        ("redis://:s3cret@cache/0?password=s3cret", "redis://***@cache/0?password=***"),
    ],
)
def test_redact_url_hides_user_and_password(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
    assert "s3cret" not in redact_url(url)


def test_redact_url_hides_a_password_containing_at_sign() -> None:
    assert redact_url("redis://:p@ssw0rd@cache:6379/0") == "redis://***@cache:6379/0"


def test_secrets_of_a_url_are_scrubbed_from_any_message_in_every_spelling() -> None:
    url = "redis://:pa%40ss1@cache/0?password=hunter22"
    secrets = url_secrets(url)
    assert set(secrets) == {"pa%40ss1", "pa@ss1", "hunter22"}
    message = f"cannot parse {url}; AUTH pa@ss1 refused; hunter22"
    assert scrub(message, secrets) == "cannot parse redis://:***@cache/0?password=***; AUTH *** refused; ***"


# live settings written by hand -------------------------------------------------------------

LIVE_INTERVAL = 0.1  # the spider's own interval in the live-settings crawl
PACED_SPIDER = f"""
from crawler.demo.spider import DemoShop


class Paced(DemoShop):
    name = "paced"
    interval = {LIVE_INTERVAL}
"""


def test_junk_live_settings_written_by_hand_mid_crawl_are_quarantined_and_workers_crawl_on(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    """``interval nan`` and ``concurrency ten``, written with HSET while real workers crawl (and
    announced, as a writer of junk may: ``changes``).

    Before: the download workers died (``cannot convert float NaN to integer``, ``invalid
    literal for int()``). After: each value is quarantined with its reason and dropped
    from the hash, the spider's interval spaces the rest of the crawl, and the burst
    workers drain the shop and exit 0.
    """
    Path(settings.sites_dir, "paced.py").write_text(PACED_SPIDER)
    with ShopSite(products=24, faults=False) as shop:
        rt = Runtime(redis_conn, settings)
        try:
            seed(rt.frontier("paced"), [shop.url + "/"])
        finally:
            rt.close()
        specs = [WorkerSpec("download", ("paced",), threads=2, burst=True), WorkerSpec("parse", ("paced",), burst=True)]
        processes = start_workers(specs, settings, redis_url)
        done = threading.Event()
        threading.Thread(target=lambda: done.wait(60) or stop_workers(processes, timeout=10), daemon=True).start()
        try:
            deadline = time.monotonic() + 60
            while len(shop.requests) < 4:
                assert time.monotonic() < deadline, "the crawl never started"
                time.sleep(0.01)
            written = time.time()  # the shop logs arrivals on this clock
            redis_conn.hset(keys.live_settings("paced"), mapping={"interval": "nan", "concurrency": "ten"})
            announce(redis_conn)  # read at once; unannounced, at the recheck (test_changes.py)
            code = wait_for(processes)
        finally:
            done.set()
        after = [entry.time for entry in shop.requests if entry.time > written]
        expected = shop.expected_items()

    assert code == 0, "a download worker died on a live setting written by hand"
    assert items_by_key(settings.database_url, site="paced") == expected
    assert len(after) >= 10, "the crawl was over before the workers read the junk"
    gaps = [b - a for a, b in zip(after, after[1:])]
    assert min(gaps) >= LIVE_INTERVAL, f"two requests {min(gaps) * 1000:.1f} ms apart after the junk"
    reasons = sorted(q.reason for q in quarantine.entries(redis_conn))
    assert reasons == [
        "live setting concurrency of paced: must be a whole number from 1 to 10000, got 'ten'",
        "live setting interval of paced: must be a number of seconds greater than 0 and at most 86400, got 'nan'",
    ]
    assert redis_conn.hgetall(keys.live_settings("paced")) == {}  # dropped: quarantined once, not every second


@pytest.mark.parametrize(
    ("field", "raw", "why"),
    [
        ("interval", "nan", "must be a number of seconds greater than 0 and at most 86400, got 'nan'"),
        ("interval", "inf", "must be a number of seconds greater than 0 and at most 86400, got 'inf'"),
        ("interval", "1e999", "must be a number of seconds greater than 0 and at most 86400, got '1e999'"),
        ("interval", "-1", "must be a number of seconds greater than 0 and at most 86400, got '-1'"),
        ("interval", "0", "must be a number of seconds greater than 0 and at most 86400, got '0'"),
        ("interval", "soon", "must be a number of seconds greater than 0 and at most 86400, got 'soon'"),
        ("concurrency", "ten", "must be a whole number from 1 to 10000, got 'ten'"),
        ("concurrency", "0", "must be a whole number from 1 to 10000, got '0'"),
        ("concurrency", "2.5", "must be a whole number from 1 to 10000, got '2.5'"),
        ("concurrency", "99999999999999999999", "must be a whole number from 1 to 10000, got '99999999999999999999'"),
        ("paused", "yes", "must be 1 (paused) or 0, got 'yes'"),
    ],
)
def test_a_live_value_that_does_not_hold_is_named_and_left_out(field: str, raw: str, why: str) -> None:
    good, bad = check_live({field: raw, "other": "x"})
    assert (good, bad) == ({}, {field: why})


def test_live_values_that_hold_are_read() -> None:
    assert check_live({"interval": "0.5", "concurrency": "3", "paused": "1"}) == (
        {"interval": 0.5, "concurrency": 3, "paused": True},
        {},
    )
    assert check_live({"paused": "0"}) == ({"paused": False}, {})


def test_junk_met_by_several_workers_is_quarantined_once_and_a_value_put_right_stays(
    fake_redis: Redis, settings: Settings
) -> None:
    spiders = {"demo": DemoShop}
    first, second = PolicyCache(fake_redis, settings, spiders), PolicyCache(fake_redis, settings, spiders)
    fake_redis.hset(keys.live_settings("demo"), mapping={"interval": "inf", "concurrency": "4", "paused": "1"})
    for cache in (first, second):
        policy = cache.get("demo", fresh=True)
        assert (policy.interval, policy.sources["interval"]) == (DemoShop.interval, "spider")
        assert (policy.concurrency, policy.paused) == (4, True)  # the values that hold apply
    (entry,) = quarantine.entries(fake_redis)
    assert (entry.source, entry.content) == (keys.live_settings("demo"), {"interval": "inf"})
    assert fake_redis.hgetall(keys.live_settings("demo")) == {b"concurrency": b"4", b"paused": b"1"}

    # Read as junk, then put right before the drop: the right value is kept.
    fake_redis.hset(keys.live_settings("demo"), "interval", "2")
    quarantine_live(fake_redis, "demo", {"interval": "..."}, {"interval": "nan"})
    assert fake_redis.hget(keys.live_settings("demo"), "interval") == b"2"
    assert quarantine.count(fake_redis) == 1


def test_a_site_policy_read_again_unchanged_is_kept_not_resolved_again(
    fake_redis: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-read every second at each site, the live settings were resolved each time: 9 % of a parse
    process's CPU at 200 slow sites. Unchanged, the policy held stays (read again now); changed, or
    holding a value that does not hold (checked again until it is quarantined), it is resolved."""
    from crawler.coord import policy as policy_module

    resolved: list[dict[str, str]] = []
    resolve = policy_module.resolve_policy
    monkeypatch.setattr(
        policy_module, "resolve_policy", lambda s, c, live: resolved.append(live) or resolve(s, c, live)
    )
    cache = PolicyCache(fake_redis, settings, {"demo": DemoShop})
    cache.put("demo", {"interval": "2"}, read_at=1.0)
    kept = cache.held("demo")
    assert kept is not None and kept.interval == 2.0
    cache.put("demo", {"interval": "2"}, read_at=5.0)
    assert cache.held("demo") is kept and cache.read_at("demo") == 5.0 and len(resolved) == 1
    cache.put("demo", {"interval": "3"}, read_at=6.0)
    changed = cache.held("demo")
    assert changed is not None and changed.interval == 3.0 and len(resolved) == 2
    monkeypatch.setattr(policy_module, "quarantine_live", lambda *args: None)  # as when its transaction lost a race
    cache.put("demo", {"interval": "nan"}, read_at=7.0)
    cache.put("demo", {"interval": "nan"}, read_at=8.0)
    assert len(resolved) == 4, "a value that does not hold was left unchecked"
