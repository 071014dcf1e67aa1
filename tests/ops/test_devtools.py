"""``crawler fetch``, ``crawler parse`` and ``crawler shell`` against the demo shop on loopback.

One URL, one callback, no crawl: through the site's robots.txt and gate as a worker
would, nothing queued, nothing recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error
from redis import Redis

from crawler.coord.frontier import Frontier
from crawler.coord.frontier import seed as seed_urls
from crawler.coord.seen import stored
from crawler.demo import ShopSite
from crawler.errors import ConfigError
from crawler.http.fetch import Response
from crawler.ops.devtools import QUEUED, REFUSED, SEEN, page_of, route, verdict
from crawler.spiders.spider import Request

Invoke = Callable[..., Result]

CRASHY = """
from crawler import Spider


class Crashy(Spider):
    name = "crashy"
    allowed_domains = ["localhost"]

    def parse(self, page):
        yield {"title": page.text("h1")}
        ratio = 1 / len(page.css("table"))
        yield {"ratio": ratio}
"""


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)


@pytest.fixture
def sites_dir(tmp_path: Path) -> Path:
    path = tmp_path / "sites"
    path.mkdir()
    return path


@pytest.fixture
def invoke(redis_url: str, redis_conn: Redis, sqlite_url: str, sites_dir: Path) -> Invoke:
    runner = CliRunner()
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(sites_dir)]

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(cli_group(), [*base, *args], input=input, env={"COLUMNS": "200"})

    return run


def cli_group():  # imported late: crawler.cli.app registers these commands when it loads
    from crawler.cli.app import cli

    return cli


def paths(shop: ShopSite) -> list[str]:
    return [entry.path for entry in shop.requests]


# -- crawler fetch -----------------------------------------------------------------------


def test_fetch_prints_the_body_on_stdout_and_status_and_headers_on_stderr(
    invoke: Invoke, shop: ShopSite, redis_conn: Redis
) -> None:
    result = invoke("fetch", f"{shop.url}/product/1", "--site", "demo")
    assert result.exit_code == 0, result.output
    assert b"<h1>Product 1</h1>" in result.stdout_bytes
    head = result.stderr.splitlines()
    assert head[0].startswith(f"HTTP 200 {shop.url}/product/1 (site demo, ")
    assert head[0].endswith("): handed to the callback")
    assert "content-type: text/html; charset=utf-8" in head
    # robots.txt first, as a worker does, then the page; nothing queued.
    assert paths(shop) == ["/robots.txt", "/product/1"]
    assert stored(redis_conn, "demo")[1] == 0


def test_fetch_headers_only(invoke: Invoke, shop: ShopSite) -> None:
    result = invoke("fetch", f"{shop.url}/old/product/5", "--headers", "--site", "demo")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith("): redirect to /product/5: a request of its own")
    assert "location: /product/5" in lines
    assert "moved" not in result.stdout


def test_fetch_obeys_robots_txt(invoke: Invoke, shop: ShopSite) -> None:
    result = invoke("fetch", f"{shop.url}/private/admin", "--site", "demo")
    assert_one_line_error(result, "disallowed by robots.txt")
    assert "/private/admin" not in paths(shop)


def test_fetch_takes_the_site_s_gate(invoke: Invoke, shop: ShopSite) -> None:
    assert invoke("set", "demo", "--interval", "0.4").exit_code == 0
    for n in (1, 2):
        assert invoke("fetch", f"{shop.url}/product/{n}", "--site", "demo").exit_code == 0
    assert paths(shop) == ["/robots.txt", "/product/1", "/product/2"]
    gaps = [b.time - a.time for a, b in zip(shop.requests, shop.requests[1:], strict=False)]
    assert min(gaps) >= 0.4


def test_fetch_of_a_url_no_spider_allows_is_one_line(invoke: Invoke) -> None:
    assert_one_line_error(invoke("fetch", "http://example.com/"), "no spider allows http://example.com/", "--site")


def test_fetch_of_a_url_two_spiders_allow_asks_for_the_site(invoke: Invoke, sites_dir: Path, shop: ShopSite) -> None:
    (sites_dir / "crashy.py").write_text(CRASHY)
    (sites_dir / "twin.py").write_text(CRASHY.replace("Crashy", "Twin").replace('"crashy"', '"twin"'))
    url = shop.url.replace("127.0.0.1", "localhost") + "/product/1"
    assert_one_line_error(invoke("fetch", url), "several spiders (crashy, twin)")  # the bundled demo is not one
    assert invoke("fetch", url, "--site", "crashy").exit_code == 0


def test_fetch_of_an_unreachable_site_is_one_line(invoke: Invoke) -> None:
    assert_one_line_error(invoke("fetch", "http://127.0.0.1:9/", "--site", "demo"))


# -- crawler parse -----------------------------------------------------------------------


def test_parse_prints_the_items_and_where_each_request_would_go(
    invoke: Invoke, shop: ShopSite, redis_conn: Redis
) -> None:
    seed_urls(Frontier(redis_conn, "demo", ["127.0.0.1"], 60, 60), [f"{shop.url}/product/3"])
    result = invoke("parse", "demo", f"{shop.url}/product/2", "--callback", "parse_product")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "1 item"
    assert json.loads(lines[1]) == shop.expected_items()["SKU-00002"]
    assert lines[2:] == ["1 request", f"  already seen  parse_product  {shop.url}/product/3"]
    result = invoke("parse", "demo", f"{shop.url}/product/4", "--callback", "parse_product")
    assert result.stdout.splitlines()[2:] == ["1 request", f"  queued        parse_product  {shop.url}/product/5"]
    # Nothing was queued or recorded: the seen set still holds the one seed.
    assert stored(redis_conn, "demo")[1] == 1


def test_parse_of_a_saved_body_needs_no_download_and_sorts_refusals(invoke: Invoke, tmp_path: Path) -> None:
    saved = tmp_path / "listing.html"
    saved.write_text(
        '<a href="/product/9">9</a> <a href="http://elsewhere.example/x">x</a> '
        '<a href="/product/9#again">again</a> <a href="mailto:a@b.c">mail</a>'
    )
    result = invoke("parse", "demo", "http://127.0.0.1:9/products?page=1", "--body", str(saved), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["items"] == []
    assert [(r["outcome"], r["url"]) for r in data["requests"]] == [
        (QUEUED, "http://127.0.0.1:9/product/9"),  # the demo spider yields product links first
        (SEEN, "http://127.0.0.1:9/product/9"),
        (REFUSED, "http://elsewhere.example/x"),
        (REFUSED, "mailto:a@b.c"),
    ]
    assert "outside the allowed domains" in data["requests"][2]["reason"]


def test_parse_gives_meta_to_the_callback(invoke: Invoke, sites_dir: Path, tmp_path: Path) -> None:
    (sites_dir / "echo.py").write_text(
        "from crawler import Spider\n\nclass Echo(Spider):\n    name = 'echo'\n    allowed_domains = ['a.test']\n\n"
        "    def parse(self, page):\n        yield dict(page.meta)\n"
    )
    saved = tmp_path / "page.html"
    saved.write_text("<p>x</p>")
    result = invoke("parse", "echo", "http://a.test/", "--body", str(saved), "--meta", '{"category": "shoes"}')
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:2] == ["1 item", '{"category": "shoes"}']


def test_a_callback_that_raises_shows_its_traceback_then_one_error_line(
    invoke: Invoke, sites_dir: Path, shop: ShopSite
) -> None:
    (sites_dir / "crashy.py").write_text(CRASHY)
    url = shop.url.replace("127.0.0.1", "localhost") + "/product/1"
    result = invoke("parse", "crashy", url)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert f'File "{sites_dir / "crashy.py"}", line 11, in parse' in result.stderr
    assert "ZeroDivisionError: division by zero" in result.stderr
    assert lines[-1] == f"Error: parse raised ZeroDivisionError on {url}"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--meta", "{not json"], "--meta is not valid JSON"),
        (["--meta", "[1, 2]"], "--meta must be a JSON object, got list"),
        (["--callback", "parse_nothing"], "has no callback 'parse_nothing'"),
    ],
    ids=["bad-json", "not-an-object", "unknown-callback"],
)
def test_parse_bad_options_are_one_line(invoke: Invoke, args: list[str], fragment: str) -> None:
    assert_one_line_error(invoke("parse", "demo", "http://127.0.0.1:9/", *args), fragment)


def test_parse_of_a_page_workers_would_not_parse_says_why(invoke: Invoke, shop: ShopSite) -> None:
    assert_one_line_error(
        invoke("parse", "demo", f"{shop.url}/catalogue.pdf"), "HTTP 200", "not HTML (application/pdf)"
    )
    assert_one_line_error(invoke("parse", "demo", f"{shop.url}/missing"), "HTTP 404", "recorded failed")


def test_route_counts_a_url_twice_on_one_page_as_seen() -> None:
    routed = route(
        [
            Request("http://a.test/x"),
            Request("http://a.test/x#y"),
            Request("http://a.test/x", dont_filter=True),
            Request("http://a.test/p", priority=5000),
            Request("http://a.test/x", method="POST", json={"q": 1}),
            Request("http://a.test/x", method="POST", json={"q": 2}),
            Request("http://a.test/x", method="POST", json={"q": 1}),
        ],
        ["a.test"],
    )
    assert [r.outcome for r in routed] == [QUEUED, SEEN, QUEUED, REFUSED, QUEUED, QUEUED, SEEN]
    assert "priority" in str(routed[3].reason)


# -- crawler shell -----------------------------------------------------------------------


def test_shell_binds_the_page_and_runs_callbacks(invoke: Invoke, shop: ShopSite) -> None:
    script = (
        "print('status', page.status)\n"
        "out = parse('parse_product')\n"
        "print('sku', out.items[0]['sku'])\n"
        f"fetch('{shop.url}/product/4')\n"
        "print('now', page.text('h1'))\n"
    )
    result = invoke("shell", "demo", f"{shop.url}/product/1", "--plain", input=script)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "crawler shell for site 'demo'" in result.stderr  # the console's banner goes to stderr
    assert "status 200" in out and "sku SKU-00001" in out and "now Product 4" in out
    assert "queued" in out and f"{shop.url}/product/2" in out  # parse() showed where the related link would go
    assert paths(shop) == ["/robots.txt", "/product/1", "/product/4"]


def test_fetch_and_parse_say_a_meta_refresh_stub_is_a_redirect_and_give_no_page() -> None:
    body = b'<html><head><meta http-equiv="refresh" content="0; url=/new"></head></html>'
    stub = Response("http://docs.example/old", 200, {"content-type": "text/html"}, body, datetime.now(UTC), 0.01)
    assert verdict(stub) == "meta refresh to http://docs.example/new: a request of its own, no callback"
    with pytest.raises(ConfigError, match="meta refresh to http://docs.example/new"):
        page_of(stub)
    # A spider that does not follow them reads the stub as a page.
    assert verdict(stub, follow_meta_refresh=False) == "handed to the callback"
    assert page_of(stub, follow_meta_refresh=False).css_first("meta") is not None
