"""A page's meta refresh taken as a redirect (``crawler.http.redirects``), and a redirect's method and
credentials (on a real crawl of two loopback servers)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from crawling import installed_runtime, items_by_key, run_in_threads
from redis import Redis
from routes import Answer, Routes, serving

from crawler.coord.frontier import seed
from crawler.http.headers import merge_headers
from crawler.http.redirects import (
    META_REFRESH_MAX_DELAY,
    META_REFRESH_SCOPE,
    meta_refresh_target,
    redirected_request,
    same_origin,
    withheld,
)
from crawler.settings import Settings

URL = "http://docs.example/std/macro.old.html"


def head(meta: str, rest: str = "") -> bytes:
    return f"<!DOCTYPE html><html><head>{meta}<title>Redirection</title></head><body>{rest}</body></html>".encode()


@pytest.mark.parametrize(
    ("meta", "target"),
    [
        ('<meta http-equiv="refresh" content="0;URL=macro.new.html">', "http://docs.example/std/macro.new.html"),
        ("<META HTTP-EQUIV=Refresh CONTENT='2; url=/elsewhere?a=1'>", "http://docs.example/elsewhere?a=1"),
        ('<meta content="0; url=https://other.example/" http-equiv="refresh">', "https://other.example/"),
        ('<meta http-equiv="rEfReSh" content="0; url=/any-case">', "http://docs.example/any-case"),
    ],
)
def test_a_refresh_sooner_than_the_limit_names_its_target_made_absolute(meta: str, target: str) -> None:
    assert meta_refresh_target(URL, head(meta)) == target


@pytest.mark.parametrize(
    "body",
    [
        head(""),  # no refresh at all
        head("", "<p>Press F5 to refresh the page.</p>"),  # the word, not the declaration
        head(f'<meta http-equiv="refresh" content="{META_REFRESH_MAX_DELAY:g}; url=/later">'),  # not sooner
        head('<meta http-equiv="refresh" content="30">'),  # a reload: no URL
        head('<meta http-equiv="refresh" content="0; url=macro.old.html#top">'),  # the page itself
        head("", '<noscript><meta http-equiv="refresh" content="0; url=/nojs"></noscript>'),
        head("", '<script>document.write(\'<meta http-equiv="refresh" content="0;url=/js">\')</script>'),
        b"",
    ],
)
def test_no_target_for_a_page_read_as_it_is(body: bytes) -> None:
    assert meta_refresh_target(URL, body) is None


def test_only_the_head_of_a_page_is_read_as_scrapy_reads_it() -> None:
    late = '<meta http-equiv="refresh" content="0; url=/late">'
    padding = "<p>" + "x" * META_REFRESH_SCOPE + "</p>"
    assert meta_refresh_target(URL, head("", padding + late)) is None
    assert meta_refresh_target(URL, head(late, padding)) == "http://docs.example/late"


def test_the_target_is_read_in_the_pages_charset() -> None:
    meta = '<meta charset="iso-8859-1"><meta http-equiv="refresh" content="0; url=/caf\u00e9">'
    assert meta_refresh_target(URL, head(meta).decode().encode("latin-1")) == "http://docs.example/caf%C3%A9"
    assert meta_refresh_target(URL, head(meta), charset="utf-8") == "http://docs.example/caf%C3%A9"


def test_a_303_or_a_posted_301_becomes_a_get_without_its_body_and_a_307_keeps_both() -> None:
    headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Token": "t"}
    here = (URL, "http://docs.example/elsewhere")
    assert redirected_request(303, "POST", headers, b"a=1", *here) == ("GET", {"X-Token": "t"}, None)
    assert redirected_request(301, "POST", headers, b"a=1", *here) == ("GET", {"X-Token": "t"}, None)
    assert redirected_request(301, "GET", headers, None, *here) == ("GET", headers, None)
    assert redirected_request(307, "POST", headers, b"a=1", *here) == ("POST", headers, b"a=1")


CREDENTIALED = {"Authorization": "Bearer t", "cookie": "a=1", "Proxy-Authorization": "Basic p", "X-Token": "t"}


@pytest.mark.parametrize(
    "target",
    [
        "https://docs.example/x",  # another scheme (httpx keeps Authorization on an upgrade; browsers do not)
        "http://docs.example:8080/x",  # another port
        "http://other.example/x",  # another host
        "http://api.docs.example/x",  # a subdomain is another host
    ],
)
def test_credentials_are_withheld_from_a_redirect_to_another_origin(target: str) -> None:
    """As browsers (the Fetch standard), httpx and Scrapy: the request's own credentials are dropped,
    and the spider's of those names (sent with every request) withheld too."""
    for status in (301, 302, 303, 307, 308):
        method, headers, _ = redirected_request(status, "GET", CREDENTIALED, None, URL, target, {"X-Site": "1"})
        assert withheld(headers) == {"X-Token": "t"} and method == "GET"
    _, headers, _ = redirected_request(302, "GET", {"X-Token": "t"}, None, URL, target, {"AUTHORIZATION": "site"})
    assert withheld(merge_headers({"AUTHORIZATION": "site", "X-Site": "1"}, headers)) == {"X-Site": "1", "X-Token": "t"}


def test_credentials_go_on_to_a_redirect_on_the_same_origin() -> None:
    for target in ("http://docs.example/std/new.html", "HTTP://DOCS.EXAMPLE:80/std/"):
        assert redirected_request(302, "GET", CREDENTIALED, None, URL, target, {}) == ("GET", CREDENTIALED, None)
    assert same_origin("https://a.example/", "https://a.example:443/x")
    assert not same_origin("http://a.example/", "http://a.example:notaport/")
    assert withheld({"Authorization": "", "X-Empty": ""}) == {"X-Empty": ""}  # only credentials are withheld


SITE_HEADERS_SPIDER = """
    from crawler import Request, Spider

    class Api(Spider):
        name = "api"
        start_urls = ["{one}/"]
        allowed_domains = ["127.0.0.1"]
        interval = 0.01
        obey_robots = False
        item_key = "sku"
        headers = {{"Authorization": "Bearer site-secret", "X-Site": "1"}}

        def parse(self, page):
            if page.css_first("h1") is not None:
                yield {{"sku": page.text("h1")}}
            own = {{"Authorization": "Bearer request-secret", "Cookie": "hand=1", "Proxy-Authorization": "Basic p",
                    "X-Keep": "1"}}
            for path in ("/away", "/stay"):
                yield Request(page.urljoin(path), headers=own, callback="landed")
            yield Request(page.urljoin("/away-plain"), callback="landed")

        def landed(self, page):
            yield {{"sku": page.text("h1")}}
"""


def test_a_redirect_to_another_origin_sends_no_authorization_the_same_origin_does(
    redis_conn: Redis, settings: Settings
) -> None:
    """A real crawl of two loopback servers (one host, two ports: two origins): the spider's and the
    request's Authorization (and a Cookie or Proxy-Authorization set by hand) go to the redirect on the
    first server, not to the one on the second; other headers go to both."""
    two = Routes({"/landing": Answer("<h1>landing</h1>"), "/plain": Answer("<h1>plain</h1>")})
    with serving(two) as other:
        one = Routes(
            {
                "/": Answer("<h1>home</h1>"),
                "/away": Answer(status=302, headers=[("Location", f"{other}/landing".encode())]),
                "/away-plain": Answer(status=307, headers=[("Location", f"{other}/plain".encode())]),
                "/stay": Answer(status=301, headers=[("Location", b"/here")]),
                "/here": Answer("<h1>here</h1>"),
            }
        )
        with serving(one) as url:
            (Path(settings.sites_dir) / "api.py").write_text(textwrap.dedent(SITE_HEADERS_SPIDER.format(one=url)))
            with installed_runtime(redis_conn, settings) as rt:
                seed(rt.frontier("api"), [f"{url}/"])
                run_in_threads(rt, sites=("api",), timeout=30)
    assert set(items_by_key(settings.database_url, "api")) == {"home", "landing", "plain", "here"}
    [landing] = two.sent_to("/landing")
    assert not {"authorization", "cookie", "proxy-authorization"} & set(landing)
    assert landing["x-keep"] == b"1" and landing["x-site"] == b"1"
    [plain] = two.sent_to("/plain")
    assert "authorization" not in plain and plain["x-site"] == b"1"
    [here] = one.sent_to("/here")
    assert here["authorization"] == b"Bearer request-secret" and here["cookie"] == b"hand=1"
    assert here["proxy-authorization"] == b"Basic p" and here["x-keep"] == b"1"
    assert one.sent_to("/")[0]["authorization"] == b"Bearer site-secret"
