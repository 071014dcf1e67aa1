"""Operator commands are safe on hostile data: CSV formulas, URLs as markup, secrets in URLs, unwritable files.

The CLI runs in-process with click's CliRunner, or as the console script in a subprocess
where a traceback would reach the real stderr.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error
from redis import Redis

from crawler.cli.app import cli
from crawler.demo import ShopSite
from crawler.store.database import OK, FetchRecord, Item, Store
from crawler.store.export import write_csv

#: Cells a spreadsheet would run as formulas (OWASP's CSV injection starts), and harmless ones.
HOSTILE = {
    "eq": '=HYPERLINK("http://evil.example","x")',
    "plus": "+1+cmd|' /C calc'!A0",
    "minus": "-2+3",
    "at": "@SUM(1+1)",
    "tab": "\t=1+1",
    "cr": "\r=1+1",
}
LOOPBACK_SPIDER = """
from crawler import Spider


class Mine(Spider):
    name = "mine"
    allowed_domains = ["127.0.0.1"]
    interval = 0.1

    def parse(self, page):
        return []
"""


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)


@pytest.fixture
def base(redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path) -> list[str]:
    (tmp_path / "sites").mkdir(exist_ok=True)
    return ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]


def invoke(base: list[str], *args: str) -> Result:
    return CliRunner().invoke(cli, [*base, *args], env={"COLUMNS": "200"})


def console_script(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and "CRAWLER_" not in k}
    script = Path(sys.executable).with_name("crawler")
    return subprocess.run([str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


# CSV formula injection --------------------------------------------------------------------------


def test_export_csv_neutralizes_formulas_by_default_and_raw_csv_keeps_them(base: list[str], sqlite_url: str) -> None:
    store = Store(sqlite_url)
    store.upsert_items("demo", [Item("k1", "http://127.0.0.1/1", {**HOSTILE, "n": -5, "ok": "a=b"})])
    store.close()
    (row,) = list(csv.DictReader(io.StringIO(invoke(base, "export", "demo", "--format", "csv").stdout)))
    assert {k: row[k] for k in HOSTILE} == {k: "'" + v for k, v in HOSTILE.items()}
    assert (row["n"], row["ok"]) == ("-5", "a=b")  # numbers and inner = stay as they are
    (raw,) = list(csv.DictReader(io.StringIO(invoke(base, "export", "demo", "--format", "csv", "--raw-csv").stdout)))
    assert {k: raw[k] for k in HOSTILE} == HOSTILE


def test_a_formula_in_a_csv_header_is_neutralized_too() -> None:
    out = io.StringIO()
    write_csv([{"=cmd()": 1}], out)
    assert out.getvalue().splitlines()[0] == "'=cmd()"


# Files that cannot be written: one line, non-zero exit --------------------------------------------


def test_export_to_a_missing_directory_is_one_line_error(base: list[str], tmp_path: Path) -> None:
    result = console_script(*base, "export", "demo", "-o", "/nonexistent/x.jsonl", cwd=tmp_path)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line == "Error: cannot write '/nonexistent/x.jsonl': No such file or directory"


@pytest.mark.parametrize(
    "args", [["export", "demo", "-o", "{file}/x.csv"], ["stats", "demo", "--plot", "/nonexistent/x.html"]]
)
def test_commands_writing_a_file_they_cannot_write_are_one_line_errors(
    base: list[str], sqlite_url: str, tmp_path: Path, args: list[str]
) -> None:
    store = Store(sqlite_url)
    start = datetime.now(UTC)
    store.record_fetches([FetchRecord("demo", "http://127.0.0.1/", OK, start, start, status=200, elapsed=0.1)])
    store.close()
    (tmp_path / "a-file").write_text("")
    result = invoke(base, *[a.format(file=tmp_path / "a-file") for a in args])
    assert_one_line_error(result, "cannot write")


# Secrets in URLs ------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("password", ["s3#TOPSECRET", "s3/TOPSECRET", "s3?TOPSECRET", "s3@TOPSECRET"])
def test_a_redis_url_whose_password_holds_a_delimiter_is_never_printed(
    password: str, sqlite_url: str, tmp_path: Path
) -> None:
    url = f"redis://u:{password}@127.0.0.1:1/0"
    result = console_script("--redis-url", url, "--database-url", sqlite_url, "status", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "TOPSECRET" not in result.stderr + result.stdout and "s3" not in result.stderr
    assert "redis://***@127.0.0.1:1/0" in result.stderr


@pytest.mark.parametrize("password", ["s3#TOPSECRET", "s3/TOPSECRET"])
def test_a_database_url_whose_password_holds_a_delimiter_is_never_printed(
    password: str, redis_url: str, tmp_path: Path
) -> None:
    url = f"postgresql+psycopg://u:{password}@127.0.0.1:1/db"
    result = console_script("--redis-url", redis_url, "--database-url", url, "export", "demo", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "TOPSECRET" not in result.stderr + result.stdout


# Recorded data is text, never rich markup -------------------------------------------------------------


def test_stats_prints_a_url_that_looks_like_markup_as_it_is(base: list[str], sqlite_url: str) -> None:
    url = "http://127.0.0.1/[bold]x/[/x]"
    store = Store(sqlite_url)
    start = datetime.now(UTC)
    store.record_fetches([FetchRecord("demo", url, OK, start, start, status=200, elapsed=0.5)])
    store.close()
    result = invoke(base, "stats", "demo")
    assert result.exit_code == 0, result.output
    assert url in result.stdout


# The bundled demo spider belongs to `crawler demo` ----------------------------------------------------


def test_fetch_of_a_loopback_url_finds_the_projects_own_spider(base: list[str], tmp_path: Path) -> None:
    (tmp_path / "sites" / "mine.py").write_text(LOOPBACK_SPIDER)
    with ShopSite(products=3, faults=False) as shop:
        result = invoke(base, "fetch", shop.url + "/")
    assert result.exit_code == 0, result.output
    assert "several spiders" not in result.output
