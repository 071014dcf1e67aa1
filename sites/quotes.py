"""quotes.toscrape.com: every quote (text, author, tags) and every author's page.

The site of Scrapy's tutorial: ``/`` and ``/page/N/`` list ten quotes each and link to
the next page; each quote links to its author's page (``/author/Albert-Einstein``).
Two kinds of item come out, told apart by their ``type``: ``"quote"`` and ``"author"``.

Run it against the live site, then export the items::

    crawler crawl quotes
    crawler export quotes > quotes.jsonl
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from crawler import Page, Request, Spider


class Quotes(Spider):
    name = "quotes"
    start_urls = ["https://quotes.toscrape.com/"]
    allowed_domains = ["quotes.toscrape.com"]
    interval = 1.0

    # Items are upserted on this field. Quotes have no id on the site, so a quote's key
    # is its text (no two quotes share one) and an author's is the slug of the author
    # page. The default, page URL + position, would store a quote twice once it moves
    # to another page, or when / and /page/1/ (the same page) are both crawled.
    item_key = "key"

    def parse(self, page: Page) -> Iterator[dict[str, Any] | Request]:
        """A page of quotes: its quotes, their authors' pages and the next page."""
        for quote in page.css("div.quote"):
            text = quote.css_first("span.text").text(strip=True).strip("“”")  # drop the curly quotes
            yield {
                "type": "quote",
                "key": f"quote:{text}",
                "text": text,
                "author": quote.css_first("small.author").text(strip=True),
                # Scoped to this quote: the page's "Top Ten tags" box uses a.tag too.
                "tags": [tag.text(strip=True) for tag in quote.css("div.tags a.tag")],
            }
        # The "(about)" link right after the author's name. An author quoted on many pages
        # is linked many times; the frontier fetches each author page once.
        yield from page.follow_all("div.quote .author + a", callback=self.parse_author)
        yield from page.follow_all("li.next a", callback=self.parse)  # none on the last page

    def parse_author(self, page: Page) -> Iterator[dict[str, Any]]:
        """An author page (``/author/Albert-Einstein``, also served with a trailing slash)."""
        slug = page.url.rstrip("/").rsplit("/", 1)[-1]
        born = datetime.strptime(page.text(".author-born-date"), "%B %d, %Y")  # "March 14, 1879"
        yield {
            "type": "author",
            "key": f"author:{slug}",
            "name": page.text("h3.author-title"),
            "born_date": born.date().isoformat(),  # "1879-03-14"
            "born_location": page.text(".author-born-location").removeprefix("in "),  # "Ulm, Germany"
            "description": page.text(".author-description"),
            "url": page.url,
        }
