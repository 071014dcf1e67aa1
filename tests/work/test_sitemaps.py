"""Sitemaps: a site with no links between its pages is crawled completely from its sitemaps."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from crawling import installed_runtime, run_in_threads
from redis import Redis

from crawler.coord import keys
from crawler.coord.frontier import Frontier
from crawler.coord.scheduler import frontier_sizes
from crawler.coord.seeding import seed_start
from crawler.coord.task import fingerprint
from crawler.errors import BadResponse, BodyTooLarge
from crawler.settings import Settings
from crawler.spiders.loading import SpiderSet
from crawler.spiders.spider import Page, Spider
from crawler.store.database import FAILED, OK, Store
from crawler.work.sitemaps import (
    MAX_ENTRIES,
    SITEMAP_CALLBACK,
    Entry,
    SitemapReader,
    entries,
    inflated,
    parse_lastmod,
    robots_sitemaps,
)

PRODUCTS = 40
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
DAY = "2024-05-01"


class SitemapSite:
    """A shop whose pages link nowhere: robots.txt names a sitemap index, which lists a gzipped
    sitemap (products 1..20) and a plain one (products 21..40, an "about" page, an off-site URL).

    ``lastmod`` (per product) and ``index_lastmod`` (per child sitemap) can change between crawls.
    """

    def __init__(self) -> None:
        self.lastmod = {i: DAY for i in range(1, PRODUCTS + 1)}
        self.index_lastmod = {"a": DAY, "b": DAY}
        self.requests: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                status, ctype, body = site.answer(self.path)
                with site.lock:
                    site.requests.append((self.path, status))
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def urlset(self, ids: range, extra: str = "") -> bytes:
        urls = "".join(f"<url><loc>{self.url}/p/{i}</loc><lastmod>{self.lastmod[i]}</lastmod></url>\n" for i in ids)
        return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>\n{urls}{extra}</urlset>\n'.encode()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        half = PRODUCTS // 2
        if path == "/robots.txt":
            return 200, "text/plain", f"User-agent: *\nAllow: /\nSitemap: {self.url}/sitemap_index.xml\n".encode()
        if path == "/sitemap_index.xml":
            children = "".join(
                f"<sitemap><loc>{self.url}/sitemaps/{name}</loc><lastmod>{self.index_lastmod[key]}</lastmod></sitemap>"
                for key, name in (("a", "a.xml.gz"), ("b", "b.xml"))
            )
            return 200, "application/xml", f'<?xml version="1.0"?><sitemapindex {NS}>{children}</sitemapindex>'.encode()
        if path == "/sitemaps/a.xml.gz":
            return 200, "application/x-gzip", gzip.compress(self.urlset(range(1, half + 1)))
        if path == "/sitemaps/b.xml":
            extra = f"<url><loc>{self.url}/about</loc></url>\n<url><loc>http://elsewhere.example/p/1</loc></url>\n"
            return 200, "text/xml; charset=utf-8", self.urlset(range(half + 1, PRODUCTS + 1), extra)
        if path.startswith("/p/") and path[3:].isdigit() and 1 <= int(path[3:]) <= PRODUCTS:
            n = int(path[3:])
            body = f"<html><h1>Product {n}</h1><span class=sku>SKU-{n}</span><span class=price>{n}.00</span></html>"
            return 200, "text/html", body.encode()
        if path == "/sitemaps/broken.xml":  # one good entry, then a tag closed wrong
            return 200, "text/xml", f"<urlset {NS}><url><loc>{self.url}/p/1</loc></url><url><loc>x</url>".encode()
        if path in ("/", "/about"):
            return 200, "text/html", b"<html><p>No links here.</p></html>"
        return 404, "text/html", b"not found"

    def fetched(self, path: str) -> int:
        with self.lock:
            return sum(1 for p, _ in self.requests if p == path)


@pytest.fixture
def site() -> Iterator[SitemapSite]:
    server = SitemapSite()
    yield server
    server.close()


def spider_for(site: SitemapSite, **attributes: Any) -> type[Spider]:
    def parse_product(self: Spider, page: Page) -> Iterator[dict[str, str]]:
        yield {"sku": page.text(".sku"), "price": page.text(".price")}

    namespace = {
        "name": "smap",
        "allowed_domains": ["127.0.0.1"],
        "interval": 0.002,
        "item_key": "sku",
        "sitemap_urls": [f"{site.url}/sitemap_index.xml"],
        "sitemap_rules": [("/p/", "parse_product")],
        "parse": lambda self, page: [],
        "parse_product": parse_product,
        **attributes,
    }
    return type("SitemapShop", (Spider,), namespace)


def crawl(redis_conn: Redis, settings: Settings, spider: type[Spider], force: bool = False) -> None:
    with installed_runtime(redis_conn, settings, spider_set=SpiderSet({"smap": spider}, [])) as rt:
        seed_start(rt.frontier("smap"), rt.spider("smap"), force=force)
        run_in_threads(rt, sites=("smap",))


def skus(settings: Settings) -> set[str]:
    store = Store(settings.database_url)
    try:
        return {item["sku"] for item in store.items("smap")}
    finally:
        store.close()


def test_a_sitemap_only_site_is_crawled_completely(redis_conn: Redis, settings: Settings, site: SitemapSite) -> None:
    crawl(redis_conn, settings, spider_for(site))
    assert skus(settings) == {f"SKU-{i}" for i in range(1, PRODUCTS + 1)}
    for i in range(1, PRODUCTS + 1):
        assert site.fetched(f"/p/{i}") == 1
    assert [site.fetched(p) for p in ("/sitemap_index.xml", "/sitemaps/a.xml.gz", "/sitemaps/b.xml")] == [1, 1, 1]
    assert site.fetched("/about") == 0  # matches no rule
    store = Store(settings.database_url)
    try:
        notes = {
            r["url"].rsplit("/", 1)[1]: r["error"]
            for r in store.fetch_rows("smap")
            if r["kind"] == "parse" and r["callback"] == SITEMAP_CALLBACK and r["outcome"] == OK
        }
    finally:
        store.close()
    assert notes["sitemap_index.xml"].endswith("2 sitemaps to follow")
    assert notes["a.xml.gz"].startswith(f"sitemap: {PRODUCTS // 2} URLs, {PRODUCTS // 2} queued")
    assert "1 matching no rule, 1 refused (http://elsewhere.example/p/1 is outside" in notes["b.xml"]


def test_the_sitemaps_of_robots_txt_are_followed(redis_conn: Redis, settings: Settings, site: SitemapSite) -> None:
    spider = spider_for(site, sitemap_urls=[], start_urls=[f"{site.url}/"], sitemap_follow_robots=True)
    assert [r.callback for r in spider().start_requests()] == ["parse", SITEMAP_CALLBACK]
    crawl(redis_conn, settings, spider)
    assert skus(settings) == {f"SKU-{i}" for i in range(1, PRODUCTS + 1)}
    assert site.fetched("/sitemap_index.xml") == 1


def test_lastmod_decides_which_known_pages_are_fetched_again(
    redis_conn: Redis, settings: Settings, site: SitemapSite
) -> None:
    spider = spider_for(site)
    crawl(redis_conn, settings, spider)
    # Three products of the gzipped sitemap changed (and its lastmod in the index); one went back in time.
    for i in (2, 5, 7):
        site.lastmod[i] = "2024-06-01T08:00:00+00:00"
    site.lastmod[9] = "2024-01-01"
    site.index_lastmod["a"] = "2024-06-01"
    crawl(redis_conn, settings, spider, force=True)  # the index is read again; b.xml did not change
    assert site.fetched("/sitemap_index.xml") == 2 and site.fetched("/sitemaps/a.xml.gz") == 2
    assert site.fetched("/sitemaps/b.xml") == 1
    assert [i for i in range(1, PRODUCTS + 1) if site.fetched(f"/p/{i}") == 2] == [2, 5, 7]
    assert all(site.fetched(f"/p/{i}") == 1 for i in range(1, PRODUCTS + 1) if i not in (2, 5, 7))


def gzipped_urlset(count: int) -> bytes:
    urls = "".join(
        f"<url><loc>http://127.0.0.1/p/{i}?color=red&amp;size=m</loc><lastmod>2024-05-01</lastmod>"
        f"<changefreq>daily</changefreq></url>\n"
        for i in range(count)
    )
    return gzip.compress(f'<?xml version="1.0"?><urlset {NS}>{urls}</urlset>'.encode())


def reader(redis_conn: Redis, spider: type[Spider] | None = None, depth: int = 0) -> SitemapReader:
    spider_class = spider or type("S", (Spider,), {"name": "smap", "allowed_domains": ["127.0.0.1"]})
    return SitemapReader(redis_conn, Frontier(redis_conn, "smap", ["127.0.0.1"], 60, 60), spider_class(), depth)


def test_a_sitemap_of_50000_urls_is_streamed_into_the_frontier(redis_conn: Redis) -> None:
    stored = zlib.compress(gzipped_urlset(50_000), 6)
    started = time.monotonic()
    report = reader(redis_conn).read("http://127.0.0.1/sitemap.xml.gz", stored)
    seconds = time.monotonic() - started
    assert (report.urls, report.queued, report.refused) == (50_000, 50_000, 0)
    assert frontier_sizes(redis_conn, ["smap"]) == [50_000]
    assert seconds < 30


def test_a_sitemap_is_read_up_to_the_protocols_50000_entries(redis_conn: Redis) -> None:
    report = reader(redis_conn).read("http://127.0.0.1/sitemap.xml.gz", zlib.compress(gzipped_urlset(MAX_ENTRIES + 10)))
    assert frontier_sizes(redis_conn, ["smap"]) == [MAX_ENTRIES]
    assert (report.urls, report.queued, report.capped) == (MAX_ENTRIES, MAX_ENTRIES, True)
    assert report.summary().endswith("; capped at 50000 entries, the rest ignored")  # in the sitemap's record


def stored(tags: Iterable[str], root: str = "urlset") -> bytes:
    """A gzipped sitemap of the given elements, as the download stores it (zlib-compressed)."""
    body = "".join(tags)
    return zlib.compress(gzip.compress(f'<?xml version="1.0"?><{root} {NS}>{body}</{root}>'.encode()), 6)


def minutes(n: int) -> str:
    return (datetime(2024, 5, 1, tzinfo=UTC) + timedelta(minutes=n)).isoformat()


@pytest.mark.parametrize("dated", [False, True], ids=["no lastmod", "rising lastmod"])
def test_a_child_sitemap_listed_20000_times_is_queued_once_and_not_again(redis_conn: Redis, dated: bool) -> None:
    child = "<loc>http://127.0.0.1/child.xml</loc>"
    index = stored(
        (f"<sitemap>{child}<lastmod>{minutes(i)}</lastmod></sitemap>" if dated else f"<sitemap>{child}</sitemap>")
        for i in range(20_000)
    )
    assert len(index) < 40_000  # a small download
    report = reader(redis_conn).read("http://127.0.0.1/index.xml.gz", index)
    assert [t.url for t in Frontier(redis_conn, "smap", ["127.0.0.1"], 60, 60).waiting()] == [
        "http://127.0.0.1/child.xml"
    ]
    # Taken once per batch (the latest lastmod); the seen set, or what this read queued, has the later batches'.
    assert report.sitemaps == 1 and report.repeated + report.duplicates == 19_999
    # Read again one level down (an index that lists itself, say): its lastmod did not move.
    again = reader(redis_conn, depth=1).read("http://127.0.0.1/child.xml", index)
    assert redis_conn.llen(keys.frontier("smap")) == 1
    assert again.sitemaps == 0


def test_a_page_listed_again_with_a_rising_lastmod_is_queued_once_per_read(redis_conn: Redis) -> None:
    page = "<loc>http://127.0.0.1/p/1</loc>"
    # 3,600 listings, four batches, each lastmod a minute later than the one before.
    first = stored(f"<url>{page}<lastmod>{minutes(i)}</lastmod></url>" for i in range(3_600))
    report = reader(redis_conn).read("http://127.0.0.1/sitemap.xml.gz", first)
    assert redis_conn.llen(keys.frontier("smap")) == 1
    assert (report.urls, report.queued, report.repeated) == (3_600, 1, 3_599)
    lastmods = keys.lastmod("smap")
    recorded = int(redis_conn.hget(lastmods, fingerprint("http://127.0.0.1/p/1")) or 0)
    assert datetime.fromtimestamp(recorded, UTC).isoformat() == minutes(3_599)  # the latest one listed
    assert reader(redis_conn).read("http://127.0.0.1/sitemap.xml.gz", first).queued == 0  # lastmod did not move
    assert redis_conn.llen(keys.frontier("smap")) == 1
    # Listed again, older lastmods first, then past the one recorded: queued once more.
    moved = stored(f"<url>{page}<lastmod>{minutes(i)}</lastmod></url>" for i in range(1_800, 5_400))
    report = reader(redis_conn).read("http://127.0.0.1/sitemap.xml.gz", moved)
    assert redis_conn.llen(keys.frontier("smap")) == 2
    assert (report.queued, report.updated) == (1, 1)
    assert not redis_conn.keys(keys.sitemap_taken("smap", "*"))  # what one read queued is forgotten after it


#: A sitemap's body in three shapes: (head, what is repeated, tail, MB of the smaller document).
#: The sizes give each shape's parse about the same work (a ``<x/>`` is an event per 4 bytes).
SHAPES = {
    "<x/>": (f"<urlset {NS}>", "<x/>", "</urlset>", 0.5),
    "urlset": (
        f"<urlset {NS}>",
        "<url><loc>http://127.0.0.1/products/a-product-with-a-long-name</loc><lastmod>2024-05-01</lastmod></url>\n",
        "</urlset>",
        4,
    ),
    "images": (
        f'<urlset {NS} xmlns:i="http://www.google.com/schemas/sitemap-image/1.1"><url><loc>http://127.0.0.1/p</loc>',
        "<i:image><i:loc>http://127.0.0.1/i.jpg</i:loc></i:image>",
        "</url></urlset>",
        4,
    ),
}
#: Largest growth of a worker's resident memory while it reads a sitemap.
MEMORY_BOUND_MIB = 64
#: Largest difference between that growth for a document and for one four times its size: a
#: parse that keeps an element for each one read, even emptied, grows with the document.
GROWTH_BOUND_MIB = 4

#: (``VmHWM``, this process's own peak since its exec; ``ru_maxrss`` would carry the test
#: process's size over across fork and exec, and hide the growth under it.)
MEASURE = """
import re, sys, zlib
from crawler.work.sitemaps import entries, inflated

def peak_kib():
    with open("/proc/self/status") as status:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))

stored = zlib.compress(open(sys.argv[1], "rb").read())
before = peak_kib()
count = sum(1 for _ in entries(inflated(stored)))
print(count, (peak_kib() - before) // 1024)
"""


def sitemap_growth(path: Path, shape: str, megabytes: float) -> tuple[int, int]:
    """(entries read, MiB of resident memory grown) while a process reads ``shape``'s sitemap of ``megabytes``."""
    head, unit, tail, _ = SHAPES[shape]
    with gzip.open(path, "wb", compresslevel=6) as out:
        out.write(f'<?xml version="1.0"?>{head}'.encode())
        out.write(unit.encode() * int(megabytes * 1_000_000 // len(unit)))
        out.write(tail.encode())
    # In a process of its own: resident memory (libxml2's too, which tracemalloc does not see).
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    count, grown_mib = map(int, result.stdout.split())
    return count, grown_mib


@pytest.mark.integration
@pytest.mark.parametrize("shape", SHAPES)
def test_reading_a_sitemap_of_any_elements_holds_a_bounded_memory(tmp_path: Path, shape: str) -> None:
    """Memory that does not grow with the document: the same growth for one four times larger."""
    unit, small = SHAPES[shape][1], SHAPES[shape][3]
    (count, grown), (count_4x, grown_4x) = (
        sitemap_growth(tmp_path / f"sitemap{n}.xml.gz", shape, n * small) for n in (1, 4)
    )
    units = int(4 * small * 1_000_000 // len(unit))
    assert count_4x == {"<x/>": 0, "urlset": units, "images": 1}[shape] and count_4x >= count
    assert grown_4x < MEMORY_BOUND_MIB, (shape, grown_4x)
    assert grown_4x - grown < GROWTH_BOUND_MIB, (shape, grown, grown_4x)


def python_peak(redis_conn: Redis, count: int) -> int:
    """Python's peak memory (tracemalloc) while a sitemap of ``count`` URLs is read."""
    redis_conn.flushdb()
    stored = zlib.compress(gzipped_urlset(count), 6)
    tracemalloc.start()
    try:
        reader(redis_conn).read("http://127.0.0.1/sitemap.xml.gz", stored)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reading_a_sitemap_holds_a_batch_not_the_document(redis_conn: Redis) -> None:
    small, large = python_peak(redis_conn, 2_000), python_peak(redis_conn, 10_000)
    # Five times the URLs, about the same peak: memory follows the batch, not the document.
    assert large < small * 1.5, (small, large)


def test_a_sitemap_over_the_cap_stops_there() -> None:
    stored = zlib.compress(gzipped_urlset(2000))
    with pytest.raises(BodyTooLarge):
        for _ in inflated(stored, cap=10_000):
            pass
    assert sum(len(piece) for piece in inflated(stored)) == len(gzip.decompress(gzipped_urlset(2000)))


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
<!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
<!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
<!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
<!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
<!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://127.0.0.1/&lol9;</loc></url></urlset>"""

EXTERNAL_ENTITY = b"""<?xml version="1.0"?><!DOCTYPE x [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<url><loc>http://127.0.0.1/&xxe;</loc></url><url><loc>http://127.0.0.1/ok</loc></url></urlset>"""


def test_xml_attacks_are_defused() -> None:
    started = time.monotonic()
    with pytest.raises(BadResponse, match="amplification"):
        list(entries([BILLION_LAUGHS]))
    assert time.monotonic() - started < 1
    # The external entity is neither read nor fetched: the entry holding it is dropped.
    assert list(entries([EXTERNAL_ENTITY])) == [Entry("url", "http://127.0.0.1/ok")]


def test_an_unreadable_sitemap_fails_its_page_and_the_crawl_goes_on(
    redis_conn: Redis, settings: Settings, site: SitemapSite
) -> None:
    spider = spider_for(site, sitemap_urls=[f"{site.url}/sitemaps/broken.xml", f"{site.url}/sitemap_index.xml"])
    crawl(redis_conn, settings, spider)
    store = Store(settings.database_url)
    try:
        (bad,) = [r for r in store.fetch_rows("smap", FAILED) if r["kind"] == "parse"]
    finally:
        store.close()
    assert bad["url"].endswith("/broken.xml")
    assert "sitemap unreadable after 1 URLs: BadResponse: not well-formed XML" in bad["error"]
    assert len(skus(settings)) == PRODUCTS


def test_entries_and_their_lastmods_are_read_in_any_pieces() -> None:
    document = (
        f'<?xml version="1.0"?><sitemapindex {NS}><sitemap><loc> http://a.example/s1.xml </loc>'
        f"<lastmod>2024-05-01T10:00:00Z</lastmod></sitemap><sitemap><loc>http://a.example/s2.xml</loc>"
        f"</sitemap></sitemapindex>"
    ).encode()
    pieces = [document[i : i + 7] for i in range(0, len(document), 7)]
    assert list(entries(pieces)) == [
        Entry("sitemap", "http://a.example/s1.xml", 1714557600),
        Entry("sitemap", "http://a.example/s2.xml"),
    ]
    assert parse_lastmod("2024-05-01") == 1714521600 and parse_lastmod("2024-05-01T12:00:00+02:00") == 1714557600
    assert parse_lastmod("last week") is None and parse_lastmod(None) is None
    assert robots_sitemaps("Sitemap: /a.xml\nsitemap: http://b.example/b.xml\n", "http://a.example/robots.txt") == [
        "http://a.example/a.xml",
        "http://b.example/b.xml",
    ]


def test_rules_route_urls_to_callbacks_and_follow_filters_indexes(redis_conn: Redis) -> None:
    spider = type(
        "S",
        (Spider,),
        {
            "name": "smap",
            "allowed_domains": ["127.0.0.1"],
            "parse_product": Spider.parse,
            "sitemap_rules": [("/p/", "parse_product"), ("/c/", "parse")],
            "sitemap_follow": ["/products-"],
        },
    )
    read = reader(redis_conn, spider)
    read._add(
        [
            Entry("url", "http://127.0.0.1/p/1"),
            Entry("url", "http://127.0.0.1/c/shoes"),
            Entry("url", "http://127.0.0.1/blog/1"),
            Entry("sitemap", "http://127.0.0.1/products-1.xml"),
            Entry("sitemap", "http://127.0.0.1/blog.xml"),
        ]
    )
    tasks = Frontier(redis_conn, "smap", ["127.0.0.1"], 60, 60).waiting()
    assert sorted((t.url, t.callback, t.depth) for t in tasks) == [
        ("http://127.0.0.1/c/shoes", "parse", 1),
        ("http://127.0.0.1/p/1", "parse_product", 1),
        ("http://127.0.0.1/products-1.xml", SITEMAP_CALLBACK, 1),
    ]
    assert (read.report.unmatched, read.report.sitemaps) == (2, 1)


@pytest.mark.parametrize(
    ("attributes", "fragment"),
    [
        ({"sitemap_rules": [("(", "parse")]}, "does not compile"),
        ({"sitemap_rules": [("/p/", "parse_nothing")]}, "'parse_nothing', which is not a callback"),
        ({"sitemap_rules": "/p/"}, "list of (regex, callback name) pairs"),
        ({"sitemap_follow": "/p/"}, "sitemap_follow must be a list"),
    ],
)
def test_bad_sitemap_rules_are_refused_when_seeding(
    redis_conn: Redis, site: SitemapSite, attributes: dict[str, Any], fragment: str
) -> None:
    from crawler.errors import ConfigError

    spider = spider_for(site, **attributes)()
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        seed_start(Frontier(redis_conn, "smap", ["127.0.0.1"], 60, 60), spider)


def test_a_sitemap_only_spider_may_visit_its_sitemaps_hosts() -> None:
    spider = type("S", (Spider,), {"name": "x", "sitemap_urls": ["https://shop.example/sitemap.xml"]})()
    assert spider.domains() == ["shop.example"]
    assert [(r.url, r.callback) for r in spider.start_requests()] == [
        ("https://shop.example/sitemap.xml", SITEMAP_CALLBACK)
    ]
