"""The ``crawler`` command line: one clear line and a non-zero exit for bad input, and the good paths.

Commands run in-process with click's CliRunner (stdout and stderr kept apart), against
the session's Redis, a per-test SQLite file and a per-test sites directory; two run
the installed console script in a subprocess, to show no traceback reaches the real stderr.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error, run_console_script, waiting_tasks
from redis import Redis
from rq import Queue

from crawler.cli.app import cli
from crawler.cli.watch import format_eta
from crawler.coord import keys
from crawler.coord.frontier import SEED_PRIORITY, Frontier
from crawler.coord.frontier import seed as seed_urls
from crawler.coord.scheduler import Scheduler
from crawler.store.database import OK, FetchRecord, Item, Store

UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"
UNREACHABLE_DATABASE = "postgresql+psycopg://u:secret@127.0.0.1:1/x"

BROKEN_SPIDER = "import a_module_that_does_not_exist_anywhere\n"
GOOD_SPIDER = """
from crawler import Spider


class Good(Spider):
    name = "good"
    start_urls = ["http://good.example/"]
    interval = 0.5

    def parse(self, page):
        return []
"""

Invoke = Callable[..., Result]


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
def base_args(redis_url: str, redis_conn: Redis, sqlite_url: str, sites_dir: Path) -> list[str]:
    """Global options that keep a command to this test's Redis, database and sites."""
    return ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(sites_dir)]


@pytest.fixture
def invoke(base_args: list[str]) -> Invoke:
    runner = CliRunner()

    def run(*args: str, base: list[str] | None = None) -> Result:
        return runner.invoke(cli, [*(base_args if base is None else base), *args], env={"COLUMNS": "200"})

    return run


def stderr_lines(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def seed_items(database_url: str, site: str, items: list[dict]) -> None:
    store = Store(database_url)
    try:
        store.upsert_items(site, [Item(item["sku"], item["url"], item) for item in items])
    finally:
        store.close()


ITEMS = [
    {"sku": "SKU-00001", "name": "Product 1", "price": 79.19, "in_stock": True, "url": "http://127.0.0.1/product/1"},
    {
        "sku": "SKU-00002",
        "name": 'Prodüct 2, "quoted"',
        "price": 158.38,
        "in_stock": False,
        "url": "http://127.0.0.1/product/2",
    },
]


# -- bad input: one line, non-zero exit -------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["seed", "nosuch", "http://127.0.0.1/"],
        ["export", "nosuch"],
        ["status", "nosuch"],
        ["set", "nosuch", "--interval", "1"],
    ],
    ids=["seed", "export", "status", "set"],
)
def test_unknown_site_is_one_line_error_naming_the_known_sites(
    invoke: Invoke, sites_dir: Path, args: list[str]
) -> None:
    (sites_dir / "good.py").write_text(GOOD_SPIDER)
    assert_one_line_error(invoke(*args), "unknown site 'nosuch'", "(known: good)")


@pytest.mark.parametrize(
    "url, reason",
    [
        ("not a url", "not an http(s) URL"),
        ("ftp://x", "not an http(s) URL"),
        ("http://", "no valid host"),
    ],
    ids=["words", "ftp", "no-host"],
)
def test_invalid_seed_url_is_one_line_error(invoke: Invoke, redis_conn: Redis, url: str, reason: str) -> None:
    assert_one_line_error(invoke("seed", "demo", url), reason)
    assert redis_conn.keys(Queue.redis_queue_namespace_prefix + "*") == []


def test_off_domain_seed_url_is_refused_and_nothing_is_enqueued(invoke: Invoke, redis_conn: Redis) -> None:
    # The good URL comes first: every URL is checked before any is enqueued.
    result = invoke("seed", "demo", "http://127.0.0.1:9/", "http://example.com/")
    assert_one_line_error(result, "http://example.com/", "outside the allowed domains")
    assert redis_conn.keys(Queue.redis_queue_namespace_prefix + "*") == []
    assert redis_conn.scard(keys.seen("demo")) == 0


def test_broken_spider_module_is_a_warning_and_the_others_still_load(invoke: Invoke, sites_dir: Path) -> None:
    (sites_dir / "broken.py").write_text(BROKEN_SPIDER)
    (sites_dir / "good.py").write_text(GOOD_SPIDER)

    result = invoke("sites")

    assert result.exit_code == 0, result.output
    assert "good" in result.stdout
    (warning,) = stderr_lines(result)
    assert warning.startswith("warning: ") and "'broken'" in warning
    assert "a_module_that_does_not_exist_anywhere" in warning
    assert "Traceback" not in result.output

    seeded = invoke("seed", "good", "http://good.example/a")
    assert seeded.exit_code == 0, seeded.output
    assert "good: 1 enqueued" in seeded.stdout


def test_seeding_the_broken_spider_fails_naming_the_module(invoke: Invoke, sites_dir: Path) -> None:
    (sites_dir / "broken.py").write_text(BROKEN_SPIDER)
    result = invoke("seed", "broken")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    error = stderr_lines(result)[-1]
    assert error.startswith("Error: ") and "'broken'" in error and "ModuleNotFoundError" in error


def test_seeding_the_broken_spider_is_exactly_one_line(invoke: Invoke, sites_dir: Path) -> None:
    (sites_dir / "broken.py").write_text(BROKEN_SPIDER)
    assert_one_line_error(invoke("seed", "broken"), "'broken'")


@pytest.mark.parametrize(
    "args",
    [
        ["seed", "demo", "http://127.0.0.1/"],
        ["status"],
        ["set", "demo", "--interval", "1"],
        ["pause", "demo"],
    ],
    ids=["seed", "status", "set", "pause"],
)
def test_unreachable_redis_is_one_line_error(invoke: Invoke, sqlite_url: str, sites_dir: Path, args: list[str]) -> None:
    base = ["--redis-url", UNREACHABLE_REDIS, "--database-url", sqlite_url, "--sites", str(sites_dir)]
    assert_one_line_error(invoke(*args, base=base), "cannot reach Redis", "127.0.0.1:1")


def test_unreachable_redis_error_hides_the_password(invoke: Invoke, sqlite_url: str, sites_dir: Path) -> None:
    base = ["--redis-url", "redis://:hunter2@127.0.0.1:1/0", "--database-url", sqlite_url, "--sites", str(sites_dir)]
    result = invoke("status", base=base)
    assert_one_line_error(result, "cannot reach Redis", "***@127.0.0.1:1")
    assert "hunter2" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "download", "--burst"],
        ["worker", "parse", "--burst"],
    ],
    ids=["download", "parse"],
)
def test_worker_with_unreachable_redis_or_database_is_one_line_error(
    invoke: Invoke, redis_url: str, sqlite_url: str, sites_dir: Path, args: list[str]
) -> None:
    no_redis = ["--redis-url", UNREACHABLE_REDIS, "--database-url", sqlite_url, "--sites", str(sites_dir)]
    assert_one_line_error(invoke(*args, base=no_redis), "cannot reach Redis")
    no_database = ["--redis-url", redis_url, "--database-url", UNREACHABLE_DATABASE, "--sites", str(sites_dir)]
    result = invoke(*args, base=no_database)
    assert_one_line_error(result, "cannot reach database")
    assert "secret" not in result.output


def test_invalid_database_url_is_one_line_error(invoke: Invoke, redis_url: str, sites_dir: Path) -> None:
    base = ["--redis-url", redis_url, "--database-url", "nosuchdialect://u:secret@host/db", "--sites", str(sites_dir)]
    result = invoke("export", "demo", base=base)
    assert_one_line_error(result, "database URL")
    assert "secret" not in result.output


def test_pause_without_a_site_is_one_line_error(invoke: Invoke) -> None:
    assert_one_line_error(invoke("pause"), "name a SITE or give --all")


def test_unreachable_database_is_one_line_error_without_the_password(
    invoke: Invoke, redis_url: str, sites_dir: Path
) -> None:
    base = ["--redis-url", redis_url, "--database-url", UNREACHABLE_DATABASE, "--sites", str(sites_dir)]
    result = invoke("export", "demo", base=base)
    assert_one_line_error(result, "cannot reach database", "127.0.0.1:1")
    assert "secret" not in result.output


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("timeout: [1, 2\n", ("not valid YAML",)),
        ("timeout: abc\n", ("timeout", "'abc'")),
        ("bogus_setting: 1\n", ("unknown setting", "bogus_setting")),
        ("- just\n- a list\n", ("must be a mapping",)),
        ("sites:\n  demo:\n    interval: 0\n", ("sites.demo.interval",)),
    ],
    ids=["bad-yaml", "wrong-type", "unknown-key", "not-a-mapping", "bad-site-interval"],
)
def test_malformed_config_file_is_one_line_error(
    invoke: Invoke, tmp_path: Path, text: str, fragments: tuple[str, ...]
) -> None:
    config = tmp_path / "crawler.yaml"
    config.write_text(text)
    assert_one_line_error(invoke("--config", str(config), "sites"), *fragments)


def test_missing_config_file_is_one_line_error(invoke: Invoke, tmp_path: Path) -> None:
    assert_one_line_error(invoke("--config", str(tmp_path / "nope.yaml"), "sites"), "cannot read config file")


@pytest.mark.parametrize("value", ["0", "-1", "-0.5"])
def test_set_rejects_an_interval_that_is_not_positive(invoke: Invoke, redis_conn: Redis, value: str) -> None:
    assert_one_line_error(invoke("set", "demo", "--interval", value), "--interval", "greater than 0")
    assert redis_conn.exists(keys.live_settings("demo")) == 0


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_set_refuses_an_interval_that_is_not_finite_as_click_refuses_a_word(
    invoke: Invoke, redis_conn: Redis, value: str
) -> None:
    """``--interval nan`` was stored, and the site's download workers then died on it."""
    result = invoke("set", "demo", f"--interval={value}")
    assert (result.exit_code, type(result.exception)) == (2, SystemExit), result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert errors == [f"Error: Invalid value for '--interval': {value!r} is not a finite number."]
    assert "Traceback" not in result.output
    assert redis_conn.exists(keys.live_settings("demo")) == 0


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_the_gate_margin_option_refuses_a_number_that_is_not_finite(invoke: Invoke, value: str) -> None:
    result = invoke(f"--gate-margin={value}", "sites")
    assert result.exit_code == 2, result.output
    assert f"Error: Invalid value for '--gate-margin': {value!r} is not a finite number." in result.stderr


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--interval", "86401", "at most 86400"),
        ("--concurrency", "0", "from 1 to 10000"),
        ("--concurrency", "10001", "from 1 to 10000"),
        ("--concurrency", "-3", "from 1 to 10000"),
    ],
)
def test_set_refuses_values_out_of_range(
    invoke: Invoke, redis_conn: Redis, option: str, value: str, message: str
) -> None:
    assert_one_line_error(invoke("set", "demo", f"{option}={value}"), option, message)
    assert redis_conn.exists(keys.live_settings("demo")) == 0


def test_set_without_a_value_is_one_line_error(invoke: Invoke) -> None:
    assert_one_line_error(invoke("set", "demo"), "nothing to set")


def test_console_script_reports_bad_seed_in_one_line_on_real_stderr(base_args: list[str], tmp_path: Path) -> None:
    result = run_console_script(*base_args, "seed", "demo", "http://example.com/", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "Error: http://example.com/ is outside the allowed domains (127.0.0.1, localhost)"
    ]


def test_console_script_reports_unreachable_database_in_one_line(
    redis_url: str, sites_dir: Path, tmp_path: Path
) -> None:
    result = run_console_script(
        "--redis-url",
        redis_url,
        "--database-url",
        UNREACHABLE_DATABASE,
        "--sites",
        str(sites_dir),
        "export",
        "demo",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot reach database"), result.stderr
    assert "Traceback" not in result.stderr and "secret" not in result.stderr + result.stdout


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A private redis-server that requires a password: (its URL with the password in the query, the password)."""
    from crawler.coord.connection import redis_server_binary

    password = "hunter2-" + os.urandom(4).hex()
    sock = tmp_path / "pw.sock"
    server = subprocess.Popen(
        [redis_server_binary(), "--port", "0", "--unixsocket", str(sock), "--save", "", "--requirepass", password],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
        yield f"unix://{sock}?db=0&password={password}", password
    finally:
        server.terminate()
        server.wait()


def test_a_password_in_a_url_query_never_reaches_output_or_worker_logs(
    password_redis: tuple[str, str], sites_dir: Path, tmp_path: Path
) -> None:
    url, password = password_redis
    database = f"sqlite:///{tmp_path / 'c.db'}"
    worker = run_console_script(
        "--redis-url",
        url,
        "--database-url",
        database,
        "--sites",
        str(sites_dir),
        "worker",
        "download",
        "--burst",
        "-v",
        cwd=tmp_path,
    )
    assert worker.returncode == 0, worker.stderr
    assert "password=***" in worker.stderr  # the start line names the Redis, redacted
    wrong = run_console_script(
        "--redis-url", url + "x", "--database-url", database, "--sites", str(sites_dir), "status", cwd=tmp_path
    )
    assert wrong.returncode == 1 and "refused the credentials" in wrong.stderr, wrong.stderr
    db_password = f"postgresql+psycopg://crawler@127.0.0.1:1/x?password={password}&sslpassword={password}"
    no_db = run_console_script(
        "--redis-url", url, "--database-url", db_password, "--sites", str(sites_dir), "export", "demo", cwd=tmp_path
    )
    assert no_db.returncode == 1 and "cannot reach database" in no_db.stderr, no_db.stderr
    bad_db = run_console_script(
        "--redis-url",
        url,
        "--database-url",
        f"postgresql+psycopg://u:{password}@[::1/x",
        "--sites",
        str(sites_dir),
        "export",
        "demo",
        cwd=tmp_path,
    )
    assert bad_db.returncode == 1, bad_db.stderr
    for result in (worker, wrong, no_db, bad_db):
        assert password not in result.stdout + result.stderr, result.stderr
        assert "Traceback" not in result.stderr


# -- good paths --------------------------------------------------------------------------


def test_sites_lists_the_projects_spiders_with_their_interval_and_not_the_bundled_demo(
    invoke: Invoke, sites_dir: Path
) -> None:
    (sites_dir / "good.py").write_text(GOOD_SPIDER)
    result = invoke("sites")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    (row,) = [line for line in result.stdout.splitlines() if " good " in line]
    assert "0.5" in row and "good.example" in row
    assert " demo " not in result.stdout  # it belongs to `crawler demo`


def test_seed_then_status_json_shows_the_queued_urls(invoke: Invoke) -> None:
    seeded = invoke("seed", "demo", "http://127.0.0.1:9/", "http://127.0.0.1:9/a#frag")
    assert seeded.exit_code == 0, seeded.output
    assert seeded.stdout.strip() == "demo: 2 enqueued, 0 already seen"
    again = invoke("seed", "demo", "http://127.0.0.1:9/a")
    assert again.stdout.strip() == "demo: 0 enqueued, 1 already seen"

    result = invoke("status", "demo", "--json")
    assert result.exit_code == 0, result.output
    (status,) = json.loads(result.stdout)["sites"]
    assert status["site"] == "demo"
    assert (status["queued"], status["in_flight"], status["fetched"], status["failed"]) == (2, 0, 0, 0)
    assert status["interval"] == 0.02 and status["paused"] is False


def test_set_and_pause_show_in_status(invoke: Invoke) -> None:
    assert invoke("set", "demo", "--interval", "0.5").exit_code == 0
    assert invoke("pause", "demo").stdout.strip() == "demo: paused"
    (status,) = json.loads(invoke("status", "demo", "--json").stdout)["sites"]
    assert (status["interval"], status["interval_source"], status["paused"]) == (0.5, "live", True)
    assert invoke("resume", "demo").exit_code == 0
    (status,) = json.loads(invoke("status", "demo", "--json").stdout)["sites"]
    assert status["paused"] is False


def test_set_reset_drops_live_values_but_keeps_a_pause(invoke: Invoke, redis_conn: Redis) -> None:
    assert invoke("set", "demo", "--interval", "0.5", "--concurrency", "2").exit_code == 0
    assert invoke("pause", "demo").exit_code == 0
    result = invoke("set", "demo", "--reset")
    assert result.exit_code == 0 and result.stdout.strip() == "demo: live settings dropped"
    (status,) = json.loads(invoke("status", "demo", "--json").stdout)["sites"]
    assert (status["interval"], status["interval_source"], status["paused"]) == (0.02, "spider", True)
    assert redis_conn.hget(keys.conf("demo"), "concurrency") is None  # the scheduler no longer caps it
    assert_one_line_error(invoke("set", "demo", "--reset", "--interval", "1"), "give it alone")


def test_export_jsonl_writes_only_items_on_stdout_and_the_count_on_stderr(invoke: Invoke, sqlite_url: str) -> None:
    seed_items(sqlite_url, "demo", ITEMS)
    result = invoke("export", "demo", "--format", "jsonl")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [json.loads(line) for line in lines] == ITEMS
    assert result.stderr.strip() == "demo: 2 items exported"


def test_export_csv_to_a_file(invoke: Invoke, sqlite_url: str, tmp_path: Path) -> None:
    seed_items(sqlite_url, "demo", ITEMS)
    out = tmp_path / "items.csv"
    result = invoke("export", "demo", "--format", "csv", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.strip() == f"demo: 2 items exported to {out}"
    with out.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows == [{k: str(v) for k, v in item.items()} for item in ITEMS]


def test_export_of_a_site_without_items_is_empty_and_succeeds(invoke: Invoke, sqlite_url: str) -> None:
    seed_items(sqlite_url, "other", ITEMS)  # another site's items are not exported
    result = invoke("export", "demo")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.strip() == "demo: 0 items exported"


def _queued(redis_conn: Redis, site: str) -> int:
    """URLs waiting for the site, every priority (its first jobs made by the seed, then its frontier)."""
    return len(waiting_tasks(redis_conn, site))


def _write_spiders(sites_dir: Path, count: int) -> list[str]:
    names = [f"site{number:03d}" for number in range(count)]
    for name in names:
        (sites_dir / f"{name}.py").write_text(
            GOOD_SPIDER.replace('"good"', f'"{name}"').replace("good.example", f"{name}.example")
        )
    return names


def test_seed_all_seeds_every_spiders_start_requests_in_one_process(
    base_args: list[str], sites_dir: Path, redis_conn: Redis
) -> None:
    names = _write_spiders(sites_dir, 60)
    result = subprocess.run(
        [sys.executable, "-c", "from crawler.cli.app import main; main()", *base_args, "seed", "--all"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{name}: 1 enqueued, 0 already seen" for name in names]
    for name in names:
        assert _queued(redis_conn, name) == 1
    again = subprocess.run(
        [sys.executable, "-c", "from crawler.cli.app import main; main()", *base_args, "seed", "--all"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.stdout.splitlines() == [f"{name}: 0 enqueued, 1 already seen" for name in names]


def test_seed_of_several_named_sites_seeds_each_and_refuses_urls_for_more_than_one(
    invoke: Invoke, sites_dir: Path, redis_conn: Redis
) -> None:
    first, second, third = _write_spiders(sites_dir, 3)
    result = invoke("seed", first, third, first)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{first}: 1 enqueued, 0 already seen",
        f"{third}: 1 enqueued, 0 already seen",
    ]
    assert _queued(redis_conn, second) == 0
    assert_one_line_error(invoke("seed", first, second, f"http://{first}.example/x"), "apply to one site")
    assert_one_line_error(invoke("seed", "--all", first), "not both")
    assert_one_line_error(invoke("seed", "nosuchsite", first), "unknown site 'nosuchsite'")
    urls = invoke("seed", second, f"http://{second}.example/a", f"http://{second}.example/b")
    assert urls.stdout.strip() == f"{second}: 2 enqueued, 0 already seen"


def test_seed_priority_is_kept_and_bounded(invoke: Invoke, redis_conn: Redis) -> None:
    assert invoke("seed", "demo", "http://127.0.0.1:9/", "--priority", "50").exit_code == 0
    assert invoke("seed", "demo", "http://127.0.0.1:9/default").exit_code == 0
    waiting = waiting_tasks(redis_conn, "demo")
    assert [(t.url, t.priority) for t in waiting] == [
        ("http://127.0.0.1:9/", 50),
        ("http://127.0.0.1:9/default", SEED_PRIORITY),
    ]
    result = invoke("seed", "demo", "http://127.0.0.1:9/x", "--priority", "5000")
    assert result.exit_code != 0 and "5000" in result.stderr


def test_status_shows_pending_refreshes_and_the_observed_rate(
    invoke: Invoke, redis_conn: Redis, sqlite_url: str
) -> None:
    store = Store(sqlite_url)
    now = datetime.now(UTC)
    store.record_fetches(
        [FetchRecord("demo", f"http://127.0.0.1:9/{i}", OK, now - timedelta(seconds=i), now) for i in range(30)]
        + [FetchRecord("demo", "http://127.0.0.1:9/old", OK, now - timedelta(minutes=5), now)]
    )
    store.close()
    Scheduler(redis_conn).schedule_refresh("demo", '["http://127.0.0.1:9/p"]', 3600, -10)
    result = invoke("status", "demo", "--json")
    assert result.exit_code == 0, result.output
    (status,) = json.loads(result.stdout)["sites"]
    assert status["refreshes"] == 1
    assert status["rate"] == pytest.approx(30 / 60)
    table = invoke("status", "demo").stdout
    assert "refreshes" in table and "0.50" in table


def test_progress_off_a_terminal_is_log_lines_with_rate_and_eta(
    redis_conn: Redis, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crawler.cli import watch as cli_module

    seed_urls(Frontier(redis_conn, "demo", ["127.0.0.1"], 60, 60), ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"])
    monkeypatch.setattr(cli_module, "PROGRESS_LOG_EVERY", 0.0)
    with cli_module.progress(redis_conn, ["demo"]) as refresh:
        refresh()
        redis_conn.hincrby(keys.stats("demo"), "fetched", 3)
        time.sleep(0.6)  # the rate meter needs half a second between snapshots
        refresh()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert "demo: done 0, queued 2" in lines[0] and "ETA -" in lines[0]
    assert "demo: done 3, queued 2" in lines[1] and "to parse 0, parsed 0" in lines[1]
    rate = float(lines[1].split(", ")[-3].split()[0])
    assert 2 < rate < 6  # 3 pages in about 0.6 s
    assert lines[1].split(", ")[-2] == "0.0 parsed/s"
    assert lines[1].endswith("ETA -")  # nothing parsed yet: the parse stage's end is unknown, not 0s


def test_eta_formats() -> None:
    assert [format_eta(s) for s in (None, 0, 12.4, 185, 3720)] == ["-", "0s", "12s", "3m05s", "1h02m"]


def test_status_shows_the_parse_backlog(invoke: Invoke, redis_conn: Redis) -> None:
    from crawler.coord import keys, pages

    assert json.loads(invoke("status", "--json").stdout)["parse"] == {"queued": 0, "in_flight": 0}
    for n in range(3):
        pages.add(redis_conn, {"site": "demo", "url": f"http://127.0.0.1:9/{n}"}, b"x")
    assert json.loads(invoke("status", "--json").stdout)["parse"] == {"queued": 3, "in_flight": 0}
    pages.ensure_group(redis_conn)
    redis_conn.xreadgroup(keys.PARSERS, "someone", {keys.pages(): ">"}, count=1)  # a parse worker took one
    assert json.loads(invoke("status", "--json").stdout)["parse"] == {"queued": 2, "in_flight": 1}
    assert "pages to parse (all sites): 2 queued, 1 in flight" in invoke("status").stdout


def test_export_history_adds_when_each_item_was_seen_and_changed(invoke: Invoke, sqlite_url: str) -> None:
    store = Store(sqlite_url)
    first, later = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    store.upsert_items("demo", [Item("A", "http://127.0.0.1:9/a", {"sku": "A", "price": 1})], seen=first)
    store.upsert_items("demo", [Item("A", "http://127.0.0.1:9/a", {"sku": "A", "price": 2})], seen=later)
    store.close()
    (line,) = invoke("export", "demo", "--history").stdout.splitlines()
    assert json.loads(line) == {
        "sku": "A",
        "price": 2,
        "_key": "A",
        "_url": "http://127.0.0.1:9/a",
        "_first_seen": first.isoformat(),
        "_last_seen": later.isoformat(),
        "_changed": later.isoformat(),
    }
    assert "_changed" in invoke("export", "demo", "--history", "--format", "csv").stdout.splitlines()[0]
