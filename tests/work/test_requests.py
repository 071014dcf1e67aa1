"""Requests that are not plain GETs: methods, headers and bodies, through a real crawl.

A loopback app (``App``) logs every request that reaches it (time, method, path, headers,
body); crawls run with ``crawler.testing.crawl`` (an embedded Redis, download and parse
workers in threads, SQLite), so each request goes through the frontier, the gate and the
download job as in production.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis import Redis

from crawler.coord.frontier import DownloadTask, Frontier
from crawler.coord.scheduler import encode_entry
from crawler.coord.seen import fingerprints_of, stored
from crawler.coord.task import fingerprint, request_fingerprint
from crawler.demo.wire import WireStampedHandler, WireStampedServer
from crawler.spiders.spider import Page, Request, Spider
from crawler.testing import crawl

INTERVAL = 0.25


@dataclass
class Arrival:
    time: float  # when the kernel received the request (``WireStampedHandler.arrival``)
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


#: A route's answer: status, headers, body.
Answer = tuple[int, dict[str, str], bytes]


class App:
    """A loopback HTTP app: ``routes[(method, path)](arrival) -> (status, headers, body)``; every request logged."""

    def __init__(self, routes: dict[tuple[str, str], Callable[[Arrival], Answer]]):
        self.routes = routes
        self.arrivals: list[Arrival] = []
        app = self

        class Handler(WireStampedHandler):
            def handle_one(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                arrival = Arrival(
                    self.arrival(),
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length) if length else b"",
                )
                app.arrivals.append(arrival)
                route = app.routes.get((self.command, self.path.split("?")[0]))
                status, headers, body = route(arrival) if route else (404, {}, b"not here")
                self.send_response(status)
                for name, value in {"content-type": "text/html", **headers}.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = handle_one

            def log_message(self, *args: Any) -> None:
                pass

        self.server = WireStampedServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def to(self, method: str, path: str) -> list[Arrival]:
        return [a for a in self.arrivals if a.method == method and a.path == path]

    def gaps(self) -> list[float]:
        """Seconds between consecutive arrivals (every request the crawl made, robots.txt included)."""
        times = sorted(a.time for a in self.arrivals)
        return [b - a for a, b in zip(times, times[1:], strict=False)]


def html(text: str) -> Answer:
    return 200, {}, f"<html><body>{text}</body></html>".encode()


def robots(_: Arrival) -> Answer:
    return 200, {"content-type": "text/plain"}, b"User-agent: *\nAllow: /\n"


# -- step 1: methods, headers, bodies --------------------------------------------------------


def search_app() -> App:
    """POST /search with a JSON body {"page": N} and the header X-Token: t0k answers a page of
    two results and, below page 3, a pointer to the next page; /see-other and /keep answer
    303 and 307 to a POST; /flaky answers 503 to its first POST."""
    flaky: list[int] = []

    def search(arrival: Arrival) -> Answer:
        if arrival.headers.get("x-token") != "t0k" or arrival.headers.get("content-type") != "application/json":
            return 403, {}, b"no token"
        n = int(json.loads(arrival.body)["page"])
        more = f'<div id="next" data-page="{n + 1}"></div>' if n < 3 else ""
        return html(f'<li class="item">p{n}-a</li><li class="item">p{n}-b</li>{more}')

    def flaky_once(arrival: Arrival) -> Answer:
        flaky.append(1)
        if len(flaky) == 1:
            return 503, {}, b"busy"
        return html(f'<li class="item">flaky {arrival.body.decode()}</li>')

    routes = {
        ("GET", "/robots.txt"): robots,
        ("GET", "/start"): lambda _: html("start"),
        ("POST", "/search"): search,
        ("POST", "/see-other"): lambda _: (303, {"location": "/result"}, b""),
        ("GET", "/result"): lambda _: html('<li class="item">result</li>'),
        ("POST", "/keep"): lambda _: (307, {"location": "/kept"}, b""),
        ("POST", "/kept"): lambda a: html(f'<li class="item">kept {a.body.decode()}</li>'),
        ("POST", "/flaky"): flaky_once,
    }
    return App(routes)


@pytest.fixture
def app() -> Iterator[App]:
    served = search_app()
    yield served
    served.close()


class SearchSpider(Spider):
    name = "search"
    allowed_domains = ["127.0.0.1"]

    def parse(self, page: Page) -> Iterator[Any]:
        for n in (1, 1, 2):  # page 1 twice: one fetch
            yield self.search(page, n)
        yield Request(page.urljoin("/see-other"), "parse_items", method="POST", form={"q": "x"})
        yield Request(page.urljoin("/keep"), "parse_items", method="POST", body="kept-body")
        yield Request(page.urljoin("/flaky"), "parse_items", method="POST", body=b"try")

    def search(self, page: Page, n: int) -> Request:
        return Request(
            page.urljoin("/search"), "parse_items", method="POST", json={"page": n}, headers={"X-Token": "t0k"}
        )

    def parse_items(self, page: Page) -> Iterator[Any]:
        for li in page.css("li.item"):
            yield {"name": li.text()}
        more = page.css_first("#next")
        if more is not None:
            yield self.search(page, int(more.attributes["data-page"] or 0))


def test_posts_with_different_bodies_are_fetched_once_each_with_their_headers_and_their_items_all_stored(
    app: App,
) -> None:
    result = crawl(SearchSpider, [app.url + "/start"], interval=INTERVAL)
    searches = app.to("POST", "/search")
    # Pages 1, 2, 3 once each: the same URL with another body is another request, the same body is not.
    assert sorted(json.loads(a.body)["page"] for a in searches) == [1, 2, 3]
    assert {a.headers["x-token"] for a in searches} == {"t0k"}
    names = sorted(item["name"] for item in result.items)
    assert [n for n in names if n.startswith("p")] == ["p1-a", "p1-b", "p2-a", "p2-b", "p3-a", "p3-b"]
    assert not result.failed


def test_a_303_turns_a_post_into_a_get_without_body_and_a_307_keeps_method_and_body(app: App) -> None:
    result = crawl(SearchSpider, [app.url + "/start"], interval=INTERVAL)
    (see_other,) = app.to("POST", "/see-other")
    assert see_other.body == b"q=x" and see_other.headers["content-type"] == "application/x-www-form-urlencoded"
    (result_get,) = app.to("GET", "/result")
    assert result_get.body == b"" and "content-type" not in result_get.headers
    (kept,) = app.to("POST", "/kept")
    assert kept.body == b"kept-body"
    names = {item["name"] for item in result.items}
    assert {"result", "kept kept-body"} <= names


def test_a_post_answered_503_is_sent_again_with_its_body(app: App) -> None:
    result = crawl(SearchSpider, [app.url + "/start"], interval=INTERVAL, settings={"backoff": 0.1})
    assert [a.body for a in app.to("POST", "/flaky")] == [b"try", b"try"]
    assert "flaky try" in {item["name"] for item in result.items}


def test_posts_keep_the_site_interval_at_the_server(app: App) -> None:
    crawl(SearchSpider, [app.url + "/start"], interval=INTERVAL, downloaders=3)
    assert len(app.arrivals) >= 10
    assert min(app.gaps()) >= INTERVAL, f"two requests {min(app.gaps()):.3f}s apart"


# -- fingerprints and frontier entries ----------------------------------------------------------


def test_a_get_keeps_the_fingerprint_the_seen_sets_of_running_crawls_hold(redis_conn: Redis) -> None:
    url = "https://shop.example/product/1?color=red"
    # The old code's bytes: blake2b of the canonical URL, 8 bytes.
    old = hashlib.blake2b(url.encode(), digest_size=8).digest()
    assert old.hex() == "7df504230d63c5ed"
    assert fingerprint(url) == old
    assert request_fingerprint(url) == request_fingerprint(url, "GET", None) == old
    assert DownloadTask("s", url).fingerprint == old
    front = Frontier(redis_conn, "fp", ["shop.example"], 60, 60)
    front.add([Request(url), Request(url, method="POST", body="a")])
    assert old in fingerprints_of(redis_conn, "fp")  # the same 64 bits, as an integer
    assert stored(redis_conn, "fp")[1] == 2


def test_requests_differ_by_method_and_body_not_by_headers(redis_conn: Redis) -> None:
    front = Frontier(redis_conn, "dedup", ["shop.example"], 60, 60)
    url = "https://shop.example/api"
    result = front.add(
        [
            Request(url),
            Request(url, method="POST"),
            Request(url, method="POST", json={"page": 1}),
            Request(url, method="POST", json={"page": 2}),
            Request(url, method="POST", json={"page": 2}, headers={"X-Other": "1"}),  # a duplicate
            Request(url, method="PUT", json={"page": 2}),
            Request(url, method="POST", body='{"page":1}'),  # the same bytes as json={"page": 1}
        ]
    )
    assert len(result.enqueued) == 5 and result.duplicates == 2


def test_old_frontier_entries_still_read_and_new_ones_carry_method_headers_and_body(redis_conn: Redis) -> None:
    old = encode_entry("https://shop.example/a", "parse_item", 2, 0, 1, {"k": 1})
    assert old == '["https://shop.example/a","parse_item",2,0,1,{"k":1}]'  # what is queued today
    task = DownloadTask.from_entry("s", old, 5)
    assert (task.method, task.headers, task.body, task.depth) == ("GET", {}, None, 2)
    post = DownloadTask("s", "https://shop.example/a", method="POST", headers={"X": "1"}, body=b"\xff\x00 raw")
    again = DownloadTask.from_entry("s", post.to_entry())
    assert (again.method, again.headers, again.body) == ("POST", {"X": "1"}, b"\xff\x00 raw")
    assert DownloadTask.from_json(post.to_json()) == post
    for bad in ('{"url": "x"}', '{"method": 5}', '{"headers": {"a": 1}}', '{"body64": "@@"}', "[1]"):
        with pytest.raises(ValueError):  # a hand-written entry: quarantined by the refill, never fetched
            DownloadTask.from_entry("s", f'["https://shop.example/a","parse",0,0,1,{{}},null,null,{bad}]')
    front = Frontier(redis_conn, "entries", ["shop.example"], 60, 60)
    front.add([Request("https://shop.example/b", method="POST", json=[1, "é"])])
    (waiting,) = front.waiting()
    assert (waiting.method, waiting.body) == ("POST", '[1,"é"]'.encode())
    assert waiting.headers == {"Content-Type": "application/json"}


def test_a_request_body_over_the_cap_is_refused_with_the_reason(redis_conn: Redis) -> None:
    front = Frontier(redis_conn, "cap", ["shop.example"], 60, 60, max_request_body_bytes=100)
    result = front.add(
        [
            Request("https://shop.example/up", method="POST", body=b"x" * 101),
            Request("https://shop.example/up", method="POST", body=b"x" * 100),
        ]
    )
    assert len(result.enqueued) == 1
    assert result.refused is not None
    ((_, reason),) = result.refused
    assert reason == "request body longer than 100 bytes (101): POST https://shop.example/up"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"method": "BREW"}, "unknown HTTP method 'BREW'"),
        ({"json": {}, "body": b"x"}, "a request has one body"),
        ({"headers": {"X": 1}}, "header 'X': names and values must be text"),
    ],
)
def test_a_request_that_cannot_be_sent_raises_a_one_line_value_error(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Request("https://shop.example/", **kwargs)


def test_a_get_form_goes_into_the_query() -> None:
    request = Request("https://shop.example/find?old=1#top", form={"q": "a b", "n": [1, 2]})
    assert (request.url, request.body, request.headers) == ("https://shop.example/find?q=a+b&n=1&n=2", None, {})


# -- step 2: responses of other types, page.json(), page.request ---------------------------------


def json_api() -> App:
    """POST /api/items with {"page": N} and X-Api-Key: k answers three items and the next page (up
    to 3) as JSON, with an X-Total-Count header; /report.pdf is a PDF; /page is HTML."""

    def items(arrival: Arrival) -> Answer:
        if arrival.headers.get("x-api-key") != "k":
            return 401, {"content-type": "application/json"}, b'{"error": "no key"}'
        n = int(json.loads(arrival.body)["page"])
        data = {"items": [{"id": f"{n}-{i}"} for i in range(3)], "next": n + 1 if n < 3 else None}
        headers = {"content-type": "application/json; charset=utf-8", "x-total-count": "9", "set-cookie": "sid=s3cret"}
        return 200, headers, json.dumps(data).encode()

    routes = {
        ("GET", "/robots.txt"): robots,
        ("POST", "/api/items"): items,
        ("GET", "/report.pdf"): lambda _: (200, {"content-type": "application/pdf"}, b"%PDF-1.4 not html"),
        ("GET", "/page"): lambda _: html('<p class="x">html too</p>'),
    }
    return App(routes)


@pytest.fixture
def api() -> Iterator[App]:
    served = json_api()
    yield served
    served.close()


class JsonApiSpider(Spider):
    name = "jsonapi"
    allowed_domains = ["127.0.0.1"]
    content_types = ("text/html", "application/json")
    base = ""

    def start_requests(self) -> Iterator[Request]:
        yield self.items_request(1)
        yield self.items_request(1)  # the same body: one fetch
        yield Request(self.base + "/report.pdf")
        yield Request(self.base + "/page", "parse_html")

    def items_request(self, n: int) -> Request:
        return Request(
            self.base + "/api/items", "parse_items", method="POST", json={"page": n}, headers={"X-Api-Key": "k"}
        )

    def parse_items(self, page: Page) -> Iterator[Any]:
        data = page.json()
        assert page.text.startswith("{") and page.body.startswith(b"{")
        for item in data["items"]:
            yield {
                **item,
                "status": page.status,
                "total": page.headers["x-total-count"],
                "cookie": page.headers.get("set-cookie"),
                "sent": [page.request.method, page.request.url, page.request.headers["X-Api-Key"]],
            }
        if data["next"]:
            yield self.items_request(data["next"])
            yield self.items_request(data["next"])  # found twice: fetched once

    def parse_html(self, page: Page) -> Iterator[Any]:
        yield {"id": "html", "text": page.text("p.x"), "method": page.request.method}


def test_a_json_api_paged_by_post_reaches_its_callback_and_every_page_s_items_are_stored(api: App) -> None:
    spider = type("Api", (JsonApiSpider,), {"base": api.url})
    result = crawl(spider, interval=0.1)
    assert sorted(json.loads(a.body)["page"] for a in api.to("POST", "/api/items")) == [1, 2, 3]
    ids = sorted(item["id"] for item in result.items)
    assert ids == sorted([f"{n}-{i}" for n in (1, 2, 3) for i in range(3)] + ["html"])
    one = next(item for item in result.items if item["id"] == "2-1")
    assert one["status"] == 200 and one["total"] == "9" and one["cookie"] is None  # a secret: not handed on
    assert one["sent"] == ["POST", api.url + "/api/items", "k"]
    assert {"id": "html", "text": "html too", "method": "GET"} in result.items
    assert not result.failed


def test_a_type_outside_content_types_is_still_recorded_skipped(api: App) -> None:
    spider = type("Api", (JsonApiSpider,), {"base": api.url})
    result = crawl(spider, interval=0.1)
    (pdf,) = [r for r in result.fetches if r["url"].endswith("/report.pdf")]
    assert (pdf["outcome"], pdf["error"]) == ("skipped", "not in content_types (application/pdf)")


def test_json_is_skipped_by_a_spider_that_keeps_the_default_html_only(api: App) -> None:
    spider = type("Api", (JsonApiSpider,), {"base": api.url, "content_types": ("text/html",)})
    result = crawl(spider, interval=0.1)
    (first,) = [r for r in result.fetches if r["url"].endswith("/api/items") and r["kind"] == "download"]
    assert (first["outcome"], first["error"]) == ("skipped", "not in content_types (application/json)")
    assert [item["id"] for item in result.items] == ["html"]


def test_a_json_page_is_never_parsed_as_html_unless_css_is_asked_for() -> None:
    page = Page("https://api.example/x", b'{"a": [1, 2]}', headers={"content-type": "application/json"})
    assert page.json() == {"a": [1, 2]}
    assert page.text == '{"a": [1, 2]}' and page.body == b'{"a": [1, 2]}'
    assert page._tree is None
    assert page.request.method == "GET" and page.request.url == "https://api.example/x"
    assert page.text("p") == ""  # the DOM, on demand
    assert page._tree is not None


def test_content_type_families_and_a_missing_type_count_as_asked() -> None:
    from crawler.spiders.spider import HTML_TYPES, accepts

    assert accepts(HTML_TYPES, "") and accepts(HTML_TYPES, "text/html") and not accepts(HTML_TYPES, "text/plain")
    assert accepts(("application/*",), "application/ld+json") and not accepts(("application/*",), "text/html")
    assert accepts(("*/*",), "image/png")


def test_a_page_whose_text_was_read_is_freed_at_once_not_left_to_the_garbage_collector() -> None:
    import gc
    import weakref

    page = Page("https://shop.example/", b"<h1>Title</h1>")
    assert page.text("h1") == "Title" and page.text == "<h1>Title</h1>"
    gone = weakref.ref(page)
    gc.disable()
    try:
        del page
        assert gone() is None  # no reference cycle between the page and its text
    finally:
        gc.enable()


# -- step 3: page.form ------------------------------------------------------------------------------


def login_app() -> App:
    """GET /login renders a login form with a new CSRF token each time; POST /session accepts a
    token once, with user alice and password pw, and welcomes her; GET /find answers its query."""
    issued: list[str] = []

    def login(_: Arrival) -> Answer:
        token = f"tok{len(issued)}-{time.monotonic_ns()}"
        issued.append(token)
        return html(
            '<form class="search" action="/find"><input name="q" value="old"><input name="page" value="1"></form>'
            '<form id="login" method="post" action="/session">'
            f'<input type="hidden" name="csrf" value="{token}">'
            '<input type="hidden" name="next" value="/account">'
            '<input name="user"><input type="password" name="password">'
            '<input type="checkbox" name="remember" value="1" checked>'
            '<select name="lang"><option value="en">English<option value="fr" selected>French</select>'
            '<button type="submit" name="action" value="login">Log in</button>'
            "</form>"
        )

    def session(arrival: Arrival) -> Answer:
        from urllib.parse import parse_qs

        form = {k: v[0] for k, v in parse_qs(arrival.body.decode()).items()}
        token_ok = form.get("csrf") in issued
        if token_ok:
            issued.remove(form["csrf"])  # once only
        if not token_ok or (form.get("user"), form.get("password")) != ("alice", "pw"):
            return 403, {}, b"bad token or password"
        return html(f'<p id="welcome">Welcome {form["user"]}</p>')

    routes = {
        ("GET", "/robots.txt"): robots,
        ("GET", "/login"): login,
        ("POST", "/session"): session,
        ("GET", "/find"): lambda a: html(f'<p id="found">{a.path}</p>'),
    }
    return App(routes)


class LoginSpider(Spider):
    name = "login"
    allowed_domains = ["127.0.0.1"]

    def parse(self, page: Page) -> Iterator[Any]:
        yield page.form("#login", data={"user": "alice", "password": "pw"}, callback=self.after_login)
        yield page.form("form.search", data={"q": "lamp"}, callback="found")

    def after_login(self, page: Page) -> Iterator[Any]:
        yield {"welcome": page.text("#welcome")}

    def found(self, page: Page) -> Iterator[Any]:
        yield {"found": page.text("#found")}


@pytest.mark.integration
def test_a_login_form_is_submitted_with_its_per_render_csrf_token_and_hidden_fields() -> None:
    app = login_app()
    try:
        result = crawl(LoginSpider, [app.url + "/login"], interval=0.1)
        (sent,) = app.to("POST", "/session")
    finally:
        app.close()
    assert {item.get("welcome") for item in result.items} >= {"Welcome alice"}
    fields = sent.body.decode()
    assert fields.startswith("csrf=tok0-") and "&next=%2Faccount&remember=1&lang=fr&action=login&" in fields
    assert fields.endswith("&user=alice&password=pw")
    assert {"found": "/find?page=1&q=lamp"} in result.items  # a GET form: its fields are the (canonical) query
    assert not result.failed


def test_form_picks_the_form_of_a_node_and_data_replaces_adds_and_drops_fields() -> None:
    page = Page(
        "https://shop.example/cart/",
        b'<base href="https://shop.example/"><form method="get"><input name="a" value="1"><input name="b" value="2">'
        b'<input name="off" value="x" disabled><input type="submit" value="no name">'
        b'<select name="many" multiple><option>x</select><textarea name="t">line\n</textarea>'
        b'<input type="image" name="go"><p id="inside"></p></form>',
    )
    request = page.form("#inside", data={"b": None, "c": ["3", "4"]}, meta={"m": 1})
    assert request.method == "GET" and request.meta == {"m": 1} and request.body is None
    assert request.url == "https://shop.example/cart/?a=1&t=line%0A&go=&c=3&c=4"
    with pytest.raises(ValueError, match="no form matching '#nope'"):
        page.form("#nope")
    with pytest.raises(ValueError, match="no form on the page"):
        Page("https://shop.example/", b"<p>none</p>").form()


# -- step 4: the spider's headers ------------------------------------------------------------------


class HeadersSpider(Spider):
    name = "headers"
    allowed_domains = ["127.0.0.1"]
    headers = {"X-Site": "s", "Accept": "application/json"}

    def parse(self, page: Page) -> Iterator[Any]:
        yield {"path": "/start", "sent": dict(page.request.headers)}
        yield Request(page.urljoin("/result"), "parse_own", headers={"accept": "text/csv", "User-Agent": "custom/1"})

    def parse_own(self, page: Page) -> Iterator[Any]:
        yield {"path": "/result", "sent": dict(page.request.headers)}


def test_the_spider_s_headers_go_with_every_request_under_the_request_s_own(app: App) -> None:
    from crawler.settings import DEFAULT_USER_AGENT

    result = crawl(HeadersSpider, [app.url + "/start"], interval=0.1)
    (start,) = app.to("GET", "/start")
    (own,) = app.to("GET", "/result")
    assert (start.headers["x-site"], start.headers["accept"], start.headers["user-agent"]) == (
        "s",
        "application/json",
        DEFAULT_USER_AGENT,
    )
    assert (own.headers["x-site"], own.headers["accept"], own.headers["user-agent"]) == ("s", "text/csv", "custom/1")
    sent = {item["path"]: item["sent"] for item in result.items}
    assert sent["/start"] == {"X-Site": "s", "Accept": "application/json"}
    assert sent["/result"] == {"X-Site": "s", "accept": "text/csv", "User-Agent": "custom/1"}


# -- step 5: depth_limit and max_pages ----------------------------------------------------------------


def tree_app() -> App:
    """/n/K links to /n/(2K+1) and /n/(2K+2): a binary tree of pages, K up to 126 (depth 6)."""

    def node(k: int) -> Callable[[Arrival], Answer]:
        links = "".join(f'<a href="/n/{c}">{c}</a>' for c in (2 * k + 1, 2 * k + 2) if c < 127)
        return lambda _: html(f'<p class="k">{k}</p>{links}')

    routes: dict[tuple[str, str], Callable[[Arrival], Answer]] = {("GET", "/robots.txt"): robots}
    routes.update({("GET", f"/n/{k}"): node(k) for k in range(127)})
    return App(routes)


@pytest.fixture
def tree() -> Iterator[App]:
    served = tree_app()
    yield served
    served.close()


class TreeSpider(Spider):
    name = "tree"
    allowed_domains = ["127.0.0.1"]

    def parse(self, page: Page) -> Iterator[Any]:
        yield {"k": page.text("p.k")}
        yield from page.follow_all("a")


def pages_fetched(app: App) -> list[str]:
    return sorted((a.path for a in app.arrivals if a.path != "/robots.txt"), key=lambda p: int(p.split("/")[-1]))


def test_depth_limit_stops_at_that_many_links_from_the_start_and_the_parse_record_says_so(tree: App) -> None:
    result = crawl(TreeSpider, [tree.url + "/n/0"], interval=0.02, depth_limit=2)
    assert pages_fetched(tree) == [f"/n/{k}" for k in range(7)]  # depths 0, 1 and 2
    notes = {r["url"].rsplit("/", 1)[1]: r["error"] for r in result.fetches if r["kind"] == "parse"}
    assert notes["3"] == "2 links beyond depth_limit (2): not queued"
    assert notes["2"] is None


def test_max_pages_admits_that_many_pages_across_every_worker_and_the_crawl_drains(tree: App) -> None:
    result = crawl(TreeSpider, [tree.url + "/n/0"], interval=0.02, downloaders=3, max_pages=10)
    assert len(pages_fetched(tree)) == 10
    assert len(result.items) == 10
    assert any("max_pages (10) reached" in (r["error"] or "") for r in result.fetches if r["kind"] == "parse")


def test_max_pages_is_counted_once_for_two_frontiers_adding_at_once(redis_conn: Redis) -> None:
    fronts = [Frontier(redis_conn, "cap5", ["shop.example"], 60, 60, max_pages=5) for _ in range(2)]
    results: list[Any] = []

    def add(front: Frontier, offset: int) -> None:
        results.append(front.add([Request(f"https://shop.example/{offset + i}") for i in range(4)]))

    threads = [threading.Thread(target=add, args=(front, 10 * i)) for i, front in enumerate(fronts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(len(r.enqueued) for r in results) == 5
    assert sum(r.over_max_pages for r in results) == 3
    assert fronts[0].add([Request("https://shop.example/0")]).duplicates == 1  # seen: not counted again
    assert fronts[0].pages_admitted() == 8
    from crawler.ops.reset import reset_site

    reset_site(redis_conn, "cap5")  # a reset crawl starts counting again
    assert fronts[0].pages_admitted() == 0


# -- politeness across processes -----------------------------------------------------------------------

POSTS_SPIDER = """
from crawler import Request, Spider


class Posts(Spider):
    name = "posts"
    allowed_domains = ["127.0.0.1"]
    interval = {interval}

    def parse(self, page):
        for n in range(1, 21):
            yield Request(
                page.urljoin("/search"), "parse_items", method="POST", json={{"page": n}}, headers={{"X-Token": "t0k"}}
            )

    def parse_items(self, page):
        for li in page.css("li.item"):
            yield {{"name": li.text()}}
"""


def test_posts_from_two_worker_processes_keep_the_interval_at_the_server(
    app: App, redis_url: str, redis_conn: Redis, settings: Any
) -> None:
    from pathlib import Path

    from crawler.coord.frontier import seed
    from crawler.store.database import Store
    from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
    from crawler.work.runtime import Runtime

    interval = 0.1
    Path(settings.sites_dir, "posts.py").write_text(POSTS_SPIDER.format(interval=interval))
    rt = Runtime(redis_conn, settings)
    try:
        seed(rt.frontier("posts"), [app.url + "/start"])
    finally:
        rt.close()
    specs = [WorkerSpec("download", ("posts",), threads=2, burst=True)] * 2
    specs += [WorkerSpec("parse", ("posts",), threads=1, burst=True)]
    processes = start_workers(specs, settings, redis_url)
    timer = threading.Timer(90, stop_workers, args=(processes,), kwargs={"timeout": 10})
    timer.start()
    try:
        assert wait_for(processes) == 0
    finally:
        timer.cancel()
    searches = app.to("POST", "/search")
    assert sorted(json.loads(a.body)["page"] for a in searches) == list(range(1, 21))
    print(f"POSTs from two worker processes: {len(app.arrivals)} requests, min gap {min(app.gaps()) * 1000:.1f} ms")
    assert min(app.gaps()) >= interval, f"two requests {min(app.gaps()) * 1000:.1f} ms apart"
    store = Store(settings.database_url)
    try:
        workers = {r["worker"] for r in store.fetch_rows("posts") if r["kind"] == "download"}
        items = store.item_rows("posts")
    finally:
        store.close()
    assert len(workers) >= 2, "the downloads were not shared between workers"
    assert len(items) == 40  # two a page, none overwritten by another body's


class TwicePosted(Spider):
    name = "twice"
    allowed_domains = ["127.0.0.1"]

    def parse(self, page: Page) -> Iterator[Any]:
        for _ in range(2):
            yield Request(page.urljoin("/kept"), "parse_kept", method="POST", body="again", dont_filter=True)
        yield Request(page.urljoin("/result"), "parse_kept")
        yield Request(page.urljoin("/result"), "parse_kept", dont_filter=True)

    def parse_kept(self, page: Page) -> Iterator[Any]:
        return iter(())


def test_the_development_cache_replays_gets_but_sends_every_post(app: App) -> None:
    crawl(TwicePosted, [app.url + "/start"], interval=0.05, settings={"http_cache": True})
    assert [a.body for a in app.to("POST", "/kept")] == [b"again", b"again"]
    assert len(app.to("GET", "/result")) == 1  # the second GET came from the cache
