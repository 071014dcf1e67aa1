"""The download job's steps, one at a time (``jobs.Attempt``), on a real loopback shop and Redis.

``test_jobs`` pins what a whole download leaves behind; these pin each step's own
contract: what it hands to the next step, what it records, and when it stops.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from redis import Redis

from crawler.coord import keys, quarantine
from crawler.coord.frontier import DownloadTask, Frontier
from crawler.demo import ShopSite
from crawler.http.fetch import Response
from crawler.spiders.spider import HTML_TYPES
from crawler.store.database import FAILED, OK, REDIRECT, REFUSED, RETRY
from crawler.work import jobs
from crawler.work.events import HeldRecords
from crawler.work.jobs import Verdict, classify
from crawler.work.jobs import attempt as attempts
from crawler.work.jobs.context import site_context
from crawler.work.runtime import Runtime

SITE = "demo"


def attempt_at(
    rt: Runtime, url: str, callback: str = "parse", held: HeldRecords | None = None, **fields: Any
) -> jobs.Attempt:
    taken = attempts.taken(rt, site_context(rt, SITE), DownloadTask(SITE, url, callback, **fields).to_json(), held)
    assert taken is not None
    return taken


def response(status: int, headers: dict[str, str] | None = None, url: str = "http://127.0.0.1/p") -> Response:
    return Response(url, status, headers or {}, b"<html></html>", datetime.now(UTC), 0.01)


def rows(rt: Runtime) -> list[tuple[str, str]]:
    """(URL path, outcome) of the site's download records, oldest first."""
    return [(r["url"].split("/", 3)[-1], r["outcome"]) for r in rt.store.fetch_rows(SITE) if r["kind"] == "download"]


def counted(rt: Runtime) -> dict[str, int]:
    """The site's stats hash once this process's counts are written (``counters``)."""
    rt.counters.flush()
    return {k.decode(): int(v) for k, v in rt.connection.hgetall(keys.stats(SITE)).items()}


@pytest.fixture
def quiet_shop() -> Iterator[ShopSite]:
    """A shop without its faults (no first 503 for product 3), answering ETags."""
    with ShopSite(products=10, faults=False, etags=True) as site:
        yield site


# -- classify: a response's verdict, reading and writing nothing ----------------------------------


@pytest.mark.parametrize(
    ("status", "headers", "conditional", "content_types", "sitemap", "verdict"),
    [
        (304, {}, True, HTML_TYPES, False, Verdict.UNCHANGED),
        # A 304 the request did not ask for is a redirect without a target, not "unchanged".
        (304, {}, False, HTML_TYPES, False, Verdict.NO_LOCATION),
        (301, {"location": "/elsewhere"}, False, HTML_TYPES, False, Verdict.REDIRECT),
        (302, {"location": "/elsewhere"}, True, HTML_TYPES, False, Verdict.REDIRECT),
        (307, {}, False, HTML_TYPES, False, Verdict.NO_LOCATION),
        (200, {"content-type": "text/html; charset=utf-8"}, False, HTML_TYPES, False, Verdict.PARSE),
        (200, {}, False, HTML_TYPES, False, Verdict.PARSE),  # no Content-Type counts as HTML
        (200, {"content-type": "application/pdf"}, False, HTML_TYPES, False, Verdict.NOT_HANDLED),
        (200, {"content-type": "application/pdf"}, False, ("application/*",), False, Verdict.PARSE),
        # A sitemap is taken whatever its type (XML, gzip, text): its parse job reads it.
        (200, {"content-type": "application/gzip"}, False, HTML_TYPES, True, Verdict.PARSE),
        (200, {"content-type": "text/html"}, True, HTML_TYPES, False, Verdict.PARSE),  # a 200 to a refresh
    ],
)
def test_classify_gives_each_response_below_400_its_verdict(
    status: int,
    headers: dict[str, str],
    conditional: bool,
    content_types: tuple[str, ...],
    sitemap: bool,
    verdict: Verdict,
) -> None:
    assert classify(response(status, headers), conditional, content_types, sitemap) is verdict


# -- _taken ---------------------------------------------------------------------------------------


def test_a_url_outside_the_allowed_domains_is_quarantined_when_taken_and_nothing_recorded(
    runtime: Runtime, redis_conn: Redis
) -> None:
    payload = DownloadTask(SITE, "http://elsewhere.test/page").to_json()
    assert attempts.taken(runtime, site_context(runtime, SITE), payload, None) is None
    (refused,) = quarantine.entries(redis_conn)
    assert "download refused when taken" in refused.reason and refused.source == keys.download_queue(SITE)
    assert runtime.store.fetch_rows(SITE) == []
    # The job is done with it: True, not "gate closed".
    assert attempts.download_one(runtime, site_context(runtime, SITE), payload, None)


# -- robots_allow ---------------------------------------------------------------------------------


def test_robots_allow_refuses_a_disallowed_page_without_requesting_it(runtime: Runtime, quiet_shop: ShopSite) -> None:
    attempt = attempt_at(runtime, f"{quiet_shop.url}/private/admin")
    assert attempt.robots_allow() is False
    assert rows(runtime) == [("robots.txt", OK), ("private/admin", REFUSED)]
    assert [entry.path for entry in quiet_shop.requests] == ["/robots.txt"]
    (refused,) = [r for r in runtime.store.fetch_rows(SITE) if r["outcome"] == REFUSED]
    assert refused["error"] == "disallowed by robots.txt"


def test_robots_allow_lets_an_allowed_page_on_recording_only_robots_txt(runtime: Runtime, quiet_shop: ShopSite) -> None:
    attempt = attempt_at(runtime, f"{quiet_shop.url}/product/1")
    assert attempt.robots_allow() is True
    assert rows(runtime) == [("robots.txt", OK)]  # the page's own record is a later step's
    assert attempt.robots_allow() is True  # robots.txt is read from Redis now: not fetched again
    assert [entry.path for entry in quiet_shop.requests] == ["/robots.txt"]


@pytest.mark.parametrize("interval", [0.05, 5.0, 12.0])
def test_a_page_whose_turn_went_to_robots_txt_goes_back_to_its_frontier_when_the_next_is_far(
    redis_conn: Redis, settings: Any, quiet_shop: ShopSite, interval: float
) -> None:
    """robots.txt took the site's turn at its gate: at an interval past TURN_WAIT_MOST (10 s) the page
    goes back to the front of its frontier, for the site's next turn, not holding its thread a whole
    interval. Up to it the page waits for the next turn in its thread, as a paced batch's URLs do (at
    1,000 sites of 5 s, a thread a site); once robots.txt is cached, no page goes back."""
    import dataclasses

    rt = Runtime(redis_conn, dataclasses.replace(settings, sites={SITE: {"interval": interval}}))
    try:
        for path in ("/product/1", "/product/2"):
            attempt = attempt_at(rt, f"{quiet_shop.url}{path}")
            assert attempt.robots_allow() is True
            sent_back = not attempt.next_turn_near()
            first = path == "/product/1"
            assert sent_back == (first and interval > attempts.TURN_WAIT_MOST)
        assert [entry.path for entry in quiet_shop.requests] == ["/robots.txt"]
        handed_back = redis_conn.lrange(keys.frontier(SITE, attempt.task.priority), 0, -1)
        assert len(handed_back) == (1 if interval > attempts.TURN_WAIT_MOST else 0)
        assert all(b"/product/1" in entry for entry in handed_back)
        if handed_back:
            assert redis_conn.zscore(keys.ready(), SITE) is not None  # ready for its next turn
        assert rows(rt) == [("robots.txt", OK)]  # nothing recorded for the page: not attempted yet
    finally:
        rt.close()


# -- build_request, take_gate ---------------------------------------------------------------------


def test_build_request_makes_a_refresh_conditional_and_refuses_an_unbuildable_header(
    runtime: Runtime, quiet_shop: ShopSite
) -> None:
    url = f"{quiet_shop.url}/product/1"
    refresh = attempt_at(runtime, url, validators=('"abc"', None), refresh=60.0)
    assert refresh.build_request() is True
    assert refresh.conditional == {"if-none-match": '"abc"'} and refresh.headers["if-none-match"] == '"abc"'

    bad = attempt_at(runtime, url, headers={"X-Name": "caf\u00e9 \u2615"}, refresh=60.0)
    assert bad.build_request() is False
    ((_, outcome),) = rows(runtime)
    assert outcome == FAILED and "request cannot be built" in runtime.store.fetch_rows(SITE)[0]["error"]
    assert runtime.connection.zcard(keys.recrawls()) == 1  # its next refresh, asking for the whole page
    assert quiet_shop.requests == []


def test_take_gate_gives_up_after_its_wait_having_done_nothing(
    runtime: Runtime, redis_conn: Redis, quiet_shop: ShopSite
) -> None:
    attempt = attempt_at(runtime, f"{quiet_shop.url}/product/1")
    redis_conn.set(keys.gate(SITE), "another-worker", px=5000)
    assert attempt.take_gate(0.2) is None
    assert attempt.gate_wait is None and runtime.store.fetch_rows(SITE) == []
    assert redis_conn.get(keys.gate(SITE)) == b"another-worker"
    redis_conn.delete(keys.gate(SITE))
    gate = attempt.take_gate(0.2)
    assert gate is not None and attempt.gate_wait is not None and 0 <= attempt.gate_wait < 0.2
    gate.let_go()


# -- fetch ----------------------------------------------------------------------------------------


def test_fetch_hands_on_a_success_unrecorded_and_deals_with_an_error_status_itself(
    runtime: Runtime, redis_conn: Redis, quiet_shop: ShopSite
) -> None:
    ok = attempt_at(runtime, f"{quiet_shop.url}/product/1")
    assert ok.build_request()
    gate = ok.take_gate(None)
    assert gate is not None
    answer = ok.fetch(gate)
    assert answer is not None and answer.status == 200
    assert runtime.store.fetch_rows(SITE) == []  # recorded by ``conclude``, not here

    missing = attempt_at(runtime, f"{quiet_shop.url}/missing")
    assert missing.build_request()
    gate = missing.take_gate(None)
    assert gate is not None
    assert missing.fetch(gate) is None
    assert rows(runtime) == [("missing", FAILED)]
    assert redis_conn.zcard(keys.delayed()) == 0  # a 404 is not retried


# -- conclude -------------------------------------------------------------------------------------


def test_conclude_sends_a_redirect_target_through_the_frontier_and_records_the_redirect(
    runtime: Runtime, redis_conn: Redis, quiet_shop: ShopSite
) -> None:
    url = f"{quiet_shop.url}/old/product/5"
    attempt = attempt_at(runtime, url, "parse_product")
    attempt.conclude(response(301, {"location": "/product/5"}, url))
    assert rows(runtime) == [("old/product/5", REDIRECT)]
    (target,) = Frontier(redis_conn, SITE, [], 0, 0).waiting()
    assert (target.url, target.callback, target.hops) == (f"{quiet_shop.url}/product/5", "parse_product", 1)
    assert redis_conn.xlen(keys.pages()) == 0 and quiet_shop.requests == []


def test_conclude_hands_a_page_to_the_parser_in_its_record_s_pipeline_and_ends_the_run_of_errors(
    runtime: Runtime, redis_conn: Redis
) -> None:
    redis_conn.set(keys.errors(SITE), 2)
    attempt = attempt_at(runtime, "http://127.0.0.1:9/product/1", "parse_product", refresh=60.0)
    attempt.conclude(response(200, {"content-type": "text/html", "etag": '"v1"'}, attempt.task.url))
    assert rows(runtime) == [("product/1", OK)]
    assert redis_conn.xlen(keys.pages()) == 1 and not redis_conn.exists(keys.errors(SITE))
    (refresh,) = redis_conn.zrange(keys.recrawls(), 0, -1)
    assert b'"\\"v1\\""' in refresh  # the next refresh carries the page's ETag


# -- record ---------------------------------------------------------------------------------------


def test_record_holds_a_batch_s_successes_and_writes_a_retry_at_once_after_them(
    runtime: Runtime, redis_conn: Redis
) -> None:
    held = HeldRecords(runtime.sink)
    first = attempt_at(runtime, "http://127.0.0.1:9/product/1", held=held)
    second = attempt_at(runtime, "http://127.0.0.1:9/product/2", held=held)
    redis_conn.set(keys.errors(SITE), 1)
    first.record(OK, response=response(200, url=first.task.url))
    assert runtime.store.fetch_rows(SITE) == [] and redis_conn.get(keys.errors(SITE)) == b"1"  # held
    second.record(RETRY, error="503; retry in 1s", status=503)
    assert rows(runtime) == [("product/1", OK), ("product/2", RETRY)]  # what was held first, in order
    assert not redis_conn.exists(keys.errors(SITE))  # the held success's DEL went out with it
    assert held.held == []


def test_record_of_another_request_neither_counts_as_the_page_nor_ends_the_run_of_errors(
    runtime: Runtime, redis_conn: Redis
) -> None:
    attempt = attempt_at(runtime, "http://127.0.0.1:9/product/1")
    redis_conn.set(keys.errors(SITE), 2)
    attempt.record(OK, url="http://127.0.0.1:9/robots.txt", status=200)
    assert redis_conn.get(keys.errors(SITE)) == b"2" and counted(runtime).get("fetched") is None
    (robots,) = runtime.store.fetch_rows(SITE)
    assert robots["url"].endswith("/robots.txt") and robots["outcome"] == OK
    attempt.record(OK, response=response(200, url=attempt.task.url))
    assert not redis_conn.exists(keys.errors(SITE)) and counted(runtime)["fetched"] == 1
