"""A page's meta refresh taken as a redirect (``crawler.http.redirects``), and a redirect's method."""

from __future__ import annotations

import pytest

from crawler.http.redirects import META_REFRESH_MAX_DELAY, META_REFRESH_SCOPE, meta_refresh_target, redirected_request

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
    assert redirected_request(303, "POST", headers, b"a=1") == ("GET", {"X-Token": "t"}, None)
    assert redirected_request(301, "POST", headers, b"a=1") == ("GET", {"X-Token": "t"}, None)
    assert redirected_request(301, "GET", headers, None) == ("GET", headers, None)
    assert redirected_request(307, "POST", headers, b"a=1") == ("POST", headers, b"a=1")
