"""The URL sent as written: a request goes out as the spider wrote it (query order, case, escapes),
while dedup, records and items keep to its canonical form (as Scrapy: canonical for the fingerprint only)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from crawler import Page, Spider
from crawler.coord.task import DownloadTask
from crawler.testing import crawl
from crawler.urls import as_written

pytestmark = pytest.mark.integration  # each crawl starts its own Redis server


@contextmanager
def signed_api() -> Iterator[tuple[str, list[str]]]:
    """A site whose answers depend on the query as sent: ``/items?b=2&a=1`` is a page, any other order a 403
    (a signed URL's signature covers the query as written); every request line's target is kept."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(self.path)
            if self.path == "/":
                body, status = '<a href="/items?b=2&a=1#top">x</a> <a href="/items?a=1&b=2">same, reordered</a>', 200
            elif self.path == "/items?b=2&a=1":
                body, status = "<h1>signed ok</h1>", 200
            elif self.path == "/robots.txt":
                body, status = "", 404
            else:
                body, status = "bad signature", 403
            data = body.encode()
            self.send_response(status)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


class SignedSpider(Spider):
    name = "signed"
    allowed_domains = ["127.0.0.1"]

    def parse(self, page: Page) -> Iterator[Any]:
        yield from page.follow_all("a", self.parse_item)

    def parse_item(self, page: Page) -> Iterator[Any]:
        yield {"title": page.text("h1"), "page": page.url, "sent": page.request.url}


def test_a_link_is_sent_as_written_and_deduplicated_by_its_canonical_form() -> None:
    with signed_api() as (base, seen):
        result = crawl(SignedSpider, [base + "/"], interval=0.01)
    assert seen.count("/items?b=2&a=1") == 1 and "/items?a=1&b=2" not in seen  # the reordered twin is the same page
    (item,) = result.items
    assert item == {"title": "signed ok", "page": base + "/items?a=1&b=2", "sent": base + "/items?b=2&a=1"}
    records = [r for r in result.fetches if "/items" in r["url"]]
    assert {r["url"] for r in records} == {base + "/items?a=1&b=2"}  # records keep the canonical URL
    assert [r["outcome"] for r in records if r["kind"] == "download"] == ["ok"]


def test_a_url_is_carried_as_written_only_when_it_is_not_its_canonical_form() -> None:
    assert as_written("http://h/p?a=1&b=2", "http://h/p?a=1&b=2") is None
    assert as_written("http://h/p?a=1#frag", "http://h/p?a=1") is None  # a fragment is never sent
    assert as_written("http://h/p?b=2&a=1", "http://h/p?a=1&b=2") == "http://h/p?b=2&a=1"
    assert as_written("http://h/a b?q=é", "http://h/a%20b?q=%C3%A9") is None  # escaped as a browser does
    assert as_written("HTTP://H:80/p?b=1&a=2", "http://h/p?a=2&b=1") == "http://h:80/p?b=1&a=2"  # host as DNS reads it


def test_a_task_whose_url_as_written_is_another_url_is_refused() -> None:
    entry = DownloadTask("s", "http://h/p?a=1&b=2", sent_url="http://h/p?b=2&a=1").to_entry()
    assert DownloadTask.from_entry("s", entry).url_to_send == "http://h/p?b=2&a=1"
    # Written by hand in Redis: a URL as written must be a spelling of the URL checked, never another host.
    forged = {"site": "s", "url": "http://h/p", "as_written": "http://evil.example/p"}
    with pytest.raises(ValueError, match="as written"):
        DownloadTask.from_json(forged)
