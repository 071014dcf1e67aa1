"""Exports: the format from a file's suffix, '-' for stdout, --fields; memory that does not grow with the items."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error, cli_reporting_peak_rss
from redis import Redis

from crawler.cli.app import cli
from crawler.coord import keys
from crawler.store.database import Item, Store

SPIDER = """
from crawler import Spider


class Stock(Spider):
    name = "stock"
    start_urls = ["http://127.0.0.1/"]
"""

#: Items of varied fields: the last one brings a field none before had (CSV's header must hold it).
ITEMS: list[dict[str, Any]] = [
    {"sku": "A1", "name": "Widget", "price": 9.5, "stock": 3, "tags": ["x", "y"]},
    {"sku": "A2", "name": "=cmd()", "price": 12, "stock": None, "tags": []},
    {"sku": "A3", "name": 'Prodüct, "quoted"', "price": 1.25, "stock": 7, "tags": ["z"], "colour": "red"},
]


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)


@pytest.fixture
def base(redis_url: str, sqlite_url: str, tmp_path: Path) -> list[str]:
    (tmp_path / "sites").mkdir(exist_ok=True)
    (tmp_path / "sites" / "stock.py").write_text(SPIDER)
    store_items(sqlite_url, ITEMS)
    return ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]


def store_items(database_url: str, items: list[dict[str, Any]] | Iterator[dict[str, Any]], batch: int = 10_000) -> None:
    store = Store(database_url)
    try:
        chunk: list[Item] = []
        for item in items:
            chunk.append(Item(item["sku"], f"http://127.0.0.1/{item['sku']}", item))
            if len(chunk) == batch:
                store.upsert_items("stock", chunk)
                chunk = []
        if chunk:
            store.upsert_items("stock", chunk)
    finally:
        store.close()


def invoke(base: list[str], *args: str) -> Result:
    return CliRunner().invoke(cli, [*base, *args])


def test_each_suffix_selects_its_format_and_every_format_holds_every_item(base: list[str], tmp_path: Path) -> None:
    for suffix in ("jsonl", "json", "csv", "parquet"):
        result = invoke(base, "export", "stock", "-o", str(tmp_path / f"items.{suffix}"))
        assert result.exit_code == 0, result.output
        assert result.stderr.strip() == f"stock: 3 items exported to {tmp_path / f'items.{suffix}'}"
    lines = (tmp_path / "items.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == ITEMS
    assert json.loads((tmp_path / "items.json").read_text(encoding="utf-8")) == ITEMS
    with open(tmp_path / "items.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["sku", "name", "price", "stock", "tags", "colour"]  # the last item's field too
    assert rows[1]["name"] == "'=cmd()"  # formulas neutralized, as before
    assert rows[2] == {**{k: str(v) for k, v in ITEMS[2].items()}, "tags": '["z"]'}
    assert rows[0]["colour"] == ""
    table = pq.read_table(tmp_path / "items.parquet")
    assert str(table.schema.field("price").type) == "double" and str(table.schema.field("stock").type) == "int64"
    assert table.to_pylist() == [
        {**item, "price": float(item["price"]), "tags": json.dumps(item["tags"]), "colour": item.get("colour")}
        for item in ITEMS
    ]


def test_format_overrides_the_suffix_and_a_suffix_naming_no_format_is_a_one_line_error(
    base: list[str], tmp_path: Path
) -> None:
    result = invoke(base, "export", "stock", "-o", str(tmp_path / "items.txt"), "--format", "csv")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "items.txt").read_bytes().startswith(b"sku,name,price,stock,tags,colour\r\n")
    result = invoke(base, "export", "stock", "-o", str(tmp_path / "items.txt"))
    assert_one_line_error(result, "cannot tell the format", "--format")


def test_dash_writes_to_stdout_in_the_format_given(base: list[str]) -> None:
    result = invoke(base, "export", "stock", "-o", "-", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == ITEMS
    assert result.stderr.strip() == "stock: 3 items exported"
    result = invoke(base, "export", "stock", "-o", "-")
    assert [json.loads(line) for line in result.stdout.splitlines()] == ITEMS


def test_fields_names_the_columns_in_their_order_and_selects_json_fields(base: list[str], tmp_path: Path) -> None:
    result = invoke(base, "export", "stock", "-o", "-", "--format", "csv", "--fields", "price,sku,colour")
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows == [["price", "sku", "colour"], ["9.5", "A1", ""], ["12", "A2", ""], ["1.25", "A3", "red"]]
    result = invoke(base, "export", "stock", "--fields", "sku")
    assert [json.loads(line) for line in result.stdout.splitlines()] == [{"sku": "A1"}, {"sku": "A2"}, {"sku": "A3"}]
    invoke(base, "export", "stock", "-o", str(tmp_path / "two.parquet"), "--fields", "sku,stock")
    assert pq.read_table(tmp_path / "two.parquet").to_pylist() == [
        {"sku": "A1", "stock": 3},
        {"sku": "A2", "stock": None},
        {"sku": "A3", "stock": 7},
    ]


# -- memory: an export's peak does not grow with the number of items -------------------------------


def many(count: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        yield {"sku": f"S{i:07d}", "name": f"Product {i} " + "x" * 200, "price": i * 1.5, "tags": ["a", "b"]}
    yield {"sku": "Z", "late": 1}  # a field only the last item has: CSV must find it without holding the rest


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[list[str], Path]]:
    """Command-line bases on a database of 20,000 items and one of 200,000."""
    made = {}
    for count in (20_000, 200_000):
        folder = tmp_path_factory.mktemp(f"items{count}")
        (folder / "sites").mkdir()
        (folder / "sites" / "stock.py").write_text(SPIDER)
        url = f"sqlite:///{folder / 'items.db'}"
        store_items(url, many(count))
        made[count] = (["--database-url", url, "--sites", str(folder / "sites")], folder)
    return made


def peak_mib(base: list[str], folder: Path, *args: str) -> float:
    report = folder / "peak"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and "CRAWLER_" not in k}
    done = subprocess.run(
        [*cli_reporting_peak_rss(report), *base, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(report.read_text()) / 1024


@pytest.mark.parametrize("suffix", ["csv", "json", "parquet"])
def test_exporting_ten_times_the_items_takes_no_more_memory(
    databases: dict[int, tuple[list[str], Path]], suffix: str
) -> None:
    peaks = {}
    for count, (base, folder) in databases.items():
        out = folder / f"items.{suffix}"
        peaks[count] = peak_mib(base, folder, "export", "stock", "-o", str(out))
    # 180,000 more items of some 300 bytes: some 100 MB more if they were held (as CSV once did).
    assert peaks[200_000] - peaks[20_000] < 15, peaks
    if suffix == "csv":
        with open(out, newline="", encoding="utf-8") as file:
            reader = csv.reader(file)
            assert next(reader) == ["sku", "name", "price", "tags", "late"]
            assert sum(1 for _ in reader) == 200_001
    print(f"{suffix}: peak {peaks}")


def test_crawl_with_an_output_it_cannot_write_fails_in_one_line_before_crawling(
    base: list[str], redis_url: str, tmp_path: Path
) -> None:
    result = invoke(base, "crawl", "stock", "-o", str(tmp_path / "missing" / "items.csv"))
    assert_one_line_error(result, "cannot write", "No such file or directory")
    assert not Redis.from_url(redis_url).exists(keys.seen("stock"))  # nothing seeded
    assert_one_line_error(invoke(base, "crawl", "stock", "-o", str(tmp_path / "items.xlsx")), "cannot tell the format")
    assert_one_line_error(invoke(base, "crawl", "stock", "--format", "csv"), "give -o too")


def test_parquet_without_pyarrow_is_a_one_line_error_and_no_file(base: list[str], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and "CRAWLER_" not in k}
    code = "import sys; sys.modules['pyarrow'] = None; from crawler.cli.app import main; main()"  # as if not installed
    out = tmp_path / "items.parquet"
    command = [sys.executable, "-c", code, *base, "export", "stock", "-o", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == "Error: Parquet export needs pyarrow: pip install 'crawler[parquet]'"
    assert not out.exists()
