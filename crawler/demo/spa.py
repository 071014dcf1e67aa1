"""A loopback single-page app shop, and its server-rendered twin, for rendering tests and benches.

Every HTML page of the app is the same shell (``<div id="app">``, a stylesheet, an image, the
app's script and a third-party script on ``tracker_host``); ``/app.js`` fetches JSON
(``/api/products``, redirected, and ``/api/product/ID``) and writes the product links or the product into
the shell. ``/ssr/...`` serves the same pages written by the server, for plain fetching.
Every request is logged with its arrival time, the tracker's apart: the time the kernel
received its request line (``wire``), where a server thread's own clock reading would
come late by however long it waited for a CPU (tens of ms beside a busy browser).

With ``consent=True`` the shell sets a ``consent`` cookie and the JSON API answers 403
to a request without it (a site whose session a rendering crawl must carry).

Two pages try a render's deadline: ``/slow-scripts`` loads ``SLOW_SCRIPTS`` scripts that the
server answers ``script_delay`` seconds late, and ``/spin`` runs a script that never yields
once the page has loaded. ``pages`` adds pages of a test's own.
"""

from __future__ import annotations

import argparse
import json
import threading
from dataclasses import dataclass
from typing import Any

from .wire import WireStampedHandler, WireStampedServer

SHELL = """<!doctype html>
<html><head><title>SPA shop</title>
<link rel="stylesheet" href="/style.css">
<script src="/app.js" defer></script>
<script src="http://{tracker}/tracker.js"></script>
</head><body><img src="/logo.png" alt="logo"><div id="app">Loading...</div></body></html>
"""

APP_JS = """
const app = document.getElementById('app');
const path = location.pathname;
if (path === '/') {
  fetch('/api/products').then(r => r.json()).then(products => {
    app.innerHTML = '<ul>' + products.map(p =>
      '<li><a class="product" href="/product/' + p.id + '">' + p.name + '</a></li>').join('') + '</ul>';
  });
} else if (path.startsWith('/product/')) {
  fetch('/api' + path).then(r => r.json()).then(p => {
    app.innerHTML = '<h1 class="name">' + p.name + '</h1><span class="sku">' + p.sku +
      '</span><span class="price">' + p.price + '</span>';
  });
}
"""


#: Scripts of the ``/slow-scripts`` page, each answered ``SpaSite.script_delay`` seconds late.
SLOW_SCRIPTS = 5

SLOW_PAGE = "<!doctype html><html><head><title>slow</title>{scripts}</head><body><p>static</p></body></html>"

#: A page whose script takes the page's thread for good once it has loaded.
SPIN_PAGE = """<!doctype html><html><head><title>spin</title></head><body><p>static</p>
<script>addEventListener('load', () => setTimeout(() => { for (;;) {} }, 50));</script></body></html>
"""

#: Paths answered with a redirect, and where to.
REDIRECTS = {"/old": "/", "/api/products": "/api/v2/products"}

#: The source of a spider for the app (``str.format`` with ``name``, ``url`` of its start
#: page and ``render``, True or False), as the rendering tests and ``bench render`` write it.
SPIDER_SOURCE = """
from crawler import Spider


class App(Spider):
    name = "{name}"
    start_urls = ["{url}"]
    allowed_domains = ["127.0.0.1"]
    item_key = "sku"
    render = {render}
    render_wait = "#app a.product"

    def parse(self, page):
        yield from page.follow_all("#app a.product", callback=self.parse_product, render_wait="#app h1.name")

    def parse_product(self, page):
        yield {{"sku": page.text(".sku"), "name": page.text("h1.name"), "price": float(page.text(".price"))}}
"""


def product(i: int) -> dict[str, Any]:
    """Product ``i`` as the API gives it."""
    return {"id": i, "sku": f"SPA-{i:04d}", "name": f"Widget {i}", "price": f"{i * 1.5:.2f}"}


@dataclass
class Arrival:
    time: float  # epoch seconds the kernel received the request's first bytes
    path: str


class SpaSite:
    """The app on ``host`` (``url``), a tracker on ``tracker_host``; start with ``with``.

    ``hang``: a path whose shell never gets its content (the script is not served: the
    render's wait runs out). ``script_delay``: seconds before a script of ``/slow-scripts`` is
    answered (cut short when the site stops). ``pages``: path -> (content type, body), served as given.
    """

    def __init__(
        self,
        products: int = 5,
        host: str = "127.0.0.1",
        tracker_host: str = "127.0.0.2",
        hang: str | None = None,
        port: int = 0,
        consent: bool = False,
        script_delay: float = 60.0,
        pages: dict[str, tuple[str, bytes]] | None = None,
    ):
        self.products = products
        self.consent = consent
        self.port = port
        self.host = host
        self.tracker_host = tracker_host
        self.hang = hang
        self.script_delay = script_delay
        self.pages = dict(pages or {})
        self._stopped = threading.Event()
        self.arrivals: list[Arrival] = []
        self.tracker_arrivals: list[Arrival] = []
        self._lock = threading.Lock()
        self._servers: list[WireStampedServer] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._servers[0].server_port}"

    @property
    def tracker(self) -> str:
        return f"{self.tracker_host}:{self._servers[1].server_port}"

    def __enter__(self) -> SpaSite:
        for host, port, log in ((self.host, self.port, self.arrivals), (self.tracker_host, 0, self.tracker_arrivals)):
            server = WireStampedServer((host, port), self._handler(log))
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._servers.append(server)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def paths(self) -> list[str]:
        with self._lock:
            return [a.path for a in self.arrivals]

    def min_gap(self) -> float | None:
        """Smallest gap in seconds between consecutive arrivals at the app; None if under 2."""
        with self._lock:
            times = sorted(a.time for a in self.arrivals)
        return min((b - a for a, b in zip(times, times[1:])), default=None)

    def expected_items(self) -> dict[str, dict[str, Any]]:
        """sku -> the item a spider of the app yields: sku, name, price (float)."""
        return {
            p["sku"]: {"sku": p["sku"], "name": p["name"], "price": float(p["price"])}
            for p in map(product, range(1, self.products + 1))
        }

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type or ``Location``, body) for ``path``: ``/old`` redirects to ``/``,
        ``/api/products`` to ``/api/v2/products``."""
        if path in self.pages:
            return 200, *self.pages[path]
        if path in REDIRECTS:
            return 301 if path == "/old" else 302, REDIRECTS[path], b""
        if path == "/slow-scripts":
            scripts = "".join(f'<script src="/slow/{i}.js"></script>' for i in range(1, SLOW_SCRIPTS + 1))
            return 200, "text/html; charset=utf-8", SLOW_PAGE.format(scripts=scripts).encode()
        if path.startswith("/slow/") and path.endswith(".js"):
            return 200, "application/javascript", b"window.slow = (window.slow || 0) + 1;"
        if path == "/spin":
            return 200, "text/html; charset=utf-8", SPIN_PAGE.encode()
        if path == "/" or (path.startswith("/product/") and path[9:].isdigit()):
            return 200, "text/html; charset=utf-8", SHELL.format(tracker=self.tracker).encode()
        if path == "/app.js":
            return 200, "application/javascript", APP_JS.encode()
        if path == "/api/v2/products":
            body = [{"id": i, "name": f"Widget {i}"} for i in range(1, self.products + 1)]
            return 200, "application/json", json.dumps(body).encode()
        if path.startswith("/api/product/") and path[13:].isdigit():
            return 200, "application/json", json.dumps(product(int(path[13:]))).encode()
        if path == "/ssr/":
            links = "".join(
                f'<li><a class="product" href="/ssr/product/{i}">Widget {i}</a></li>'
                for i in range(1, self.products + 1)
            )
            return 200, "text/html; charset=utf-8", f'<div id="app"><ul>{links}</ul></div>'.encode()
        if path.startswith("/ssr/product/") and path[13:].isdigit():
            p = product(int(path[13:]))
            html = (
                f'<div id="app"><h1 class="name">{p["name"]}</h1><span class="sku">{p["sku"]}</span>'
                f'<span class="price">{p["price"]}</span></div>'
            )
            return 200, "text/html; charset=utf-8", html.encode()
        if path == "/style.css":
            return 200, "text/css", b"body { color: #333 }"
        if path == "/logo.png":
            return 200, "image/png", b"\x89PNG\r\n\x1a\n"
        if path == "/tracker.js":
            return 200, "application/javascript", b"window.tracked = true;"
        return 404, "text/plain", b"not found"

    def _handler(self, log: list[Arrival]) -> type[WireStampedHandler]:
        site = self

        class Handler(WireStampedHandler):
            protocol_version = "HTTP/1.1"
            arrived = 0.0

            def parse_request(self) -> bool:
                self.arrived = self.arrival()  # the request line's, just read
                return super().parse_request()

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                with site._lock:
                    log.append(Arrival(self.arrived, self.path))
                if self.path.startswith("/slow/") and site._stopped.wait(site.script_delay):
                    return  # the site stopped first: its client is long gone
                if site.hang is not None and self.path == "/app.js" and site.hang in self.headers.get("referer", ""):
                    status, kind, body = 404, "text/plain", b"not found"
                else:
                    status, kind, body = site.answer(self.path)
                consented = "consent=yes" in self.headers.get("cookie", "")
                if site.consent and self.path.startswith("/api/") and not consented:
                    status, kind, body = 403, "text/plain", b"accept our cookies first"
                self.send_response(status)
                self.send_header("Location" if 300 <= status < 400 else "Content-Type", kind)
                if site.consent and self.path == "/":
                    self.send_header("Set-Cookie", "consent=yes; Path=/")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def main() -> None:
    """``python -m crawler.demo.spa [--port 8000] [--products 5]``: serve the app until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m crawler.demo.spa", description=main.__doc__)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--products", type=int, default=5)
    args = parser.parse_args()
    with SpaSite(products=args.products, port=args.port) as site:
        print(f"single-page app on {site.url}/ (server-rendered twin on {site.url}/ssr/); Ctrl-C to stop", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
