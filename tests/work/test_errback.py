"""Errbacks: a request that finally fails is handed, once, to its errback in a parse worker.

Real crawls (``crawler.testing.crawl``: an embedded Redis, download and parse workers in
threads) of a loopback site whose answers each test sets (``routes``).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from routes import Answer, Routes, serving

from crawler import Failure, Page, Request, Spider
from crawler.coord.task import DownloadTask
from crawler.testing import crawl

pytestmark = pytest.mark.integration  # each crawl starts its own Redis server

FAST = {"max_retries": 1, "backoff": 0.05}


def failure_item(failure: Failure) -> dict[str, Any]:
    """What an errback here stores of what it was told."""
    return {
        "url": failure.url,
        "kind": failure.kind,
        "status": failure.status,
        "attempts": failure.attempts,
        "method": failure.method,
        "body": failure.page.text if failure.page is not None else None,
        "meta": failure.meta,
        "error": failure.error,
    }


class MirrorSpider(Spider):
    """A product whose main URL is gone: the errback tries its mirror."""

    name = "mirrored"
    allowed_domains = ["127.0.0.1"]

    def parse(self, page: Page) -> Iterator[Any]:
        yield page.follow("/gone", self.parse_product, errback=self.try_mirror, meta={"sku": "A-1"})

    def parse_product(self, page: Page) -> Iterator[Any]:
        yield {"sku": page.meta["sku"], "from": page.url.rsplit("/", 1)[1], "title": page.css_first("h1").text()}

    def try_mirror(self, failure: Failure) -> Iterator[Any]:
        yield {"sku": "failure", **failure_item(failure)}
        yield Request(failure.url.replace("/gone", "/mirror"), self.parse_product, meta=failure.meta)


def test_a_404_goes_to_the_errback_which_fetches_a_mirror_and_the_failure_stays_recorded() -> None:
    routes = Routes(
        {
            "/": Answer("<html><body>home</body></html>"),
            "/gone": Answer("<html><body><p>moved away</p></body></html>", 404),
            "/mirror": Answer("<html><body><h1>Widget</h1></body></html>"),
        }
    )
    with serving(routes) as base:
        result = crawl(MirrorSpider, [base + "/"], interval=0.01, settings=FAST, item_key="sku")
    told = result.keyed["failure"]
    assert told["url"] == base + "/gone" and told["kind"] == "status" and told["status"] == 404
    assert told["attempts"] == 1 and told["method"] == "GET" and told["meta"] == {"sku": "A-1"}
    assert "moved away" in told["body"]  # the answer's body, when there was one
    assert result.keyed["A-1"] == {"sku": "A-1", "from": "mirror", "title": "Widget"}
    gone = [r for r in result.fetches if r["url"] == base + "/gone"]
    assert [(r["kind"], r["outcome"]) for r in gone] == [("download", "failed"), ("parse", "ok")]  # once each
    assert gone[1]["callback"] == "try_mirror"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class DefaultErrbackSpider(Spider):
    """No request names an errback: the spider's own ``errback`` method takes every failure."""

    name = "defaulted"
    allowed_domains = ["127.0.0.1"]
    obey_robots = False  # the unreachable host's robots.txt would fail first

    def parse(self, page: Page) -> Iterator[Any]:
        yield {"sku": "never"}

    def errback(self, failure: Failure) -> Iterator[Any]:
        yield {"sku": failure.kind, **failure_item(failure)}


def test_no_connection_after_the_retries_goes_to_the_spiders_own_errback_with_no_page() -> None:
    url = f"http://127.0.0.1:{closed_port()}/product"
    result = crawl(DefaultErrbackSpider, [url], interval=0.01, settings=FAST)
    (told,) = result.items
    assert (told["kind"], told["status"], told["body"]) == ("connection", None, None)
    assert told["attempts"] == FAST["max_retries"] + 1  # called once, after the last retry
    assert [(r["kind"], r["outcome"]) for r in result.fetches if r["url"] == url] == [
        ("download", "retry"),
        ("download", "failed"),
        ("parse", "ok"),
    ]


class NamedErrbackSpider(Spider):
    """The spider's ``errback`` names a method; robots.txt refuses the page."""

    name = "named"
    allowed_domains = ["127.0.0.1"]
    errback = "on_failure"

    def parse(self, page: Page) -> Iterator[Any]:
        yield {"sku": "never"}

    def on_failure(self, failure: Failure) -> Iterator[Any]:
        yield {"sku": failure.kind, **failure_item(failure)}


def test_a_page_robots_txt_refuses_goes_to_the_errback_the_spider_names() -> None:
    routes = Routes({"/robots.txt": Answer("User-agent: *\nDisallow: /private\n")})
    with serving(routes) as base:
        result = crawl(NamedErrbackSpider, [base + "/private/1"], interval=0.01, settings=FAST)
    (told,) = result.items
    assert (told["kind"], told["status"], told["body"]) == ("refused", None, None)
    assert "robots.txt" in told["error"]


class RaisingErrbackSpider(Spider):
    name = "raising"
    allowed_domains = ["127.0.0.1"]

    def parse(self, page: Page) -> Iterator[Any]:
        yield page.follow("/gone", errback=self.broken)
        yield page.follow("/plain")  # no errback here, none on the spider: recorded only

    def broken(self, failure: Failure) -> Iterator[Any]:
        raise RuntimeError(f"the errback broke on {failure.url}")


def test_an_errback_that_raises_is_recorded_with_its_traceback_and_calls_no_errback() -> None:
    routes = Routes({"/": Answer("<p>home</p>"), "/gone": Answer("gone", 410), "/plain": Answer("gone too", 404)})
    with serving(routes) as base:
        result = crawl(RaisingErrbackSpider, [base + "/"], interval=0.01, settings=FAST)
    gone = [(r["kind"], r["outcome"]) for r in result.fetches if r["url"] == base + "/gone"]
    assert gone == [("download", "failed"), ("parse", "failed")]  # once: the errback's failure is not handed on
    (parse,) = [r for r in result.fetches if r["url"] == base + "/gone" and r["kind"] == "parse"]
    assert "RuntimeError: the errback broke on" in parse["error"]
    plain = [(r["kind"], r["outcome"]) for r in result.fetches if r["url"] == base + "/plain"]
    assert plain == [("download", "failed")]  # no errback: no parse entry
    assert result.items == []


def test_a_requests_errback_rides_in_its_task_and_a_malformed_one_is_refused() -> None:
    spider = MirrorSpider()
    request = Request("http://127.0.0.1/a", errback=spider.try_mirror)
    assert request.errback == "try_mirror" and not request.is_plain
    task = DownloadTask.from_entry("mirrored", DownloadTask("mirrored", request.url, errback="try_mirror").to_entry())
    assert task.errback == "try_mirror"
    assert DownloadTask.from_json({"site": "s", "url": "http://h/"}).errback is None
    with pytest.raises(ValueError, match="errback"):
        DownloadTask.from_json({"site": "s", "url": "http://h/", "errback": "os.system('x')"})
