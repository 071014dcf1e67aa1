"""A small demo shop served on loopback, for ``crawler demo``, the tests and benchmarks.

Standard library only. ``ShopSite`` runs a threaded HTTP/1.1 server (keep-alive, exact
``Content-Length``) in a daemon thread and logs every request it receives, so a test
can check what a crawl did: which URLs it fetched, how often, and how far apart.

Layout::

    /robots.txt            User-agent: * / Disallow: /private/
    /                      links to /products?page=1 and /private/admin (robots-disallowed)
    /products?page=N       per_page ``li.prod a`` product links in mixed spellings (absolute,
                           relative, with a #reviews fragment), a duplicate "featured" link to
                           the page's first product, ``a.next`` on all but the last page;
                           page 1 also links to /catalogue.pdf (and, with faults, to /missing
                           and /old/product/5)
    /product/ID            h1 name, .price, .sku, .stock, a link back to page 1, ``a.related``
    /catalogue.pdf         application/pdf, never HTML
    /private/admin         200, but a polite crawler never asks for it

With ``faults=True``: /product/3 answers 503 (``Retry-After: 1``, or what
``retry_after`` says; None sends none) to its first request only, /product/7 always
answers 500, /missing answers 404 and /old/product/5 answers 301 to /product/5.

With ``etags=True``: every 200 carries an ``ETag`` (a digest of its body), and a request
whose ``If-None-Match`` names the current one gets ``304 Not Modified`` without a body.
"""

from __future__ import annotations

import bisect
import hashlib
import html
import math
import socket
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .wire import WireStampedHandler, WireStampedServer

HTML = "text/html; charset=utf-8"
ROBOTS_TXT = "User-agent: *\nDisallow: /private/\n"
PDF_BODY = b"%PDF-1.4\n% demo catalogue\n%%EOF\n"

#: Product whose first request fails with 503 (transient) when faults are on.
TRANSIENT_ID = 3
#: Product that always fails with 500 (permanent) when faults are on.
BROKEN_ID = 7
#: Product reachable through a 301 from ``/old/product/ID`` when faults are on.
MOVED_ID = 5


@dataclass
class RequestLogEntry:
    """One request the shop received.

    ``time`` is its arrival on the wire (``wire``: the kernel's receive timestamp of the
    segment that carried the request line), which a handler thread that runs late under
    load cannot move;
    ``path`` is the path and query as requested; ``status`` is the status sent, 0 until
    the response starts.
    """

    time: float
    method: str
    path: str
    status: int = 0
    #: The request's headers (names in lower case), and the bytes of body sent back.
    headers: dict[str, str] = field(default_factory=dict)
    sent: int = 0


@dataclass
class _Response:
    status: int
    body: bytes
    content_type: str = HTML
    headers: dict[str, str] = field(default_factory=dict)


def product_price(product_id: int) -> str:
    """The price text of a product, e.g. ``"12.34"`` (deterministic, 1.00 to 999.99)."""
    cents = 100 + (product_id * 7919) % 99900
    return f"{cents // 100}.{cents % 100:02d}"


def product_in_stock(product_id: int) -> bool:
    """Whether a product is in stock (every fourth one is not)."""
    return product_id % 4 != 0


def product_sku(product_id: int) -> str:
    """The SKU of a product: ``SKU-`` and the ID zero-padded to 5 digits."""
    return f"SKU-{product_id:05d}"


def _page(title: str, body: str) -> bytes:
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>\n<body>\n{body}\n</body></html>\n"
    ).encode()


class ShopSite:
    """The demo shop: construct, ``start()`` (or use as a context manager), crawl ``url``.

    ``latency`` seconds are slept before every answer; with ``slow_every > 0`` every
    product whose ID is a multiple of it sleeps ``slow_seconds`` more; both can be
    changed while the shop runs. ``port=0`` picks a free port.
    """

    def __init__(
        self,
        products: int = 300,
        per_page: int = 20,
        latency: float = 0.0,
        slow_every: int = 0,
        slow_seconds: float = 0.5,
        etags: bool = False,
        faults: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        retry_after: str | None = "1",
    ):
        if products < 0 or per_page < 1:
            raise ValueError("products must be >= 0 and per_page >= 1")
        self.products = products
        self.per_page = per_page
        self.latency = latency
        self.slow_every = slow_every
        self.slow_seconds = slow_seconds
        self.faults = faults
        #: ``Retry-After`` of the transient 503 (None: the header is not sent).
        self.retry_after = retry_after
        self.host = host
        self.port = port
        #: Every request received, ordered by arrival time.
        self.requests: list[RequestLogEntry] = []
        #: Prices set while the shop runs (``reprice``), by product ID.
        self.repriced: dict[int, str] = {}
        #: Whether 200 answers carry an ETag (a digest of the body) and If-None-Match gets a 304.
        self.etags = etags
        self._lock = threading.Lock()
        self._failed_once: set[int] = set()
        self._connections: set[socket.socket] = set()
        self._server: _ShopServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> ShopSite:
        """Bind and serve in a daemon thread; returns self. Starting twice is an error."""
        if self._server is not None:
            raise RuntimeError("ShopSite is already started")
        server = _ShopServer((self.host, self.port), _Handler)
        server.site = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"shop-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket and any kept-alive connections."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ShopSite:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` without a trailing slash; valid once started."""
        if self._server is None:
            raise RuntimeError("ShopSite is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def pages(self) -> int:
        """Number of listing pages (at least one, possibly empty)."""
        return max(1, math.ceil(self.products / self.per_page))

    # -- inspection ---------------------------------------------------------------

    def reprice(self, product_id: int, price: str) -> None:
        """Change a product's price from now on (a page that changes between fetches)."""
        self.repriced[product_id] = price

    def requests_for(self, path: str) -> list[RequestLogEntry]:
        """The logged requests whose path and query equal ``path`` exactly."""
        with self._lock:
            return [entry for entry in self.requests if entry.path == path]

    def min_gap(self) -> float | None:
        """Smallest gap in seconds between consecutive arrivals; None if under 2 requests."""
        with self._lock:
            times = [entry.time for entry in self.requests]
        if len(times) < 2:
            return None
        return min(b - a for a, b in zip(times, times[1:]))

    def expected_items(self) -> dict[str, dict[str, Any]]:
        """Ground truth: sku -> the item the demo spider yields, for every parseable product.

        The permanently broken product (with faults on) is left out; the transient one
        is in, since a crawl that retries gets it.
        """
        items: dict[str, dict[str, Any]] = {}
        for product_id in range(1, self.products + 1):
            if self.faults and product_id == BROKEN_ID:
                continue
            sku = product_sku(product_id)
            items[sku] = {
                "sku": sku,
                "name": f"Product {product_id}",
                "price": float(product_price(product_id)),
                "in_stock": product_in_stock(product_id),
                "url": f"{self.url}/product/{product_id}",
            }
        return items

    # -- serving (called from handler threads) --------------------------------------

    def _record(self, arrival: float, method: str, path: str) -> RequestLogEntry:
        entry = RequestLogEntry(arrival, method, path)
        with self._lock:
            bisect.insort(self.requests, entry, key=lambda e: e.time)
        return entry

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _respond(self, target: str) -> _Response:
        """The response to a GET of ``target`` (path and query), after any delay."""
        if self.latency > 0:
            time.sleep(self.latency)
        parts = urlsplit(target)
        path = parts.path
        if path == "/robots.txt":
            return _Response(200, ROBOTS_TXT.encode(), "text/plain; charset=utf-8")
        if path == "/":
            return _Response(200, self._home())
        if path == "/products":
            return self._listing(parts.query)
        if path.startswith("/product/"):
            return self._product(path.removeprefix("/product/"))
        if path == "/catalogue.pdf":
            return _Response(200, PDF_BODY, "application/pdf")
        if path == "/private/admin":
            return _Response(200, _page("Admin", "<h1>Admin</h1><p>Crawlers keep out.</p>"))
        if self.faults and path == f"/old/product/{MOVED_ID}" and MOVED_ID <= self.products:
            body = _page("Moved", f'<a href="/product/{MOVED_ID}">moved</a>')
            return _Response(301, body, headers={"Location": f"/product/{MOVED_ID}"})
        return self._not_found()

    def _not_found(self) -> _Response:
        return _Response(404, _page("Not found", "<h1>Not found</h1>"))

    def _home(self) -> bytes:
        return _page(
            "Demo shop",
            '<h1>Demo shop</h1>\n<ul>\n<li><a href="/products?page=1">All products</a></li>\n'
            '<li><a href="/private/admin">Admin</a></li>\n</ul>',
        )

    def _listing(self, query: str) -> _Response:
        values = parse_qs(query).get("page", ["1"])
        try:
            number = int(values[0])
        except ValueError:
            return self._not_found()
        if not 1 <= number <= self.pages:
            return self._not_found()
        first = (number - 1) * self.per_page + 1
        ids = range(first, min(first + self.per_page, self.products + 1))
        lines = [f"<h1>Products, page {number} of {self.pages}</h1>"]
        if ids:
            featured = f'<a href="/product/{first}">Featured: Product {first}</a>'
            lines.append(f'<p class="featured">{featured}</p>')
        lines.append('<ul class="products">')
        for product_id in ids:
            link = f'<a href="{self._product_href(product_id)}">Product {product_id}</a>'
            lines.append(f'<li class="prod">{link}</li>')
        lines.append("</ul>")
        if number == 1:
            lines.append('<p><a class="pdf" href="/catalogue.pdf">Catalogue (PDF)</a></p>')
            if self.faults:
                lines.append('<p><a href="/missing">Discontinued</a></p>')
                if MOVED_ID <= self.products:
                    lines.append(f'<p><a href="/old/product/{MOVED_ID}">Old link</a></p>')
        if number < self.pages:
            lines.append(f'<a class="next" href="/products?page={number + 1}">Next</a>')
        return _Response(200, _page(f"Products {number}", "\n".join(lines)))

    def _product_href(self, product_id: int) -> str:
        """A link to a product, in one of three spellings that canonicalize alike."""
        spelling = product_id % 3
        if spelling == 0:
            return f"{self.url}/product/{product_id}"
        if spelling == 1:
            return f"product/{product_id}"  # relative to /products?page=N: /product/ID
        return f"/product/{product_id}#reviews"

    def _product(self, raw_id: str) -> _Response:
        if not raw_id.isdigit() or raw_id.startswith("0") or int(raw_id) > self.products:
            return self._not_found()
        product_id = int(raw_id)
        if self.slow_every > 0 and product_id % self.slow_every == 0:
            time.sleep(self.slow_seconds)
        if self.faults and product_id == BROKEN_ID:
            return _Response(500, _page("Error", "<h1>Internal server error</h1>"))
        if self.faults and product_id == TRANSIENT_ID:
            with self._lock:
                first_time = product_id not in self._failed_once
                self._failed_once.add(product_id)
            if first_time:
                body = _page("Unavailable", "<h1>Service unavailable</h1>")
                headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
                return _Response(503, body, headers=headers)
        related = product_id % self.products + 1
        stock = "in stock" if product_in_stock(product_id) else "out of stock"
        price = self.repriced.get(product_id) or product_price(product_id)
        body = _page(
            f"Product {product_id}",
            f"<h1>Product {product_id}</h1>\n"
            f'<p>Price: <span class="price">{price}</span> EUR</p>\n'
            f'<p>SKU: <span class="sku">{product_sku(product_id)}</span></p>\n'
            f'<p><span class="stock">{stock}</span></p>\n'
            f'<p><a class="related" href="/product/{related}">Related: Product {related}</a></p>\n'
            '<p><a href="/products?page=1">Back to products</a></p>',
        )
        return _Response(200, body)


def _revalidated(response: _Response, if_none_match: str | None) -> _Response:
    """``response`` with its ETag, or a 304 when the request's If-None-Match names it."""
    etag = '"' + hashlib.blake2b(response.body, digest_size=8).hexdigest() + '"'
    offered = {tag.strip().removeprefix("W/") for tag in (if_none_match or "").split(",")}
    if etag in offered or "*" in offered:
        return _Response(304, b"", response.content_type, {"ETag": etag})
    return _Response(response.status, response.body, response.content_type, {**response.headers, "ETag": etag})


class _ShopServer(WireStampedServer):
    site: ShopSite


class _Handler(WireStampedHandler):
    """Serves a ShopSite: logs arrival, then writes the site's response with a length."""

    server: _ShopServer
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle kept-alive connections are closed after this many seconds
    wbufsize = -1  # buffered: headers and body leave in one segment (flushed per request)
    _entry: RequestLogEntry | None = None

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.site._track(self.connection, True)

    def finish(self) -> None:
        self.server.site._track(self.connection, False)
        super().finish()

    def parse_request(self) -> bool:
        # Called right after the request line is read: the arrival is that line's.
        arrival = self.arrival()
        self._entry = None
        if not super().parse_request():
            return False
        self._entry = self.server.site._record(arrival, self.command, self.path)
        return True

    def send_response(self, code: int, message: str | None = None) -> None:
        if self._entry is not None:
            self._entry.status = code
        super().send_response(code, message)

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, with_body: bool) -> None:
        response = self.server.site._respond(self.path)
        if self._entry is not None:
            self._entry.headers = {name.lower(): value for name, value in self.headers.items()}
        if self.server.site.etags and response.status == 200:
            response = _revalidated(response, self.headers.get("If-None-Match"))
        if response.status == 304:  # no body, no length (RFC 9110 §15.4.5)
            self.send_response(304)
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            return
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if with_body:
            self.wfile.write(response.body)
            if self._entry is not None:
                self._entry.sent = len(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: the request log is ``ShopSite.requests``."""
