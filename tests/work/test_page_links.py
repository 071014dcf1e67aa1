"""A page's links: every one queued, a chunk at a time, and links to files the spider does not take skipped.

A page's requests go to the frontier in chunks while its callback runs (``parse_job.PageLinks``),
so a page of 100,000 links queues them all with the parse step's memory bounded; a cap is the
spider's or the operator's choice. Links whose path names a type the spider does not accept
(``Spider.deny_extensions``, Scrapy's ``IGNORED_EXTENSIONS``) are never requested.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import redis
from crawling import installed_runtime, waiting_tasks
from redis import Redis

from crawler import Spider
from crawler.coord.frontier import Frontier
from crawler.settings import Settings, load_settings
from crawler.spiders.check import check_spider
from crawler.spiders.extensions import IGNORED_EXTENSIONS, extension_type, link_extension
from crawler.spiders.spider import Page
from crawler.testing import crawl
from crawler.work import parse_job
from crawler.work.runtime import Runtime

LINKS_SPIDER = """
from crawler import Spider


class Links(Spider):
    name = "links"
    start_urls = ["http://127.0.0.1:9/"]
    allowed_domains = ["127.0.0.1"]

    def parse(self, page):
        yield from page.follow_all("a")
        yield {"url": page.url}
"""
PAGE_URL = "http://127.0.0.1:9/list"


def links_page(links: int) -> bytes:
    """A page of ``links`` anchors to distinct pages /p/I (about 24 bytes each)."""
    anchors = "".join(f'<a href="/p/{i}">x</a>' for i in range(links))
    return f"<html><body>{anchors}</body></html>".encode()


def parse_held(rt: Runtime, raw: bytes) -> None:
    """The page through the parse job as a parse worker runs it: held with its batch, then written."""
    held = parse_job.HeldParses(rt)
    parse_job.parse({"site": "links", "url": PAGE_URL, "status": 200}, zlib.compress(raw, 1), "w", None, held, rt=rt)
    held.flush()


def peak_bytes(step: Callable[[], Any]) -> int:
    """Peak bytes Python allocated while ``step`` ran (tracemalloc)."""
    tracemalloc.start()
    try:
        step()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def parse_record(rt: Runtime) -> dict[str, Any]:
    (record,) = [r for r in rt.store.fetch_rows("links") if r["kind"] == "parse"]
    return record


@pytest.fixture
def links_settings(settings: Settings) -> Settings:
    (Path(settings.sites_dir) / "links.py").write_text(LINKS_SPIDER)
    return settings


# -- every link queued -----------------------------------------------------------------


def test_no_cap_on_a_pages_links_by_default() -> None:
    assert load_settings().max_links_per_page == 0 and Spider.max_links_per_page is None


def test_every_link_of_a_100000_link_page_is_queued_with_the_parse_steps_memory_bounded(
    redis_conn: Redis, links_settings: Settings
) -> None:
    """The bound: the parse step holds, beyond the page (its body, decoded text, parsed tree and the
    callback's own selection of 100,000 nodes, measured alone as ``baseline``) and its inflated body,
    one chunk of LINK_CHUNK (5,000) requests (about 1 KB each as they are vetted and encoded) and
    at most JOINS_KEPT (10,000) joined hrefs (about 200 bytes each): some 7 MiB, whatever the link
    count; 16 MiB leaves room. All 100,000 requests held at once took 47 MiB more."""
    links = 100_000
    raw = links_page(links)
    with installed_runtime(redis_conn, links_settings) as rt:
        baseline = peak_bytes(lambda: Page(PAGE_URL, raw, headers={"content-type": "text/html"}).css("a"))
        peak = peak_bytes(lambda: parse_held(rt, raw))
        record = parse_record(rt)
        assert record["outcome"] == "ok" and record["error"] is None  # nothing dropped, nothing refused
        urls = [task.url for task in waiting_tasks(redis_conn, "links")]
    assert len(urls) == links
    assert set(urls) == {f"http://127.0.0.1:9/p/{i}" for i in range(links)}
    extra = (peak - baseline - len(raw)) / 2**20
    print(f"parse step: {peak / 2**20:.1f} MiB peak, page alone {baseline / 2**20:.1f} MiB, {extra:.1f} MiB beyond")
    assert extra < 16, f"{extra:.1f} MiB beyond the page and its body"


def test_a_spider_that_sets_max_links_per_page_has_its_pages_capped_and_the_record_says_so(
    redis_conn: Redis, links_settings: Settings
) -> None:
    Path(links_settings.sites_dir, "links.py").write_text(
        LINKS_SPIDER.replace('    name = "links"', '    name = "links"\n    max_links_per_page = 6000')
    )
    with installed_runtime(redis_conn, links_settings) as rt:
        parse_held(rt, links_page(7500))
        assert parse_record(rt)["error"] == "links capped at max_links_per_page (6,000): 1,500 more dropped"
        urls = [task.url for task in waiting_tasks(redis_conn, "links")]
    assert urls == [f"http://127.0.0.1:9/p/{i}" for i in range(6000)]  # the first ones, in the page's order


def test_the_max_links_per_page_setting_wins_over_the_spiders(redis_conn: Redis, links_settings: Settings) -> None:
    Path(links_settings.sites_dir, "links.py").write_text(
        LINKS_SPIDER.replace('    name = "links"', '    name = "links"\n    max_links_per_page = 6000')
    )
    with installed_runtime(redis_conn, dataclasses.replace(links_settings, max_links_per_page=10)) as rt:
        parse_held(rt, links_page(7500))
        assert parse_record(rt)["error"] == "links capped at max_links_per_page (10): 7,490 more dropped"
        assert len(waiting_tasks(redis_conn, "links")) == 10


def test_redis_failing_while_a_chunk_of_links_is_queued_leaves_the_page_with_the_worker(
    redis_conn: Redis, links_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not recorded failed as if the callback had raised: the worker keeps the page and parses it again."""
    calls: list[int] = []

    def down(self: Frontier, requests: list[Any], *args: Any, **kwargs: Any) -> Any:
        calls.append(len(requests))
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(Frontier, "add", down)
    with installed_runtime(redis_conn, links_settings) as rt:
        with pytest.raises(redis.ConnectionError):
            parse_held(rt, links_page(parse_job.LINK_CHUNK + 10))
        assert calls == [parse_job.LINK_CHUNK]  # the first chunk, while the callback ran
        assert [r for r in rt.store.fetch_rows("links") if r["kind"] == "parse"] == []


# -- links to files the spider does not take --------------------------------------------


class FileSite:
    """A loopback site whose index links files of several types; every path requested is kept."""

    LINKS = ["a.pdf", "b.JPG", "c.zip", "d.html", "e.pdf?x=1", "f/"]
    TYPES = {".pdf": "application/pdf", ".jpg": "image/jpeg", ".zip": "application/zip"}

    def __init__(self) -> None:
        self.paths: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner.paths.append(self.path)
                if self.path == "/robots.txt":
                    return self._send(404, "text/plain", b"")
                path = self.path.split("?")[0].lower()
                kind = next((t for suffix, t in owner.TYPES.items() if path.endswith(suffix)), "text/html")
                body = "".join(f'<a href="{link}">{link}</a>' for link in owner.LINKS) if path == "/" else "file"
                self._send(200, kind, f"<html><body>{body}</body></html>".encode())

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FileSite:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def requested(self) -> set[str]:
        return set(self.paths) - {"/robots.txt"}


@pytest.fixture
def file_site() -> Iterator[FileSite]:
    with FileSite() as site:
        yield site


class Files(Spider):
    name = "files"
    allowed_domains = ["127.0.0.1"]

    def parse(self, page: Page) -> Iterator[Any]:
        yield from page.follow_all("a")


HTML_PATHS = {"/", "/d.html", "/f/"}
PDF_PATHS = {"/a.pdf", "/e.pdf?x=1"}


def test_links_to_pdfs_images_and_archives_are_not_requested_and_the_page_record_counts_them(
    file_site: FileSite,
) -> None:
    result = crawl(Files, [file_site.url + "/"], interval=0.01)
    assert file_site.requested() == HTML_PATHS
    (index,) = [r for r in result.fetches if r["kind"] == "parse" and r["url"] == file_site.url + "/"]
    assert index["error"] == "4 links to files by their extension (.pdf, .jpg, .zip): not queued (deny_extensions)"
    assert not result.failed


def test_links_of_a_type_the_spider_accepts_are_requested(file_site: FileSite) -> None:
    crawl(Files, [file_site.url + "/"], interval=0.01, content_types=("text/html", "application/pdf"))
    assert file_site.requested() == HTML_PATHS | PDF_PATHS


def test_an_empty_deny_extensions_requests_every_link(file_site: FileSite) -> None:
    crawl(Files, [file_site.url + "/"], interval=0.01, deny_extensions=set())
    assert file_site.requested() == HTML_PATHS | PDF_PATHS | {"/b.JPG", "/c.zip"}


def test_a_deny_extensions_of_its_own_replaces_scrapys_list(file_site: FileSite) -> None:
    crawl(Files, [file_site.url + "/"], interval=0.01, deny_extensions={"ZIP", ".html"})
    assert file_site.requested() == {"/", "/f/", "/b.JPG"} | PDF_PATHS


def test_a_seed_with_a_denied_extension_is_requested(file_site: FileSite) -> None:
    """Only links a callback yields are filtered: a URL the user names is fetched (and skipped as not HTML)."""
    result = crawl(Files, [file_site.url + "/a.pdf"], interval=0.01)
    assert file_site.requested() == {"/a.pdf"}
    assert [r["outcome"] for r in result.fetches if r["url"] == file_site.url + "/a.pdf"] == ["skipped"]


def test_a_links_extension_is_read_from_its_path_alone_as_scrapy_reads_it() -> None:
    denied = IGNORED_EXTENSIONS
    assert link_extension("https://h/a.pdf?x=1", denied) == "pdf"
    assert link_extension("https://h/b.JPG#page=2", denied) == "jpg"
    assert link_extension("https://h/c.tar.gz", denied) == "tar.gz"
    assert link_extension("https://h/d.pdf;jsessionid=1", denied) == "pdf"  # a last segment's parameters
    assert link_extension("https://h/x.min.js", denied) == "js"
    for url in (
        "https://h/d.html",
        "https://h/f/",
        "https://h/dir.pdf/",
        "https://h/a.pdf/page",
        "https://h/search?file=a.pdf",
        "https://h/page#a.pdf",
        "https://h/a;v=1.pdf",
        "https://example.zip",  # a host, not a path
        "https://example.zip?a.pdf",
        "https://h/a.pdf.html",
    ):
        assert link_extension(url, denied) is None, url
    assert link_extension("https://h/a.pdf", frozenset()) is None


def test_a_links_extension_agrees_with_scrapys_url_has_any_extension_on_20000_random_urls() -> None:
    """Scrapy: ``urlparse(url).path.lower().endswith(ext)`` for any extension of its list."""
    rng = random.Random(43)
    pieces = ["a", "b.pdf", "c.tar", ".gz", "x.JPG", ";p=1", ";q.pdf", "?", "#", "/", "//", ".", "..", "zip"]
    pieces += ["tar.gz", "%2F", "h.zip", ":80", "@", "min.js", "-", "=", "&", ":/", "://"]
    suffixes = tuple(f".{extension}" for extension in IGNORED_EXTENSIONS)
    for _ in range(20_000):
        host = rng.choice(["h", "h.zip", "example.pdf", "u@h.pdf:8", "[::1]"])
        url = f"{rng.choice(['http', 'HTTPS'])}://{host}" + "".join(rng.choices(pieces, k=rng.randint(0, 7)))
        scrapy = urlparse(url).path.lower().endswith(suffixes)
        assert (link_extension(url, IGNORED_EXTENSIONS) is not None) == scrapy, url


def test_every_extension_of_scrapys_list_has_a_type_so_a_spider_taking_it_follows_such_links() -> None:
    assert {"pdf", "jpg", "zip", "docx", "mp4", "css", "js", "tar.gz"} <= IGNORED_EXTENSIONS
    assert extension_type("PDF") == "application/pdf" and extension_type(".jpg") == "image/jpeg"
    assert extension_type("unheard-of") == "application/octet-stream"
    assert {extension_type(e).split("/")[0] for e in IGNORED_EXTENSIONS} == {
        "application",
        "audio",
        "image",
        "text",
        "video",
    }


def test_a_bad_deny_extensions_or_max_links_per_page_is_a_one_line_error() -> None:
    for attributes, fragment in (
        ({"deny_extensions": "pdf"}, "deny_extensions must be a set of file extensions"),
        ({"deny_extensions": {"pdf", 3}}, "deny_extensions must hold file extensions"),
        ({"deny_extensions": {"a/b"}}, "deny_extensions must hold file extensions"),
        ({"max_links_per_page": 0}, "max_links_per_page must be a whole number of at least 1"),
    ):
        problem = check_spider(type("Bad", (Files,), attributes))
        assert problem is not None and fragment in problem, problem
    assert check_spider(type("Good", (Files,), {"deny_extensions": frozenset(), "max_links_per_page": 5})) is None
