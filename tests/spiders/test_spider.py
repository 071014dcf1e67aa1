"""The spider author's API: Page, Request, Spider, and loading spiders from a directory."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
from selectolax.lexbor import LexborHTMLParser

import crawler
from crawler.errors import ConfigError, SpiderLoadError
from crawler.spiders.loading import SpiderSet, load_spiders
from crawler.spiders.spider import Page, Request, Spider, callback_name

HTML = b"""<!doctype html>
<html><head><title>Catalogue</title></head>
<body>
  <h1> Shoes </h1>
  <ul>
    <li class="prod"><a href="/p/1">One</a> <span class="price">9.99</span></li>
    <li class="prod"><a href="p/2?x=1">Two</a> <span class="price">19.99</span></li>
    <li class="prod"><a href="">Empty</a></li>
    <li class="prod"><a href="   ">Blank</a></li>
    <li class="prod"><a>No href</a></li>
  </ul>
  <a class="next" href="https://other.example/page/2">next</a>
</body></html>
"""


class Shop(Spider):
    name = "shop"
    start_urls = ["https://Shop.Example:8443/start", "http://cdn.shop.example/x", "/relative"]

    def parse(self, page: Page) -> Iterator[Any]:
        yield from page.follow_all("li.prod a", callback=self.parse_product)

    def parse_product(self, page: Page) -> Iterator[Any]:
        yield {"title": page.text("h1")}

    def _helper(self, page: Page) -> None: ...


@pytest.fixture
def page() -> Page:
    return Page("http://shop.example/cat/shoes", HTML, headers={"Content-Type": "text/html"})


def test_public_surface_is_pinned() -> None:
    assert crawler.__all__ == ["Auto", "DropItem", "Failure", "Page", "Request", "Rule", "Spider"]


# Page ----------------------------------------------------------------------------------


def test_css_returns_every_match_and_css_first_the_first(page: Page) -> None:
    prices = page.css("span.price")
    assert [n.text() for n in prices] == ["9.99", "19.99"]
    assert page.css_first("span.price").text() == "9.99"
    assert page.css_first("table") is None
    assert page.css_first("table", default="none") == "none"
    assert page.css("table") == []


def test_text_strips_by_default_and_falls_back_to_default(page: Page) -> None:
    assert page.text("h1") == "Shoes"
    assert page.text("h1", strip=False) == " Shoes "
    assert page.text("table", default="?") == "?"
    assert "Shoes" in page.text()


def test_text_of_nested_tags_keeps_the_pages_spacing_and_collapses_it() -> None:
    page = Page(
        "http://shop.example/",
        "<h1>Struct <span>Box</span><button>Copy path</button></h1>"
        "<p class=price>Price: <b>£</b><b>5</b>\u00a0each</p>"
        "<div class=body>\n  <p>One\n   line</p>\n  <p>Two</p>\n</div>".encode(),
    )
    assert page.text("h1") == "Struct BoxCopy path"  # as in the page: no space before the button's text
    assert page.text(".price") == "Price: £5\u00a0each"  # a no-break space is kept
    assert page.text(".body") == "One line Two"
    assert page.text(".body", strip=False) == "\n  One\n   line\n  Two\n"


def test_headers_are_lowercased(page: Page) -> None:
    assert page.headers == {"content-type": "text/html"}


def test_urljoin_is_relative_to_the_page(page: Page) -> None:
    assert page.urljoin("p/2") == "http://shop.example/cat/p/2"
    assert page.urljoin("/p/1") == "http://shop.example/p/1"
    assert page.urljoin("  /p/1 ") == "http://shop.example/p/1"
    assert page.urljoin("https://else.example/") == "https://else.example/"


def test_urljoin_honours_base_href() -> None:
    page = Page("http://shop.example/a/b", b'<head><base href="/base/dir/"></head><body></body>')
    assert page.urljoin("c") == "http://shop.example/base/dir/c"
    absolute = Page("http://shop.example/a/b", b'<base href="https://mirror.example/root/">')
    assert absolute.urljoin("c?q=1") == "https://mirror.example/root/c?q=1"


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ('<base href="/base/dir/">', "http://shop.example/base/dir/c?q=1"),  # relative to the page
        ('<base href="sub/">', "http://shop.example/a/sub/c?q=1"),
        ('<base href="https://mirror.example/root/">', "https://mirror.example/root/c?q=1"),
        ("", "http://shop.example/a/c?q=1"),  # no base: the page's URL
        ('<base target="_blank">', "http://shop.example/a/c?q=1"),  # a base without href is no base
        ('<base href="">', "http://shop.example/a/c?q=1"),  # nor is an empty one
        ('<base target="_top"><base href="/second/">', "http://shop.example/second/c?q=1"),  # first with href
        ('<base href="/first/"><base href="/second/">', "http://shop.example/first/c?q=1"),
    ],
)
def test_base_href_semantics(head: str, expected: str) -> None:
    page = Page("http://shop.example/a/b", f"<html><head>{head}</head><body><a href='c?q=1'>c</a></body>".encode())
    assert page.urljoin("c?q=1") == expected
    assert [r.url for r in page.follow_all("a")] == [expected]
    assert page.urljoin("https://else.example/x") == "https://else.example/x"


class CountingParser(LexborHTMLParser):
    """The parser Page uses, counting the document searches for a ``<base>``."""

    base_queries = 0

    def css_first(self, query: str, *args: Any, **kwargs: Any) -> Any:
        if "base" in query:
            CountingParser.base_queries += 1
        return super().css_first(query, *args, **kwargs)


@pytest.mark.parametrize("head", ["", '<base href="/b/">'])
def test_base_is_looked_up_once_per_page_however_many_links(monkeypatch: pytest.MonkeyPatch, head: str) -> None:
    monkeypatch.setattr("crawler.spiders.spider.LexborHTMLParser", CountingParser)
    monkeypatch.setattr(CountingParser, "base_queries", 0)
    links = "".join(f'<a href="p/{i}">{i}</a><a href="#top">top</a>' for i in range(2_000))
    page = Page("http://shop.example/a/", f"<head>{head}</head><body>{links}</body>".encode())
    requests = list(page.follow_all("a"))
    page.urljoin("x")
    page.follow(page.css_first("a"))
    assert len(requests) == 4_000
    assert CountingParser.base_queries == 1


def test_repeated_hrefs_resolve_alike_however_spelled() -> None:
    page = Page("http://shop.example/cat/", b'<a href="p">1</a><a href=" p ">2</a><a href="p">3</a><a href="/p">4</a>')
    assert [r.url for r in page.follow_all("a")] == ["http://shop.example/cat/p"] * 3 + ["http://shop.example/p"]


def old_base_url(page_url: str, body: bytes) -> str:
    """The base ``Page.urljoin`` joined against before links were cached: with urljoin, the oracle."""
    base = LexborHTMLParser(body.decode()).css_first("base[href]")
    return urljoin(page_url, base.attributes.get("href") or "") if base else page_url


BASES = [
    "http://shop.example/cat/shoes",
    "http://shop.example",
    "https://shop.example/a/b/",
    "http://h/a//b/c;p?q#f",
    "https://Shop.Example:8443/x/../y/./z",
    "http://h/a/..",
    "mailto:someone@shop.example",
    "data:text/html,x",
]
#: Pieces of hrefs: plain ones (the fast paths) and every kind of oddity.
PLAIN = ["a", "b-c", "/", "/", "../", "./", "?", "=", "&", "#", "x.html", "~u", "http://h.example", "https://h:8080"]
ODD = [".", "..", "//", ":", ";", "%2F", " ", "\t", "\n", "é", "http:", "https://other.example", "@", "\\", "'", "#"]


def random_hrefs(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    plain = ["".join(rng.choices(PLAIN, k=rng.randrange(1, 9))) for _ in range(n)]
    odd = ["".join(rng.choices(PLAIN + ODD, k=rng.randrange(1, 9))) for _ in range(n)]
    return plain + odd


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("tag", [False, True])
def test_urljoin_gives_what_urllib_gives_for_any_href(base: str, tag: bool) -> None:
    body = b'<head><base href="../up/"></head>' if tag else b"<p>no base</p>"
    hrefs = random_hrefs(1_500, seed=len(base)) + [
        "a",
        "a/b/",
        "../a?x=1",
        "./",
        "../",
        "../../../../a",
        "/",
        "/a/b?",
        "?q",
        "#f",
        "a#",
        "a#f\tg",
        "a?b#c",
        "a//b",
        "a/./b",
        "a/../b",
        ".a",
        "a:b",
        "//other.example/x",
        "a;p",
        "a?",
        " a#x ",
        "%41",
        "a b",
        "https://Other.Example/a/../b?x",
        "HTTP://h/x",
        "http://h:80/a;p?q",
        "http://h?",
        "http://h/a?",
        "https://h/é",
        "http://h",
        "https://h//a/%2e%2E/b?c=d#e",
        "http://[::1]/a",
        "http://u@h/",
        "ftp://h/a",
        "http:a",
    ]
    page = Page(base, body)
    old_base = old_base_url(base, body)
    for href in hrefs * 2:  # twice: the second time from the page's caches
        assert page.urljoin(href) == urljoin(old_base, href.strip()), href


@pytest.mark.slow
def test_follow_all_returns_100000_links_in_document_order() -> None:
    def href(i: int) -> str:
        return (f"item/{i}", f"/abs/{i}?q={i}", f"https://cdn.example/{i}", f"../up/{i}#f")[i % 4]

    def expected(i: int) -> str:
        return (
            f"http://shop.example/cat/item/{i}",
            f"http://shop.example/abs/{i}?q={i}",
            f"https://cdn.example/{i}",
            f"http://shop.example/up/{i}#f",
        )[i % 4]

    n = 100_000
    body = "<ul>" + "".join(f'<li><a href="{href(i)}">{i}</a></li>' for i in range(n)) + "</ul>"
    page = Page("http://shop.example/cat/list", body.encode())
    urls = [r.url for r in page.follow_all("li a", callback="parse_item")]
    assert len(urls) == n
    assert urls == [expected(i) for i in range(n)]


def test_follow_accepts_a_node_and_names_the_callback(page: Page) -> None:
    node = page.css_first("a.next")
    request = page.follow(node, callback="parse_next", meta={"n": 2})
    assert request.url == "https://other.example/page/2"
    assert request.callback == "parse_next"
    assert request.meta == {"n": 2}


def test_follow_all_skips_empty_and_missing_hrefs(page: Page) -> None:
    spider = Shop()
    requests = list(page.follow_all("li.prod a", callback=spider.parse_product))
    assert [r.url for r in requests] == ["http://shop.example/p/1", "http://shop.example/cat/p/2?x=1"]
    assert {r.callback for r in requests} == {"parse_product"}


def test_invalid_bytes_decode_with_replacement() -> None:
    page = Page("http://shop.example/", b"<p>caf\xe9 \xff\xfe ok</p>", encoding="utf-8")
    assert page.text("p") == "caf\ufffd \ufffd\ufffd ok"


def test_declared_charset_is_used() -> None:
    page = Page("http://shop.example/", b"<p>caf\xe9</p>", encoding="latin-1")
    assert page.text("p") == "café"


def test_unknown_charset_falls_back_to_utf8() -> None:
    page = Page("http://shop.example/", "<p>café</p>".encode(), encoding="no-such-charset")
    assert page.text("p") == "café"


def test_a_charset_declared_only_in_the_page_is_used() -> None:
    latin = Page("http://shop.example/", '<meta charset="iso-8859-1"><p>café</p>'.encode("latin-1"))
    assert latin.text("p") == "café"
    cyrillic = '<meta http-equiv="Content-Type" content="text/html; charset=windows-1251"><p>Привет</p>'
    assert Page("http://shop.example/", cyrillic.encode("cp1251")).text("p") == "Привет"
    xml = Page("http://shop.example/f.xml", '<?xml version="1.0" encoding="ISO-8859-1"?><p>é</p>'.encode("latin-1"))
    assert "é" in xml.text


def test_the_header_charset_wins_over_the_pages_and_a_byte_order_mark_over_both() -> None:
    body = '<meta charset="iso-8859-1"><p>café</p>'.encode()
    assert Page("http://shop.example/", body, encoding="utf-8").text("p") == "café"
    bom = Page("http://shop.example/", b"\xef\xbb\xbf" + "<p>café</p>".encode(), encoding="latin-1")
    assert bom.text("p") == "café"
    unknown = Page("http://shop.example/", '<meta charset="koi8-r"><p>Привет</p>'.encode("koi8-r"), encoding="nope")
    assert unknown.text("p") == "Привет"


def test_empty_body_parses_to_nothing() -> None:
    page = Page("http://shop.example/", b"")
    assert page.css("a") == []
    assert page.text("h1") == ""


# Request -------------------------------------------------------------------------------


def test_request_names_a_bound_method_callback() -> None:
    request = Request("http://shop.example/", callback=Shop().parse_product)
    assert request.callback == "parse_product"


def test_request_keeps_a_string_callback_and_defaults_to_parse() -> None:
    assert Request("http://shop.example/", callback="parse_product").callback == "parse_product"
    assert Request("http://shop.example/").callback == "parse"
    assert callback_name(None) == "parse"


def plain_function(page: Page) -> None: ...


@pytest.mark.parametrize("bad", [plain_function, lambda page: None, Shop.parse_product, 42])
def test_request_refuses_a_callback_that_is_not_a_bound_method(bad: Any) -> None:
    with pytest.raises(TypeError, match="callback"):
        Request("http://shop.example/", callback=bad)


# Spider --------------------------------------------------------------------------------


def test_spider_callback_returns_the_bound_method() -> None:
    spider = Shop()
    assert spider.callback("parse_product") == spider.parse_product
    assert spider.callback("parse") == spider.parse


@pytest.mark.parametrize("name", ["missing", "_helper", "__init__", "__class__", "name", "start_urls"])
def test_spider_callback_refuses_unknown_private_and_non_callable_names(name: str) -> None:
    with pytest.raises(AttributeError, match=repr(name)):
        Shop().callback(name)


def test_default_parse_says_it_is_not_defined(page: Page) -> None:
    class Bare(Spider):
        name = "bare"

    with pytest.raises(NotImplementedError, match="Bare.parse"):
        Bare().parse(page)


def test_domains_default_to_the_start_urls_hosts() -> None:
    assert Shop().domains() == ["cdn.shop.example", "shop.example"]


def test_allowed_domains_are_lowercased_and_undotted() -> None:
    class Listed(Shop):
        allowed_domains = [".Shop.Example", "cdn.example"]

    assert Listed().domains() == ["shop.example", "cdn.example"]


def test_start_requests_follow_start_urls() -> None:
    assert [r.url for r in Shop().start_requests()] == Shop.start_urls


# load_spiders ----------------------------------------------------------------------------

GOOD = """
from crawler import Spider, Page
from crawler.spiders.spider import Spider as SameSpider


class Books(Spider):
    name = "books"
    start_urls = ["http://books.example/"]
    interval = 0.5


class Nameless(Spider):
    pass
"""

REEXPORT = """
from crawler_sites.good import Books  # imported, not defined here: not registered twice


class Music(Books):
    name = "music"
"""


@pytest.fixture
def sites_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "sites"
    directory.mkdir()
    (directory / "good.py").write_text(GOOD)
    (directory / "raises.py").write_text("raise RuntimeError('no API key configured')\n")
    (directory / "syntax.py").write_text("class Broken(:\n    pass\n")
    (directory / "_private.py").write_text("raise SystemExit('must not be imported')\n")
    (directory / "notes.txt").write_text("not python")
    before = set(sys.modules)
    yield directory
    for name in set(sys.modules) - before:
        if name.startswith("crawler_sites"):
            del sys.modules[name]


def test_load_spiders_keeps_good_modules_and_names_the_broken_ones(sites_dir: Path) -> None:
    found = load_spiders(sites_dir)
    assert set(found.spiders) == {"books"}
    assert found.spiders["books"].interval == 0.5
    errors = {e.module: e for e in found.errors}
    assert set(errors) == {"raises", "syntax"}
    assert "RuntimeError: no API key configured" in errors["raises"].reason
    assert "SyntaxError" in errors["syntax"].reason
    assert "'raises'" in str(errors["raises"])
    assert "crawler_sites.raises" not in sys.modules


def test_load_spiders_registers_a_class_only_where_it_is_defined(sites_dir: Path) -> None:
    (sites_dir / "reexport.py").write_text(REEXPORT)
    found = load_spiders(sites_dir)
    assert set(found.spiders) == {"books", "music"}
    assert found.spiders["books"].__module__ == "crawler_sites.good"


def test_load_spiders_finds_extra_spiders_by_name_only_and_tolerates_a_missing_directory(tmp_path: Path) -> None:
    found = load_spiders(tmp_path / "does-not-exist", extra=[Shop])
    assert found.spiders == {}  # not listed (``crawler sites``), not matched by domain (``crawler fetch``)
    assert found.get("shop") is Shop and found.named() == {"shop": Shop}
    assert found.errors == []


def test_spider_set_get_unknown_site_lists_the_known_ones(sites_dir: Path) -> None:
    found = load_spiders(sites_dir, extra=[Shop])
    assert found.get("books").name == "books"
    with pytest.raises(ConfigError, match=r"unknown site 'nope' \(known: books\)"):
        found.get("nope")


def test_spider_set_get_failed_module_raises_its_load_error(sites_dir: Path) -> None:
    found = load_spiders(sites_dir)
    with pytest.raises(SpiderLoadError) as info:
        found.get("raises")
    assert info.value.module == "raises"
    assert "no API key configured" in str(info.value)


def test_empty_spider_set_says_none_are_known() -> None:
    with pytest.raises(ConfigError, match=r"known: none"):
        SpiderSet({}, []).get("shop")
