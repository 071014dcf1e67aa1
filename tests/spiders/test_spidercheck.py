"""Spider modules are checked when they load: wrong attributes and import errors are named by file and line."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from crawling import assert_one_line_error
from redis import Redis

from crawler.cli.app import cli
from crawler.coord import keys
from crawler.errors import ConfigError, SpiderLoadError
from crawler.settings import check_site_interval
from crawler.spiders.check import check_spider
from crawler.spiders.loading import load_spiders
from crawler.spiders.spider import Spider

SPIDER = """
from crawler import Spider


class Shop(Spider):
    name = "shop"
    start_urls = ["http://shop.example/"]
{attributes}
    def parse(self, page):
        return []

    def parse_product(self, page):
        return []
"""


@pytest.fixture
def sites_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "sites"
    directory.mkdir()
    before = set(sys.modules)
    yield directory
    for name in set(sys.modules) - before:
        if name.startswith("crawler_sites"):
            del sys.modules[name]


def write_spider(directory: Path, attributes: str, module: str = "shop") -> Path:
    body = "".join(f"    {line}\n" for line in attributes.splitlines())
    path = directory / f"{module}.py"
    path.write_text(SPIDER.format(attributes=body))
    return path


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


@pytest.mark.parametrize(
    "attributes, fragment",
    [
        ("interval = -1", "Shop.interval must be a number of seconds greater than 0, or Auto(min=, max=), got -1"),
        ('gate_by = "host"', "Shop.gate_by must be 'site', 'ip' or None, got 'host'"),
        ("revisit_after = 0", "Shop.revisit_after must be a number of seconds greater than 0, or None, got 0"),
        (
            "interval = '1.0'",
            "Shop.interval must be a number of seconds greater than 0, or Auto(min=, max=), got '1.0'",
        ),
        ("interval = True", "Shop.interval must be a number"),
        ("interval = float('inf')", "Shop.interval must be at most 86400 seconds (a day), got inf"),
        ("interval = 1e999", "Shop.interval must be at most 86400 seconds (a day), got inf"),
        (
            "interval = float('nan')",
            "Shop.interval must be a number of seconds greater than 0, or Auto(min=, max=), got nan",
        ),
        ("interval = -0.5", "Shop.interval must be a number of seconds greater than 0, or Auto(min=, max=), got -0.5"),
        ("interval = 10**6", "Shop.interval must be at most 86400 seconds (a day), got 1000000"),
        ("start_urls = 'http://shop.example/'", "Shop.start_urls must be a list of URLs, got str"),
        ("start_urls = ['shop.example/']", "Shop.start_urls must hold absolute http(s) URLs, got 'shop.example/'"),
        ("allowed_domains = ['https://shop.example']", "Shop.allowed_domains must hold host names without scheme"),
        ("allowed_domains = 'shop.example'", "Shop.allowed_domains must be a list of host names"),
        ("concurrency = 0", "Shop.concurrency must be a whole number of at least 1"),
        ("obey_robots = 'no'", "Shop.obey_robots must be True or False, got 'no'"),
        ("item_key = 3", "Shop.item_key must be a non-empty string or None, got 3"),
        ("refresh = {'parse_item': 60}", "Shop.refresh names 'parse_item', which is not a callback of Shop"),
        ("refresh = {'parse_product': 0}", "Shop.refresh['parse_product'] must be a number of seconds greater than 0"),
        ("refresh = -5", "Shop.refresh must be seconds greater than 0"),
        ("refresh_priority = 5000", "Shop.refresh_priority must be a whole number from -1000 to 1000, got 5000"),
        ("name = 'my shop'", "Shop.name must be 1 to 64 letters"),
        ("pipelines = 'shop_pipes.Clean'", "Shop.pipelines must be a list of pipeline classes or dotted paths"),
        (
            "pipelines = ['shop_pipes.Clean']",
            "Shop.pipelines[0] 'shop_pipes.Clean' cannot be used: ModuleNotFoundError: No module named 'shop_pipes'",
        ),
        ("pipelines = ['json.Nope']", "Shop.pipelines[0] 'json.Nope' cannot be used: AttributeError: module 'json'"),
        ("pipelines = [dict]", "Shop.pipelines[0] 'builtins.dict' cannot be used: TypeError: dict has no process_item"),
        ("pipelines = [3]", "Shop.pipelines[0] must be a class or a dotted path, got int 3"),
        ("content_types = 'application/json'", "Shop.content_types must be a non-empty tuple of content types"),
        ("content_types = ()", "Shop.content_types must be a non-empty tuple of content types"),
        ("depth_limit = 0", "Shop.depth_limit must be a whole number of at least 1, or None for no limit, got 0"),
        ("max_pages = 2.5", "Shop.max_pages must be a whole number of at least 1, or None for no limit, got 2.5"),
        ("headers = [('X-A', '1')]", "Shop.headers must be a dict of header names to values, got list"),
        ("headers = {'X A': '1'}", "Shop.headers has a header name that is not an HTTP token: 'X A'"),
        ("headers = {'X-A': 1}", "Shop.headers['X-A'] must be printable ASCII text, got 1"),
        ("content_types = ('JSON',)", "Shop.content_types must hold lower-case content types like"),
        ("errback = 'on_failure'", "Shop.errback must name a method of the spider (failure) -> items and requests"),
        ("errback = 3", "Shop.errback must name a method of the spider"),
    ],
    ids=lambda value: value if "=" in value else "",
)
def test_a_wrong_attribute_is_refused_at_load_naming_it_and_its_line(
    sites_dir: Path, attributes: str, fragment: str
) -> None:
    path = write_spider(sites_dir, attributes)
    found = load_spiders(sites_dir)
    assert found.spiders == {}
    (error,) = found.errors
    assert fragment in error.reason
    assert f"{path}, line {line_of(path, attributes)}: " in error.reason
    assert error.module == "shop"


def test_a_valid_spider_with_every_attribute_set_loads(sites_dir: Path) -> None:
    write_spider(
        sites_dir,
        "allowed_domains = ['shop.example', 'cdn.shop.example']\ninterval = 0.25\n"
        "concurrency = 2\nitem_key = 'sku'\nobey_robots = False\nuser_agent = 'me'\n"
        "refresh = {'parse_product': 3600}\nrefresh_priority = -5\n"
        "content_types = ('text/html', 'application/json', 'text/*')\nheaders = {'X-Api-Key': 'k'}\n"
        "depth_limit = 3\nmax_pages = 1000\n",
    )
    found = load_spiders(sites_dir)
    assert found.errors == [] and set(found.spiders) == {"shop"}


def test_an_invalid_spider_is_named_when_asked_for_and_the_module_s_others_load(sites_dir: Path) -> None:
    path = write_spider(sites_dir, "interval = -1")
    path.write_text(path.read_text() + "\n\nclass Other(Shop):\n    name = 'other'\n    interval = 2.0\n")
    found = load_spiders(sites_dir)
    assert set(found.spiders) == {"other"}
    with pytest.raises(SpiderLoadError, match=r"spider 'shop' in module 'shop' is invalid: .*interval"):
        found.get("shop")


def test_check_spider_without_a_file_names_only_the_attribute() -> None:
    class Fast(Spider):
        name = "fast"
        interval = 0

    assert check_spider(Fast) == "Fast.interval must be a number of seconds greater than 0, or Auto(min=, max=), got 0"
    assert check_spider(type("Fine", (Spider,), {"name": "fine"})) is None


def test_an_import_error_is_reported_with_its_file_and_line(sites_dir: Path) -> None:
    (sites_dir / "raises.py").write_text("import os\n\n\nraise RuntimeError('no API key configured')\n")
    (sites_dir / "syntax.py").write_text("from crawler import Spider\n\nclass Broken(:\n    pass\n")
    (sites_dir / "deep.py").write_text("def helper():\n    return 1 / 0\n\n\nVALUE = helper()\n")
    errors = {e.module: e.reason for e in load_spiders(sites_dir).errors}
    assert errors["raises"] == f"{sites_dir / 'raises.py'}, line 4: RuntimeError: no API key configured"
    assert errors["syntax"].startswith(f"{sites_dir / 'syntax.py'}, line 3: SyntaxError")
    # The deepest line in the spider's own file: where the error happened, not where it was called.
    assert errors["deep"] == f"{sites_dir / 'deep.py'}, line 2: ZeroDivisionError: division by zero"


@pytest.mark.parametrize(
    ("auto", "fragment"),
    [
        ("Auto(min=float('inf'))", "ValueError: Auto min must be a finite number, got inf"),
        ("Auto(min=float('inf'), max=float('inf'))", "ValueError: Auto min must be a finite number, got inf"),
        ("Auto(min=1, max=float('inf'))", "ValueError: Auto max must be a finite number, got inf"),
        ("Auto(min=float('nan'))", "ValueError: Auto min must be a finite number, got nan"),
        ("Auto(factor=1e999)", "ValueError: Auto factor must be a finite number, got inf"),
        ("Auto(min=1, max=10**6)", "ValueError: Auto needs 0 < min <= max <= 86400, got min=1 max=1000000"),
    ],
)
def test_an_auto_interval_that_is_not_finite_fails_the_module_at_its_line(
    sites_dir: Path, auto: str, fragment: str
) -> None:
    path = write_spider(sites_dir, f"interval = {auto}")
    path.write_text("from crawler import Auto\n" + path.read_text())
    found = load_spiders(sites_dir)
    assert found.spiders == {}
    (error,) = found.errors
    assert error.reason == f"{path}, line {line_of(path, auto)}: {fragment}"


def test_cli_warns_with_file_and_line_and_seeding_the_invalid_spider_is_one_line(
    sites_dir: Path, redis_url: str, redis_conn: Redis, sqlite_url: str
) -> None:
    path = write_spider(sites_dir, "interval = -1")
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(sites_dir)]
    runner = CliRunner()
    listed = runner.invoke(cli, [*base, "sites"])
    assert listed.exit_code == 0, listed.output
    (warning,) = [line for line in listed.stderr.splitlines() if line.strip()]
    assert warning.startswith("warning: spider 'shop' in module 'shop' is invalid: ")
    assert f"{path}, line {line_of(path, 'interval = -1')}: Shop.interval" in warning
    assert " shop " not in listed.stdout

    seeded = runner.invoke(cli, [*base, "seed", "shop"])
    assert_one_line_error(
        seeded, "Shop.interval must be a number of seconds greater than 0, or Auto(min=, max=), got -1"
    )
    assert redis_conn.scard(keys.seen("shop")) == 0


@pytest.mark.parametrize("bound", [{"min": 1, "max": float("inf")}, {"min": float("nan")}, {"max": 1e6}])
def test_a_config_file_auto_interval_that_is_not_finite_or_above_a_day_is_refused(bound: dict) -> None:
    with pytest.raises(ConfigError, match=r"config: sites.shop.interval: Auto (max|min|needs)"):
        check_site_interval("sites.shop.interval", bound)
