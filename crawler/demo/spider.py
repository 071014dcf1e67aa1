"""The bundled demo spider: crawls the demo shop (``crawler.demo.shop``) for products.

It doubles as the example to copy: one callback for navigation pages, one for item
pages, links routed by what their URL looks like.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..spiders.spider import Page, Request, Spider

#: Links to product pages (``/product/ID``, in any spelling, and old moved ones).
PRODUCT_LINKS = "a[href*='product/']"


class DemoShop(Spider):
    """Every product of the demo shop, keyed by SKU. ``crawler demo`` seeds its URL."""

    name = "demo"
    start_urls: list[str] = []
    allowed_domains = ["127.0.0.1", "localhost"]
    interval = 0.02
    item_key = "sku"

    def parse(self, page: Page) -> Iterator[Request]:
        """Home and listing pages: product links to ``parse_product``, all others here."""
        yield from page.follow_all(PRODUCT_LINKS, callback=self.parse_product)
        yield from page.follow_all(f"a[href]:not({PRODUCT_LINKS})", callback=self.parse)

    def parse_product(self, page: Page) -> Iterator[dict[str, Any] | Request]:
        """A product page: its item, then the related product."""
        yield {
            "sku": page.text(".sku"),
            "name": page.text("h1"),
            "price": float(page.text(".price")),
            "in_stock": page.text(".stock") == "in stock",
            "url": page.url,
        }
        yield from page.follow_all("a.related", callback=self.parse_product)
