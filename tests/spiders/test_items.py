"""Items of any kind, ``process_item`` and pipelines (``crawler.spiders.items``), end to end.

Real crawls of the loopback demo shop: with a parse worker in threads of this process
(typed items, an invalid pydantic model, DropItem counted), and with real worker
processes started by ``crawler crawl`` (pipelines opened and closed once per process);
``crawler parse`` and ``crawler.testing.run_page`` show what the database would get.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from click.testing import CliRunner, Result
from crawling import installed_runtime, items_by_key, run_in_threads
from redis import Redis

from crawler import DropItem, Page, Spider
from crawler.cli.app import cli
from crawler.coord.frontier import seed
from crawler.demo import ShopSite
from crawler.demo.shop import product_in_stock
from crawler.settings import Settings
from crawler.spiders.items import ItemError
from crawler.testing import run_page

Invoke = Callable[..., Result]


@pytest.fixture
def invoke(redis_url: str, redis_conn: Redis, settings: Settings) -> Invoke:
    """Runs a command on this test's Redis, database and sites directory."""
    base = ["--redis-url", redis_url, "--database-url", settings.database_url, "--sites", settings.sites_dir]
    runner = CliRunner()
    return lambda *args: runner.invoke(cli, [*base, *args], env={"COLUMNS": "250"})


@pytest.fixture(autouse=True)
def forget_site_modules() -> Iterator[None]:
    """Each test's spider modules are its own: the next test imports its own copy."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("crawler_sites"):
            del sys.modules[name]


TYPED_SPIDER = """
import dataclasses
from datetime import date

import attrs
import pydantic

from crawler.demo.spider import DemoShop


@dataclasses.dataclass
class Plain:
    sku: str
    name: str
    price: float
    in_stock: bool
    url: str
    listed: date = date(2025, 3, 1)
    kind: str = "dataclass"


@attrs.define
class Attrs:
    sku: str
    name: str
    price: float
    in_stock: bool
    url: str
    kind: str = "attrs"


class Product(pydantic.BaseModel):
    sku: str
    name: str
    price: float
    in_stock: bool
    url: str
    kind: str = "pydantic"


class TypedShop(DemoShop):
    name = "typed"

    def parse_product(self, page):
        number = int(page.url.rsplit("/", 1)[1])
        price = page.text(".price")
        fields = dict(sku=page.text(".sku"), name=page.text("h1"), in_stock=page.text(".stock") == "in stock")
        if number % 3 == 0:
            yield Product(price=price, url=page.url, **fields)  # pydantic parses the price text itself
        else:
            yield (Plain if number % 3 == 1 else Attrs)(price=float(price), url=page.url, **fields)
        yield from page.follow_all("a.related", callback=self.parse_product)
"""


def test_dataclass_attrs_and_pydantic_items_are_stored_and_an_invalid_model_fails_its_page_until_retried(
    redis_conn: Redis, invoke: Invoke, settings: Settings
) -> None:
    Path(settings.sites_dir, "typed.py").write_text(TYPED_SPIDER)
    with ShopSite(products=12, faults=False) as shop, installed_runtime(redis_conn, settings) as runtime:
        shop.repriced[6] = "N/A"  # product 6 is a pydantic one: its price no longer parses
        seed(runtime.frontier("typed"), [shop.url + "/"])
        run_in_threads(runtime, ("typed",))

        expected = shop.expected_items()
        for number, sku in enumerate(expected, start=1):
            expected[sku]["kind"] = ("pydantic", "dataclass", "attrs")[number % 3]
            if number % 3 == 1:
                expected[sku]["listed"] = "2025-03-01"  # a date, stored as JSON text
        stored = items_by_key(settings.database_url, "typed")
        assert stored == {sku: item for sku, item in expected.items() if sku != "SKU-00006"}

        (failed,) = json.loads(invoke("failed", "typed", "--json").stdout)
        assert (failed["url"], failed["kind"]) == (f"{shop.url}/product/6", "parse")
        assert failed["reason"] == (
            "ValidationError for Product: price: Input should be a valid number, "
            "unable to parse string as a number (got 'N/A')"
        )
        assert "Traceback" in failed["error"]
        listing = invoke("failed", "typed").stdout
        assert "price: Input should be a valid number" in listing and "/product/6" in listing

        del shop.repriced[6]  # the shop is fixed: the page is retried and stored
        assert invoke("retry", "typed", "--all").stdout.strip() == "typed: 1 failed page requeued"
        run_in_threads(runtime, ("typed",))
        assert items_by_key(settings.database_url, "typed") == expected
        assert invoke("failed", "typed").stdout.strip() == "no failed pages"


DROPPING_SPIDER = """
from crawler import DropItem
from crawler.demo.spider import DemoShop


class DroppingShop(DemoShop):
    name = "dropping"

    def process_item(self, item, page):
        if not item["in_stock"]:
            raise DropItem(f"{item['sku']} is out of stock")
        item["checked"] = page.url
        return item
"""


def test_items_dropped_by_process_item_are_not_stored_and_are_counted_in_stats(
    redis_conn: Redis, invoke: Invoke, settings: Settings
) -> None:
    Path(settings.sites_dir, "dropping.py").write_text(DROPPING_SPIDER)
    with ShopSite(products=20, faults=False) as shop, installed_runtime(redis_conn, settings) as runtime:
        seed(runtime.frontier("dropping"), [shop.url + "/"])
        run_in_threads(runtime, ("dropping",))

        out_of_stock = [n for n in range(1, 21) if not product_in_stock(n)]
        assert 0 < len(out_of_stock) < 20
        expected = {
            sku: {**item, "checked": item["url"]} for sku, item in shop.expected_items().items() if item["in_stock"]
        }
        assert items_by_key(settings.database_url, "dropping") == expected
        assert invoke("failed", "dropping").stdout.strip() == "no failed pages"

        summary = json.loads(invoke("stats", "dropping", "--json").stdout)
        assert summary["items"] == {"stored": len(expected), "dropped": len(out_of_stock)}
        text = invoke("stats", "dropping").stdout
        assert f"items: {len(expected)} stored, {len(out_of_stock)} dropped" in text


PIPELINE_SPIDER = """
import os
from pathlib import Path

from crawler.demo.spider import DemoShop

LOG = Path({log!r})


def note(line):
    with LOG.open("a") as f:
        f.write(line + "\\n")


class Upper:
    def open(self, spider):
        note(f"open {{os.getpid()}} {{spider.name}}")

    def process_item(self, item, spider, page):
        item["name"] = item["name"].upper()
        return item

    def close(self, spider):
        note(f"close {{os.getpid()}} {{spider.name}}")


class PipedShop(DemoShop):
    name = "piped"
    pipelines = [Upper, "shop_pipes.Stamp"]
"""

STAMP_PIPELINE = """
class Stamp:
    \"\"\"Runs after Upper: it sees the name as Upper left it.\"\"\"

    def process_item(self, item, spider, page):
        return {**item, "seen_name": item["name"], "status": page.status}
"""


def test_pipelines_change_items_in_order_and_each_worker_process_opens_and_closes_them_once(
    redis_url: str, settings: Settings, tmp_path: Path
) -> None:
    log, lib = tmp_path / "pipelines.log", tmp_path / "lib"
    lib.mkdir()
    (lib / "shop_pipes.py").write_text(STAMP_PIPELINE)
    Path(settings.sites_dir, "piped.py").write_text(PIPELINE_SPIDER.format(log=str(log)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLER_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = str(lib)  # the dotted path's module, importable as a user's own package would be
    with ShopSite(products=20, faults=False) as shop:
        command = [sys.executable, "-c", "from crawler.cli.app import main; main()", "--redis-url", redis_url,
                   "--database-url", settings.database_url, "--sites", settings.sites_dir,
                   "crawl", "piped", shop.url + "/", "-n", "1", "--threads", "1", "--parsers", "2"]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        expected = {
            sku: {**item, "name": item["name"].upper(), "seen_name": item["name"].upper(), "status": 200}
            for sku, item in shop.expected_items().items()
        }
    assert items_by_key(settings.database_url, "piped") == expected
    lines = log.read_text().splitlines()
    opened = [line.split()[1] for line in lines if line.startswith("open ")]
    closed = [line.split()[1] for line in lines if line.startswith("close ")]
    assert opened and sorted(opened) == sorted(set(opened)) == sorted(closed)  # once each, per process
    assert str(os.getpid()) not in opened  # in the parse worker processes, not this one
    assert all(line.endswith(" piped") for line in lines)


class Checked(Spider):
    """A spider whose items go through a dropping ``process_item``, then its pipelines."""

    name = "checked"

    def parse(self, page: Page) -> Iterator[dict[str, Any]]:
        for node in page.css("li"):
            yield {"name": node.text(), "price": node.attributes.get("data-price")}

    def process_item(self, item: Any, page: Page) -> Any:
        if item["name"] == "sample":
            raise DropItem("free sample")
        return item


class Product(pydantic.BaseModel):
    name: str
    price: float


class Validate:
    def process_item(self, item: dict[str, Any], spider: Spider, page: Page) -> Product:
        return Product(**item)


PAGE = '<ul><li data-price="2.5">tea</li><li data-price="0">sample</li><li data-price="9">cup</li></ul>'


def test_run_page_shows_what_the_database_would_get_and_raises_on_an_invalid_item() -> None:
    spider = type("Validated", (Checked,), {"pipelines": [Validate]})
    out = run_page(spider, "http://shop.example/", PAGE)
    assert out.items == [{"name": "tea", "price": 2.5}, {"name": "cup", "price": 9.0}]  # made floats by the model
    assert out.dropped == ["free sample"]

    with pytest.raises(ItemError, match=r"^Validate.process_item: ValidationError for Product: price: Input should"):
        run_page(spider, "http://shop.example/", PAGE.replace('"9"', '"nine"'))


class Forgetful:
    def process_item(self, item: Any, spider: Spider, page: Page) -> None:
        item["seen"] = True  # and no return: nothing would be stored


class Unopenable:
    def open(self, spider: Spider) -> None:
        raise RuntimeError(f"no licence for {spider.name}")

    def process_item(self, item: Any, spider: Spider, page: Page) -> Any:
        return item


def test_a_step_that_returns_no_item_or_a_pipeline_that_cannot_open_fails_the_page_naming_it() -> None:
    with pytest.raises(ItemError, match=r"^Forgetful.process_item returned NoneType; expected an item"):
        run_page(type("Forgets", (Checked,), {"pipelines": [Forgetful]}), "http://shop.example/", PAGE)
    with pytest.raises(ItemError, match=r"^pipeline Unopenable failed to open: RuntimeError: no licence for checked$"):
        run_page(type("Locked", (Checked,), {"pipelines": [Unopenable]}), "http://shop.example/", PAGE)


PARSED_SPIDER = """
import pydantic

from crawler import DropItem, Page, Spider


class Product(pydantic.BaseModel):
    name: str
    price: float


class Validate:
    def process_item(self, item, spider, page):
        return Product(**item)


class Parsed(Spider):
    name = "parsed"
    start_urls = ["http://shop.example/"]
    pipelines = [Validate]

    def parse(self, page):
        for node in page.css("li"):
            yield {"name": node.text(), "price": node.attributes.get("data-price")}

    def process_item(self, item, page):
        if item["name"] == "sample":
            raise DropItem("free sample")
        return item
"""


def test_crawler_parse_applies_process_item_and_pipelines_and_names_the_failing_step(
    invoke: Invoke, settings: Settings, tmp_path: Path
) -> None:
    Path(settings.sites_dir, "parsed.py").write_text(PARSED_SPIDER)
    body = tmp_path / "page.html"
    body.write_text(PAGE)
    result = invoke("parse", "parsed", "http://shop.example/", "--body", str(body), "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["items"] == [{"name": "tea", "price": 2.5}, {"name": "cup", "price": 9.0}]
    assert shown["dropped"] == ["free sample"]
    text = invoke("parse", "parsed", "http://shop.example/", "--body", str(body)).stdout
    assert "1 item dropped" in text and "dropped: free sample" in text

    body.write_text(PAGE.replace('"9"', '"nine"'))
    failed = invoke("parse", "parsed", "http://shop.example/", "--body", str(body))
    assert failed.exit_code == 1
    assert failed.stderr.strip().splitlines()[-1] == (
        "Error: Validate.process_item: ValidationError for Product: price: Input should be a valid number, "
        "unable to parse string as a number (got 'nine') (on http://shop.example/)"
    )
