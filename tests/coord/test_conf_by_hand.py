"""A site's hashes in Redis written by hand: what does not hold is ignored, once, and the crawl goes on.

Anyone who can write to Redis can HSET a site's live settings (``crawler:settings:{SITE}``,
``crawler set``'s) or its conf (``crawler:conf:{SITE}``, the politeness the scheduler and the
gate read). Neither may stop a worker, stall the crawl or break ``crawler status``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import installed_runtime, items_by_key, run_in_threads
from redis import Redis

from crawler.cli.app import cli
from crawler.coord import keys
from crawler.coord.frontier import seed
from crawler.demo import ShopSite
from crawler.settings import Settings
from crawler.work.runtime import REPUBLISH_EVERY, Runtime

Invoke = Callable[..., Result]

#: Seconds the crawl may take: under REPUBLISH_EVERY, so a junk conf field is not simply written over meanwhile.
CRAWL_WITHIN = REPUBLISH_EVERY * 2 / 3

AUTO_SHOP = """
from crawler import Auto
from crawler.demo.spider import DemoShop


class AutoShop(DemoShop):
    name = "autoshop"
    interval = Auto(min=0.02, max=0.5)
"""


@pytest.fixture
def invoke(redis_url: str, settings: Settings) -> Invoke:
    base = ["--redis-url", redis_url, "--database-url", settings.database_url, "--sites", settings.sites_dir]

    def run(*args: str) -> Result:
        return CliRunner().invoke(cli, [*base, *args], env={"COLUMNS": "200"})

    return run


def status_of(invoke: Invoke, site: str) -> dict:
    result = invoke("status", site, "--json")
    assert result.exit_code == 0, result.output
    (status,) = json.loads(result.stdout)["sites"]
    return status


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


@pytest.mark.parametrize(
    "junk",
    [
        {"interval": "abc", "concurrency": "x"},
        {"interval": "-1", "concurrency": "0"},
        {"interval": "inf", "concurrency": "1e999"},
        {"interval": "1e999", "paused": "yes", "surprise": "1"},
    ],
    ids=["words", "zero-and-negative", "infinite", "unknown-field"],
)
def test_live_settings_written_by_hand_that_do_not_hold_are_ignored_once_and_the_crawl_ends(
    runtime: Runtime,
    redis_conn: Redis,
    settings: Settings,
    invoke: Invoke,
    caplog: pytest.LogCaptureFixture,
    junk: dict[str, str],
) -> None:
    redis_conn.hset(keys.live_settings("demo"), mapping=junk)
    with ShopSite(products=5, faults=False) as shop:
        seed(runtime.frontier("demo"), [shop.url + "/"])
        run_in_threads(runtime, ("demo",), timeout=CRAWL_WITHIN)
        assert len(items_by_key(settings.database_url)) == 5
    for name in junk:  # each bad value warned about once, however many workers and reads met it
        if name != "surprise":
            assert len(warnings_about(caplog, f"live setting {name} of demo")) == 1, caplog.text
    redis_conn.hset(keys.live_settings("demo"), mapping=junk)
    for _ in range(2):
        status = status_of(invoke, "demo")
        assert (status["interval"], status["interval_source"], status["paused"]) == (0.02, "spider", False)


@pytest.mark.parametrize(
    "junk",
    [
        {"interval_ms": "abc", "concurrency": "x", "paused": "maybe", "batch": "many"},
        {"interval_ms": "-1", "concurrency": "0", "margin_ms": "-5000", "batch": "0"},
        {"robots_delay_ms": "inf", "margin_ms": "nan", "closed_until": "soon", "closed_why": "\udcff"},
        {"robots_delay_ms": "1e999", "concurrency": "-3", "surprise": "1", "interval_ms": "1e999"},
        {"robots_delay_ms": "abc", "closed_until": "1e999", "gate": "not-a-gate"},
        {"gate": "\udcff\udcfe"},
    ],
    ids=["words", "zero-and-negative", "infinite-and-nan", "huge", "unknown-gate", "binary-gate"],
)
def test_a_conf_written_by_hand_that_does_not_hold_is_ignored_and_the_crawl_ends(
    runtime: Runtime,
    redis_conn: Redis,
    settings: Settings,
    invoke: Invoke,
    caplog: pytest.LogCaptureFixture,
    junk: dict[str, str],
) -> None:
    with ShopSite(products=5, faults=False) as shop:
        runtime.publish("demo")  # as ``crawler seed`` does: the junk comes after
        seed(runtime.frontier("demo"), [shop.url + "/"])
        redis_conn.hset(keys.conf("demo"), mapping={k: v.encode("utf-8", "surrogateescape") for k, v in junk.items()})
        run_in_threads(runtime, ("demo",), timeout=CRAWL_WITHIN)
        assert len(items_by_key(settings.database_url)) == 5
    redis_conn.hset(keys.conf("demo"), mapping={k: v.encode("utf-8", "surrogateescape") for k, v in junk.items()})
    for _ in range(2):
        status = status_of(invoke, "demo")
        assert (status["interval"], status["interval_source"]) == (0.02, "spider")
        assert invoke("status").exit_code == 0
    for name in ("robots_delay_ms", "closed_until"):  # the fields status reads: each bad value warned about once
        if name in junk:
            assert len(warnings_about(caplog, f"demo: conf field {name}=")) == 1, caplog.text


@pytest.mark.parametrize("pace", ["abc", "nan", "inf", "-1", "1e999"])
def test_an_adaptive_pace_written_by_hand_that_does_not_hold_is_ignored_and_the_crawl_ends(
    redis_conn: Redis, settings: Settings, invoke: Invoke, caplog: pytest.LogCaptureFixture, pace: str
) -> None:
    Path(settings.sites_dir, "autoshop.py").write_text(AUTO_SHOP)
    with ShopSite(products=5, faults=False) as shop, installed_runtime(redis_conn, settings) as runtime:
        seed(runtime.frontier("autoshop"), [shop.url + "/"])
        redis_conn.hset(keys.conf("autoshop"), "pace_ms", pace)
        run_in_threads(runtime, ("autoshop",), timeout=CRAWL_WITHIN)
        assert len(items_by_key(settings.database_url, "autoshop")) == 5
    redis_conn.hset(keys.conf("autoshop"), "pace_ms", pace)
    for _ in range(2):
        status = status_of(invoke, "autoshop")
        assert (status["interval"], status["interval_why"]) == (0.02, "auto 0.02s (min)"), status
    assert len(warnings_about(caplog, f"autoshop: conf field pace_ms={pace!r}")) == 1, caplog.text
