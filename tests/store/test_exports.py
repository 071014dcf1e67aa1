"""Exports: the format from a file's suffix, '-' for stdout, --fields; memory that does not grow with the items;
valid files whatever the items hold; named pipes and /dev/stdout written as they are."""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error, cli_reporting_peak_rss
from redis import Redis
from sqlalchemy import create_engine, text
from sqlalchemy import text as sql_text

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


#: Items in the smaller database, and in the larger (four times as many). An export holds a
#: Parquet row group (PARQUET_BATCH items) at most: the smaller one fills two already, and the
#: larger one's 60,000 more items would cost tens of MiB if they were held.
FEWER, MORE = 20_000, 80_000


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[list[str], Path]]:
    """Command-line bases on a database of FEWER items and one of MORE."""
    made = {}
    for count in (FEWER, MORE):
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


@pytest.mark.integration
@pytest.mark.parametrize("suffix", ["csv", "json", "parquet"])
def test_exporting_four_times_the_items_takes_no_more_memory(
    databases: dict[int, tuple[list[str], Path]], suffix: str
) -> None:
    peaks = {}
    for count, (base, folder) in databases.items():
        out = folder / f"items.{suffix}"
        peaks[count] = peak_mib(base, folder, "export", "stock", "-o", str(out))
    # Held (as CSV once did), the items would cost tens of MiB more.
    assert peaks[MORE] - peaks[FEWER] < 15, peaks
    if suffix == "csv":
        with open(out, newline="", encoding="utf-8") as file:
            reader = csv.reader(file)
            assert next(reader) == ["sku", "name", "price", "tags", "late"]
            assert sum(1 for _ in reader) == MORE + 1
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


# -- values JSON APIs send that the formats cannot hold as they are --------------------------------

#: A product as a JSON API sends it: a number past a double, a lone surrogate, an integer past 64 bits.
HOSTILE_JSON = (
    '{"sku": "H1", "price": 1e400, "floor": -1e400, "sizes": [1e400, 2], "note": "caf\\ud800e", '
    '"\\udc80key": "odd", "smile": "\\ud83d\\ude00", "stock": 18446744073709551616, "debt": -9223372036854775809}'
)


def strict_json(text: str) -> Any:
    """``json.loads`` that refuses NaN and Infinity, as JSON (and every non-Python reader) does."""

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def hostile(sqlite_url: str, tmp_path: Path) -> list[str]:
    """A base whose items hold NaN, infinities, lone surrogates and integers past 64 bits, between plain ones."""
    (tmp_path / "sites").mkdir(exist_ok=True)
    (tmp_path / "sites" / "stock.py").write_text(SPIDER)
    nan = {"sku": "H2", "price": float("nan"), "note": "fine", "stock": 5, "debt": 1}  # NaN as a callback yields it
    first = {"sku": "A0", "price": 1.5, "note": "plain", "stock": 1, "debt": 0}
    store_items(sqlite_url, [first, json.loads(HOSTILE_JSON), nan, {"sku": "Z9", "price": 2.0, "stock": 2}])
    return ["--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]


def exported(base: list[str], path: Path) -> None:
    result = invoke(base, "export", "stock", "-o", str(path))
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == f"stock: 4 items exported to {path}"


def test_nan_and_infinities_are_null_in_every_format_and_the_json_is_strict(
    hostile: list[str], sqlite_url: str, tmp_path: Path
) -> None:
    stored = Store(sqlite_url)
    try:
        # Stored now as null; a database written before that holds them as Python writes them
        # (JSON text "Infinity", "NaN"), read back as floats: the export takes either.
        assert next(item for item in stored.items("stock") if item["sku"] == "H1")["price"] is None
        with stored.engine.begin() as conn:
            for key, item in (("H1", json.loads(HOSTILE_JSON)), ("H2", {"sku": "H2", "price": float("nan")})):
                conn.execute(
                    sql_text("UPDATE items SET data = :data WHERE key = :key"), {"data": json.dumps(item), "key": key}
                )
        assert next(item for item in stored.items("stock") if item["sku"] == "H1")["price"] == float("inf")
    finally:
        stored.close()
    for suffix in ("jsonl", "json", "csv", "parquet"):
        exported(hostile, tmp_path / f"items.{suffix}")
    lines = [strict_json(line) for line in (tmp_path / "items.jsonl").read_text(encoding="utf-8").splitlines()]
    assert strict_json((tmp_path / "items.json").read_text(encoding="utf-8")) == lines
    assert [(item["sku"], item["price"]) for item in lines] == [("A0", 1.5), ("H1", None), ("H2", None), ("Z9", 2.0)]
    assert (lines[1]["floor"], lines[1]["sizes"]) == (None, [None, 2])  # nested ones too
    with open(tmp_path / "items.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert [(row["price"], row["floor"], row["sizes"]) for row in rows[1:3]] == [("", "", "[null, 2]"), ("", "", "")]
    table = pq.read_table(tmp_path / "items.parquet")
    assert str(table.schema.field("price").type) == "double"
    assert table.column("price").to_pylist() == [1.5, None, None, 2.0]  # null, not NaN: as the other formats
    assert table.column("sizes").to_pylist()[1] == "[null, 2]"


def test_a_lone_surrogate_is_written_as_the_replacement_character_in_every_format_and_later_items_are_kept(
    hostile: list[str], tmp_path: Path
) -> None:
    for suffix in ("jsonl", "json", "csv", "parquet"):
        exported(hostile, tmp_path / f"items.{suffix}")
    for suffix in ("jsonl", "json", "csv"):
        (tmp_path / f"items.{suffix}").read_bytes().decode("utf-8")  # valid UTF-8, strictly
    lines = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [item["sku"] for item in lines] == ["A0", "H1", "H2", "Z9"]  # not stopped after the first line
    assert (lines[1]["note"], lines[1]["\ufffdkey"], lines[1]["smile"]) == ("caf\ufffde", "odd", "\U0001f600")
    assert json.loads((tmp_path / "items.json").read_text(encoding="utf-8")) == lines
    with open(tmp_path / "items.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert [row["sku"] for row in rows] == ["A0", "H1", "H2", "Z9"]
    assert (rows[1]["note"], rows[1]["\ufffdkey"]) == ("caf\ufffde", "odd")
    table = pq.read_table(tmp_path / "items.parquet")
    assert table.column("sku").to_pylist() == ["A0", "H1", "H2", "Z9"]
    assert table.column("note").to_pylist()[1] == "caf\ufffde" and "\ufffdkey" in table.column_names
    result = invoke(hostile, "export", "stock", "-o", "-", "--format", "csv")  # stdout too: UTF-8, all rows
    assert result.exit_code == 0, result.output
    assert [row[0] for row in csv.reader(io.StringIO(result.stdout_bytes.decode("utf-8")))][1:] == [
        "A0",
        "H1",
        "H2",
        "Z9",
    ]


def test_integers_past_64_bits_keep_every_parquet_row_as_their_digits(hostile: list[str], tmp_path: Path) -> None:
    exported(hostile, tmp_path / "items.parquet")
    table = pq.read_table(tmp_path / "items.parquet")
    assert table.num_rows == 4
    assert str(table.schema.field("stock").type) == "string"  # its small values too: one type a column
    assert table.column("stock").to_pylist() == ["1", "18446744073709551616", "5", "2"]
    assert table.column("debt").to_pylist() == ["0", "-9223372036854775809", "1", None]
    result = invoke(hostile, "export", "stock", "-o", str(tmp_path / "fields.parquet"), "--fields", "sku,stock")
    assert result.exit_code == 0, result.output
    assert pq.read_table(tmp_path / "fields.parquet").column("stock").to_pylist()[1] == "18446744073709551616"


def test_an_item_that_cannot_be_read_is_a_one_line_error_naming_it_and_the_file_is_left_as_it_was(
    hostile: list[str], sqlite_url: str, tmp_path: Path
) -> None:
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:  # a row written by hand, not JSON
        conn.execute(text("UPDATE items SET data = '{\"sku\": oops' WHERE key = 'H2'"))
    engine.dispose()
    for suffix in ("jsonl", "csv", "parquet"):
        out = tmp_path / f"items.{suffix}"
        out.write_text("the last good export\n")
        result = invoke(hostile, "export", "stock", "-o", str(out))
        assert_one_line_error(result, "stock: item 'H2' cannot be read from the database")
        assert out.read_text() == "the last good export\n"  # not a part of an export
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".")) == []  # no part file left


# -- outputs that are not regular files: a named pipe, /dev/stdout ---------------------------------


@contextmanager
def pipe_reader(path: Path) -> Iterator[list[bytes]]:
    """A named pipe at ``path`` and a thread reading it to its end; the list gets what it read, once done."""
    os.mkfifo(path)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(path.read_bytes()), daemon=True)
    reader.start()
    try:
        yield got
    finally:
        reader.join(timeout=120)
        if reader.is_alive():  # the writer never came: let the reader go
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            reader.join(timeout=10)


def test_export_to_a_named_pipe_opens_it_once_and_its_reader_gets_every_item(base: list[str], tmp_path: Path) -> None:
    with pipe_reader(tmp_path / "items.jsonl") as got:
        result = invoke(base, "export", "stock", "-o", str(tmp_path / "items.jsonl"))
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in got[0].decode().splitlines()] == ITEMS
    assert stat.S_ISFIFO(os.stat(tmp_path / "items.jsonl").st_mode)  # still the pipe, not a file renamed over it


def test_export_to_dev_stdout_appends_to_what_the_shell_opened(base: list[str], tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    out.write_text('{"sku": "before"}\n')
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and "CRAWLER_" not in k}
    command = [sys.executable, "-c", "from crawler.cli.app import main; main()", *base, "export", "stock"]
    with open(out, "ab") as appended:  # as `crawler export stock -o /dev/stdout >> log.jsonl`
        done = subprocess.run(
            [*command, "-o", "/dev/stdout", "--format", "jsonl"],
            env=env,
            stdout=appended,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["sku"] for line in out.read_text().splitlines()] == ["before", "A1", "A2", "A3"]
    done = subprocess.run([*command, "-o", "/dev/stdout", "--format", "csv"], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == b"sku,name,price,stock,tags,colour"  # a pipe: written as it is


API_SPIDER = """
from crawler import Spider


class Api(Spider):
    name = "api"
    start_urls = ["http://127.0.0.1/"]
    allowed_domains = ["127.0.0.1"]
    interval = 0.05
    item_key = "sku"
    content_types = ("application/json",)

    def parse(self, page):
        yield from page.json()["products"]
"""


class _Api(BaseHTTPRequestHandler):
    """A JSON API: 30 products, one of them with values no format holds as they are."""

    def do_GET(self) -> None:  # noqa: N802  # http.server's name
        products = [HOSTILE_JSON] + [json.dumps({"sku": f"P{n:02d}", "price": n + 0.5}) for n in range(29)]
        body = ('{"products": [' + ", ".join(products) + "]}").encode()
        self.send_response(404 if self.path == "/robots.txt" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_crawl_to_a_named_pipe_opens_it_once_and_its_reader_gets_every_item(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "api.py").write_text(API_SPIDER)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and "CRAWLER_" not in k}
    pipe = tmp_path / "items.jsonl"
    command = [sys.executable, "-c", "from crawler.cli.app import main; main()", "--redis-url", redis_url,
               "--database-url", sqlite_url, "--sites", str(tmp_path / "sites"), "crawl", "api",
               f"http://127.0.0.1:{server.server_address[1]}/", "-n", "1", "-o", str(pipe)]  # fmt: skip
    crawl = None
    try:
        with pipe_reader(pipe) as got, open(tmp_path / "crawl.log", "wb") as log:
            crawl = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        items = [strict_json(line) for line in got[0].decode("utf-8").splitlines()]
        assert sorted(item["sku"] for item in items) == ["H1", *(f"P{n:02d}" for n in range(29))]
        assert crawl.wait(timeout=60) == 0, (tmp_path / "crawl.log").read_text()
    finally:
        if crawl is not None and crawl.poll() is None:
            crawl.kill()
        server.shutdown()
        server.server_close()
    hostile = next(item for item in items if item["sku"] == "H1")
    assert (hostile["price"], hostile["note"], hostile["stock"]) == (None, "caf\ufffde", 18446744073709551616)
    assert "api: 30 items exported to" in (tmp_path / "crawl.log").read_text()
