"""One line per job: human text, or one JSON object per line for log shippers."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from redis import Redis
from test_cli import run_console_script

from crawler.coord.frontier import Frontier, seed
from crawler.demo import ShopSite
from crawler.store.database import FAILED, OK, FetchRecord, utcnow
from crawler.work.events import JSONFormatter, fields, summary


def record(**changes: object) -> FetchRecord:
    now = utcnow()
    base: dict[str, object] = dict(
        site="demo",
        url="http://127.0.0.1:9/p",
        outcome=OK,
        started=now,
        finished=now,
        status=200,
        bytes=512,
        elapsed=0.0123,
        worker="w1",
        attempt=1,
        callback="parse",
    )
    base.update(changes)
    return FetchRecord(**base)  # type: ignore[arg-type]


def test_fields_are_plain_json_and_errors_are_one_line() -> None:
    data = fields(
        record(outcome=FAILED, status=None, error="Traceback (most recent call last):\n  ...\nKeyError: 'x'"),
        gate_wait=0.25,
    )
    assert data == {
        "kind": "download",
        "site": "demo",
        "url": "http://127.0.0.1:9/p",
        "outcome": FAILED,
        "bytes": 512,
        "elapsed_ms": 12.3,
        "attempt": 1,
        "worker": "w1",
        "callback": "parse",
        "gate_wait_ms": 250.0,
        "error": "KeyError: 'x'",
    }
    assert summary(record()) == "download ok 200 12ms http://127.0.0.1:9/p"


def test_json_formatter_puts_job_fields_at_the_top_level() -> None:
    formatter = JSONFormatter()
    job = logging.LogRecord("crawler.job", logging.INFO, __file__, 1, "ignored", None, None)
    job.job = fields(record())
    line = json.loads(formatter.format(job))
    assert line["logger"] == "crawler.job" and line["level"] == "info"
    assert (line["outcome"], line["status"], line["url"]) == (OK, 200, "http://127.0.0.1:9/p")
    assert line["time"].endswith("Z") and "message" not in line
    plain = logging.LogRecord(
        "crawler.work.download_worker", logging.WARNING, __file__, 1, "Redis is %s", ("back",), None
    )
    assert json.loads(formatter.format(plain))["message"] == "Redis is back"


def test_a_worker_with_log_format_json_logs_each_job_as_json(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "sites").mkdir()
    base_args = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]
    with ShopSite(products=3) as shop:
        # A PDF and a 404: download jobs that make no parse job, so a download worker alone drains.
        seed(Frontier(redis_conn, "demo", ["127.0.0.1"], 60, 60), [shop.url + "/catalogue.pdf", shop.url + "/missing"])
        result = run_console_script(*base_args, "worker", "download", "--burst", "--log-format", "json", cwd=tmp_path)
        origin = shop.url
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    jobs = {line["url"].removeprefix(origin): line for line in lines if line.get("logger") == "crawler.job"}
    assert set(jobs) == {"/robots.txt", "/catalogue.pdf", "/missing"}
    assert (jobs["/catalogue.pdf"]["outcome"], jobs["/catalogue.pdf"]["status"]) == ("skipped", 200)
    assert (jobs["/missing"]["outcome"], jobs["/missing"]["status"]) == (FAILED, 404)
    assert all(isinstance(j["elapsed_ms"], float) and j["worker"] for j in jobs.values())
    assert "gate_wait_ms" in jobs["/missing"]
