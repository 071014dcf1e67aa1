"""``crawler.testing``: one page without Redis or a database, a whole small crawl on its own embedded Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawler.demo import ShopSite
from crawler.demo.spider import DemoShop
from crawler.errors import ConfigError
from crawler.spiders.spider import Spider
from crawler.testing import crawl, run_page

PRODUCT = b"""<html><body><h1>Product 7</h1><span class="price">12.50</span><span class="sku">SKU-7</span>
<span class="stock">in stock</span><a class="related" href="/product/8">next</a></body></html>"""


class Raises(Spider):
    name = "raises"
    allowed_domains = ["127.0.0.1"]

    def parse(self, page):
        yield from page.follow_all("a", callback=self.parse)
        if "/product/" in page.url:
            raise ValueError(f"no price on {page.url}")


def test_run_page_on_saved_bytes_text_or_file_gives_items_and_requests(tmp_path: Path) -> None:
    saved = tmp_path / "p7.html"
    saved.write_bytes(PRODUCT)
    url = "http://127.0.0.1:9/product/7"
    for body in (PRODUCT, PRODUCT.decode(), saved):
        out = run_page(DemoShop, url, body, callback="parse_product")
        assert out.items == [{"sku": "SKU-7", "name": "Product 7", "price": 12.5, "in_stock": True, "url": url}]
        assert out.links() == ["http://127.0.0.1:9/product/8"]
        assert out.links("parse_product") == ["http://127.0.0.1:9/product/8"]
        assert out.links("parse") == []


def test_run_page_passes_meta_and_lets_the_callback_s_error_through() -> None:
    class Meta(Spider):
        name = "meta"

        def parse(self, page):
            yield {"category": page.meta["category"]}

    assert run_page(Meta, "http://a.test/", "<p></p>", meta={"category": "shoes"}).items == [{"category": "shoes"}]
    with pytest.raises(KeyError):
        run_page(Meta, "http://a.test/", "<p></p>")


def test_run_page_without_a_body_downloads_from_a_local_server(shop: ShopSite) -> None:
    out = run_page(DemoShop(), f"{shop.url}/product/2", callback="parse_product")
    assert out.items == [shop.expected_items()["SKU-00002"]]
    assert [entry.path for entry in shop.requests] == ["/product/2"]  # no robots.txt, no gate: no crawl
    with pytest.raises(ConfigError, match="not HTML"):
        run_page(DemoShop, f"{shop.url}/catalogue.pdf")


@pytest.mark.integration
def test_crawl_runs_the_whole_pipeline_on_its_own_redis_and_database() -> None:
    with ShopSite(products=30) as shop:
        result = crawl(DemoShop, [shop.url + "/"], interval=0.005, settings={"backoff": 0.1})
        assert result.keyed == shop.expected_items()
        assert result.site == "demo"
        # The shop's permanent faults: a 404 link and a 500 that never heals.
        assert sorted(r["url"] for r in result.failed) == [f"{shop.url}/missing", f"{shop.url}/product/7"]
        assert result.urls("download")[0] == f"{shop.url}/robots.txt"
        # robots.txt obeyed: the page is recorded refused and the shop never asked.
        assert [r["outcome"] for r in result.fetches if r["url"] == f"{shop.url}/private/admin"] == ["refused"]
        assert "/private/admin" not in [entry.path for entry in shop.requests]


@pytest.mark.integration
def test_crawl_records_callback_errors_as_failed_pages() -> None:
    with ShopSite(products=3, faults=False) as shop:
        base = shop.url
        result = crawl(Raises, [base + "/products?page=1"], interval=0.005)
    failed = {r["url"]: r["error"] for r in result.failed}
    assert set(failed) == {f"{base}/product/{n}" for n in (1, 2, 3)}
    assert all("ValueError: no price on" in error for error in failed.values())


@pytest.mark.integration
def test_crawl_refuses_an_invalid_spider_and_times_out_cleanly() -> None:
    with pytest.raises(ConfigError, match="allowed_domains must be a list of host names"):
        crawl(DemoShop, ["http://127.0.0.1:9/"], allowed_domains="127.0.0.1")
    with ShopSite(products=5, latency=0.5, faults=False) as shop:
        with pytest.raises(TimeoutError, match="did not drain within 0.3s"):
            crawl(DemoShop, [shop.url + "/"], interval=0.005, timeout=0.3)
