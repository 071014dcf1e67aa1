"""Spider arguments (``crawl``/``seed -a key=value``): kept in Redis, seen by every worker's spider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error, waiting_tasks
from redis import Redis

from crawler.cli.app import cli
from crawler.coord import keys
from crawler.coord.frontier import SEED_PRIORITY
from crawler.coord.spiderargs import ARGS_REFRESH, MAX_VALUE_LENGTH, build_spider, read_args, store_args
from crawler.settings import Settings
from crawler.spiders.spider import Spider
from crawler.work.runtime import Runtime

SHELF = """
import os

from crawler import Request, Spider


class Shelf(Spider):
    name = "shelf"
    allowed_domains = ["127.0.0.1"]
    interval = 0.05
    item_key = "url"
    base = ""
    category = "all"
    pages: int = 1  # annotated: -a pages=3 arrives as the int 3
    tags = ["new"]  # not plain data: no argument replaces it

    @property
    def title(self):
        return self.category.title()

    @classmethod
    def make(cls):
        return cls()

    def __init__(self):
        self.label = f"{self.category}!"  # the arguments are in place when __init__ runs

    def start_requests(self):
        for n in range(self.pages):
            yield Request(f"{self.base}/{self.category}/{n}")

    def parse(self, page):
        yield {"url": page.url, "category": self.category, "label": self.label, "pages": self.pages,
               "pid": os.getpid()}
"""


class _Pages(BaseHTTPRequestHandler):
    requested: list[str] = []

    def do_GET(self) -> None:  # noqa: N802  # http.server's name
        body = b"<html><body>a page</body></html>"
        status = 404 if self.path == "/robots.txt" else 200
        if status == 200:
            _Pages.requested.append(self.path)
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def pages() -> Iterator[str]:
    """A loopback site answering every path with a page; the paths asked are in ``_Pages.requested``."""
    _Pages.requested = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def base(redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path) -> list[str]:
    (tmp_path / "sites").mkdir(exist_ok=True)
    (tmp_path / "sites" / "shelf.py").write_text(SHELF)
    return ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]


def invoke(base: list[str], *args: str) -> Result:
    return CliRunner().invoke(cli, [*base, *args])


def test_crawl_arguments_reach_start_requests_init_and_callbacks_in_every_worker_process(
    base: list[str], redis_conn: Redis, pages: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and "CRAWLER_" not in k}
    out = tmp_path / "items.jsonl"
    command = [sys.executable, "-c", "from crawler.cli.app import main; main()", *base, "crawl", "shelf",
               "-a", f"base={pages}", "-a", "category=books", "-a", "pages=3",
               "-n", "2", "--parsers", "2", "-o", str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(_Pages.requested) == ["/books/0", "/books/1", "/books/2"]  # start requests saw them
    items = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(item["url"] for item in items) == [f"{pages}/books/{n}" for n in range(3)]
    assert {(item["category"], item["label"], item["pages"]) for item in items} == {("books", "books!", 3)}
    assert os.getpid() not in {item["pid"] for item in items}  # parsed in the worker processes
    assert read_args(redis_conn, "shelf") == {"base": pages, "category": "books", "pages": "3"}
    assert invoke(base, "reset", "shelf", "--yes").exit_code == 0
    assert not redis_conn.exists(keys.spider_args("shelf"))


def test_seed_arguments_are_seen_by_the_start_requests(base: list[str], redis_conn: Redis, pages: str) -> None:
    result = invoke(base, "seed", "shelf", "-a", f"base={pages}", "-a", "category=music", "-a", "pages=2")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "shelf: 2 enqueued, 0 already seen"
    queued = [task.url for task in waiting_tasks(redis_conn, "shelf") if task.priority == SEED_PRIORITY]
    assert len(queued) == 2 and all("/music/" in url for url in queued), queued
    again = invoke(base, "seed", "shelf")  # no -a: the crawl's arguments are kept, and named
    assert again.exit_code == 0, again.output
    assert "spider arguments kept from before: base=" in again.stderr and "category=music" in again.stderr
    assert read_args(redis_conn, "shelf")["category"] == "music"


@pytest.mark.parametrize(
    ("pair", "fragment"),
    [
        ("parse=x", "is a method"),
        ("start_requests=x", "is a method"),
        ("interval=5", "a setting of every spider"),
        ("name=other", "a setting of every spider"),
        ("__class__=x", "identifier not starting with _"),
        ("_private=x", "identifier not starting with _"),
        ("1x=y", "identifier"),
        ("pages=many", "Shelf.pages is int"),
        ("title=x", "Shelf.title is a property"),
        ("make=x", "Shelf.make is a classmethod"),
        ("tags=x", "Shelf.tags is a list"),
        ("category", "give key=value"),
        (f"category={'x' * (MAX_VALUE_LENGTH + 1)}", f"at most {MAX_VALUE_LENGTH}"),
    ],
)
def test_a_bad_argument_is_a_one_line_error_and_nothing_is_stored(
    base: list[str], redis_conn: Redis, pair: str, fragment: str
) -> None:
    result = invoke(base, "seed", "shelf", "-a", pair)
    assert_one_line_error(result, fragment)
    assert not redis_conn.exists(keys.spider_args("shelf"))


def test_stored_arguments_replace_those_before_and_each_write_is_announced(fake_redis: Redis) -> None:
    assert read_args(fake_redis, "shelf") == {}
    tokens = [fake_redis.get(keys.settings_changes())]
    store_args(fake_redis, "shelf", {"category": "games", "pages": "4"})
    tokens.append(fake_redis.get(keys.settings_changes()))
    assert read_args(fake_redis, "shelf") == {"category": "games", "pages": "4"}
    store_args(fake_redis, "shelf", {"category": "books"})  # replaces, not merges
    tokens.append(fake_redis.get(keys.settings_changes()))
    assert read_args(fake_redis, "shelf") == {"category": "books"}
    store_args(fake_redis, "shelf", {})
    tokens.append(fake_redis.get(keys.settings_changes()))
    assert read_args(fake_redis, "shelf") == {} and not fake_redis.exists(keys.spider_args("shelf"))
    assert tokens[0] is None and len(set(tokens)) == 4  # a new token after every write: readers read again


def test_a_running_worker_builds_its_spider_again_when_the_arguments_change(
    redis_conn: Redis, settings: Settings
) -> None:
    Path(settings.sites_dir, "shelf.py").write_text(SHELF)
    runtime = Runtime(redis_conn, settings)
    try:
        before = runtime.spider("shelf")
        assert (before.category, before.label) == ("all", "all!")  # type: ignore[attr-defined]
        assert runtime.pipelines("shelf").spider is before
        store_args(redis_conn, "shelf", {"category": "games", "pages": "4"})
        time.sleep(ARGS_REFRESH + 0.1)
        after = runtime.spider("shelf")
        assert (after.category, after.label, after.pages) == ("games", "games!", 4)  # type: ignore[attr-defined]
        assert runtime.spider("shelf") is after  # built once for these arguments
        assert runtime.pipelines("shelf").spider is after  # its process_item is the new instance's
        redis_conn.hset(keys.spider_args("shelf"), "parse", "junk")  # written by hand: left out
        time.sleep(ARGS_REFRESH + 0.1)
        assert callable(runtime.spider("shelf").parse)
    finally:
        runtime.close()


def test_a_stored_argument_naming_a_property_is_ignored_with_a_warning_and_the_site_still_runs(
    base: list[str], redis_conn: Redis, pages: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    redis_conn.hset(keys.spider_args("shelf"), mapping={"base": pages, "category": "games", "title": "x", "tags": "y"})
    result = invoke(base, "seed", "shelf")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "1 enqueued" in result.stdout
    warnings = [r.getMessage() for r in caplog.records if "spider argument ignored" in r.getMessage()]
    assert len(warnings) == 2 and "Shelf.title is a property" in " ".join(warnings), warnings
    Path(settings.sites_dir, "shelf.py").write_text(SHELF)
    runtime = Runtime(redis_conn, settings)
    try:
        spider = runtime.spider("shelf")
        assert (spider.category, spider.title, spider.tags) == ("games", "Games", ["new"])  # type: ignore[attr-defined]
    finally:
        runtime.close()


def test_an_argument_the_spider_refuses_to_set_is_left_out_when_the_spider_is_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Guarded(Spider):
        name = "guarded"
        category = "all"
        mode = "fast"

        def __setattr__(self, name: str, value: object) -> None:
            if name == "mode":
                raise ValueError("mode is fixed")
            super().__setattr__(name, value)

    spider = build_spider(Guarded, {"category": "books", "mode": "slow"})
    assert (spider.category, spider.mode) == ("books", "fast")
    assert "spider argument mode='slow' ignored: mode is fixed" in caplog.text
