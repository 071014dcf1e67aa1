"""The pages stream between download and parse workers: claims, leases, reclaims, refusals.

Parse workers run in threads of the test process against a real Redis; the pages are
written straight into the stream (``pages.add``), as a download job writes them.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawling import installed_runtime
from redis import Redis
from rq.suspension import resume, suspend

from crawler import keys, pages, quarantine
from crawler.launcher import WorkerSpec, start_workers, stop_workers
from crawler.parsing import READ_BLOCK, ParseWorker
from crawler.runtime import Runtime
from crawler.settings import Settings
from crawler.vetting import page_entry
from crawler.workers import SUSPENSION_CHECK_EVERY

SITE = "echo"

ECHO_SPIDER = """
import time
from crawler import Spider


class Echo(Spider):
    name = "echo"
    start_urls = ["http://127.0.0.1:9/"]
    allowed_domains = ["127.0.0.1"]

    def parse(self, page):
        time.sleep(float(page.meta.get("sleep", 0)))
        yield {"url": page.url, "text": page.css_first("p").text()}
"""


@pytest.fixture
def echo(redis_conn: Redis, settings: Settings) -> Iterator[Runtime]:
    """A runtime with the echo spider (it stores each page's URL and text, after ``meta["sleep"]`` seconds)."""
    (Path(settings.sites_dir) / "echo.py").write_text(ECHO_SPIDER)
    with installed_runtime(redis_conn, dataclasses.replace(settings, job_lease=3)) as rt:
        yield rt


def add_page(connection: Redis, n: int, sleep: float = 0.0) -> str:
    url = f"http://127.0.0.1:9/{n}"
    pages.add(
        connection,
        {"site": SITE, "url": url, "status": 200, "meta": {"sleep": sleep}},
        zlib.compress(f"<p>page {n}</p>".encode()),
    )
    return url


def run_workers(connection: Redis, count: int, timeout: float = 60) -> None:
    """``count`` burst parse workers in threads until the stream is drained."""
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=ParseWorker(connection, (SITE,), stop_event=stop).work, kwargs={"burst": True}, daemon=True
        )
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0))
    stop.set()
    assert not any(t.is_alive() for t in threads), f"parse workers did not drain the stream within {timeout}s"


def assert_stream_empty(connection: Redis) -> None:
    assert connection.xlen(keys.pages()) == 0
    assert connection.xpending(keys.pages(), keys.PARSERS)["pending"] == 0


def test_malformed_entries_are_quarantined_and_the_worker_parses_the_rest(echo: Runtime, redis_conn: Redis) -> None:
    urls = [add_page(redis_conn, 1)]
    junk = [redis_conn.xadd(keys.pages(), {"task": '{"site": "echo", "url": "http://127.0.0.1:9/x"}'}).decode()]
    urls.append(add_page(redis_conn, 2))
    junk.append(redis_conn.xadd(keys.pages(), {"task": b"\x80\x04not json", "body": b"x"}).decode())
    junk.append(redis_conn.xadd(keys.pages(), {"task": '{"site": "echo", "url": 7}', "body": b"x"}).decode())
    urls.append(add_page(redis_conn, 3))

    run_workers(redis_conn, 1)

    assert sorted(item["url"] for item in echo.store.items(SITE)) == urls
    refused = {q.job_id: q for q in quarantine.entries(redis_conn)}
    assert set(refused) == set(junk)
    assert {q.source for q in refused.values()} == {keys.pages()}
    assert "without 'body'" in refused[junk[0]].reason and "not JSON" in refused[junk[1]].reason
    assert "'url' has the wrong type" in refused[junk[2]].reason
    assert refused[junk[1]].content == {"task": "\ufffd\x04not json", "body": "<1 bytes>"}
    assert not [r for r in echo.store.fetch_rows(SITE) if "/x" in r["url"]]  # never run
    assert_stream_empty(redis_conn)


def test_two_workers_never_parse_one_entry_twice_even_when_a_page_outlasts_the_lease(
    echo: Runtime, redis_conn: Redis
) -> None:
    lease = echo.settings.job_lease
    # A page longer than the lease at the head of two batches: the pages read with it wait
    # longer than the lease too. Their holder's lease thread keeps them its own.
    urls = [add_page(redis_conn, n, sleep=lease + 1.0 if n in (0, 9) else 0.01) for n in range(60)]

    run_workers(redis_conn, 3)

    parses = Counter(r["url"] for r in echo.store.fetch_rows(SITE) if r["kind"] == "parse" and r["outcome"] == "ok")
    assert parses == Counter(urls), {url: n for url, n in parses.items() if n != 1}
    assert len({r["worker"] for r in echo.store.fetch_rows(SITE)}) >= 2  # shared between the workers
    assert_stream_empty(redis_conn)


def test_a_stopped_worker_finishes_its_page_and_puts_the_rest_of_its_batch_back(
    echo: Runtime, redis_conn: Redis
) -> None:
    urls = [add_page(redis_conn, n, sleep=0.5) for n in range(6)]
    pages.ensure_group(redis_conn)
    stop = threading.Event()
    worker = ParseWorker(redis_conn, (SITE,), stop_event=stop)
    thread = threading.Thread(target=worker.work, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not redis_conn.xpending(keys.pages(), keys.PARSERS)["pending"]:
        assert time.monotonic() < deadline, "the batch was never read"
        time.sleep(0.02)
    time.sleep(0.25)  # into the first page (each takes 0.5 s)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()

    parsed = [r["url"] for r in echo.store.fetch_rows(SITE)]  # the pages parsed are written, not dropped
    assert 1 <= len(parsed) < len(urls)
    left = [page_entry(fields)[0]["url"] for _, fields in redis_conn.xrange(keys.pages())]
    assert sorted(parsed + left) == sorted(urls)  # each page parsed or back in the stream, none both
    assert redis_conn.xpending(keys.pages(), keys.PARSERS)["pending"] == 0  # held by no one
    assert worker.name not in {c.name for c in pages.live_consumers(redis_conn)}


def test_reclaim_raises_the_count_of_the_entries_their_holder_may_have_been_running(redis_conn: Redis) -> None:
    ids = [redis_conn.xadd(keys.pages(), {"task": "{}", "body": str(n)}).decode() for n in range(4)]
    pages.ensure_group(redis_conn)
    assert len(pages.read(redis_conn, "gone", 10, 100)) == 4  # read by a worker that then vanishes
    redis_conn.xdel(keys.pages(), ids[3])  # deleted without being acknowledged (by hand)
    alive = pages.read(redis_conn, "alive", 10, 100)
    assert alive == []
    time.sleep(0.25)

    claimed = pages.reclaim(redis_conn, "rescuer", 200, 10)

    # All on their first delivery: run as one batch, any may have killed it; one more delivery each.
    assert [(entry_id, deliveries) for entry_id, _, deliveries in claimed] == [(ids[0], 2), (ids[1], 2), (ids[2], 2)]
    assert [fields[b"body"] for _, fields, _ in claimed] == [b"0", b"1", b"2"]
    pending = redis_conn.xpending_range(keys.pages(), keys.PARSERS, "-", "+", 10)
    assert [(p["message_id"].decode(), p["consumer"]) for p in pending] == [(i, b"rescuer") for i in ids[:3]]
    # Entries touched by their holder are not claimed by anyone else.
    assert pages.touch(redis_conn, "rescuer", ids) == set(ids[:3])
    assert pages.touch(redis_conn, "someone-else", ids) == set()
    time.sleep(0.1)
    assert pages.reclaim(redis_conn, "thief", 200, 10) == []

    # The rescuer ran them one at a time (delivered before) and vanished too: the oldest was running.
    time.sleep(0.25)
    again = pages.reclaim(redis_conn, "second", 200, 10)
    assert [(entry_id, deliveries) for entry_id, _, deliveries in again] == [(ids[0], 3), (ids[1], 2), (ids[2], 2)]


def test_consumers_long_idle_with_nothing_pending_leave_the_group_and_the_others_stay(redis_conn: Redis) -> None:
    for n in range(2):
        redis_conn.xadd(keys.pages(), {"task": "{}", "body": str(n)})
    pages.ensure_group(redis_conn)
    pages.read(redis_conn, "holder", 1, 100)  # holds one entry
    ((entry_id, _, _),) = pages.read(redis_conn, "finished", 1, 100)
    redis_conn.xack(keys.pages(), keys.PARSERS, entry_id)  # done with its only entry
    redis_conn.execute_command("XGROUP", "CREATECONSUMER", keys.pages(), keys.PARSERS, "fresh")
    time.sleep(0.3)
    redis_conn.execute_command("XGROUP", "CREATECONSUMER", keys.pages(), keys.PARSERS, "new")

    assert pages.forget(redis_conn, 250) == 2  # "finished" and "fresh": idle long enough, nothing pending

    remaining = {c["name"].decode(): c["pending"] for c in redis_conn.xinfo_consumers(keys.pages(), keys.PARSERS)}
    assert remaining == {"holder": 1, "new": 0}  # a holder keeps its entries; a recent one stays
    assert pages.forget(redis_conn, 0, "holder") == 0 and pages.forget(redis_conn, 0, "new") == 1


def test_a_parse_worker_process_takes_no_page_while_suspended_and_parses_it_after_resume(
    echo: Runtime, redis_conn: Redis, redis_url: str
) -> None:
    (worker,) = start_workers([WorkerSpec("parse", (SITE,))], echo.settings, redis_url)
    try:
        deadline = time.monotonic() + 30
        while not pages.live_consumers(redis_conn):
            assert time.monotonic() < deadline, "the parse worker never started"
            time.sleep(0.05)
        suspend(redis_conn)
        # Past the worker's once-a-second look and a read that may be blocking already.
        time.sleep(READ_BLOCK + SUSPENSION_CHECK_EVERY + 0.5)
        url = add_page(redis_conn, 1)
        time.sleep(3 * SUSPENSION_CHECK_EVERY)
        assert list(echo.store.items(SITE)) == [] and redis_conn.xlen(keys.pages()) == 1  # waiting, not taken
        assert redis_conn.xpending(keys.pages(), keys.PARSERS)["pending"] == 0

        resume(redis_conn)
        deadline = time.monotonic() + 15
        while not list(echo.store.items(SITE)):
            assert time.monotonic() < deadline, "the page was not parsed after rq resume"
            time.sleep(0.05)
        assert [item["url"] for item in echo.store.items(SITE)] == [url]
        assert worker.is_alive()  # paused, not ended
    finally:
        resume(redis_conn)
        stop_workers([worker])
