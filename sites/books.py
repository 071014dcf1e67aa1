"""books.toscrape.com: every book, with its price, stock, rating and category.

A static copy of a django-oscar shop. Listing pages (the home page, the paged
"All products" list ``catalogue/page-N.html`` and each category's pages) link to the
categories, to their next page and to product pages. All links are relative, and
differently so on each kind of page (``catalogue/x_1000/index.html`` on the home page,
``x_1000/index.html`` under ``catalogue/``, ``../../../x_1000/index.html`` on a
category's page): ``page.follow_all`` resolves each against the page it is on.

Run it against the live site (1000 books, about 1,200 pages), then export the items::

    crawler crawl books
    crawler export books --format csv -o books.csv
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from crawler import Page, Request, Spider

#: ``<p class="star-rating Three">`` → 3.
RATINGS = {"One": 1, "Two": 2, "Three": 3, "Four": 4, "Five": 5}
#: Currency symbols → ISO 4217 codes.
CURRENCIES = {"£": "GBP", "€": "EUR", "$": "USD"}
#: "£51.77" → ("£", "51.77").
PRICE = re.compile(r"\s*(\D*?)\s*(\d[\d,]*\.\d+)\s*")
#: "In stock (22 available)" → "22".
AVAILABLE = re.compile(r"\((\d+) available\)")


class Books(Spider):
    name = "books"
    start_urls = ["https://books.toscrape.com/"]
    allowed_domains = ["books.toscrape.com"]
    interval = 1.0
    item_key = "upc"  # the product's UPC, unique on the site (the "Product Information" table)

    def parse(self, page: Page) -> Iterator[Request]:
        """Any listing page: its books, its next page, and the categories in the sidebar.

        The sidebar is on every listing page and links every category, "Books" (all of
        them) included; the frontier skips URLs it has seen, so each page is fetched
        once however often it is linked.
        """
        yield from page.follow_all("article.product_pod h3 a", callback=self.parse_book)
        yield from page.follow_all("li.next a", callback=self.parse)
        yield from page.follow_all("div.side_categories a", callback=self.parse)

    def parse_book(self, page: Page) -> Iterator[dict[str, Any]]:
        """A product page: ``div.product_main`` and the "Product Information" table."""
        info = {
            row.css_first("th").text(strip=True): row.css_first("td").text(strip=True)
            for row in page.css("table.table-striped tr")
        }
        price = page.text("div.product_main p.price_color")
        match = PRICE.fullmatch(price)
        if match is None:  # fails this page, with the reason in `crawler failed books`
            raise ValueError(f"unreadable price {price!r}")
        symbol, amount = match.groups()
        available = AVAILABLE.search(info["Availability"])  # absent when out of stock
        rating = page.css_first("div.product_main p.star-rating").attributes.get("class", "").split()
        yield {
            "upc": info["UPC"],
            "title": page.text("div.product_main h1"),
            # A string, exact to the penny: Decimal(item["price"]) for arithmetic. A float
            # would print 51.77 but is not 51.77, and sums of floats drift.
            "price": amount.replace(",", ""),
            "currency": CURRENCIES.get(symbol, symbol),
            "in_stock": info["Availability"].lower().startswith("in stock"),
            "stock": int(available.group(1)) if available else 0,
            "rating": next((RATINGS[word] for word in rating if word in RATINGS), None),
            # The breadcrumb is Home > Books > Category > (the book, not a link).
            "category": page.css("ul.breadcrumb li a")[-1].text(strip=True),
            "url": page.url,
        }
