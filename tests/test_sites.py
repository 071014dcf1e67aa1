"""The real-site spiders in ``sites/``, proven offline against copies of the sites.

``tests/sitecopies.py`` serves pages with the live sites' markup, paths and relative
links. Callbacks are run on those pages as if they came from the live hosts (so links
must resolve to the live URLs), then each copy is crawled end to end with worker
threads: every item stored once with its exact values, every page fetched once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from crawling import installed_runtime, run_in_threads
from redis import Redis
from sitecopies import (
    AUTHORS,
    BOOKS,
    CATEGORIES,
    QUOTE_PAGES,
    BooksSite,
    QuotesSite,
    SiteCopy,
    expected_author,
    expected_book,
    expected_quote,
)

from crawler import testing
from crawler.coord.frontier import seed
from crawler.settings import Settings
from crawler.spiders.loading import SpiderSet, load_spiders
from crawler.spiders.spider import Request, Spider
from crawler.store.database import OK, Store
from crawler.testing import run_page

SITES_DIR = Path(__file__).resolve().parent.parent / "sites"
QUOTES_LIVE = "https://quotes.toscrape.com"
BOOKS_LIVE = "https://books.toscrape.com"
#: Longest a crawl of a copy may take.
CRAWL_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def spiders() -> SpiderSet:
    return load_spiders(SITES_DIR)


@pytest.fixture(scope="module")
def quotes_spider(spiders: SpiderSet) -> Spider:
    return spiders.get("quotes")()


@pytest.fixture(scope="module")
def books_spider(spiders: SpiderSet) -> Spider:
    return spiders.get("books")()


@pytest.fixture(scope="module")
def quotes_site() -> QuotesSite:
    return QuotesSite()  # not started: the callback tests only read its pages


@pytest.fixture(scope="module")
def books_site() -> BooksSite:
    return BooksSite()


Outputs = tuple[list[dict[str, Any]], list[Request]]


def run(spider: Spider, callback: str, site: SiteCopy, path: str, base: str) -> Outputs:
    """Run ``callback`` on ``site``'s page at ``path``, as if fetched from ``base + path`` (``crawler.testing``)."""
    out = run_page(spider, base + path, site.body(path), callback=callback, headers={"Content-Type": site.content_type})
    return out.items, out.requests


def links(requests: list[Request], callback: str) -> list[str]:
    return [r.url for r in requests if r.callback == callback]


# -- the modules --------------------------------------------------------------------


def test_both_spiders_load_from_sites_and_aim_at_the_live_sites(spiders: SpiderSet) -> None:
    assert [e.module for e in spiders.errors if e.module in ("quotes", "books")] == []
    quotes, books = spiders.get("quotes"), spiders.get("books")
    assert (quotes.start_urls, quotes.allowed_domains) == ([QUOTES_LIVE + "/"], ["quotes.toscrape.com"])
    assert (books.start_urls, books.allowed_domains) == ([BOOKS_LIVE + "/"], ["books.toscrape.com"])
    for spider in (quotes, books):
        assert spider.interval == 1.0
        assert spider.obey_robots and not spider.allow_private_addresses
    assert (quotes.item_key, books.item_key) == ("key", "upc")


# -- quotes: callbacks ----------------------------------------------------------------


def test_quotes_first_page_gives_its_ten_quotes_authors_and_next_page(
    quotes_spider: Spider, quotes_site: QuotesSite
) -> None:
    items, requests = run(quotes_spider, "parse", quotes_site, "/", QUOTES_LIVE)
    assert items[0] == {
        "type": "quote",
        "key": "quote:The world as we have created it is a process of our thinking. "
        "It cannot be changed without changing our thinking.",
        "text": "The world as we have created it is a process of our thinking. "
        "It cannot be changed without changing our thinking.",
        "author": "Albert Einstein",
        "tags": ["change", "deep-thoughts", "thinking", "world"],
    }
    assert items == [expected_quote(q) for q in QUOTE_PAGES[0]]
    # One author link per quote (Einstein thrice; the frontier fetches it once), no slash.
    assert links(requests, "parse_author") == [f"{QUOTES_LIVE}/author/{q.author}" for q in QUOTE_PAGES[0]]
    assert links(requests, "parse") == [f"{QUOTES_LIVE}/page/2/"]
    assert len(requests) == 11  # no tag, login, "Top Ten tags" or footer links


def test_quotes_later_pages_follow_next_not_previous_and_the_last_page_stops(
    quotes_spider: Spider, quotes_site: QuotesSite
) -> None:
    items, requests = run(quotes_spider, "parse", quotes_site, "/page/2/", QUOTES_LIVE)
    assert items == [expected_quote(q) for q in QUOTE_PAGES[1]]
    assert links(requests, "parse") == [f"{QUOTES_LIVE}/page/3/"]

    items, requests = run(quotes_spider, "parse", quotes_site, "/page/3/", QUOTES_LIVE)
    assert items == [expected_quote(q) for q in QUOTE_PAGES[2]]
    assert links(requests, "parse") == []
    untagged = [item for item in items if item["author"] == "J.K. Rowling"]
    assert [item["tags"] for item in untagged] == [[]]


def test_quotes_page_past_the_end_gives_nothing(quotes_spider: Spider, quotes_site: QuotesSite) -> None:
    assert run(quotes_spider, "parse", quotes_site, "/page/4/", QUOTES_LIVE) == ([], [])


def test_quotes_author_page_gives_one_author_item(quotes_spider: Spider, quotes_site: QuotesSite) -> None:
    url = f"{QUOTES_LIVE}/author/Albert-Einstein"
    items, requests = run(quotes_spider, "parse_author", quotes_site, "/author/Albert-Einstein", QUOTES_LIVE)
    assert requests == []
    assert items == [
        {
            "type": "author",
            "key": "author:Albert-Einstein",
            "name": "Albert Einstein",
            "born_date": "1879-03-14",
            "born_location": "Ulm, Germany",
            "description": AUTHORS["Albert-Einstein"].description,
            "url": url,
        }
    ]
    # The same page with the trailing slash is the same author (the same key).
    items, _ = run(quotes_spider, "parse_author", quotes_site, "/author/Albert-Einstein/", QUOTES_LIVE)
    assert items == [expected_author("Albert-Einstein", url + "/")]
    for slug in AUTHORS:
        items, _ = run(quotes_spider, "parse_author", quotes_site, f"/author/{slug}", QUOTES_LIVE)
        assert items == [expected_author(slug, f"{QUOTES_LIVE}/author/{slug}")]


# -- books: callbacks -----------------------------------------------------------------


def test_books_home_page_links_its_books_the_next_page_and_the_categories(
    books_spider: Spider, books_site: BooksSite
) -> None:
    for path in ("/", "/index.html"):
        items, requests = run(books_spider, "parse", books_site, path, BOOKS_LIVE)
        assert items == []
        assert links(requests, "parse_book") == [f"{BOOKS_LIVE}{b.path}" for b in BOOKS[:20]]
        assert links(requests, "parse_book")[0] == f"{BOOKS_LIVE}/catalogue/a-light-in-the-attic_1000/index.html"
        assert links(requests, "parse") == [
            f"{BOOKS_LIVE}/catalogue/page-2.html",  # href="catalogue/page-2.html"
            f"{BOOKS_LIVE}/catalogue/category/books_1/index.html",
            f"{BOOKS_LIVE}/catalogue/category/books/travel_2/index.html",
            f"{BOOKS_LIVE}/catalogue/category/books/mystery_3/index.html",
            f"{BOOKS_LIVE}/catalogue/category/books/poetry_23/index.html",
        ]


def test_books_catalogue_pages_resolve_their_links_under_catalogue(books_spider: Spider, books_site: BooksSite) -> None:
    _, requests = run(books_spider, "parse", books_site, "/catalogue/page-2.html", BOOKS_LIVE)
    assert links(requests, "parse_book") == [f"{BOOKS_LIVE}{b.path}" for b in BOOKS[20:40]]
    assert links(requests, "parse")[0] == f"{BOOKS_LIVE}/catalogue/page-3.html"  # href="page-3.html"

    _, requests = run(books_spider, "parse", books_site, "/catalogue/page-3.html", BOOKS_LIVE)
    assert links(requests, "parse_book") == [f"{BOOKS_LIVE}{b.path}" for b in BOOKS[40:]]
    assert links(requests, "parse")[0] == f"{BOOKS_LIVE}/catalogue/category/books_1/index.html"  # no next


def test_books_category_pages_list_their_books_and_page_on(books_spider: Spider, books_site: BooksSite) -> None:
    _, requests = run(books_spider, "parse", books_site, "/catalogue/category/books/travel_2/index.html", BOOKS_LIVE)
    travel = [b for b in BOOKS if b.category == "travel_2"]
    # href="../../../its-only-the-himalayas_981/index.html"
    assert links(requests, "parse_book")[0] == f"{BOOKS_LIVE}/catalogue/its-only-the-himalayas_981/index.html"
    assert links(requests, "parse_book") == [f"{BOOKS_LIVE}{b.path}" for b in travel]
    assert f"{BOOKS_LIVE}/catalogue/category/books/travel_2/page-2.html" not in links(requests, "parse")

    mystery = [b for b in BOOKS if b.category == "mystery_3"]
    directory = f"{BOOKS_LIVE}/catalogue/category/books/mystery_3"
    _, requests = run(books_spider, "parse", books_site, "/catalogue/category/books/mystery_3/index.html", BOOKS_LIVE)
    assert links(requests, "parse_book") == [f"{BOOKS_LIVE}{b.path}" for b in mystery[:20]]
    assert links(requests, "parse")[0] == f"{directory}/page-2.html"
    _, requests = run(books_spider, "parse", books_site, "/catalogue/category/books/mystery_3/page-2.html", BOOKS_LIVE)
    assert links(requests, "parse_book") == [f"{BOOKS_LIVE}{b.path}" for b in mystery[20:]]
    assert f"{directory}/page-3.html" not in links(requests, "parse")


def test_books_every_link_followed_from_every_listing_page_is_a_page_of_the_site(
    books_spider: Spider, books_site: BooksSite
) -> None:
    listings = [p for p in books_site.pages if "/category/" in p or "page-" in p or p in ("/", "/index.html")]
    # "All products" (/, /index.html, catalogue/page-1..3.html), "Books" (index.html, page-1..3.html), and
    # each category's index.html, page-1.html and further pages: Travel 2, Mystery 3, Poetry 2.
    assert len(listings) == 5 + 4 + 2 + 3 + 2
    reached = set()
    for path in listings:
        _, requests = run(books_spider, "parse", books_site, path, BOOKS_LIVE)
        for request in requests:
            assert request.url.startswith(BOOKS_LIVE + "/"), request.url
            target = request.url.removeprefix(BOOKS_LIVE)
            assert target in books_site.pages, f"{path} links {request.url}, not a page of the site"
            reached.add(target)
    assert reached >= {b.path for b in BOOKS} | {f"{c.dir}/index.html" for c in CATEGORIES}


def test_books_product_page_gives_the_exact_item(books_spider: Spider, books_site: BooksSite) -> None:
    path = "/catalogue/a-light-in-the-attic_1000/index.html"
    items, requests = run(books_spider, "parse_book", books_site, path, BOOKS_LIVE)
    assert requests == []  # the breadcrumb links back to listings already crawled
    assert items == [
        {
            "upc": "a897fe39b1053632",
            "title": "A Light in the Attic",
            "price": "51.77",
            "currency": "GBP",
            "in_stock": True,
            "stock": 22,
            "rating": 3,
            "category": "Poetry",
            "url": BOOKS_LIVE + path,
        }
    ]


def test_books_every_product_page_including_out_of_stock(books_spider: Spider, books_site: BooksSite) -> None:
    for book in BOOKS:
        items, _ = run(books_spider, "parse_book", books_site, book.path, BOOKS_LIVE)
        assert items == [expected_book(book, BOOKS_LIVE + book.path)]
    bazaar = next(b for b in BOOKS if b.slug == "the-great-railway-bazaar")
    items, _ = run(books_spider, "parse_book", books_site, bazaar.path, BOOKS_LIVE)
    assert (items[0]["in_stock"], items[0]["stock"]) == (False, 0)
    # Titles with entities and typographic marks come out as text.
    noah = next(b for b in BOOKS if b.id == 811)
    items, _ = run(books_spider, "parse_book", books_site, noah.path, BOOKS_LIVE)
    assert items[0]["title"] == "Full Moon over Noah’s Ark: An Odyssey to Mount Ararat and Beyond"


# -- full crawls of the copies ---------------------------------------------------------


def loopback_copy(spider: type[Spider], site: SiteCopy) -> type[Spider]:
    """``spider`` aimed at the copy: its start URL on loopback, a short interval."""
    return type(
        spider.__name__,
        (spider,),
        {
            "start_urls": [site.url + "/"],
            "allowed_domains": ["127.0.0.1"],
            "interval": 0.01,
        },
    )


def crawl(connection: Redis, settings: Settings, spider: type[Spider]) -> None:
    """Seed ``spider``'s start URLs and crawl to the end with in-process worker threads."""
    with installed_runtime(connection, settings, spider_set=SpiderSet({spider.name: spider}, [])) as rt:
        seed(rt.frontier(spider.name), spider.start_urls)
        run_in_threads(rt, (spider.name,), CRAWL_TIMEOUT)


def assert_complete_crawl(settings: Settings, site_name: str, site: SiteCopy) -> None:
    """Every item once with its exact values; every page fetched once and parsed fine."""
    store = Store(settings.database_url)
    try:
        rows = store.item_rows(site_name)
        fetches = store.fetch_rows(site_name)
    finally:
        store.close()
    assert {row["key"]: row["data"] for row in rows} == site.expected_items()
    assert len(rows) == len(site.expected_items())
    assert site.counts() == dict.fromkeys(site.crawl_paths(), 1)
    assert {status for _, status in site.requests} == {200}
    assert {(r["kind"], r["outcome"]) for r in fetches} <= {("download", OK), ("parse", OK)}
    pages = {r["url"] for r in fetches if r["kind"] == "parse"}
    assert pages == {site.url + path for path in site.crawl_paths() - {"/robots.txt"}}


@pytest.mark.integration
def test_quotes_crawl_of_the_copy_stores_every_quote_and_author_once(spiders: SpiderSet) -> None:
    # With crawler.testing.crawl: its own embedded Redis and SQLite file, worker threads.
    with QuotesSite() as site:
        result = testing.crawl(
            spiders.get("quotes"), [site.url + "/"], allowed_domains=["127.0.0.1"], interval=0.01, timeout=CRAWL_TIMEOUT
        )
        assert result.keyed == site.expected_items()
        assert len(result.items) == len(site.expected_items()) == 30 + len(AUTHORS)
        assert site.counts() == dict.fromkeys(site.crawl_paths(), 1)
        assert {(r["kind"], r["outcome"]) for r in result.fetches} == {("download", OK), ("parse", OK)}
        assert set(result.urls("parse")) == {site.url + path for path in site.crawl_paths() - {"/robots.txt"}}
        assert result.failed == []


def test_books_crawl_of_the_copy_stores_every_book_once(
    redis_conn: Redis, settings: Settings, spiders: SpiderSet
) -> None:
    with BooksSite() as site:
        spider = loopback_copy(spiders.get("books"), site)
        crawl(redis_conn, settings, spider)
        assert_complete_crawl(settings, "books", site)
        assert len(site.expected_items()) == len(BOOKS) == 41
