"""The pages stream between download and parse workers: claims, leases, reclaims, refusals.

Parse workers run in threads of the test process against a real Redis; the pages are
written straight into the stream (``pages.add``), as a download job writes them.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawling import installed_runtime, peak_rss_mib, waiting_tasks
from redis import Redis
from rq.suspension import resume, suspend

from crawler.coord import joblife, keys, pages, quarantine
from crawler.coord.frontier import Frontier
from crawler.coord.scheduler import frontier_sizes
from crawler.coord.vetting import page_entry
from crawler.settings import Settings
from crawler.work import parse_job
from crawler.work.crawl_worker import SUSPENSION_CHECK_EVERY
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers
from crawler.work.parse_worker import READ_BLOCK, ParseWorker
from crawler.work.runtime import Runtime

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


def run_workers(rt: Runtime, count: int, timeout: float = 60) -> None:
    """``count`` burst parse workers in threads until the stream is drained."""
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=ParseWorker(rt.connection, (SITE,), stop_event=stop, rt=rt).work, kwargs={"burst": True}, daemon=True
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

    run_workers(echo, 1)

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

    run_workers(echo, 3)

    parses = Counter(r["url"] for r in echo.store.fetch_rows(SITE) if r["kind"] == "parse" and r["outcome"] == "ok")
    assert parses == Counter(urls), {url: n for url, n in parses.items() if n != 1}
    assert len({r["worker"] for r in echo.store.fetch_rows(SITE)}) >= 2  # shared between the workers
    assert_stream_empty(redis_conn)


def test_a_burst_parse_worker_ends_soon_after_its_last_page(echo: Runtime, redis_conn: Redis) -> None:
    """A burst worker looks for the drain after each read that found nothing: it reads with a short
    block (BURST_READ_BLOCK), not READ_BLOCK, after which a burst ended up to a second late."""
    from crawler.work.parse_worker import BURST_READ_BLOCK

    assert BURST_READ_BLOCK < READ_BLOCK / 2
    add_page(redis_conn, 1)
    pages.ensure_group(redis_conn)
    worker = ParseWorker(redis_conn, (SITE,), stop_event=threading.Event(), rt=echo)
    thread = threading.Thread(target=worker.work, kwargs={"burst": True}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while redis_conn.xlen(keys.pages()):  # parsed, acknowledged and deleted
        assert time.monotonic() < deadline, "the page was never parsed"
        time.sleep(0.01)
    parsed_at = time.monotonic()
    thread.join(10)
    took = time.monotonic() - parsed_at
    assert not thread.is_alive()
    assert took < (BURST_READ_BLOCK + READ_BLOCK) / 2 + 0.2, f"the burst ended {took:.2f} s after its last page"


def test_a_burst_parse_worker_reads_longer_while_the_crawl_s_sites_wait_for_their_turn(
    echo: Runtime, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each empty 50 ms read was followed by a drain look of some ten commands on every shard, also
    while no process held a job and the sites' work waited for their gates (a crawl's tail of slow
    sites): then it blocks BURST_WAITING_BLOCK, and a page still wakes it at once."""
    from crawler.work import drain, parse_worker
    from crawler.work.parse_worker import BURST_READ_BLOCK, BURST_WAITING_BLOCK

    saw = [drain.SITES]
    blocks: list[int] = []
    read = pages.read

    def look(connection: Redis, sites: object, count_all: object, seen: list[str]) -> bool:
        seen.append(saw[0])
        return False

    def reading(client: Redis, name: str, count: int, block_ms: int) -> list[pages.Entry]:
        blocks.append(block_ms)
        return read(client, name, count, block_ms)

    monkeypatch.setattr(parse_worker, "crawl_drained", look)
    monkeypatch.setattr(pages, "read", reading)
    pages.ensure_group(redis_conn)
    worker = ParseWorker(redis_conn, (SITE,), stop_event=threading.Event(), rt=echo)
    assert worker._step(burst=True) and worker._step(burst=True)
    assert blocks == [BURST_READ_BLOCK * 1000, BURST_WAITING_BLOCK * 1000]
    saw[0] = drain.BUSY
    assert worker._step(burst=True) and worker._step(burst=True)
    assert blocks[2:] == [BURST_WAITING_BLOCK * 1000, BURST_READ_BLOCK * 1000]


def test_a_stopped_worker_finishes_its_page_and_puts_the_rest_of_its_batch_back(
    echo: Runtime, redis_conn: Redis
) -> None:
    urls = [add_page(redis_conn, n, sleep=0.5) for n in range(6)]
    pages.ensure_group(redis_conn)
    stop = threading.Event()
    worker = ParseWorker(redis_conn, (SITE,), stop_event=stop, rt=echo)
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


# -- bounds on a page's links ---------------------------------------------------------

LINKS_SPIDER = """
from crawler import Request, Spider


class Links(Spider):
    name = "links"
    start_urls = ["http://127.0.0.1:9/"]
    allowed_domains = ["127.0.0.1"]

    def parse(self, page):
        if page.meta.get("long"):
            yield Request("http://127.0.0.1:9/" + "l" * 9000)
        yield from page.follow_all("a")
        yield {"url": page.url}
"""


def links_page(n: int, links: int) -> bytes:
    """Page ``n``: ``links`` anchors to /p/N/I (about 28 bytes each), zlib-compressed as a stream entry holds it."""
    anchors = "".join(f'<a href="/p/{n}/{i}">x</a>' for i in range(links))
    return zlib.compress(f"<html><body>{anchors}</body></html>".encode(), 1)


def add_links_page(connection: Redis, n: int, body: bytes, **meta: object) -> str:
    url = f"http://127.0.0.1:9/list/{n}"
    pages.add(connection, {"site": "links", "url": url, "status": 200, "meta": meta}, body)
    return url


@pytest.fixture
def links_settings(settings: Settings) -> Settings:
    (Path(settings.sites_dir) / "links.py").write_text(LINKS_SPIDER)
    return dataclasses.replace(settings, job_lease=3)


def parse_the_stream(rt: Runtime, site: str, timeout: float = 60) -> None:
    """A parse worker in a thread until the pages stream is empty (the links it queued never drain: no downloads)."""
    connection = rt.connection
    stop = threading.Event()
    thread = threading.Thread(target=ParseWorker(connection, (site,), stop_event=stop, rt=rt).work, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while connection.xlen(keys.pages()):
        assert time.monotonic() < deadline, f"the stream was not parsed within {timeout}s"
        time.sleep(0.05)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


def parse_records(rt: Runtime) -> list[dict[str, object]]:
    return [r for r in rt.store.fetch_rows("links") if r["kind"] == "parse"]


def test_a_page_over_max_links_per_page_keeps_its_first_links_and_its_record_says_so(
    redis_conn: Redis, links_settings: Settings
) -> None:
    with installed_runtime(redis_conn, dataclasses.replace(links_settings, max_links_per_page=100)) as rt:
        url = add_links_page(redis_conn, 1, links_page(1, 250), long=True)
        parse_the_stream(rt, "links")
        (record,) = parse_records(rt)
        assert record["outcome"] == "ok"
        # The cap counts every request yielded: the over-long link is the first of the 100 taken.
        assert str(record["error"]).startswith(
            "links capped at max_links_per_page (100): 151 more dropped; "
            "1 links refused: URL longer than 8,192 bytes (9,019)"
        )
        queued = [task.url for task in waiting_tasks(redis_conn, "links")]  # the first made into jobs already
        assert queued == [f"http://127.0.0.1:9/p/1/{i}" for i in range(99)]
        assert [item["url"] for item in rt.store.items("links")] == [url]  # the callback ran to its end
    assert_stream_empty(redis_conn)


def test_a_parse_worker_makes_jobs_of_links_whose_site_has_none_queued_and_leaves_the_others_in_the_frontier(
    redis_conn: Redis, links_settings: Settings
) -> None:
    """A slow site crawled by following its links runs dry after each of its first pages; its next job
    was made only when a look found it due, five round trips before its send (``refill_together``)."""
    with installed_runtime(redis_conn, links_settings) as rt:
        add_links_page(redis_conn, 1, links_page(1, 3))
        parse_the_stream(rt, "links")
        frontier = rt.frontier("links")
        assert frontier.queue.count >= 1  # made by the parse worker: no download worker runs here
        assert frontier.waiting() == []
        assert [t.url for t in waiting_tasks(redis_conn, "links")] == [f"http://127.0.0.1:9/p/1/{i}" for i in range(3)]
        jobs_before = frontier.queue.job_ids
        add_links_page(redis_conn, 2, links_page(2, 3))
        parse_the_stream(rt, "links")
        assert frontier.queue.job_ids == jobs_before  # jobs were queued: the links wait for the usual refill
        assert [t.url for t in frontier.waiting()] == [f"http://127.0.0.1:9/p/2/{i}" for i in range(3)]
    assert_stream_empty(redis_conn)


def test_a_batch_is_written_before_the_next_page_once_its_links_pass_the_byte_budget(
    redis_conn: Redis, links_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four pages of 1,000 links each hold about 350 KB each: over this budget, each is written alone.
    monkeypatch.setattr(parse_job, "HELD_LINK_BYTES", 300_000)
    with installed_runtime(redis_conn, links_settings) as rt:
        for few_or_many in (10, 1000):
            redis_conn.delete(keys.pages())
            for n in range(4):
                add_links_page(redis_conn, few_or_many * 10 + n, links_page(few_or_many * 10 + n, few_or_many))
            parse_the_stream(rt, "links")
        records = parse_records(rt)
        assert len(records) == 8 and all(r["outcome"] == "ok" for r in records)
        # A batch's records are written together with one finishing time (``HeldParses.flush``).
        assert len({r["finished"] for r in records[:4]}) == 1  # few links: one batch, one write
        assert len({r["finished"] for r in records[4:]}) == 4  # many: a write a page
        assert len(waiting_tasks(redis_conn, "links")) == 4 * 10 + 4 * 1000  # the first made into jobs already
    assert_stream_empty(redis_conn)


def test_a_parse_worker_given_pages_of_250000_links_each_queues_them_all_and_stays_under_400_mib(
    redis_conn: Redis, redis_url: str, links_settings: Settings
) -> None:
    """The issue's pages: eight of 550,000 links each put one parse worker at 2.8 GiB (all their links held).
    Every link is queued (no cap by default): a page's links go to the frontier a chunk at a time."""
    count, links = 4, 250_000
    urls = [add_links_page(redis_conn, n, links_page(n, links)) for n in range(count)]
    settings = links_settings
    command = [sys.executable, "-c", "from crawler.cli.app import main; main()", "--redis-url", redis_url]
    command += ["--database-url", settings.database_url, "--sites", settings.sites_dir, "worker", "parse"]
    worker = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with installed_runtime(redis_conn, settings) as rt:
        deadline = time.monotonic() + 180
        while len(parse_records(rt)) < count and worker.poll() is None:
            assert time.monotonic() < deadline, f"{len(parse_records(rt))} of {count} pages parsed in 180 s"
            time.sleep(0.5)
        records = parse_records(rt)
    peak = peak_rss_mib(worker.pid)  # the launcher's and its worker process's, before they exit
    worker.send_signal(signal.SIGTERM)  # it has no --burst end: the pages' links wait to be downloaded
    worker.wait(timeout=60)
    print(f"parse worker, {count} pages of {links:,} links: peak RSS {peak:.0f} MiB")
    assert peak < 400, f"peak RSS {peak:.0f} MiB"
    assert sorted(str(r["url"]) for r in records) == sorted(urls)
    assert all(r["error"] is None for r in records)  # nothing dropped
    frontier = Frontier(redis_conn, "links", [], 60, 60)
    jobs = sum(len(joblife.tasks_left(job)) for job in frontier.queue.get_jobs())
    assert frontier_sizes(redis_conn, ["links"])[0] + jobs == count * links


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
