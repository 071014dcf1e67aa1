"""Offline copies of quotes.toscrape.com and books.toscrape.com, served on loopback.

No machine running the tests reaches the internet, so the spiders in ``sites/`` are
proven against these: pages with the live sites' markup (classes, nesting, whitespace,
the boxes and links a careless selector would also match) at the live sites' paths,
with the same relative links. ``QuotesSite`` and ``BooksSite`` run a threaded HTTP/1.1
server in a daemon thread, log every request (``requests``, ``counts()``), and expose
the ground truth: ``expected_items()`` (what the spider must store, by item key),
``crawl_paths()`` (every path a complete crawl requests, once each) and ``body(path)``
(a page as served, for testing callbacks without a server).

What is copied and what is not:

* quotes.toscrape.com: the layout of ``/``, ``/page/N/`` (an empty "No quotes found!"
  page past the last one, as on the live site) and ``/author/SLUG`` (served with and
  without the trailing slash). Three pages of ten quotes (the live site has ten) by
  20 authors, modelled on the live site's first pages: texts, authors, tags and birth
  data as there, a long quote and every author description shortened. One quote has
  no tags, as some on the live site have.
* books.toscrape.com: the layout of the home page (``/`` and ``/index.html``), the
  "All products" pages ``/catalogue/page-N.html``, the category pages
  ``/catalogue/category/books_1/…`` ("Books": every book) and
  ``/catalogue/category/books/SLUG_ID/index.html`` / ``page-N.html``, and the product
  pages ``/catalogue/SLUG_ID/index.html``, 20 books per listing page, every link
  relative to the page it is on as there (``catalogue/page-2.html`` on the home page,
  ``page-3.html`` under ``catalogue/``, ``../../../SLUG_ID/index.html`` on a category
  page, ``../../index.html`` on a product page). A 41-book catalogue in three
  categories (one of them paged), modelled on the live one: "A Light in the Attic" as
  there (UPC, price, stock), titles and prices of the others after the live site, UPCs
  and stock counts made up (the site says its own prices and ratings are random). Two
  books are out of stock, in django-oscar's markup for that, which the live site (all
  in stock) does not show. Pages are served as ``text/html`` without a charset, as the
  live site serves them.

Both serve a permissive robots.txt; anything else is a 404.
"""

from __future__ import annotations

import hashlib
import html
import posixpath
import re
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

ROBOTS_TXT = b"User-agent: *\nDisallow:\n"


def esc(text: str) -> str:
    return html.escape(text, quote=True)


# -- the server -----------------------------------------------------------------------


class SiteCopy:
    """A set of fixed pages served on loopback, with a log of the requests received.

    Subclasses build ``self.pages`` (path -> body) and may override ``respond``.
    """

    #: Content-Type of the HTML pages.
    content_type = "text/html; charset=utf-8"

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port
        self.pages: dict[str, bytes] = {}
        #: (path, status) of every request received, in order.
        self.requests: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> SiteCopy:
        server = _Server((self.host, self.port), _Handler)
        server.site = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"sitecopy-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, no trailing slash (valid once started)."""
        if self._server is None:
            raise RuntimeError("the site copy is not started")
        return f"http://{self.host}:{self.port}"

    def counts(self) -> Counter[str]:
        """How many times each path was requested."""
        with self._lock:
            return Counter(path for path, _ in self.requests)

    def body(self, path: str) -> bytes:
        """The body served at ``path`` (KeyError for a path that is not a page)."""
        status, _, body = self.respond(path)
        if status != 200:
            raise KeyError(path)
        return body

    def crawl_paths(self) -> set[str]:
        """Every path a complete crawl requests (robots.txt included)."""
        raise NotImplementedError

    def expected_items(self, base: str | None = None) -> dict[str, dict[str, Any]]:
        """Item key -> the item the site's spider stores, for pages served from ``base``."""
        raise NotImplementedError

    def respond(self, target: str) -> tuple[int, str, bytes]:
        """Status, content type and body for a GET of ``target``."""
        path = urlsplit(target).path
        if path == "/robots.txt":
            return 200, "text/plain", ROBOTS_TXT
        if path in self.pages:
            return 200, self.content_type, self.pages[path]
        return 404, self.content_type, b"<html><body><h1>Not Found</h1></body></html>"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    site: SiteCopy


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 30

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        site = self.server.site
        status, content_type, body = site.respond(self.path)
        with site._lock:
            site.requests.append((self.path, status))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: the log is ``SiteCopy.requests``."""


# -- quotes.toscrape.com --------------------------------------------------------------


@dataclass(frozen=True)
class Author:
    slug: str
    name: str
    born_date: str  # as the site shows it: "March 14, 1879"
    born_location: str  # as the site shows it: "in Ulm, Germany"
    description: str


@dataclass(frozen=True)
class Quote:
    text: str  # without the curly quotes the site puts around it
    author: str  # an Author's slug
    tags: tuple[str, ...]


AUTHORS = {
    a.slug: a
    for a in [
        Author(
            "Albert-Einstein",
            "Albert Einstein",
            "March 14, 1879",
            "in Ulm, Germany",
            "In 1879, Albert Einstein was born in Ulm, Germany. He completed his Ph.D. at the "
            "University of Zurich by 1909. His theory of relativity changed physics.",
        ),
        Author(
            "J-K-Rowling",
            "J.K. Rowling",
            "July 31, 1965",
            "in Yate, South Gloucestershire, England, The United Kingdom",
            "Although she writes under the pen name J.K. Rowling, her name is Joanne Rowling. "
            "She wrote the Harry Potter series.",
        ),
        Author(
            "Jane-Austen",
            "Jane Austen",
            "December 16, 1775",
            "in Steventon Rectory, Hampshire, The United Kingdom",
            "Jane Austen was an English novelist whose works of romantic fiction, set among the "
            "landed gentry, earned her a place among the most widely read writers in English.",
        ),
        Author(
            "Marilyn-Monroe",
            "Marilyn Monroe",
            "June 01, 1926",
            "in The United States",
            "Marilyn Monroe (born Norma Jeane Mortenson) was an actress, singer and model.",
        ),
        Author(
            "Andre-Gide",
            "André Gide",
            "November 22, 1869",
            "in Paris, France",
            "André Paul Guillaume Gide was a French author and winner of the Nobel Prize in literature in 1947.",
        ),
        Author(
            "Thomas-A-Edison",
            "Thomas A. Edison",
            "February 11, 1847",
            "in Milan, Ohio, The United States",
            "Thomas Alva Edison was an American inventor, scientist & businessman who developed "
            "many devices that greatly influenced life around the world.",
        ),
        Author(
            "Eleanor-Roosevelt",
            "Eleanor Roosevelt",
            "October 11, 1884",
            "in The United States",
            "Anna Eleanor Roosevelt was an American political leader who used her influence as an "
            "active First Lady from 1933 to 1945.",
        ),
        Author(
            "Steve-Martin",
            "Steve Martin",
            "August 14, 1945",
            "in Waco, Texas, The United States",
            'Stephen Glenn "Steve" Martin is an American actor, comedian, writer, playwright, '
            "producer, musician, and composer.",
        ),
        Author(
            "Bob-Marley",
            "Bob Marley",
            "February 06, 1945",
            "in Nine Mile, Saint Ann, Jamaica",
            'Robert "Bob" Nesta Marley was a Jamaican singer-songwriter and musician.',
        ),
        Author(
            "Dr-Seuss",
            "Dr. Seuss",
            "March 02, 1904",
            "in Springfield, MA, The United States",
            "Theodor Seuss Geisel was born 2 March 1904 in Springfield, Massachusetts.",
        ),
        Author(
            "Douglas-Adams",
            "Douglas Adams",
            "March 11, 1952",
            "in Cambridge, England, The United Kingdom",
            "Douglas Noël Adams was an English author, comic radio dramatist, and musician.",
        ),
        Author(
            "Elie-Wiesel",
            "Elie Wiesel",
            "September 30, 1928",
            "in Sighet, Romania",
            "Eliezer Wiesel was a Romanian-born Jewish-American writer, professor and activist.",
        ),
        Author(
            "Friedrich-Nietzsche",
            "Friedrich Nietzsche",
            "October 15, 1844",
            "in Röcken bei Lützen, Prussian Province of Saxony, Germany",
            "Friedrich Wilhelm Nietzsche was a German philosopher of the late 19th century.",
        ),
        Author(
            "Mark-Twain",
            "Mark Twain",
            "November 30, 1835",
            "in Florida, Missouri, The United States",
            "Samuel Langhorne Clemens, better known by his pen name Mark Twain, was an American author and humorist.",
        ),
        Author(
            "Allen-Saunders",
            "Allen Saunders",
            "April 24, 1899",
            "in Lebanon, Indiana, The United States",
            "Allen Saunders was an American writer, journalist and cartoonist.",
        ),
        Author(
            "Pablo-Neruda",
            "Pablo Neruda",
            "July 12, 1904",
            "in Parral, Chile",
            "Pablo Neruda was the pen name of the Chilean poet and diplomat Neftalí Ricardo Reyes Basoalto.",
        ),
        Author(
            "Ralph-Waldo-Emerson",
            "Ralph Waldo Emerson",
            "May 25, 1803",
            "in Boston, Massachusetts, The United States",
            "Ralph Waldo Emerson was an American essayist, lecturer, and poet.",
        ),
        Author(
            "Mother-Teresa",
            "Mother Teresa",
            "August 26, 1910",
            "in Skopje, Ottoman Empire (now Republic of Macedonia)",
            "Mother Teresa founded the Missionaries of Charity in Calcutta in 1950.",
        ),
        Author(
            "Garrison-Keillor",
            "Garrison Keillor",
            "August 07, 1942",
            "in Anoka, Minnesota, The United States",
            "Garrison Keillor is an American author, storyteller, humorist and radio host.",
        ),
        Author(
            "Jim-Henson",
            "Jim Henson",
            "September 24, 1936",
            "in Greenville, Mississippi, The United States",
            'James Maury "Jim" Henson was an American puppeteer, best known as the creator of The Muppets.',
        ),
    ]
}

QUOTE_PAGES: list[list[Quote]] = [
    [
        Quote(
            "The world as we have created it is a process of our thinking. It cannot be changed "
            "without changing our thinking.",
            "Albert-Einstein",
            ("change", "deep-thoughts", "thinking", "world"),
        ),
        Quote(
            "It is our choices, Harry, that show what we truly are, far more than our abilities.",
            "J-K-Rowling",
            ("abilities", "choices"),
        ),
        Quote(
            "There are only two ways to live your life. One is as though nothing is a miracle. The other "
            "is as though everything is a miracle.",
            "Albert-Einstein",
            ("inspirational", "life", "live", "miracle", "miracles"),
        ),
        Quote(
            "The person, be it gentleman or lady, who has not pleasure in a good novel, must be intolerably stupid.",
            "Jane-Austen",
            ("aliteracy", "books", "classic", "humor"),
        ),
        Quote(
            "Imperfection is beauty, madness is genius and it's better to be absolutely ridiculous than "
            "absolutely boring.",
            "Marilyn-Monroe",
            ("be-yourself", "inspirational"),
        ),
        Quote(
            "Try not to become a man of success. Rather become a man of value.",
            "Albert-Einstein",
            ("adulthood", "success", "value"),
        ),
        Quote(
            "It is better to be hated for what you are than to be loved for what you are not.",
            "Andre-Gide",
            ("life", "love"),
        ),
        Quote(
            "I have not failed. I've just found 10,000 ways that won't work.",
            "Thomas-A-Edison",
            ("edison", "failure", "inspirational", "paraphrased"),
        ),
        Quote(
            "A woman is like a tea bag; you never know how strong it is until it's in hot water.",
            "Eleanor-Roosevelt",
            ("misattributed-eleanor-roosevelt",),
        ),
        Quote("A day without sunshine is like, you know, night.", "Steve-Martin", ("humor", "obvious", "simile")),
    ],
    [
        Quote(
            "This life is what you make it. No matter what, you're going to mess up sometimes, it's a "
            "universal truth. But the good part is you get to decide how you're going to mess it up.",
            "Marilyn-Monroe",
            ("friends", "heartbreak", "inspirational", "life", "love", "sisters"),
        ),
        Quote(
            "It takes a great deal of bravery to stand up to our enemies, but just as much to stand up to our friends.",
            "J-K-Rowling",
            ("courage", "friends"),
        ),
        Quote(
            "If you can't explain it to a six year old, you don't understand it yourself.",
            "Albert-Einstein",
            ("simplicity", "understand"),
        ),
        Quote(
            "The truth is, everyone is going to hurt you. You just got to find the ones worth suffering for.",
            "Bob-Marley",
            ("friendship",),
        ),
        Quote(
            "I like nonsense, it wakes up the brain cells. Fantasy is a necessary ingredient in living.",
            "Dr-Seuss",
            ("fantasy",),
        ),
        Quote(
            "I may not have gone where I intended to go, but I think I have ended up where I needed to be.",
            "Douglas-Adams",
            ("life", "navigation"),
        ),
        Quote(
            "The opposite of love is not hate, it's indifference. The opposite of art is not ugliness, "
            "it's indifference.",
            "Elie-Wiesel",
            ("activism", "apathy", "hate", "indifference", "inspirational", "love", "opposite", "philosophy"),
        ),
        Quote(
            "It is not a lack of love, but a lack of friendship that makes unhappy marriages.",
            "Friedrich-Nietzsche",
            ("friendship", "lack-of-friendship", "lack-of-love", "love", "marriage", "unhappy-marriage"),
        ),
        Quote(
            "Good friends, good books, and a sleepy conscience: this is the ideal life.",
            "Mark-Twain",
            ("books", "contentment", "friends", "friendship", "life"),
        ),
        Quote(
            "Life is what happens to us while we are making other plans.",
            "Allen-Saunders",
            ("fate", "life", "misattributed-john-lennon", "planning", "plans"),
        ),
    ],
    [
        Quote(
            "I love you without knowing how, or when, or from where. I love you simply, without problems or pride.",
            "Pablo-Neruda",
            ("love", "poetry"),
        ),
        Quote(
            "For every minute you are angry you lose sixty seconds of happiness.", "Ralph-Waldo-Emerson", ("happiness",)
        ),
        Quote("If you judge people, you have no time to love them.", "Mother-Teresa", ("attributed-no-source",)),
        Quote(
            "Anyone who thinks sitting in church can make you a Christian must also think that sitting "
            "in a garage can make you a car.",
            "Garrison-Keillor",
            ("humor", "religion"),
        ),
        Quote(
            "Beauty is in the eye of the beholder and it may be necessary from time to time to give a "
            "stupid or misinformed beholder a black eye.",
            "Jim-Henson",
            ("humor",),
        ),
        Quote(
            "Today you are You, that is truer than true. There is no one alive who is Youer than You.",
            "Dr-Seuss",
            ("comedy", "life", "yourself"),
        ),
        Quote(
            "If you want your children to be intelligent, read them fairy tales. If you want them to be "
            "more intelligent, read them more fairy tales.",
            "Albert-Einstein",
            ("children", "fairy-tales"),
        ),
        Quote(
            "It is impossible to live without failing at something, unless you live so cautiously that "
            "you might as well not have lived at all - in which case, you fail by default.",
            "J-K-Rowling",
            (),
        ),
        Quote(
            "Logic will get you from A to Z; imagination will get you everywhere.", "Albert-Einstein", ("imagination",)
        ),
        Quote("One good thing about music, when it hits you, you feel no pain.", "Bob-Marley", ("music",)),
    ],
]

#: The site's "Top Ten tags" box (``a.tag`` links outside any quote).
TOP_TAGS = [
    ("love", 28),
    ("inspirational", 26),
    ("life", 26),
    ("humor", 24),
    ("books", 22),
    ("reading", 14),
    ("friendship", 10),
    ("friends", 8),
    ("truth", 8),
    ("simile", 6),
]

_QUOTES_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
\t<meta charset="UTF-8">
\t<title>Quotes to Scrape</title>
    <link rel="stylesheet" href="/static/bootstrap.min.css">
    <link rel="stylesheet" href="/static/main.css">
</head>
<body>
    <div class="container">
        <div class="row header-box">
            <div class="col-md-8">
                <h1>
                    <a href="/" style="text-decoration: none">Quotes to Scrape</a>
                </h1>
            </div>
            <div class="col-md-4">
                <p>
                    <a href="/login">Login</a>
                </p>
            </div>
        </div>
"""

_QUOTES_FOOT = """
    </div>
    <footer class="footer">
        <div class="container">
            <p class="text-muted">
                Quotes by: <a href="https://www.goodreads.com/quotes">GoodReads.com</a>
            </p>
            <p class="copyright">
                Made with <span class='zyte'>❤</span> by <a class='zyte' href="https://www.zyte.com">Zyte</a>
            </p>
        </div>
    </footer>
</body>
</html>"""


class QuotesSite(SiteCopy):
    """quotes.toscrape.com on loopback (see the module docstring)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__(host, port)
        self.pages["/"] = self._listing(1)
        for number in range(1, len(QUOTE_PAGES) + 1):
            self.pages[f"/page/{number}/"] = self._listing(number)
        for slug, author in AUTHORS.items():
            self.pages[f"/author/{slug}"] = self.pages[f"/author/{slug}/"] = self._author(author)

    def respond(self, target: str) -> tuple[int, str, bytes]:
        path = urlsplit(target).path
        past_the_end = re.fullmatch(r"/page/(\d+)/", path)
        if past_the_end and int(past_the_end.group(1)) > len(QUOTE_PAGES):
            return 200, self.content_type, self._listing(int(past_the_end.group(1)))
        return super().respond(target)

    # -- ground truth -----------------------------------------------------------------

    def crawl_paths(self) -> set[str]:
        """Every path a complete crawl from ``/`` requests (robots.txt included)."""
        paths = {"/robots.txt", "/"} | {f"/page/{n}/" for n in range(2, len(QUOTE_PAGES) + 1)}
        return paths | {f"/author/{slug}" for slug in AUTHORS}

    def expected_items(self, base: str | None = None) -> dict[str, dict[str, Any]]:
        """Item key -> item, for every quote and every author, as served from ``base``."""
        base = base or self.url
        items: dict[str, dict[str, Any]] = {}
        for quote in (q for page in QUOTE_PAGES for q in page):
            items[f"quote:{quote.text}"] = expected_quote(quote)
        for slug in AUTHORS:
            item = expected_author(slug, f"{base}/author/{slug}")
            items[item["key"]] = item
        return items

    # -- pages ------------------------------------------------------------------------

    def _listing(self, number: int) -> bytes:
        quotes = QUOTE_PAGES[number - 1] if number <= len(QUOTE_PAGES) else []
        parts = [_QUOTES_HEAD, '    \n\n<div class="row">\n    <div class="col-md-8">\n']
        for quote in quotes:
            parts.append(_quote_html(quote))
        if not quotes:
            parts.append("    No quotes found!\n")
        if quotes:
            parts.append('    <nav>\n        <ul class="pager">\n')
            if number > 1:
                parts.append(
                    f'            <li class="previous">\n                <a href="/page/{number - 1}/">'
                    '<span aria-hidden="true">&larr;</span> Previous</a>\n            </li>\n'
                )
            if number < len(QUOTE_PAGES):
                parts.append(
                    f'            <li class="next">\n                <a href="/page/{number + 1}/">Next '
                    '<span aria-hidden="true">&rarr;</span></a>\n            </li>\n'
                )
            parts.append("        </ul>\n    </nav>\n")
        parts.append('    </div>\n    <div class="col-md-4 tags-box">\n        <h2>Top Ten tags</h2>\n')
        for tag, size in TOP_TAGS:
            parts.append(
                f'            <span class="tag-item">\n            <a class="tag" style="font-size: '
                f'{size}px" href="/tag/{tag}/">{tag}</a>\n            </span>\n'
            )
        parts.append("    </div>\n</div>\n")
        parts.append(_QUOTES_FOOT)
        return "".join(parts).encode()

    def _author(self, author: Author) -> bytes:
        return (
            _QUOTES_HEAD
            + '    <div class="author-details">\n'
            + f'        <h3 class="author-title">{esc(author.name)}\n        </h3>\n'
            + f'        <p><strong>Born:</strong> <span class="author-born-date">{esc(author.born_date)}</span> '
            + f'<span class="author-born-location">{esc(author.born_location)}</span></p>\n'
            + "        <p><strong>Description:</strong></p>\n"
            + f'        <div class="author-description">\n        {esc(author.description)}\n        </div>\n'
            + "    </div>\n"
            + _QUOTES_FOOT
        ).encode()


def _quote_html(quote: Quote) -> str:
    author = AUTHORS[quote.author]
    tags = "".join(f'\n            <a class="tag" href="/tag/{esc(tag)}/page/1/">{esc(tag)}</a>' for tag in quote.tags)
    return f"""
    <div class="quote" itemscope itemtype="http://schema.org/CreativeWork">
        <span class="text" itemprop="text">“{esc(quote.text)}”</span>
        <span>by <small class="author" itemprop="author">{esc(author.name)}</small>
        <a href="/author/{author.slug}">(about)</a>
        </span>
        <div class="tags">
            Tags:
            <meta class="keywords" itemprop="keywords" content="{esc(",".join(quote.tags))}" /    > {tags}
        </div>
    </div>
"""


def expected_quote(quote: Quote) -> dict[str, Any]:
    """The item the quotes spider yields for ``quote``."""
    return {
        "type": "quote",
        "key": f"quote:{quote.text}",
        "text": quote.text,
        "author": AUTHORS[quote.author].name,
        "tags": list(quote.tags),
    }


_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


def expected_author(slug: str, url: str) -> dict[str, Any]:
    """The item the quotes spider yields for the author page of ``slug`` at ``url``."""
    author = AUTHORS[slug]
    month, day, year = author.born_date.replace(",", "").split()
    return {
        "type": "author",
        "key": f"author:{slug}",
        "name": author.name,
        "born_date": f"{year}-{_MONTHS.index(month) + 1:02d}-{day}",
        "born_location": author.born_location.removeprefix("in "),
        "description": author.description,
        "url": url,
    }


# -- books.toscrape.com ---------------------------------------------------------------


@dataclass(frozen=True)
class Category:
    slug: str  # "travel_2"
    name: str

    @property
    def dir(self) -> str:
        return f"/catalogue/category/books/{self.slug}"


@dataclass(frozen=True)
class Book:
    id: int
    slug: str  # "a-light-in-the-attic"
    title: str
    price: str  # "51.77"
    rating: str  # "Three"
    category: str  # a Category's slug
    stock: int  # 0: out of stock
    upc: str = ""

    @property
    def dir(self) -> str:
        return f"/catalogue/{self.slug}_{self.id}"

    @property
    def path(self) -> str:
        return f"{self.dir}/index.html"

    @property
    def availability(self) -> str:
        return f"In stock ({self.stock} available)" if self.stock else "Out of stock"


CATEGORIES = [Category("travel_2", "Travel"), Category("mystery_3", "Mystery"), Category("poetry_23", "Poetry")]
#: The "Books" category: every book.
ALL_BOOKS_DIR = "/catalogue/category/books_1"
PER_PAGE = 20
#: Ids of the books shown out of stock.
OUT_OF_STOCK = {446, 285}

#: (id, slug, title, price, rating, category): the catalogue, newest (highest id) first.
_BOOK_ROWS = [
    (1000, "a-light-in-the-attic", "A Light in the Attic", "51.77", "Three", "poetry_23"),
    (997, "sharp-objects", "Sharp Objects", "47.82", "Four", "mystery_3"),
    (991, "the-black-maria", "The Black Maria", "52.15", "One", "poetry_23"),
    (989, "shakespeares-sonnets", "Shakespeare's Sonnets", "20.66", "Four", "poetry_23"),
    (984, "olio", "Olio", "23.88", "One", "poetry_23"),
    (981, "its-only-the-himalayas", "It's Only the Himalayas", "45.17", "Two", "travel_2"),
    (963, "in-a-dark-dark-wood", "In a Dark, Dark Wood", "19.63", "One", "mystery_3"),
    (942, "the-past-never-ends", "The Past Never Ends", "56.50", "Four", "mystery_3"),
    (877, "a-murder-in-time", "A Murder in Time", "16.64", "One", "mystery_3"),
    (
        852,
        "the-murder-of-roger-ackroyd-hercule-poirot-4",
        "The Murder of Roger Ackroyd (Hercule Poirot #4)",
        "44.10",
        "Four",
        "mystery_3",
    ),
    (
        811,
        "full-moon-over-noahs-ark-an-odyssey-to-mount-ararat-and-beyond",
        "Full Moon over Noah’s Ark: An Odyssey to Mount Ararat and Beyond",
        "49.43",
        "Four",
        "travel_2",
    ),
    (761, "howl-and-other-poems", "Howl and Other Poems", "40.45", "Two", "poetry_23"),
    (
        732,
        "see-america-a-celebration-of-our-national-parks-treasured-sites",
        "See America: A Celebration of Our National Parks & Treasured Sites",
        "48.87",
        "Three",
        "travel_2",
    ),
    (720, "the-last-mile-amos-decker-2", "The Last Mile (Amos Decker #2)", "54.21", "Two", "mystery_3"),
    (712, "that-darkness-gardiner-and-renner-1", "That Darkness (Gardiner and Renner #1)", "13.92", "One", "mystery_3"),
    (686, "tastes-like-fear-di-marnie-rome-3", "Tastes Like Fear (DI Marnie Rome #3)", "10.69", "One", "mystery_3"),
    (
        657,
        "a-time-of-torment-charlie-parker-14",
        "A Time of Torment (Charlie Parker #14)",
        "48.35",
        "Five",
        "mystery_3",
    ),
    (
        656,
        "a-study-in-scarlet-sherlock-holmes-1",
        "A Study in Scarlet (Sherlock Holmes #1)",
        "16.73",
        "Two",
        "mystery_3",
    ),
    (627, "poisonous-max-revere-novels-3", "Poisonous (Max Revere Novels #3)", "26.80", "Three", "mystery_3"),
    (
        587,
        "murder-at-the-42nd-street-library-raymond-ambler-1",
        "Murder at the 42nd Street Library (Raymond Ambler #1)",
        "54.36",
        "Four",
        "mystery_3",
    ),
    (
        552,
        "vagabonding-an-uncommon-guide-to-the-art-of-long-term-world-travel",
        "Vagabonding: An Uncommon Guide to the Art of Long-Term World Travel",
        "36.94",
        "Two",
        "travel_2",
    ),
    (542, "most-wanted", "Most Wanted", "35.28", "Three", "mystery_3"),
    (521, "hide-away-eve-duncan-20", "Hide Away (Eve Duncan #20)", "11.84", "Four", "mystery_3"),
    (504, "under-the-tuscan-sun", "Under the Tuscan Sun", "37.33", "Three", "travel_2"),
    (470, "boar-island-anna-pigeon-19", "Boar Island (Anna Pigeon #19)", "59.48", "Three", "mystery_3"),
    (466, "the-widow", "The Widow", "27.26", "Two", "mystery_3"),
    (458, "a-summer-in-europe", "A Summer In Europe", "44.34", "Two", "travel_2"),
    (446, "the-great-railway-bazaar", "The Great Railway Bazaar", "30.54", "One", "travel_2"),
    (440, "playing-with-fire", "Playing with Fire", "13.71", "Three", "mystery_3"),
    (421, "a-year-in-provence-provence-1", "A Year in Provence (Provence #1)", "56.88", "Four", "travel_2"),
    (
        419,
        "what-happened-on-beale-street-secrets-of-the-south-mysteries-2",
        "What Happened on Beale Street (Secrets of the South Mysteries #2)",
        "25.37",
        "Five",
        "mystery_3",
    ),
    (
        351,
        "the-bachelor-girls-guide-to-murder-herringford-and-watts-mysteries-1",
        "The Bachelor Girl's Guide to Murder (Herringford and Watts Mysteries #1)",
        "52.30",
        "Four",
        "mystery_3",
    ),
    (344, "the-waste-land", "The Waste Land", "10.97", "Five", "poetry_23"),
    (
        285,
        "delivering-the-truth-quaker-midwife-mystery-1",
        "Delivering the Truth (Quaker Midwife Mystery #1)",
        "20.89",
        "Four",
        "mystery_3",
    ),
    (
        277,
        "the-road-to-little-dribbling-adventures-of-an-american-in-britain-notes-from-a-small-island-2",
        "The Road to Little Dribbling: Adventures of an American in Britain (Notes From a Small Island #2)",
        "23.21",
        "One",
        "travel_2",
    ),
    (
        250,
        "the-mysterious-affair-at-styles-hercule-poirot-1",
        "The Mysterious Affair at Styles (Hercule Poirot #1)",
        "24.80",
        "One",
        "mystery_3",
    ),
    (234, "in-the-woods-dublin-murder-squad-1", "In the Woods (Dublin Murder Squad #1)", "38.38", "Three", "mystery_3"),
    (211, "leaves-of-grass", "Leaves of Grass", "41.34", "Three", "poetry_23"),
    (
        198,
        "neither-here-nor-there-travels-in-europe",
        "Neither Here nor There: Travels in Europe",
        "38.95",
        "Three",
        "travel_2",
    ),
    (155, "the-prophet", "The Prophet", "28.44", "Four", "poetry_23"),
    (1, "1000-places-to-see-before-you-die", "1,000 Places to See Before You Die", "26.08", "Five", "travel_2"),
]


def _make_book(book_id: int, slug: str, title: str, price: str, rating: str, category: str) -> Book:
    if book_id == 1000:  # copied from the live site
        return Book(book_id, slug, title, price, rating, category, 22, "a897fe39b1053632")
    stock = 0 if book_id in OUT_OF_STOCK else 1 + book_id * 7 % 22
    return Book(book_id, slug, title, price, rating, category, stock, hashlib.md5(slug.encode()).hexdigest()[:16])


#: Every book, newest (highest id) first, the order of the site's listings.
BOOKS = [_make_book(*row) for row in _BOOK_ROWS]

RATING_VALUES = {"One": 1, "Two": 2, "Three": 3, "Four": 4, "Five": 5}


def expected_book(book: Book, url: str) -> dict[str, Any]:
    """The item the books spider yields for ``book``'s page at ``url``."""
    return {
        "upc": book.upc,
        "title": book.title,
        "price": book.price,
        "currency": "GBP",
        "in_stock": book.stock > 0,
        "stock": book.stock,
        "rating": RATING_VALUES[book.rating],
        "category": _category(book.category).name,
        "url": url,
    }


def _category(slug: str) -> Category:
    return next(c for c in CATEGORIES if c.slug == slug)


def rel(path: str, from_dir: str) -> str:
    """``path`` relative to the directory ``from_dir``, as the site writes its links."""
    return posixpath.relpath(path, from_dir)


def listing_paths(first: str, directory: str, count: int) -> list[str]:
    """Paths of a listing's pages: ``first`` then ``DIR/page-2.html`` …"""
    pages = max(1, -(-count // PER_PAGE))
    return [first] + [f"{directory}/page-{n}.html" for n in range(2, pages + 1)]


class BooksSite(SiteCopy):
    """books.toscrape.com on loopback (see the module docstring)."""

    content_type = "text/html"  # no charset, as the live site sends it

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__(host, port)
        # The "All products" list: page 1 is the home page, later pages are under catalogue/.
        self._add_listing("All products", "/index.html", "/catalogue", BOOKS, None, aliases=["/"])
        self._add_listing("Books", f"{ALL_BOOKS_DIR}/index.html", ALL_BOOKS_DIR, BOOKS, ALL_BOOKS_DIR)
        for category in CATEGORIES:
            books = [b for b in BOOKS if b.category == category.slug]
            self._add_listing(category.name, f"{category.dir}/index.html", category.dir, books, category.dir)
        for book in BOOKS:
            self.pages[book.path] = self._product(book)

    # -- ground truth -----------------------------------------------------------------

    def listing_pages(self) -> set[str]:
        """Every listing page's path as the next links reach it (no page-1 aliases)."""
        paths = set(listing_paths("/", "/catalogue", len(BOOKS)))
        paths |= set(listing_paths(f"{ALL_BOOKS_DIR}/index.html", ALL_BOOKS_DIR, len(BOOKS)))
        for category in CATEGORIES:
            count = sum(1 for b in BOOKS if b.category == category.slug)
            paths |= set(listing_paths(f"{category.dir}/index.html", category.dir, count))
        return paths

    def crawl_paths(self) -> set[str]:
        """Every path a complete crawl from ``/`` requests (robots.txt included)."""
        return {"/robots.txt"} | self.listing_pages() | {book.path for book in BOOKS}

    def expected_items(self, base: str | None = None) -> dict[str, dict[str, Any]]:
        """UPC -> item for every book, as served from ``base``."""
        base = base or self.url
        return {book.upc: expected_book(book, base + book.path) for book in BOOKS}

    # -- pages ------------------------------------------------------------------------

    def _add_listing(
        self,
        title: str,
        first: str,
        directory: str,
        books: list[Book],
        category_dir: str | None,
        aliases: tuple[str, ...] | list[str] = (),
    ) -> None:
        paths = listing_paths(first, directory, len(books))
        for number, path in enumerate(paths, start=1):
            chunk = books[(number - 1) * PER_PAGE : number * PER_PAGE]
            body = self._listing(title, path, chunk, number, len(paths), len(books), category_dir)
            self.pages[path] = body
            if number == 1:
                for alias in aliases:
                    self.pages[alias] = body
                # page-1.html (what "previous" on page 2 links to) is page 1 at another path.
                alias = f"{directory}/page-1.html"
                self.pages[alias] = self._listing(title, alias, chunk, 1, len(paths), len(books), category_dir)

    def _listing(
        self, title: str, path: str, books: list[Book], number: int, pages: int, total: int, category_dir: str | None
    ) -> bytes:
        here = posixpath.dirname(path)
        crumbs = f'    <li><a href="{rel("/index.html", here)}">Home</a></li>\n'
        if category_dir is not None and category_dir != ALL_BOOKS_DIR:
            crumbs += f'    <li><a href="{rel(ALL_BOOKS_DIR + "/index.html", here)}">Books</a></li>\n'
        crumbs += f'    <li class="active">{esc(title)}</li>\n'
        sidebar = "".join(
            f'\n                <li>\n                    <a href="{rel(c.dir + "/index.html", here)}">\n'
            f"                            \n                                {esc(c.name)}\n"
            "                            \n                        </a>\n                </li>\n"
            for c in CATEGORIES
        )
        shown = (
            (
                f" - showing <strong>{(number - 1) * PER_PAGE + 1}</strong> to "
                f"<strong>{(number - 1) * PER_PAGE + len(books)}</strong>"
            )
            if pages > 1
            else ""
        )
        pods = "".join(self._pod(book, here) for book in books)
        pager = ""
        if pages > 1:
            pager = '<div>\n    <ul class="pager">\n'
            if number > 1:
                previous = f"{here}/page-{number - 1}.html"
                pager += f'            <li class="previous"><a href="{rel(previous, here)}">previous</a></li>\n'
            pager += f'        <li class="current">\n            Page {number} of {pages}\n        </li>\n'
            if number < pages:
                directory = "/catalogue" if here == "/" else here
                following = f"{directory}/page-{number + 1}.html"
                pager += f'            <li class="next"><a href="{rel(following, here)}">next</a></li>\n'
            pager += "    </ul>\n</div>\n"
        body = f"""
<div class="container-fluid page">
    <div class="page_inner">
<ul class="breadcrumb">
{crumbs}</ul>
        <div class="row">
            <aside class="sidebar col-sm-4 col-md-3 col-lg-3">
                <div id="promotions_left"></div>
    <div class="side_categories">
        <ul class="nav nav-list">
                <li>
                    <a href="{rel(ALL_BOOKS_DIR + "/index.html", here)}">
                        Books
                    </a>
                    <ul>{sidebar}
                    </ul></li>
        </ul>
    </div>
            </aside>
            <div class="col-sm-8 col-md-9">
                <div class="page-header action">
                    <h1>{esc(title)}</h1>
                </div>
                <div id="messages"></div>
                <div id="promotions"></div>
<form method="get" class="form-horizontal">
    <div style="display:none"></div>
        <strong>{total}</strong> results{shown}.
</form>
    <section>
        <div class="alert alert-warning" role="alert"><strong>Warning!</strong> This is a demo website for web \
scraping purposes. Prices and ratings here were randomly assigned and have no real meaning.</div>
        <div>
            <ol class="row">
{pods}
            </ol>
{pager}
        </div>
    </section>
            </div>
        </div><!-- /row -->
    </div><!-- /page_inner -->
</div><!-- /container-fluid -->
"""
        return _books_page(f"{title} | Books to Scrape - Sandbox", here, body)

    def _pod(self, book: Book, here: str) -> str:
        href = rel(book.path, here)
        words = book.title.split()
        short = " ".join(words[:4]) + " ..." if len(words) > 4 else book.title
        return f"""
                    <li class="col-xs-6 col-sm-4 col-md-3 col-lg-3">
    <article class="product_pod">
            <div class="image_container">
                    <a href="{href}"><img src="{rel(_image(book, "thumb"), here)}" alt="{esc(book.title)}" \
class="thumbnail"></a>
            </div>
                <p class="star-rating {book.rating}">
                    <i class="icon-star"></i>
                    <i class="icon-star"></i>
                    <i class="icon-star"></i>
                    <i class="icon-star"></i>
                    <i class="icon-star"></i>
                </p>
            <h3><a href="{href}" title="{esc(book.title)}">{esc(short)}</a></h3>
            <div class="product_price">
        <p class="price_color">£{book.price}</p>
{_availability(book, listing=True)}
    <form>
        <button type="submit" class="btn btn-primary btn-block" data-loading-text="Adding...">Add to basket</button>
    </form>
            </div>
    </article>
</li>"""

    def _product(self, book: Book) -> bytes:
        here = book.dir
        category = _category(book.category)
        stars = "\n".join('        <i class="icon-star"></i>' for _ in range(5))
        body = f"""
<div class="container-fluid page">
    <div class="page_inner">
<ul class="breadcrumb">
    <li>
        <a href="{rel("/index.html", here)}">Home</a>
    </li>
        <li>
            <a href="{rel(ALL_BOOKS_DIR + "/index.html", here)}">Books</a>
        </li>
        <li>
            <a href="{rel(category.dir + "/index.html", here)}">{esc(category.name)}</a>
        </li>
    <li class="active">{esc(book.title)}</li>
</ul>
        <div id="messages"></div>
            <div class="content">
                <div id="promotions"></div>
                <div id="content_inner">
<article class="product_page"><!-- Start of product page -->
    <div class="row">
        <div class="col-sm-6">
<div id="product_gallery" class="carousel">
    <div class="thumbnail">
        <div class="carousel-inner">
            <div class="item active">
                <img src="{rel(_image(book, "full"), here)}" alt="{esc(book.title)}" />
            </div>
        </div>
    </div>
</div>
        </div>
        <div class="col-sm-6 product_main">
            <h1>{esc(book.title)}</h1>
<p class="price_color">£{book.price}</p>
{_availability(book, listing=False)}
    <p class="star-rating {book.rating}">
{stars}
        <!-- <small><a href="{rel(book.path, here)}#reviews">0 customer reviews</a></small> -->
    </p>
            <hr/>
<div class="alert alert-warning" role="alert"><strong>Warning!</strong> This is a demo website for web scraping \
purposes. Prices and ratings here were randomly assigned and have no real meaning.</div>
        </div><!-- /col-sm-6 -->
    </div><!-- /row -->
    <div id="product_description" class="sub-header">
        <h2>Product Description</h2>
    </div>
    <p>{esc(book.title)}: a book of the {esc(category.name)} category, {book.stock} in stock.</p>
    <div class="sub-header">
        <h2>Product Information</h2>
    </div>
    <table class="table table-striped">
        <tr>
            <th>UPC</th><td>{book.upc}</td>
        </tr>
        <tr>
            <th>Product Type</th><td>Books</td>
        </tr>
            <tr>
                <th>Price (excl. tax)</th><td>£{book.price}</td>
            </tr>
                <tr>
                    <th>Price (incl. tax)</th><td>£{book.price}</td>
                </tr>
                <tr>
                    <th>Tax</th><td>£0.00</td>
                </tr>
            <tr>
                <th>Availability</th>
                <td>{book.availability}</td>
            </tr>
            <tr>
                <th>Number of reviews</th>
                <td>0</td>
            </tr>
    </table>
    <section>
        <div id="reviews" class="sub-header">
            <h2>Customer Reviews</h2>
        </div>
    </section>
</article><!-- End of product page -->
                </div>
            </div>
    </div><!-- /page_inner -->
</div><!-- /container-fluid -->
"""
        return _books_page(f"{book.title} | Books to Scrape - Sandbox", here, body)


def _availability(book: Book, listing: bool) -> str:
    if not book.stock:
        return '<p class="outofstock availability">\n    <i class="icon-remove"></i>\n        Out of stock\n</p>'
    message = "In stock" if listing else book.availability
    return f'<p class="instock availability">\n    <i class="icon-ok"></i>\n        {message}\n</p>'


def _image(book: Book, size: str) -> str:
    digest = hashlib.md5(f"{size}:{book.slug}".encode()).hexdigest()
    return f"/media/cache/{digest[:2]}/{digest[2:4]}/{digest}.jpg"


def _books_page(title: str, here: str, body: str) -> bytes:
    static = rel("/static/oscar", here)
    return f"""<!DOCTYPE html>
<!--[if lt IE 7]>      <html lang="en-us" class="no-js lt-ie9 lt-ie8 lt-ie7"> <![endif]-->
<!--[if IE 7]>         <html lang="en-us" class="no-js lt-ie9 lt-ie8"> <![endif]-->
<!--[if IE 8]>         <html lang="en-us" class="no-js lt-ie9"> <![endif]-->
<!--[if gt IE 8]><!--> <html lang="en-us" class="no-js"> <!--<![endif]-->
    <head>
        <title>
    {esc(title)}
</title>
        <meta http-equiv="content-type" content="text/html; charset=UTF-8" />
        <meta name="created" content="24th Jun 2016 09:29" />
        <meta name="description" content="" />
        <meta name="viewport" content="width=device-width" />
        <meta name="robots" content="NOARCHIVE,NOCACHE" />
        <link rel="shortcut icon" href="{static}/favicon.ico" />
        <link rel="stylesheet" type="text/css" href="{static}/css/styles.css" />
    </head>
    <body id="default" class="default">
        <header class="header container-fluid">
            <div class="page_inner">
                <div class="row">
                    <div class="col-sm-8 h1"><a href="{rel("/index.html", here)}">Books to Scrape</a>\
<small> We love being scraped!</small>
</div>
                </div>
            </div>
        </header>
{body}
    </body>
</html>
""".encode()
