"""A pipeline whose ``open(spider)`` hangs fails its own site's pages, bounded in time, and no other site's."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from crawling import installed_runtime, items_by_key, run_in_threads
from redis import Redis

from crawler import Page, Spider
from crawler.cli.app import cli
from crawler.coord.frontier import seed
from crawler.demo import ShopSite
from crawler.settings import Settings
from crawler.spiders import items
from crawler.spiders.items import ItemError, Pipelines
from crawler.work.runtime import Runtime

Invoke = Callable[..., Result]

SPIDERS = """
import threading

from crawler.demo.spider import DemoShop

#: Set by the test: until then, Stuck.open waits (forever).
RELEASE = threading.Event()


class Stuck:
    open_timeout = 0.5  # its own, over OPEN_TIMEOUT

    def open(self, spider):
        RELEASE.wait()

    def process_item(self, item, spider, page):
        item["via"] = "stuck"
        return item


class Plain:
    def open(self, spider):
        pass

    def process_item(self, item, spider, page):
        item["via"] = "plain"
        return item


class StuckShop(DemoShop):
    name = "stuck"
    pipelines = [Stuck]


class FineShop(DemoShop):
    name = "fine"
    pipelines = [Plain]
"""


@pytest.fixture
def invoke(redis_url: str, settings: Settings) -> Invoke:
    base = ["--redis-url", redis_url, "--database-url", settings.database_url, "--sites", settings.sites_dir]
    runner = CliRunner()
    return lambda *args: runner.invoke(cli, [*base, *args], env={"COLUMNS": "250"})


@pytest.fixture(autouse=True)
def forget_site_modules() -> Iterator[None]:
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("crawler_sites"):
            del sys.modules[name]


def release(runtime: Runtime) -> None:
    """Let the stuck pipeline's open return: the event of the module the runtime loaded (a command
    run since may have loaded the module again, with an event of its own)."""
    stuck: Any = runtime.spider_set.get("stuck").pipelines[0]
    stuck.open.__globals__["RELEASE"].set()


def test_a_pipeline_whose_open_hangs_fails_its_sites_pages_while_another_site_is_parsed_then_retried(
    redis_conn: Redis, invoke: Invoke, settings: Settings
) -> None:
    Path(settings.sites_dir, "shops.py").write_text(SPIDERS)
    with (
        ShopSite(products=6, faults=False) as stuck,
        ShopSite(products=6, faults=False) as fine,
        installed_runtime(redis_conn, settings) as runtime,
    ):
        try:
            seed(runtime.frontier("stuck"), [stuck.url + "/"])
            seed(runtime.frontier("fine"), [fine.url + "/"])
            began = time.monotonic()
            run_in_threads(runtime, ("stuck", "fine"))  # one parse worker for both sites
            assert time.monotonic() - began < 30  # the crawl ended by itself, not held by the open

            assert items_by_key(settings.database_url, "fine") == {
                sku: {**item, "via": "plain"} for sku, item in fine.expected_items().items()
            }
            assert items_by_key(settings.database_url, "stuck") == {}
            (failed,) = json.loads(invoke("failed", "stuck", "--json").stdout)
            assert (failed["url"], failed["kind"]) == (stuck.url + "/", "parse")
            assert failed["reason"].startswith("pipeline Stuck did not open within 0.5s (still opening")
            assert json.loads(invoke("failed", "fine", "--json").stdout) == []

            release(runtime)  # the open returns
            assert invoke("retry", "stuck", "--all").stdout.strip() == "stuck: 1 failed page requeued"
            run_in_threads(runtime, ("stuck", "fine"))
            assert items_by_key(settings.database_url, "stuck") == {
                sku: {**item, "via": "stuck"} for sku, item in stuck.expected_items().items()
            }
        finally:
            release(runtime)  # the thread its open waits in ends, whatever happened


class Sleepy(Spider):
    name = "sleepy"

    def parse(self, page: Page) -> list:
        return []


class Slow:
    def open(self, spider: Spider) -> None:
        time.sleep(0.6)

    def process_item(self, item: dict, spider: Spider, page: Page) -> dict:
        return item


class Failing:
    def open(self, spider: Spider) -> None:
        time.sleep(0.6)
        raise RuntimeError("no licence")

    def process_item(self, item: dict, spider: Spider, page: Page) -> dict:
        return item


def test_an_open_that_overruns_fails_at_once_while_under_way_then_its_result_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(items, "OPEN_TIMEOUT", 0.2)
    spider = type("SlowShop", (Sleepy,), {"pipelines": [Slow]})()
    with pytest.raises(ItemError, match=r"^pipeline Slow did not open within 0.2s"):
        Pipelines.open(spider)
    began = time.monotonic()
    with pytest.raises(ItemError, match=r"still opening"):
        Pipelines.open(spider)  # no second thread, no second wait
    assert time.monotonic() - began < 0.1
    time.sleep(0.6)
    opened = Pipelines.open(spider)  # the late opening's pipelines, not another one's
    assert [type(p) for p in opened.pipelines] == [Slow]

    failing = type("FailingShop", (Sleepy,), {"pipelines": [Failing]})()
    with pytest.raises(ItemError, match="did not open within"):
        Pipelines.open(failing)
    time.sleep(0.6)
    with pytest.raises(ItemError, match=r"^pipeline Failing failed to open: RuntimeError: no licence$"):
        Pipelines.open(failing)  # its late error, once
    with pytest.raises(ItemError, match="did not open within"):
        Pipelines.open(failing)  # then a fresh try


def test_a_sites_open_under_way_holds_up_no_other_sites_pipelines(redis_conn: Redis, settings: Settings) -> None:
    Path(settings.sites_dir, "shops.py").write_text(SPIDERS)
    with installed_runtime(redis_conn, settings) as runtime:
        try:
            stuck = threading.Thread(target=lambda: pytest.raises(ItemError, runtime.pipelines, "stuck"))
            stuck.start()
            deadline = time.monotonic() + 5
            while "stuck" not in runtime._opening and time.monotonic() < deadline:
                time.sleep(0.01)
            assert runtime._opening["stuck"].locked()  # the stuck site's open is under way
            began = time.monotonic()
            opened = runtime.pipelines("fine")
            assert [type(p).__name__ for p in opened.pipelines] == ["Plain"]
            assert runtime._opening["stuck"].locked()  # taken while the other was still opening
            assert time.monotonic() - began < 0.5
            stuck.join(5)
        finally:
            release(runtime)
