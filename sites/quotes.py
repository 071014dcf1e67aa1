"""quotes.toscrape.com: quotes with their author and tags, following pagination.

The site of Scrapy's tutorial. Run it against the live site with:
    crawler crawl quotes
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from crawler import Page, Request, Spider


class Quotes(Spider):
    name = "quotes"
    start_urls = ["https://quotes.toscrape.com/"]
    allowed_domains = ["quotes.toscrape.com"]
    interval = 1.0

    def parse(self, page: Page) -> Iterator[dict[str, Any] | Request]:
        for quote in page.css("div.quote"):
            text = quote.css_first("span.text")
            author = quote.css_first("small.author")
            yield {
                "text": text.text(strip=True) if text else "",
                "author": author.text(strip=True) if author else "",
                "tags": [tag.text(strip=True) for tag in quote.css("div.tags a.tag")],
            }
        yield from page.follow_all("li.next a", callback=self.parse)
