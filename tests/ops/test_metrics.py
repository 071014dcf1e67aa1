"""Prometheus metrics: counted in Redis per job, exported on scrape, served over HTTP.

Counting and exposition run against the session's real Redis and are read back with
``prometheus_client``'s own parser; the end-to-end test crawls the loopback demo shop
with real workers and checks the endpoint against the ``fetches`` table; the CLI tests
run ``crawler metrics`` and ``crawler worker --metrics-port`` as real processes.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error, join_all, start_in_threads
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from redis import Redis
from rq import Worker

from crawler.cli.app import cli
from crawler.coord import keys, pages
from crawler.coord.counters import Counters
from crawler.coord.frontier import DownloadTask, seed
from crawler.coord.policy import set_live
from crawler.demo import ShopSite
from crawler.ops.metrics import MetricsCollector, serve
from crawler.ops.status import site_status
from crawler.store.database import FAILED, OK, REDIRECT, REFUSED, RETRY, FetchRecord, utcnow
from crawler.work.events import DURATION_BUCKETS, job_fields
from crawler.work.runtime import Runtime

SITE = "shop"
#: Seconds a CLI subprocess may take to start serving or to stop.
PROCESS_TIMEOUT = 30.0


# -- helpers ------------------------------------------------------------------------------


def record(
    outcome: str,
    status: int | None = 200,
    elapsed: float | None = 0.1,
    nbytes: int | None = None,
    kind: str = "download",
    site: str = SITE,
) -> FetchRecord:
    finished = utcnow()
    return FetchRecord(
        site=site,
        url=f"http://127.0.0.1/{outcome}",
        outcome=outcome,
        kind=kind,
        status=status,
        bytes=nbytes,
        elapsed=elapsed,
        started=finished - timedelta(seconds=elapsed or 0),
        finished=finished,
    )


def count(connection: Redis, *jobs: tuple[FetchRecord, float | None]) -> None:
    """Count jobs as ``events.job_done`` does, through a process's counters, and write them."""
    counters = Counters(connection)
    for job, gate_wait in jobs:
        counters.add(job.site, metrics=job_fields(job, gate_wait))
    counters.close()


def exposition(collector: MetricsCollector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def samples(text: str) -> list[Sample]:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def values(text: str, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples called ``name`` whose labels include ``labels``, keyed by their other labels."""
    found = {}
    for sample in samples(text):
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            found[tuple(sorted((k, v) for k, v in sample.labels.items() if k not in labels))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float:
    (only,) = values(text, name, **labels).values()
    return only


def buckets(text: str, name: str, **labels: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound."""
    return {float(dict(key)["le"]): n for key, n in values(text, f"{name}_bucket", **labels).items()}


@pytest.fixture
def collector(redis_conn: Redis) -> Iterator[MetricsCollector]:
    redis_conn.sadd(keys.sites(), SITE)  # as seeding does; the exporter lists the seeded sites
    scraper = MetricsCollector(redis_conn)
    yield scraper
    scraper.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another socket is listening on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.fixture
def base_args(redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path) -> list[str]:
    sites = tmp_path / "sites"
    sites.mkdir(exist_ok=True)
    return ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(sites)]


def invoke(base_args: list[str], *args: str) -> Result:
    return CliRunner().invoke(cli, [*base_args, *args])


def start_console_script(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL") and not k.startswith("CRAWLER_")
    }
    command = [sys.executable, "-c", "from crawler.cli.app import main; main()", *args]
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def metrics_url(process: subprocess.Popen[str]) -> str:
    """The endpoint a CLI process announced on stderr (it prints that line once it listens)."""
    assert process.stderr is not None
    deadline = time.monotonic() + PROCESS_TIMEOUT
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        if line.startswith("metrics at "):
            return line.split()[2]
    process.kill()
    pytest.fail(f"no 'metrics at' line on stderr (exit {process.wait()})")


def stop(process: subprocess.Popen[str], sig: int) -> int:
    process.send_signal(sig)
    try:
        return process.wait(PROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"process did not stop within {PROCESS_TIMEOUT:g}s of signal {sig}")


# -- counting and exposition -----------------------------------------------------------------


def test_requests_are_counted_by_site_kind_outcome_and_status(redis_conn: Redis, collector: MetricsCollector) -> None:
    count(
        redis_conn,
        (record(OK, nbytes=1000), 0.0),
        (record(OK, nbytes=500), 0.0),
        (record(REDIRECT, 301, nbytes=0), 0.0),
        (record(RETRY, 503), 0.0),
        (record(RETRY, None), 0.0),
        (record(FAILED, 404), 0.0),
        (record(REFUSED, None), None),
        (record(OK, kind="parse"), None),
        (record(FAILED, kind="parse"), None),
        (record(OK, site="other", nbytes=7), 0.0),
    )
    text = exposition(collector)

    requests = values(text, "crawler_requests_total", site=SITE)
    assert requests == {
        (("kind", "download"), ("outcome", "ok"), ("status", "200")): 2,
        (("kind", "download"), ("outcome", "redirect"), ("status", "301")): 1,
        (("kind", "download"), ("outcome", "retry"), ("status", "503")): 1,
        (("kind", "download"), ("outcome", "retry"), ("status", "none")): 1,
        (("kind", "download"), ("outcome", "failed"), ("status", "404")): 1,
        (("kind", "download"), ("outcome", "refused"), ("status", "none")): 1,
        (("kind", "parse"), ("outcome", "ok"), ("status", "200")): 1,
        (("kind", "parse"), ("outcome", "failed"), ("status", "200")): 1,
    }
    assert value(text, "crawler_response_bytes_total", site=SITE, kind="download") == 1500
    # "other" was never seeded, so it is not listed (every real job's site was seeded first).
    assert values(text, "crawler_requests_total", site="other") == {}
    assert value(text, "crawler_redis_up") == 1


def test_duration_and_gate_wait_histograms_are_cumulative_with_count_and_sum(
    redis_conn: Redis, collector: MetricsCollector
) -> None:
    elapsed = [0.005, 0.025, 0.03, 0.7, 45.0]  # 0.025 sits on a bound: le means "at most"
    waits = [0.0, 0.001, 0.2, 400.0]
    count(
        redis_conn,
        *[(record(OK, elapsed=e), w) for e, w in zip(elapsed, [*waits, None], strict=True)],
        (record(OK, kind="parse", elapsed=0.3), None),
    )
    text = exposition(collector)

    download = buckets(text, "crawler_request_duration_seconds", site=SITE, kind="download")
    assert list(download) == list(DURATION_BUCKETS)
    assert download == {
        0.01: 1,
        0.025: 2,
        0.05: 3,
        0.1: 3,
        0.25: 3,
        0.5: 3,
        1.0: 4,
        2.5: 4,
        5.0: 4,
        10.0: 4,
        30.0: 4,
        float("inf"): 5,
    }
    assert value(text, "crawler_request_duration_seconds_count", site=SITE, kind="download") == 5
    assert value(text, "crawler_request_duration_seconds_sum", site=SITE, kind="download") == pytest.approx(45.76)
    parse = buckets(text, "crawler_request_duration_seconds", site=SITE, kind="parse")
    assert (parse[0.25], parse[0.5], parse[float("inf")]) == (0, 1, 1)

    gate = buckets(text, "crawler_gate_wait_seconds", site=SITE)
    assert (gate[0.001], gate[0.1], gate[0.25], gate[300.0], gate[float("inf")]) == (2, 2, 3, 3, 4)
    assert value(text, "crawler_gate_wait_seconds_count", site=SITE) == 4
    assert value(text, "crawler_gate_wait_seconds_sum", site=SITE) == pytest.approx(400.201)


def test_a_download_adds_at_most_six_fields_of_one_hash_and_a_parse_three() -> None:
    download = job_fields(record(OK, nbytes=10), 0.01)
    parse = job_fields(record(OK, kind="parse"), None)
    assert len(download) == 6 and len(parse) == 3
    assert {name for name, n in {**download, **parse}.items() if isinstance(n, float)} == {
        "dur:download:sum",
        "gate:sum",
        "dur:parse:sum",
    }


def test_many_jobs_cost_one_command_per_field_when_written(redis_conn: Redis) -> None:
    counters = Counters(redis_conn, flush_every=3600)
    for _ in range(100):
        counters.add(SITE, metrics=job_fields(record(OK, nbytes=10, elapsed=0.02), 0.003))
    before = redis_conn.info("commandstats")
    counters.close()
    after = redis_conn.info("commandstats")
    sent = {
        name: after[name]["calls"] - before.get(name, {"calls": 0})["calls"]
        for name in ("cmdstat_hincrby", "cmdstat_hincrbyfloat")
    }
    assert sent == {"cmdstat_hincrby": 4, "cmdstat_hincrbyfloat": 2}  # req, bytes, 2 buckets; 2 sums
    written = {k.decode(): v.decode() for k, v in redis_conn.hgetall(keys.metrics(SITE)).items()}
    assert written["req:download:ok:200"] == "100" and written["bytes:download"] == "1000"
    assert float(written["dur:download:sum"]) == pytest.approx(2.0)


@pytest.mark.integration
def test_redis_outage_gives_redis_up_zero_and_a_warning_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    unreachable = Redis.from_url("redis://127.0.0.1:1/0")
    with caplog.at_level(logging.WARNING, logger="crawler.metrics"):
        text = exposition(MetricsCollector(unreachable, timeout=1.0))
    names = {sample.name for sample in samples(text)}
    assert names == {"crawler_redis_up", "crawler_scrape_duration_seconds"}
    assert value(text, "crawler_redis_up") == 0
    assert [r.getMessage() for r in caplog.records if "Redis error" in r.getMessage()]


def test_gauges_show_queued_work_pause_live_interval_and_parse_queue(runtime: Runtime, redis_conn: Redis) -> None:
    urls = [f"http://127.0.0.1:9/page/{n}" for n in range(5)]
    seed(runtime.frontier("demo"), urls)
    set_live(redis_conn, "demo", interval=0.5, paused=True)
    for n in range(3):  # pages waiting for a parse worker, one of them read by one
        pages.add(redis_conn, {"site": "demo", "url": f"http://127.0.0.1:9/parse/{n}"}, b"x")
    pages.ensure_group(redis_conn)
    redis_conn.xreadgroup(keys.PARSERS, "someone", {keys.pages(): ">"}, count=1)
    for url in urls[:3]:  # the same page twice: one refresh pending
        runtime.scheduler.schedule_refresh("demo", DownloadTask("demo", url).to_entry(), 3600, 0)
    runtime.scheduler.schedule_refresh("demo", DownloadTask("demo", urls[0]).to_entry(), 60, 0)
    scraper = MetricsCollector(redis_conn, runtime.spider_set.named(), runtime.settings)
    try:
        text = exposition(scraper)
    finally:
        scraper.close()

    (status,) = site_status(redis_conn, ["demo"])
    assert value(text, "crawler_queue_depth", site="demo") == status.queued == 5
    assert value(text, "crawler_in_flight", site="demo") == 0
    assert value(text, "crawler_retries_waiting", site="demo") == 0
    assert value(text, "crawler_refreshes_scheduled", site="demo") == 3
    assert value(text, "crawler_site_paused", site="demo") == 1
    assert value(text, "crawler_site_interval_seconds", site="demo") == 0.5
    assert value(text, "crawler_parse_queue_depth") == 2
    assert value(text, "crawler_parse_in_flight") == 1
    assert values(text, "crawler_workers") == {}  # none registered


def test_junk_fields_written_by_hand_are_skipped_and_counted_and_the_endpoint_answers_200(
    redis_conn: Redis, collector: MetricsCollector, caplog: pytest.LogCaptureFixture
) -> None:
    """One field that did not parse made every scrape answer 500, for the whole fleet."""
    count(redis_conn, (record(OK, nbytes=1000), 0.0), (record(OK, nbytes=500), 0.0), (record(FAILED, 404), 0.0))
    redis_conn.sadd(keys.sites(), "other")
    count(redis_conn, (record(OK, site="other", nbytes=7), 0.0))
    junk = {
        "req:download:ok:201": "lots",  # int("lots")
        "req:download": "1",  # no outcome nor status
        "bytes:parse": "-5",  # a count below zero
        "dur:download:0.3": "1.5",  # a bucket count that is not whole
        "dur:parse:soon": "1",  # a bucket bound that is not a number
        "dur:parse:sum": "inf",
        "gate:7": "x",
        b"\xff\xfe": "1",  # a name that is not UTF-8
        "junk": "1",
    }
    redis_conn.hset(keys.metrics(SITE), mapping=junk)  # type: ignore[arg-type]
    redis_conn.hset(keys.live_settings(SITE), mapping={"interval": "nan", "paused": b"\xff"})  # type: ignore[arg-type]
    server = serve(collector, "127.0.0.1", 0)
    try:
        with caplog.at_level(logging.WARNING, logger="crawler.metrics"):
            responses = [httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) for _ in range(2)]
    finally:
        server.shutdown()
        server.server_close()

    assert [r.status_code for r in responses] == [200, 200]
    text = responses[1].text
    assert values(text, "crawler_requests_total", site=SITE) == {
        (("kind", "download"), ("outcome", "ok"), ("status", "200")): 2,
        (("kind", "download"), ("outcome", "failed"), ("status", "404")): 1,
    }
    assert value(text, "crawler_response_bytes_total", site=SITE, kind="download") == 1500
    assert value(text, "crawler_request_duration_seconds_count", site=SITE, kind="download") == 3
    assert value(text, "crawler_gate_wait_seconds_count", site=SITE) == 3
    assert values(text, "crawler_request_duration_seconds_count", site=SITE, kind="parse") == {}
    assert value(text, "crawler_metrics_bad_fields", site=SITE) == len(junk)
    assert value(text, "crawler_metrics_bad_fields", site="other") == 0
    assert value(text, "crawler_response_bytes_total", site="other", kind="download") == 7
    assert values(text, "crawler_site_interval_seconds", site=SITE) == {}  # no spider here, a live value that is junk
    assert value(text, "crawler_site_paused", site=SITE) == 0
    assert value(text, "crawler_redis_up") == 1
    warnings = [r.getMessage() for r in caplog.records if "do not parse" in r.getMessage()]
    assert len(warnings) == 1 and "req:download:ok:201" in warnings[0]  # once, not at every scrape


# -- end to end ---------------------------------------------------------------------------------


def test_endpoint_after_a_real_crawl_matches_the_fetches_table(
    runtime: Runtime, redis_conn: Redis, shop: ShopSite
) -> None:
    seed(runtime.frontier("demo"), [shop.url + "/", shop.url + "/catalogue.pdf"])  # a seed is fetched: skipped
    threads, stop_event = start_in_threads(runtime)
    join_all(threads, stop_event)
    server = serve(MetricsCollector(redis_conn, runtime.spider_set.named(), runtime.settings), "127.0.0.1", 0)
    try:
        response = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text

    rows = runtime.store.fetch_rows("demo")
    expected = Counter((r["kind"], r["outcome"], "none" if r["status"] is None else str(r["status"])) for r in rows)
    counted = {
        (dict(k)["kind"], dict(k)["outcome"], dict(k)["status"]): n
        for k, n in values(text, "crawler_requests_total", site="demo").items()
    }
    assert counted == dict(expected)
    assert {outcome for _, outcome, _ in counted} >= {OK, REDIRECT, RETRY, FAILED, REFUSED, "skipped"}
    downloads = [r for r in rows if r["kind"] == "download"]
    assert value(text, "crawler_response_bytes_total", site="demo", kind="download") == sum(
        r["bytes"] or 0 for r in downloads
    )
    for kind in ("download", "parse"):
        timed = [r["elapsed"] for r in rows if r["kind"] == kind and r["elapsed"] is not None]
        assert value(text, "crawler_request_duration_seconds_count", site="demo", kind=kind) == len(timed)
        assert value(text, "crawler_request_duration_seconds_sum", site="demo", kind=kind) == pytest.approx(sum(timed))
        cumulative = list(buckets(text, "crawler_request_duration_seconds", site="demo", kind=kind).values())
        assert cumulative == sorted(cumulative) and cumulative[-1] == len(timed)
    # Every download that took the gate: not robots.txt (its own record), not a robots refusal.
    gated = [r for r in downloads if r["outcome"] != REFUSED and not r["url"].endswith("/robots.txt")]
    assert value(text, "crawler_gate_wait_seconds_count", site="demo") == len(gated)

    for gauge in (
        "crawler_queue_depth",
        "crawler_in_flight",
        "crawler_retries_waiting",
        "crawler_refreshes_scheduled",
        "crawler_site_paused",
    ):
        assert value(text, gauge, site="demo") == 0, gauge
    assert value(text, "crawler_parse_queue_depth") == 0 and value(text, "crawler_parse_in_flight") == 0
    assert value(text, "crawler_site_interval_seconds", site="demo") == runtime.policy("demo").interval
    assert value(text, "crawler_items_total", site="demo") >= runtime.store.count_items("demo") > 0


# -- command line --------------------------------------------------------------------------------


def test_metrics_command_on_a_port_in_use_is_one_line_error(base_args: list[str], busy_port: int) -> None:
    result = invoke(base_args, "metrics", "--port", str(busy_port))
    assert_one_line_error(result, f"cannot serve metrics on 127.0.0.1:{busy_port}", "in use")


def test_worker_metrics_port_in_use_is_one_line_error_and_starts_no_worker(
    base_args: list[str], busy_port: int, redis_conn: Redis
) -> None:
    result = invoke(base_args, "worker", "parse", "--burst", "--metrics-port", str(busy_port))
    assert_one_line_error(result, f"cannot serve metrics on 127.0.0.1:{busy_port}")
    assert redis_conn.keys(Worker.redis_worker_namespace_prefix + "*") == []


def test_metrics_command_serves_until_interrupted(
    base_args: list[str], redis_url: str, runtime: Runtime, tmp_path: Path
) -> None:
    seed(runtime.frontier("demo"), ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"])
    port = free_port()
    process = start_console_script(*base_args, "metrics", "--port", str(port), cwd=tmp_path)
    try:
        url = metrics_url(process)
        assert url == f"http://127.0.0.1:{port}/metrics"
        text = httpx.get(url, timeout=10).text
    finally:
        code = stop(process, signal.SIGINT)
    assert value(text, "crawler_redis_up") == 1
    assert value(text, "crawler_queue_depth", site="demo") == 2
    assert code == 0
    assert "Traceback" not in (process.stderr.read() if process.stderr else "")


def test_worker_metrics_port_serves_the_fleet_while_its_workers_run(base_args: list[str], tmp_path: Path) -> None:
    process = start_console_script(*base_args, "worker", "parse", "-n", "2", "--metrics-port", "0", cwd=tmp_path)
    try:
        url = metrics_url(process)
        deadline, workers = time.monotonic() + PROCESS_TIMEOUT, 0.0
        while workers < 2 and time.monotonic() < deadline:  # spawned processes register in a second or two
            time.sleep(0.2)
            workers = sum(values(httpx.get(url, timeout=10).text, "crawler_workers").values())
    finally:
        code = stop(process, signal.SIGTERM)
    assert workers == 2
    assert code == 0
