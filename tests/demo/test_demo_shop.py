"""The demo shop server (over loopback HTTP) and the demo spider's callbacks (offline)."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urldefrag

import httpx
import pytest
from selectolax.lexbor import LexborHTMLParser

from crawler.demo import DemoShop, ShopSite
from crawler.demo import shop as shop_module
from crawler.spiders.spider import Page, Request

PRODUCTS = 45
PER_PAGE = 20


@pytest.fixture
def site() -> Iterator[ShopSite]:
    with ShopSite(products=PRODUCTS, per_page=PER_PAGE) as shop:
        yield shop


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(follow_redirects=False, timeout=5) as http:
        yield http


def fetch_page(client: httpx.Client, url: str) -> Page:
    """A spider Page built from what the server answers at ``url``."""
    response = client.get(url)
    return Page(url, response.content, response.status_code, dict(response.headers))


def product_links(body: str) -> list[str]:
    return [node.attributes["href"] or "" for node in LexborHTMLParser(body).css("li.prod a")]


# -- the server ---------------------------------------------------------------------


@pytest.mark.integration
def test_url_and_lifecycle() -> None:
    shop = ShopSite(products=1)
    with pytest.raises(RuntimeError):
        _ = shop.url
    with shop:
        assert shop.url.startswith("http://127.0.0.1:") and not shop.url.endswith("/")
        assert httpx.get(shop.url + "/").status_code == 200
    shop.stop()  # idempotent


def test_robots_txt(site: ShopSite, client: httpx.Client) -> None:
    response = client.get(site.url + "/robots.txt")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text.splitlines() == ["User-agent: *", "Disallow: /private/"]


def test_home_links(site: ShopSite, client: httpx.Client) -> None:
    response = client.get(site.url + "/")
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    hrefs = [a.attributes["href"] for a in LexborHTMLParser(response.text).css("a")]
    assert hrefs == ["/products?page=1", "/private/admin"]


def test_listing_pagination(site: ShopSite, client: httpx.Client) -> None:
    seen: list[int] = []
    for number, count in [(1, 20), (2, 20), (3, 5)]:
        response = client.get(f"{site.url}/products?page={number}")
        assert response.status_code == 200
        tree = LexborHTMLParser(response.text)
        hrefs = product_links(response.text)
        assert len(hrefs) == count
        seen += [int(urldefrag(h).url.rsplit("/", 1)[1]) for h in hrefs]
        spellings = {h.startswith("http://") for h in hrefs} | {"#" in h for h in hrefs}
        assert spellings == {True, False}  # absolute, relative and fragment links mixed
        featured = tree.css_first("p.featured a").attributes["href"]
        assert featured == f"/product/{(number - 1) * PER_PAGE + 1}"
        next_link = tree.css_first("a.next")
        if number < 3:
            assert next_link.attributes["href"] == f"/products?page={number + 1}"
        else:
            assert next_link is None
        has_pdf = tree.css_first("a.pdf") is not None
        assert has_pdf == (number == 1)
    assert seen == list(range(1, PRODUCTS + 1))
    assert client.get(site.url + "/products?page=4").status_code == 404
    assert client.get(site.url + "/products?page=x").status_code == 404


def test_listing_page_one_fault_links(site: ShopSite, client: httpx.Client) -> None:
    body = client.get(site.url + "/products?page=1").text
    hrefs = {a.attributes["href"] for a in LexborHTMLParser(body).css("a")}
    assert {"/catalogue.pdf", "/missing", "/old/product/5"} <= hrefs
    with ShopSite(products=PRODUCTS, faults=False) as quiet:
        body = client.get(quiet.url + "/products?page=1").text
        hrefs = {a.attributes["href"] for a in LexborHTMLParser(body).css("a")}
        assert "/catalogue.pdf" in hrefs
        assert not {"/missing", "/old/product/5"} & hrefs


def test_products_match_expected_items(site: ShopSite, client: httpx.Client) -> None:
    expected = site.expected_items()
    assert len(expected) == PRODUCTS - 1 and "SKU-00007" not in expected
    assert expected["SKU-00012"]["url"] == site.url + "/product/12"
    client.get(site.url + "/product/3")  # burn the transient 503
    for item in expected.values():
        tree = LexborHTMLParser(client.get(item["url"]).text)
        assert tree.css_first("h1").text() == item["name"]
        assert tree.css_first(".sku").text() == item["sku"]
        assert float(tree.css_first(".price").text()) == item["price"]
        assert (tree.css_first(".stock").text() == "in stock") == item["in_stock"]
        assert tree.css_first("a.related") is not None
    assert {item["in_stock"] for item in expected.values()} == {True, False}
    assert len({item["price"] for item in expected.values()}) > 1


@pytest.mark.integration
def test_expected_items_without_faults() -> None:
    with ShopSite(products=10, faults=False) as shop:
        assert sorted(shop.expected_items()) == [f"SKU-{i:05d}" for i in range(1, 11)]


def test_transient_503_then_200(site: ShopSite, client: httpx.Client) -> None:
    first = client.get(site.url + "/product/3")
    assert first.status_code == 503
    assert first.headers["retry-after"] == "1"
    assert client.get(site.url + "/product/3").status_code == 200
    assert [e.status for e in site.requests_for("/product/3")] == [503, 200]


def test_permanent_500(site: ShopSite, client: httpx.Client) -> None:
    assert [client.get(site.url + "/product/7").status_code for _ in range(3)] == [500] * 3


@pytest.mark.integration
def test_no_faults_when_disabled(client: httpx.Client) -> None:
    with ShopSite(products=10, faults=False) as shop:
        assert client.get(shop.url + "/product/3").status_code == 200
        assert client.get(shop.url + "/product/7").status_code == 200
        assert client.get(shop.url + "/old/product/5").status_code == 404


def test_redirect_404_and_unknown(site: ShopSite, client: httpx.Client) -> None:
    moved = client.get(site.url + "/old/product/5")
    assert moved.status_code == 301
    assert moved.headers["location"] == "/product/5"
    assert client.get(site.url + "/missing").status_code == 404
    assert client.get(site.url + "/nowhere").status_code == 404
    assert client.get(site.url + f"/product/{PRODUCTS + 1}").status_code == 404
    assert client.get(site.url + "/product/0").status_code == 404


def test_pdf_is_not_html(site: ShopSite, client: httpx.Client) -> None:
    response = client.get(site.url + "/catalogue.pdf")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/pdf"
    assert response.content.startswith(b"%PDF")


def test_keep_alive_with_content_length(site: ShopSite) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=5)
    try:
        conn.connect()
        sock = conn.sock
        for path in ["/", "/product/1", "/catalogue.pdf", "/missing"]:
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            assert response.version == 11
            assert int(response.headers["Content-Length"]) == len(body)
            assert not response.will_close
        assert conn.sock is sock  # the same connection served all four
    finally:
        conn.close()


@pytest.mark.integration
def test_request_log_records_arrival(client: httpx.Client) -> None:
    with ShopSite(products=5, latency=0.2) as shop:
        before = time.time()
        client.get(shop.url + "/product/1")
        after = time.time()
        client.head(shop.url + "/product/3")
        (entry,) = shop.requests_for("/product/1")
        assert entry.method == "GET" and entry.status == 200
        assert before <= entry.time <= after - 0.2  # logged on arrival, not on reply
        assert after - before >= 0.2  # latency applies
        assert [(e.method, e.path, e.status) for e in shop.requests] == [
            ("GET", "/product/1", 200),
            ("HEAD", "/product/3", 503),
        ]


@pytest.mark.integration
def test_arrival_is_stamped_on_the_wire_not_when_a_late_handler_thread_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handler thread that runs late (a loaded machine) does not move the arrival.

    Stamped by the thread, a request read 0.4 s after it arrived would look 0.4 s later,
    so two requests sent far apart could look close (a false short gap) and a real short
    gap could hide. The kernel's receive timestamp is what the site saw on the wire.
    """
    original_setup = shop_module._Handler.setup

    def late_setup(handler: Any) -> None:
        original_setup(handler)
        time.sleep(0.4)  # the request is in the socket's buffer meanwhile

    monkeypatch.setattr(shop_module._Handler, "setup", late_setup)
    with ShopSite(products=2) as shop, socket.create_connection((shop.host, shop.port)) as sock:
        sent = time.time()
        sock.sendall(b"GET /product/1 HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")
        while sock.recv(65536):
            pass
        (entry,) = shop.requests_for("/product/1")
        assert sent <= entry.time + 0.005  # clocks of one machine; the kernel stamps after the send
        assert entry.time - sent < 0.2, "stamped when the late thread read it, not on arrival"


@pytest.mark.integration
def test_slow_products(client: httpx.Client) -> None:
    with ShopSite(products=5, slow_every=2, slow_seconds=0.3) as shop:
        start = time.monotonic()
        client.get(shop.url + "/product/1")
        fast = time.monotonic() - start
        client.get(shop.url + "/product/2")
        slow = time.monotonic() - start - fast
        assert fast < 0.2 <= 0.3 <= slow


def test_min_gap(site: ShopSite, client: httpx.Client) -> None:
    assert site.min_gap() is None
    client.get(site.url + "/")
    assert site.min_gap() is None
    for _ in range(2):
        time.sleep(0.05)
        client.get(site.url + "/")
    gap = site.min_gap()
    assert gap is not None and 0.05 <= gap < 1
    times = [e.time for e in site.requests]
    assert times == sorted(times)


# -- the demo spider, offline ---------------------------------------------------------


def test_spider_settings() -> None:
    assert DemoShop.name == "demo"
    assert DemoShop.item_key == "sku"
    assert DemoShop.start_urls == []
    assert DemoShop().domains() == ["127.0.0.1", "localhost"]


@pytest.mark.parametrize("product_id", [1, 4, 12, 45])
def test_parse_product_yields_expected_item(site: ShopSite, client: httpx.Client, product_id: int) -> None:
    page = fetch_page(client, f"{site.url}/product/{product_id}")
    results = list(DemoShop().parse_product(page))
    items = [r for r in results if isinstance(r, dict)]
    assert items == [site.expected_items()[f"SKU-{product_id:05d}"]]
    requests = [r for r in results if isinstance(r, Request)]
    related = product_id % PRODUCTS + 1
    assert [(r.url, r.callback) for r in requests] == [(f"{site.url}/product/{related}", "parse_product")]


@pytest.mark.parametrize("number", [1, 2, 3])
def test_parse_listing_routes_links(site: ShopSite, client: httpx.Client, number: int) -> None:
    page = fetch_page(client, f"{site.url}/products?page={number}")
    requests = list(DemoShop().parse(page))
    assert all(isinstance(r, Request) for r in requests)
    to_product = {urldefrag(r.url).url for r in requests if r.callback == "parse_product"}
    to_parse = {r.url for r in requests if r.callback == "parse"}
    first = (number - 1) * PER_PAGE + 1
    on_page = {f"{site.url}/product/{i}" for i in range(first, min(first + PER_PAGE, PRODUCTS + 1))}
    if number == 1:
        assert to_product == on_page | {site.url + "/old/product/5"}
        assert to_parse == {
            site.url + "/catalogue.pdf",
            site.url + "/missing",
            site.url + "/products?page=2",
        }
    elif number == 2:
        assert to_product == on_page
        assert to_parse == {site.url + "/products?page=3"}
    else:
        assert to_product == on_page
        assert to_parse == set()


def test_parse_home(site: ShopSite, client: httpx.Client) -> None:
    requests = list(DemoShop().parse(fetch_page(client, site.url + "/")))
    assert [(r.url, r.callback) for r in requests] == [
        (site.url + "/products?page=1", "parse"),
        (site.url + "/private/admin", "parse"),
    ]
