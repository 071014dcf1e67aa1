"""One line per job: human text, or one JSON object per line for log shippers."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from crawling import run_console_script
from redis import Redis

from crawler.coord import keys
from crawler.coord.frontier import Frontier, seed
from crawler.demo import ShopSite
from crawler.store import outbox
from crawler.store.database import FAILED, OK, FetchRecord, utcnow
from crawler.work.events import Done, JSONFormatter, RecordWriter, SoonRecords, fields, summary, write_now
from crawler.work.runtime import Runtime


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


# -- records written together (``RecordWriter``) ------------------------------------------------


def counted_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records each database write held, as ``outbox.write_all`` is called."""
    sizes: list[int] = []
    real = outbox.write_all

    def write_all(connection: Any, store: Any, records: Any) -> list[str]:
        sizes.append(len(records))
        return real(connection, store, records)

    monkeypatch.setattr(outbox, "write_all", write_all)
    return sizes


def test_records_handed_by_many_threads_are_written_together_once_the_first_is_due(
    runtime: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight threads each hand a record due in 0.5 s, one a record due at once: one database
    write and one pipeline take all nine, well before 0.5 s; each thread's flush then returns."""
    sizes = counted_writes(monkeypatch)
    writer = RecordWriter(runtime.sink)
    handed = threading.Barrier(9)
    flushed: list[float] = []

    def batch_thread(index: int, due_in: float) -> None:
        soon = SoonRecords(writer, lambda: time.monotonic() + due_in)
        done = Done(record(url=f"http://127.0.0.1:9/p{index}"), also=lambda pipe: pipe.incr("handed"))
        if due_in > 0:
            soon.add(done)
            handed.wait()
        else:
            handed.wait()  # the others are waiting to be written
            soon.add(done)
        soon.flush()
        flushed.append(time.monotonic())

    started = time.monotonic()
    threads = [threading.Thread(target=batch_thread, args=(i, 0.5 if i else 0.0)) for i in range(9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    assert sizes == [9], f"database writes of {sizes} records"
    assert redis_conn.get("handed") == b"9"
    assert len(runtime.store.fetch_rows("demo")) == 9
    assert max(flushed) - started < 0.4, "the record due at once waited for the others' time"


def test_an_error_in_one_records_commands_goes_to_its_thread_alone_and_others_are_written(
    runtime: Runtime, redis_conn: Redis
) -> None:
    writer = RecordWriter(runtime.sink)
    good = SoonRecords(writer, lambda: time.monotonic() + 0.2)
    bad = SoonRecords(writer, lambda: time.monotonic() + 0.2)
    redis_conn.set("not-a-hash", "x")
    good.add(Done(record(url="http://127.0.0.1:9/good"), also=lambda pipe: pipe.incr("handed"), stats={"fetched": 1}))
    bad.add(Done(record(url="http://127.0.0.1:9/bad"), also=lambda pipe: pipe.hset("not-a-hash", "f", 1)))
    good.flush()
    with pytest.raises(Exception, match="WRONGTYPE"):
        bad.flush()
    bad.flush()  # told once
    writer.close()
    assert redis_conn.get("handed") == b"1"
    runtime.counters.flush()
    assert redis_conn.hget(keys.stats("demo"), "fetched") == b"1"


def test_a_whole_write_that_fails_fails_every_record_in_it_and_the_writer_lives_on(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = RecordWriter(runtime.sink)
    real = outbox.write_all

    def broken(connection: Any, store: Any, records: Any) -> list[str]:
        raise RuntimeError("the write broke")

    monkeypatch.setattr(outbox, "write_all", broken)
    first, second = (SoonRecords(writer, time.monotonic) for _ in range(2))
    first.add(Done(record(url="http://127.0.0.1:9/a")))
    second.add(Done(record(url="http://127.0.0.1:9/b")))
    for soon in (first, second):
        with pytest.raises(RuntimeError, match="the write broke"):
            soon.flush()
    monkeypatch.setattr(outbox, "write_all", real)
    first.add(Done(record(url="http://127.0.0.1:9/c")))
    first.flush()
    writer.close()
    assert [row["url"] for row in runtime.store.fetch_rows("demo")] == ["http://127.0.0.1:9/c"]


def test_records_written_now_by_many_threads_share_the_writers_transactions(
    runtime: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job of one URL writes its record at once (``write_now``): while the process's writer is in
    one write, the records of four more threads wait for it and go in its next write together, not
    in a transaction each, queued one by one for the database."""
    sizes = counted_writes(monkeypatch)
    real, in_write, go_on = outbox.write_all, threading.Event(), threading.Event()

    def first_write_waits(connection: Any, store: Any, records: Any) -> list[str]:
        if not in_write.is_set():
            in_write.set()
            go_on.wait(5)
        return real(connection, store, records)

    monkeypatch.setattr(outbox, "write_all", first_write_waits)
    errors: list[BaseException] = []

    def write(index: int) -> None:
        try:
            write_now(
                runtime.record_writer,
                Done(record(url=f"http://127.0.0.1:9/p{index}"), also=lambda pipe: pipe.incr("handed")),
            )
        except BaseException as exc:  # noqa: BLE001  # told to the test
            errors.append(exc)

    first = threading.Thread(target=write, args=(0,))
    first.start()
    assert in_write.wait(5)
    others = [threading.Thread(target=write, args=(i,)) for i in range(1, 5)]
    for thread in others:
        thread.start()
    deadline = time.monotonic() + 5
    while len(runtime.record_writer._waiting) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    go_on.set()
    for thread in [first, *others]:
        thread.join(5)
    assert not errors
    assert sizes == [1, 4], f"database writes of {sizes} records"
    assert redis_conn.get("handed") == b"5"
    assert len(runtime.store.fetch_rows("demo")) == 5
