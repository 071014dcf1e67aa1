"""Link rules (``Spider.rules``, ``crawler.spiders.rules``): Scrapy's ``CrawlSpider`` semantics on any spider.

Extraction and rule order on HTML strings (``run_page``, no server), the checks at load, a
crawl of the demo shop by a spider of rules alone, and one of the books.toscrape.com copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sitecopies import BooksSite

from crawler import Request, Rule, Spider
from crawler.demo import ShopSite
from crawler.errors import ConfigError
from crawler.spiders.check import check_spider
from crawler.spiders.loading import load_spiders
from crawler.spiders.spider import Page
from crawler.testing import crawl, run_page

BASE = "https://shop.example"
SITES_DIR = Path(__file__).resolve().parents[2] / "sites"

LISTING = """<html><head><base href="https://shop.example/cat/"></head><body>
<nav><a href="/cat/shoes">Shoes</a> <a href="/cat/hats?page=2">Hats</a> <a href="/about">About</a></nav>
<div class="list">
  <a href="/item/1">  One </a> <a href="item/2">Two <b>big</b></a> <a href="/item/1">One, again</a>
  <a href="https://other.example/item/9">Elsewhere</a> <a href="https://cdn.shop.example/item/8">CDN</a>
  <a href="/item/3.PDF">Brochure</a> <a href="mailto:shop@shop.example">Mail</a> <a href="javascript:void(0)">JS</a>
</div>
<a class="list" href="/item/5">Five, the region itself</a>
<a href="/item/4">Four, outside the list</a>
<map><area href="/item/6"></map>
<link rel="next" href="/cat/shoes?page=2"><div data-href="/item/7">Seven</div>
</body></html>"""


def links(out: Any) -> list[tuple[str, str, int | None]]:
    """Each request as (path and query, callback, rule index)."""
    return [(r.url.removeprefix(BASE), r.callback, r.meta.get("rule")) for r in out.requests]


class Catalogue(Spider):
    name = "catalogue"
    start_urls = [f"{BASE}/"]
    rules = [
        Rule(allow=r"/item/\d+", restrict_css=".list", callback="parse_item"),
        Rule(allow=[r"/cat/", r"/item/"], deny=r"hats"),
    ]

    def parse_item(self, page: Page) -> Any:
        yield {"url": page.url}
        yield Request(f"{BASE}/reviews/1", callback=self.parse_item)


def test_the_first_rule_that_takes_a_link_wins_and_pages_of_the_default_callback_are_followed() -> None:
    out = run_page(Catalogue, f"{BASE}/cat/", LISTING)
    assert out.items == []  # no parse, no parse_start_url: the start page yields its rules' links alone
    assert links(out) == [
        # rule 0: items in the .list regions, each once, in document order (a region may be the link itself)
        ("/item/1", "parse_item", 0),
        ("/cat/item/2", "parse_item", 0),  # relative to <base href>
        ("https://cdn.shop.example/item/8", "parse_item", 0),  # a subdomain: within the allowed domains
        ("/item/3.PDF", "parse_item", 0),  # the spider's deny_extensions drop it when queued (PageLinks)
        ("/item/5", "parse_item", 0),
        # rule 1: what rule 0 took is not taken again; hats denied, /about not allowed
        ("/cat/shoes", "parse", 1),
        ("/item/4", "parse", 1),
        ("/item/6", "parse", 1),  # <area href> as well as <a href>
    ]


def test_a_rule_with_a_callback_does_not_follow_by_default_one_without_follows() -> None:
    on_item = run_page(Catalogue, f"{BASE}/item/1", LISTING, callback="parse_item", meta={"rule": 0})
    assert on_item.items == [{"url": f"{BASE}/item/1"}]
    assert links(on_item) == [("/reviews/1", "parse_item", None)]  # its own request, no rule's links
    on_category = run_page(Catalogue, f"{BASE}/cat/shoes", LISTING, meta={"rule": 1})
    assert on_category.items == [] and len(on_category.requests) == 8

    class Follows(Catalogue):
        rules = [Rule(allow=r"/item/\d+$", callback="parse_item", follow=True), Rule(allow=r"/cat/", follow=False)]

        def parse(self, page: Page) -> Any:
            yield {"parsed": page.url}

    followed = run_page(Follows, f"{BASE}/item/1", LISTING, callback="parse_item", meta={"rule": 0})
    # The callback's outputs first, then its page's links through the rules.
    assert [r.url.removeprefix(BASE) for r in followed.requests][:3] == ["/reviews/1", "/item/1", "/cat/item/2"]
    # A rule without a callback calls none, even with a parse defined; follow=False: no links either.
    assert run_page(Follows, f"{BASE}/cat/shoes", LISTING, meta={"rule": 1}).requests == []
    assert run_page(Follows, f"{BASE}/cat/shoes", LISTING, meta={"rule": 1}).items == []
    # A start page goes to parse, then through the rules.
    start = run_page(Follows, f"{BASE}/", LISTING)
    assert start.items == [{"parsed": f"{BASE}/"}] and start.links("parse_item")[:1] == [f"{BASE}/item/1"]


def test_pages_the_spider_s_own_requests_lead_to_are_not_followed_and_a_stale_rule_index_is_ignored() -> None:
    class Follows(Catalogue):
        rules = [Rule(allow=r"/item/\d+$", callback="parse_item", follow=True), Rule(allow=r"/cat/")]

    def run(meta: dict[str, Any] | None) -> list[tuple[str, str, int | None]]:
        return links(run_page(Follows, f"{BASE}/item/2", LISTING, callback="parse_item", meta=meta))

    items = ["/item/1", "/cat/item/2", "https://cdn.shop.example/item/8", "/item/5", "/item/4", "/item/6"]
    assert run({"rule": 0}) == [
        ("/reviews/1", "parse_item", None),  # the callback's own first, then the rules' (it follows)
        *[(path, "parse_item", 0) for path in items],
        ("/cat/shoes", "parse", 1),
        ("/cat/hats?page=2", "parse", 1),
    ]
    own = [("/reviews/1", "parse_item", None)]
    assert run(None) == own  # the spider's own request for parse_item: as in Scrapy, its page is not followed
    assert run({"rule": 1}) == own  # rule 1 has no callback: a request for parse_item is not its (the rules changed)
    assert run({"rule": 9}) == own


def test_parse_start_url_handles_start_pages_of_a_spider_without_parse() -> None:
    class Start(Catalogue):
        def parse_start_url(self, page: Page) -> Any:
            yield {"start": page.url}

    out = run_page(Start, f"{BASE}/", LISTING)
    assert out.items == [{"start": f"{BASE}/"}] and len(out.requests) == 8


def test_filters_domains_tags_attrs_extensions_and_text() -> None:
    class Filters(Catalogue):
        allowed_domains = ["shop.example"]
        rules = [
            Rule(deny=r"/item/", deny_domains="cdn.shop.example", callback="parse_item"),
            Rule(allow_domains=["cdn.shop.example"], callback="parse_item", meta={"from": "cdn"}),
            Rule(tags=("link", "div"), attrs=("href", "data-href"), callback="parse_item"),
            Rule(allow=r"/item/", deny_extensions=["pdf"], restrict_text=[r"^(One|Two|Four)"], callback="parse_item"),
        ]

    out = run_page(Filters, f"{BASE}/cat/", LISTING)
    assert [(r.url.removeprefix(BASE), r.meta) for r in out.requests] == [
        ("/cat/shoes", {"rule": 0}),
        ("/cat/hats?page=2", {"rule": 0}),
        ("/about", {"rule": 0}),
        ("https://cdn.shop.example/item/8", {"from": "cdn", "rule": 1}),  # a subdomain of the allowed domain
        ("/cat/shoes?page=2", {"rule": 2}),
        ("/item/7", {"rule": 2}),
        ("/item/1", {"rule": 3}),  # "  One " as text "One"; other.example is outside the allowed domains
        ("/cat/item/2", {"rule": 3}),  # "Two big": the text of everything in the link
        ("/item/4", {"rule": 3}),
    ]


def test_process_links_and_process_request_hooks_and_the_rule_s_errback() -> None:
    class Hooks(Catalogue):
        rules = [
            Rule(
                allow=r"/item/", process_links="first_two", process_request="tag", callback="parse_item", errback="gone"
            )
        ]

        def gone(self, failure: Any) -> Any:
            yield {"gone": failure.url}

        def first_two(self, found: list[Any]) -> list[Any]:
            return found[:2]

        def tag(self, request: Request, page: Page) -> Request | None:
            if request.url.endswith("/2"):
                return None
            request.meta["from"] = page.url
            return request

    out = run_page(Hooks, f"{BASE}/cat/", LISTING)
    assert [(r.url, r.meta, r.errback) for r in out.requests] == [
        (f"{BASE}/item/1", {"rule": 0, "from": f"{BASE}/cat/"}, "gone")
    ]


def test_rules_leave_non_html_pages_alone_and_callbacks_may_be_methods() -> None:
    class Json(Catalogue):
        content_types = ("text/html", "application/json")
        rules = [Rule(allow=r"/item/", callback=Catalogue.parse_item)]  # the function itself names the method

    out = run_page(Json, f"{BASE}/", LISTING, headers={"Content-Type": "application/json"})
    assert out.requests == []
    assert run_page(Json, f"{BASE}/", LISTING).links("parse_item")[:1] == [f"{BASE}/item/1"]


def test_follow_all_filters_by_allow_and_deny() -> None:
    page = Page(f"{BASE}/cat/", LISTING.encode())
    urls = [r.url.removeprefix(BASE) for r in page.follow_all("a", allow=r"/item/\d", deny=[r"(?i)\.pdf$", r"/4$"])]
    assert urls == [
        "/item/1",
        "/cat/item/2",
        "/item/1",
        "https://other.example/item/9",
        "https://cdn.shop.example/item/8",
        "/item/5",
    ]
    # One regex or several, searched in the absolute URL (mailto: too: follow_all takes any href).
    assert len(list(page.follow_all(".list a", allow=r"shop\.example"))) == 6
    assert len(list(page.follow_all("a", callback="parse_item"))) == 13  # no allow nor deny: every href


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([Rule(allow="(")], "Shop.rules[0].allow: '(' is not a regex: missing ), unterminated subpattern"),
        (
            [Rule(), Rule(deny=["ok", "[a-"])],
            "Shop.rules[1].deny: ['ok', '[a-'] is not a regex: unterminated character",
        ),
        ([Rule(callback="parse_itme")], "Shop.rules[0].callback names 'parse_itme', which is not a method of Shop"),
        ([Rule(callback=3)], "Shop.rules[0].callback must be a spider method or its name, got 3"),  # type: ignore[arg-type]
        ([Rule(callback=lambda page: [])], "Shop.rules[0].callback names '<lambda>', which is not a method of Shop"),
        ([Rule(process_links="_private")], "Shop.rules[0].process_links names '_private', which is not a method"),
        ([Rule(errback="on_error")], "Shop.rules[0].errback names 'on_error', which is not a method of Shop"),
        ([Rule(restrict_css="div[[")], "Shop.rules[0].restrict_css: 'div[[' is not a CSS selector"),
        ([Rule(tags="a href")], "Shop.rules[0]: tags and attrs must be names like 'a' and 'href'"),
        ([Rule(meta={"a": object()})], "Shop.rules[0].meta must be a dict of JSON data"),
        ([Rule(follow="yes")], "Shop.rules[0].follow must be True, False or None, got 'yes'"),  # type: ignore[arg-type]
        (Rule(), "Shop.rules must be a list of Rule(...), got Rule("),
        (["/item/"], "Shop.rules[0] must be a Rule(...), got '/item/'"),
    ],
    ids=lambda value: None if isinstance(value, str) else repr(value)[:40],
)
def test_a_bad_rule_is_a_one_line_error_naming_it(rules: Any, message: str) -> None:
    class Shop(Spider):
        name = "shop"
        start_urls = [f"{BASE}/"]

        def parse_item(self, page: Page) -> Any:
            return []

    Shop.rules = rules
    problem = check_spider(Shop)
    assert problem is not None and problem.startswith(message) and "\n" not in problem
    with pytest.raises(ConfigError, match="^Shop.rules"):  # at parse time too, should the check be skipped
        run_page(Shop(), f"{BASE}/", LISTING)


class ShopByRules(Spider):
    """The demo shop crawled by rules alone: listings followed (but the third), products parsed, not followed."""

    name = "shop-rules"
    allowed_domains = ["127.0.0.1"]
    item_key = "sku"
    rules = [
        Rule(allow=r"/product/\d+", callback="parse_product"),
        Rule(allow=r"/products\?page=\d+$", deny=r"page=3$"),
    ]

    def parse_product(self, page: Page) -> Any:
        yield {
            "sku": page.text(".sku"),
            "name": page.text("h1"),
            "price": float(page.text(".price")),
            "in_stock": page.text(".stock") == "in stock",
            "url": page.url,
        }


@pytest.mark.integration
def test_a_spider_of_rules_alone_crawls_the_shop_and_requests_nothing_its_rules_deny() -> None:
    with ShopSite(products=30, per_page=10, faults=False) as shop:
        result = crawl(ShopByRules, [shop.url + "/"], interval=0.005)
        requested = sorted(entry.path for entry in shop.requests)
        expected = {sku: item for sku, item in shop.expected_items().items() if int(sku[-5:]) <= 20}
    assert result.keyed == expected and not result.failed
    # Listing 3 is denied, so its products are never reached: product pages follow no links
    # (their rule has a callback), not their "related" product, not "back to products".
    # Nor /private/admin, /catalogue.pdf: no rule takes them.
    assert requested == sorted(
        ["/robots.txt", "/", "/products?page=1", "/products?page=2"] + [f"/product/{n}" for n in range(1, 21)]
    )


@pytest.mark.integration
def test_books_by_rules_alone_fetch_what_the_hand_written_spider_fetches() -> None:
    # sites/books.py's callbacks for books, its parse replaced by two rules: the same crawl of the copy.
    books = load_spiders(SITES_DIR).get("books")

    class BooksByRules(books):  # type: ignore[misc,valid-type]
        parse = Spider.parse  # no parse of its own: start pages go through the rules alone
        rules = [
            Rule(restrict_css="article.product_pod h3", callback="parse_book"),
            Rule(restrict_css=["li.next", "div.side_categories"]),
        ]

    with BooksSite() as site:
        result = crawl(BooksByRules, [site.url + "/"], allowed_domains=["127.0.0.1"], interval=0.005, timeout=60)
        assert result.keyed == site.expected_items() and not result.failed
        assert site.counts() == dict.fromkeys(site.crawl_paths(), 1)  # every page of the site once, no other
