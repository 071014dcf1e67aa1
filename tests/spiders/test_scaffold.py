"""``crawler new NAME URL``: a spider module that loads, passes the checks and crawls."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error

from crawler.cli.app import cli
from crawler.spiders.check import check_spider
from crawler.spiders.loading import load_spiders
from crawler.store.database import Store

#: A three-page site: the home page links to two pages, which link to each other and home.
PAGES = {
    "/": '<title>Home</title><a href="/a">A</a> <a href="/b">B</a>',
    "/a": '<title>Page A</title><a href="/b">B</a> <a href="/">home</a>',
    "/b": '<title>Page B</title><a href="/a">A</a>',
}


class _Site(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802  # http.server's name
        page = PAGES.get(self.path)
        body = f"<html><body>{page}</body></html>".encode() if page else b"not found"
        self.send_response(200 if page else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def base(redis_url: str, sqlite_url: str, tmp_path: Path) -> list[str]:
    return ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]


def invoke(base: list[str], *args: str) -> Result:
    return CliRunner().invoke(cli, [*base, *args], env={"COLUMNS": "200"})


def test_a_new_spider_loads_passes_the_checks_and_its_crawl_stores_items(
    base: list[str], sqlite_url: str, site: str, tmp_path: Path
) -> None:
    result = invoke(base, "new", "mysite", site)
    assert result.exit_code == 0, result.output
    module = tmp_path / "sites" / "mysite.py"
    assert result.stdout.strip() == f"wrote {module}: edit it, then `crawler crawl mysite`"
    listed = invoke(base, "sites")
    assert listed.exit_code == 0 and "mysite" in listed.stdout and "127.0.0.1" in listed.stdout, listed.output
    spiders = load_spiders(tmp_path / "sites")
    assert spiders.errors == [] and check_spider(spiders.spiders["mysite"], module) is None
    assert spiders.spiders["mysite"].start_urls == [site]
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and "CRAWLER_" not in k}
    command = [sys.executable, "-c", "from crawler.cli.app import main; main()", *base, "crawl", "mysite", "-n", "1"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    store = Store(sqlite_url)
    try:
        stored = {row["key"]: row["data"] for row in store.item_rows("mysite")}
    finally:
        store.close()
    assert stored == {
        f"{site}a": {"url": f"{site}a", "title": "Page A"},
        f"{site}b": {"url": f"{site}b", "title": "Page B"},
    }


def test_new_never_overwrites_a_file(base: list[str], tmp_path: Path) -> None:
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "notes.py").write_text("# mine\n")
    result = invoke(base, "new", "notes", "https://example.com/")
    assert_one_line_error(result, "notes.py exists: not overwritten")
    assert (tmp_path / "sites" / "notes.py").read_text() == "# mine\n"


@pytest.mark.parametrize(
    ("name", "url", "fragment"),
    [
        ("my-site", "https://example.com/", "identifier"),
        ("class", "https://example.com/", "keyword"),
        ("café", "https://example.com/", "identifier"),
        ("../evil", "https://example.com/", "identifier"),
        ("a b", "https://example.com/", "identifier"),
        ('x"""', "https://example.com/", "identifier"),
        ("a\\N", "https://example.com/", "identifier"),
        ("shop", "ftp://example.com/", "http:// or https://"),
        ("shop", "example.com", "http:// or https://"),
        ("shop", "https://example.com:port/", "URL"),
        ("shop", "https:///path", "with a host"),
    ],
)
def test_a_bad_name_or_url_is_a_one_line_error_and_writes_nothing(
    base: list[str], tmp_path: Path, name: str, url: str, fragment: str
) -> None:
    assert_one_line_error(invoke(base, "new", name, url), fragment)
    assert not (tmp_path / "sites").exists() or not list((tmp_path / "sites").iterdir())


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/a\\N",
        "https://example.com/\\N{HYPHEN}",
        "https://example.com/\\x4",
        "https://example.com/\\u12",
        'https://example.com/q?"""',
        "https://example.com/q?'''",
        'https://example.com/it\'s"quoted"',
        "https://example.com/end\\",
        "https://example.com/{name}/café?a=1&b=2",
        "https://example.com/nul\x00del\x7f",
        "https://example.com/\udcff",
    ],
)
def test_a_url_with_backslashes_or_quotes_scaffolds_a_module_that_loads_with_that_start_url(
    base: list[str], tmp_path: Path, url: str
) -> None:
    result = invoke(base, "new", "nasty", url)
    assert result.exit_code == 0, result.output
    module = tmp_path / "sites" / "nasty.py"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an invalid escape sequence is a warning today, an error tomorrow
        compile(module.read_bytes(), str(module), "exec")
    spiders = load_spiders(tmp_path / "sites")
    assert spiders.errors == [] and check_spider(spiders.spiders["nasty"], module) is None
    assert spiders.spiders["nasty"].start_urls == [url]
    assert spiders.spiders["nasty"].allowed_domains == ["example.com"]
