"""The frontier: canonical URLs, allowed domains, dedup in Redis, JSON jobs in RQ."""

from __future__ import annotations

import json
import pickle
import random
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from crawling import count_round_trips
from redis import Redis
from rq import Queue
from rq.job import Job
from test_urls import random_urls

from crawler.coord import keys
from crawler.coord.frontier import DownloadTask, Frontier, seed
from crawler.coord.seen import fingerprints_of, stored
from crawler.coord.together import refill_together
from crawler.coord.vetting import DOWNLOAD_FUNC
from crawler.errors import RefusedURL
from crawler.settings import DEFAULT_MAX_URL_LENGTH
from crawler.spiders.spider import Request, Spider
from crawler.store.database import FAILED
from crawler.work import jobs
from crawler.work.runtime import Runtime
from crawler.work.sitemaps import SitemapReader

SITE = "shop"
FAILURE_TTL = 3600
JOB_TIMEOUT = 120


@pytest.fixture
def frontier(redis_conn: Redis) -> Frontier:
    return Frontier(redis_conn, SITE, ["example.com"], failure_ttl=FAILURE_TTL, job_timeout=JOB_TIMEOUT)


def queued_tasks(frontier: Frontier) -> list[DownloadTask]:
    """Tasks waiting in the compact frontier, then in the RQ queue."""
    jobs = [DownloadTask.from_json(job.args[0]) for job in frontier.queue.get_jobs()]
    return frontier.waiting() + jobs


def queued_urls(frontier: Frontier) -> list[str]:
    return [task.url for task in queued_tasks(frontier)]


def queued(frontier: Frontier) -> int:
    return len(queued_tasks(frontier))


def raw_job(connection: Redis, job_id: str) -> dict[bytes, bytes]:
    return connection.hgetall(Job.key_for(job_id))


# Frontier.add ------------------------------------------------------------------------


def test_add_enqueues_each_url_once_across_calls_and_spellings(frontier: Frontier) -> None:
    first = frontier.add([Request("http://example.com/a?x=1&y=2"), Request("http://example.com/b")])
    assert first.enqueued == ["http://example.com/a?x=1&y=2", "http://example.com/b"]
    assert first.duplicates == 0

    again = frontier.add([Request("HTTP://EXAMPLE.COM:80/a?y=2&x=1#f"), Request("http://example.com/b")])
    assert again.enqueued == []
    assert again.duplicates == 2
    assert sorted(queued_urls(frontier)) == ["http://example.com/a?x=1&y=2", "http://example.com/b"]


def test_add_deduplicates_within_one_batch(frontier: Frontier) -> None:
    result = frontier.add([Request("http://example.com/a"), Request("http://example.com/a#x")])
    assert result.enqueued == ["http://example.com/a"]
    assert result.duplicates == 1
    assert queued(frontier) == 1


def test_links_of_several_pages_enqueued_at_once_are_what_adding_each_page_gives(
    frontier: Frontier, redis_conn: Redis
) -> None:
    pages = [
        [Request("http://example.com/a"), Request("http://example.com/b"), Request("http://elsewhere.org/x")],
        [Request("http://example.com/b#top"), Request("http://example.com/c", callback="parse_item")],
    ]
    vetted = [frontier.vet(requests) for requests in pages]
    assert [refused for _, refused in vetted] == [
        [("http://elsewhere.org/x", "http://elsewhere.org/x is outside the allowed domains (example.com)")],
        [],
    ]
    frontier.add([Request("http://example.com/")])  # the seen-set script loaded
    before = redis_conn.info("commandstats")
    results = frontier.enqueue([(vetted[0][0], 1), (vetted[1][0], 2)])
    after = redis_conn.info("commandstats")

    # The page seen second finds /b already queued by the first, as with one add after the other.
    assert [(r.enqueued, r.duplicates) for r in results] == [
        (["http://example.com/a", "http://example.com/b"], 0),
        (["http://example.com/c"], 1),
    ]
    assert [(t.url, t.depth, t.callback) for t in queued_tasks(frontier)] == [
        ("http://example.com/", 0, "parse"),
        ("http://example.com/a", 1, "parse"),
        ("http://example.com/b", 1, "parse"),
        ("http://example.com/c", 2, "parse_item"),
    ]
    calls = after["cmdstat_evalsha"]["calls"] - before.get("cmdstat_evalsha", {"calls": 0})["calls"]
    assert calls == 1  # one seen-set call for both pages
    assert after["cmdstat_rpush"]["calls"] - before.get("cmdstat_rpush", {"calls": 0})["calls"] == 1


@pytest.mark.parametrize("chunk", [None, 7])
def test_adding_a_batch_does_what_adding_its_requests_one_by_one_does(
    redis_conn: Redis, chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if chunk:  # the seen set asked in many calls, as for a page of more than SEEN_CHUNK links
        monkeypatch.setattr("crawler.coord.seen.SEEN_CHUNK", chunk)
    rng = random.Random(3)
    urls = random_urls(300, seed=11) + [f"http://example.com/{p}" for p in ("a", "a#1", "a#2", "A", "b?y=1&x=2")]
    # Spellings that differ only after the page: a fragment that cannot be encoded, a space before "#".
    urls += [
        "http://example.com/s#ok",
        "http://example.com/s#\ud800",
        "http://example.com/t #x",
        "http://example.com/t ",
    ]
    urls += [f"https://www.example.com/p/{n}{rng.choice(['', '#top', '?b=1&a=2', '/./x'])}" for n in range(150)]
    shared_meta = {"from": "nav"}
    requests = []
    for _ in range(3_000):
        meta = rng.choice([{}, shared_meta, {"n": rng.randrange(3)}])
        requests.append(
            Request(
                rng.choice(urls),
                callback=rng.choice(["parse", "parse_item"]),
                meta=meta,
                priority=rng.choice([0, 0, 5, -1]),
                dont_filter=rng.random() < 0.05,
                refresh=rng.choice([None, None, 30.0]),
            )
        )
    requests.append(Request("http://example.com/p", priority=5000))  # a bad priority is refused too

    def refresh(request: Request) -> float | None:
        return 3600.0 if request.callback == "parse_item" else None

    def frontier(site: str) -> Frontier:
        made = Frontier(redis_conn, site, ["example.com"], FAILURE_TTL, JOB_TIMEOUT, refresh=refresh)
        made.add([Request("http://example.com/seen-before")])
        return made

    batch, single = frontier("batch"), frontier("single")
    result = batch.add(requests, depth=2, hops=1)
    singles = [single.add([request], depth=2, hops=1) for request in requests]

    assert result.enqueued == [url for s in singles for url in s.enqueued]
    assert result.duplicates == sum(s.duplicates for s in singles) > 0
    assert result.refused == [refusal for s in singles for refusal in s.refused or []]
    assert len(result.enqueued) > 100 and len(result.refused or []) > 100

    def waiting(f: Frontier) -> list[tuple[int, str]]:
        return [(task.priority, task.to_entry()) for task in f.waiting()]

    assert waiting(batch) == waiting(single)
    assert fingerprints_of(redis_conn, "batch") == fingerprints_of(redis_conn, "single")


def test_a_page_of_repeated_links_sends_each_url_to_the_seen_set_once(
    frontier: Frontier, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each distinct URL is sent once, and the seen table is asked once a sub-set, not once a URL."""
    import crawler.coord.seen

    def calls(command: str) -> int:
        return int(redis_conn.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))

    frontier.add([Request(f"http://example.com/{i}") for i in range(500)])  # a table of 3 sub-sets
    subsets = len(stored(redis_conn, SITE)[0]) - 2  # less the table and the old set's name
    assert subsets == 3
    sent: list[bytes] = []
    chunk_of = crawler.coord.seen.chunk_of
    monkeypatch.setattr(
        crawler.coord.seen, "chunk_of", lambda fps, *shape: (sent.extend(fps), chunk_of(fps, *shape))[1]
    )
    before = {command: calls(command) for command in ("sadd", "evalsha", "sismember", "smismember")}
    result = frontier.add([Request(f"http://example.com/{i % 1_000}#{i}") for i in range(12_000)])
    assert len(result.enqueued) == 500 and result.duplicates == 11_500
    assert len(sent) == len(set(sent)) == 1_000  # each distinct URL sent once
    looks = sum(calls(command) - before[command] for command in ("sismember", "smismember"))
    assert looks <= subsets  # one look a sub-set
    assert calls("sadd") - before["sadd"] <= 5 + 3 + 1  # the new ones a SADD a sub-set (5), splits, the site
    assert calls("evalsha") - before["evalsha"] <= 2  # one call (a second after loading the script)


@pytest.mark.parametrize("scripts_flushed", [False, True])
def test_links_of_pages_of_several_sites_are_marked_seen_in_one_round_trip(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch, scripts_flushed: bool
) -> None:
    """A parse worker's batch holds pages of as many sites: a seen-set call of each site was a round
    trip for nearly every page at 200 slow sites. One pipeline now marks them all; then one transaction
    pushes the new links of every site. A site whose URLs are seen for a while only has calls of its own."""
    import redis.client

    from crawler.coord.together import enqueue_together

    sites = [Frontier(redis_conn, f"s{n}", ["example.com"], FAILURE_TTL, JOB_TIMEOUT) for n in range(3)]
    timed = Frontier(redis_conn, "timed", ["example.com"], FAILURE_TTL, JOB_TIMEOUT, revisit_after=60.0)
    for frontier in (*sites, timed):
        frontier.add([Request("http://example.com/seen")])
    if scripts_flushed:
        redis_conn.script_flush()  # a Redis restarted mid-crawl: the scripts are no longer loaded
    pages = [
        (
            frontier,
            [
                (
                    frontier.vet([Request("http://example.com/seen"), Request(f"http://example.com/{frontier.site}")])[
                        0
                    ],
                    1,
                )
            ],
        )
        for frontier in sites
    ]
    trips: list[str] = []
    execute = redis.client.Pipeline.execute
    monkeypatch.setattr(
        redis.client.Pipeline, "execute", lambda p, *a, **k: (trips.append(str(len(p))), execute(p, *a, **k))[1]
    )
    sends = count_round_trips(monkeypatch)
    results = enqueue_together([*pages, (sites[0], [])])
    monkeypatch.undo()
    assert trips[0] == "3", "the seen-set calls were not sent together"
    if scripts_flushed:  # refused: the first call again on its own (which loads ADD_SEEN), the others together
        assert trips.pop(1) == "2"
        assert len(sends) == 1 + 3 + 1 + 1  # the calls; the first again (refused, loaded, run); the others
    else:
        assert len(sends) == 1 + 1  # the calls, then the pushes of the three sites with a new link, together
    assert trips[1:] == []  # the pushes' transaction goes raw (``bulk.transact_many``), not by a pipeline
    assert [[(r.enqueued, r.duplicates) for r in found] for found in results] == [
        *([([f"http://example.com/{frontier.site}"], 1)] for frontier in sites),
        [],
    ]
    (timed_result,) = enqueue_together([(timed, [(timed.vet([Request("http://example.com/seen")])[0], 1)])])[0]
    assert (timed_result.enqueued, timed_result.duplicates) == ([], 1)


def test_dont_filter_enqueues_a_seen_url_again(frontier: Frontier) -> None:
    frontier.add([Request("http://example.com/a")])
    result = frontier.add([Request("http://example.com/a", dont_filter=True)])
    assert result.enqueued == ["http://example.com/a"]
    assert queued(frontier) == 2


def test_forget_lets_a_url_be_enqueued_again(frontier: Frontier) -> None:
    frontier.add([Request("http://example.com/a")])
    frontier.forget("http://EXAMPLE.com/a#frag")
    assert frontier.add([Request("http://example.com/a")]).enqueued == ["http://example.com/a"]


def test_off_domain_and_bad_links_are_returned_not_raised(frontier: Frontier, redis_conn: Redis) -> None:
    result = frontier.add(
        [
            Request("http://evilexample.com/x"),
            Request("mailto:a@example.com"),
            Request("http://sub.example.com/ok"),
        ]
    )
    assert result.enqueued == ["http://sub.example.com/ok"]
    assert result.refused is not None
    refused = dict(result.refused)
    assert set(refused) == {"http://evilexample.com/x", "mailto:a@example.com"}
    assert "allowed domains" in refused["http://evilexample.com/x"]
    assert stored(redis_conn, SITE)[1] == 1  # refused URLs are not marked seen


def test_add_with_only_refused_links_enqueues_nothing(frontier: Frontier, redis_conn: Redis) -> None:
    result = frontier.add([Request("http://other.org/")])
    assert result.enqueued == [] and len(result.refused or []) == 1
    assert queued(frontier) == 0
    assert not redis_conn.exists(keys.seen_table(SITE))


def test_added_urls_wait_compactly_and_mark_the_site_ready(frontier: Frontier, redis_conn: Redis) -> None:
    frontier.add([Request("http://example.com/a"), Request("http://example.com/p", callback="parse_product")])
    assert redis_conn.lrange(keys.frontier(SITE), 0, -1) == [
        b'["http://example.com/a"]',
        b'["http://example.com/p","parse_product"]',
    ]
    assert redis_conn.zscore(keys.ready(), SITE) == 0  # due now
    assert frontier.queue.count == 0  # no RQ job until a worker asks for one


def test_refill_keeps_only_a_few_jobs_ahead_and_trims_the_frontier(frontier: Frontier, redis_conn: Redis) -> None:
    frontier.add([Request(f"http://example.com/{i}") for i in range(5)])
    assert frontier.refill(2) == 2
    assert frontier.refill(2) == 0  # already two ahead
    assert [j.args[0]["url"] for j in frontier.queue.get_jobs()] == ["http://example.com/0", "http://example.com/1"]
    assert redis_conn.llen(keys.frontier(SITE)) == 3
    assert queued_urls(frontier) == [f"http://example.com/{i}" for i in (2, 3, 4, 0, 1)]


def test_a_refill_is_two_round_trips_and_makes_the_site_due_when_asked(
    frontier: Frontier, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read (the queue's length, the priorities, the list of priority 0) and one script for the
    move; a lock, a WATCH and a read a command, then the writes, were some ten at every fifth
    request of a slow site."""
    import redis.client

    frontier.add([Request(f"http://example.com/{i}") for i in range(6)])
    assert frontier.refill(1) == 1  # the process's first: RQ asks the server's version, the script is loaded
    redis_conn.zadd(keys.ready(), {SITE: 12345})  # as NEXT_JOB left it while the queue was dry
    commands: list[str] = []
    single = redis.client.Redis.execute_command
    monkeypatch.setattr(
        redis.client.Redis, "execute_command", lambda s, *a, **k: (commands.append(str(a[0])), single(s, *a, **k))[1]
    )
    trips = count_round_trips(monkeypatch)
    assert frontier.refill(4, due_now=True) == 3
    monkeypatch.undo()
    assert len(trips) == 2 and commands == ["EVALSHA"]  # the reads together, then the move's script
    assert redis_conn.zscore(keys.ready(), SITE) == 0  # due at once: its jobs are made
    assert queued_urls(frontier) == [f"http://example.com/{i}" for i in (4, 5, 0, 1, 2, 3)]


def test_refilling_sites_together_takes_three_round_trips_for_all_and_leaves_a_changed_one_to_its_own(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``refill_together``: the reads of every site in one round trip, the second look of a site with another
    priority waiting in another, the moves in a third. A site with jobs enough is left as it is; one
    whose lists changed between the read and the move refills on its own."""
    from crawler.coord import together

    def made(site: str, urls: int, priority: int = 0) -> Frontier:
        frontier = Frontier(redis_conn, site, ["example.com"], FAILURE_TTL, JOB_TIMEOUT)
        frontier.add([Request(f"http://example.com/{site}/{i}", priority=priority) for i in range(urls)])
        return frontier

    dry = [made(f"dry{i}", 3) for i in range(3)]
    full = made("full", 6)
    assert full.refill(4) == 4
    ranked = made("ranked", 2, priority=5)
    changed = made("changed", 2)
    made("warm", 1).refill(1)  # the process's first: RQ asks the server's version, the script is loaded
    real_read, reads = together.read_many, []

    def read(connection: Redis, commands: list[Any]) -> list[Any]:
        reads.append(len(commands))
        replies = real_read(connection, commands)
        if len(reads) == 1:  # after the first reads: a push to the head of one site's list
            changed.hand_back([DownloadTask("changed", "http://example.com/changed/back")])
        return replies

    monkeypatch.setattr(together, "read_many", read)
    trips = count_round_trips(monkeypatch)
    assert refill_together([*dry, full, ranked, changed], jobs_ahead=4) == 3 * 3 + 2 + 3
    assert reads == [3 * 6, 1]  # three reads a site at once; the second look at `ranked`'s priority 5
    # then the moves together, and `changed` alone: read again, moved (and the hand-back's own transaction)
    assert len(trips) == 3 + 2 + 1
    monkeypatch.undo()
    for frontier in dry:
        assert queued_urls(frontier) == [f"http://example.com/{frontier.site}/{i}" for i in range(3)]
        assert redis_conn.llen(keys.frontier(frontier.site)) == 0
    assert full.queue.count == 4 and redis_conn.llen(keys.frontier("full")) == 2  # untouched
    assert ranked.queue.count == 2
    assert sorted(queued_urls(changed)) == sorted(
        ["http://example.com/changed/back", "http://example.com/changed/0", "http://example.com/changed/1"]
    )
    assert changed.queue.count == 3


def test_a_refill_whose_lists_change_before_its_move_reads_again_losing_and_doubling_nothing(
    frontier: Frontier, redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the read and the move, the rest of a batch is handed back to the list's head (or a
    retry promoted there): the move of what was read would trim the handed-back entries unread."""
    frontier.add([Request(f"http://example.com/{i}") for i in range(6)])
    real_move, handed = Frontier.move_to_queue, []

    def hand_back_once_read(self: Frontier, read: Any, due_now: bool) -> bool:
        if not handed:
            handed.append(True)
            frontier.hand_back([DownloadTask(SITE, "http://example.com/back")])
        return real_move(self, read, due_now)

    monkeypatch.setattr(Frontier, "move_to_queue", hand_back_once_read)
    assert frontier.refill(2) == 2
    assert handed
    assert [t.url for t in queued_tasks(frontier)][-2:] == ["http://example.com/back", "http://example.com/0"]
    assert sorted(queued_urls(frontier)) == sorted(
        [f"http://example.com/{i}" for i in range(6)] + ["http://example.com/back"]
    )
    # emptied to the last entry: the priority leaves the levels set with it
    frontier.refill(10)
    assert redis_conn.llen(keys.frontier(SITE)) == 0 and not redis_conn.exists(keys.levels(SITE))


def test_jobs_land_in_the_sites_queue_as_json_with_ttls(frontier: Frontier, redis_conn: Redis) -> None:
    frontier.add([Request("http://example.com/p", callback="parse_product", meta={"k": [1, 2]})], depth=3, hops=1)
    frontier.refill(2)
    assert frontier.queue.name == "download:{shop}"  # its RQ keys share the site's Cluster slot
    job_ids = redis_conn.lrange(Queue(keys.download_queue("shop"), connection=redis_conn).key, 0, -1)
    assert len(job_ids) == 1
    raw = raw_job(redis_conn, job_ids[0].decode())

    data = zlib.decompress(raw[b"data"])
    assert not data.startswith(b"\x80"), "job data is a pickle"
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(data)
    func, _instance, args, kwargs = json.loads(data)
    assert func == DOWNLOAD_FUNC
    assert kwargs == {}
    assert args == [
        {
            "site": SITE,
            "url": "http://example.com/p",
            "callback": "parse_product",
            "meta": {"k": [1, 2]},
            "depth": 3,
            "hops": 1,
            "attempt": 1,
            "priority": 0,
        }
    ]
    assert raw[b"result_ttl"] == b"0"
    assert raw[b"failure_ttl"] == str(FAILURE_TTL).encode()
    assert raw[b"timeout"] == str(JOB_TIMEOUT).encode()
    assert raw[b"description"] == b"http://example.com/p"
    assert redis_conn.smembers(keys.sites()) == {SITE.encode()}


def test_callback_method_is_stored_by_name(frontier: Frontier) -> None:
    class Owner:
        def parse_item(self, page: Any) -> None: ...

    frontier.add([Request("http://example.com/i", callback=Owner().parse_item)])
    (task,) = queued_tasks(frontier)
    assert task.callback == "parse_item"


# seed ----------------------------------------------------------------------------------


def test_seed_refuses_a_batch_with_one_off_domain_url_and_enqueues_nothing(
    frontier: Frontier, redis_conn: Redis
) -> None:
    with pytest.raises(RefusedURL, match="evil.org"):
        seed(frontier, ["http://example.com/1", "http://evil.org/2", "http://example.com/3"])
    assert queued(frontier) == 0
    assert not redis_conn.exists(keys.seen_table(SITE))


def test_seed_refuses_a_malformed_url(frontier: Frontier) -> None:
    with pytest.raises(RefusedURL):
        seed(frontier, ["http://example.com:notaport/"])
    assert queued(frontier) == 0


def test_seed_skips_seen_urls_unless_forced(frontier: Frontier) -> None:
    assert seed(frontier, ["http://example.com/"]).enqueued == ["http://example.com/"]
    assert seed(frontier, ["http://example.com/"]).enqueued == []
    assert seed(frontier, ["http://example.com/"], force=True).enqueued == ["http://example.com/"]
    assert queued(frontier) == 2


# DownloadTask ----------------------------------------------------------------------------


def test_download_task_round_trips_through_json() -> None:
    task = DownloadTask("shop", "http://example.com/", "parse_x", {"a": 1}, depth=2, hops=1, attempt=3)
    assert DownloadTask.from_json(json.loads(json.dumps(task.to_json()))) == task


def test_download_task_fills_defaults() -> None:
    task = DownloadTask.from_json({"site": "shop", "url": "http://example.com/"})
    assert (task.callback, task.meta, task.depth, task.hops, task.attempt) == ("parse", {}, 0, 0, 1)


@pytest.mark.parametrize(
    "data",
    [
        None,
        "http://example.com/",
        ["shop", "http://example.com/"],
        {"url": "http://example.com/"},
        {"site": "shop"},
        {"site": 1, "url": "http://example.com/"},
        {"site": "shop", "url": b"http://example.com/"},
        {"site": "shop", "url": "http://example.com/", "meta": ["not", "a", "dict"]},
        {"site": "shop", "url": "http://example.com/", "depth": "deep"},
    ],
)
def test_download_task_rejects_bad_shapes(data: Any) -> None:
    with pytest.raises(ValueError):
        DownloadTask.from_json(data)


@pytest.mark.parametrize("field", ["depth", "hops", "attempt"])
def test_download_task_rejects_non_numeric_counters_with_value_error(field: str) -> None:
    with pytest.raises(ValueError):
        DownloadTask.from_json({"site": "shop", "url": "http://example.com/", field: None})


# URL length ------------------------------------------------------------------------------


def longest_entry(connection: Redis, site: str) -> int:
    """Bytes of the longest entry in ``site``'s frontier lists."""
    lists = connection.scan_iter(keys.frontier(site) + "*")
    return max((len(entry) for key in lists for entry in connection.lrange(key, 0, -1)), default=0)


def test_a_url_over_max_url_length_is_refused_with_a_short_reason_and_one_at_the_cap_admitted(
    frontier: Frontier, redis_conn: Redis
) -> None:
    assert frontier.max_url_length == DEFAULT_MAX_URL_LENGTH == 8192
    at_cap = "http://example.com/" + "a" * (8192 - 19)
    over = at_cap + "b"
    grows = "http://example.com/" + "é" * 2000  # 4,019 bytes as written, 12,019 once percent-encoded
    fragment = "http://example.com/f#" + "x" * 10_000  # the fragment is dropped: 20 bytes queued
    huge_query = "http://example.com/?" + "a=b&" * 1_250_000  # 5 MB; w3lib would take seconds over it
    started = time.monotonic()
    result = frontier.add([Request(u) for u in (at_cap, over, grows, fragment, huge_query)])
    assert time.monotonic() - started < 1.0  # refused as written, not canonicalized first
    assert sorted(result.enqueued) == sorted([at_cap, "http://example.com/f"])
    assert [url for url, _ in result.refused or []] == [over, grows, huge_query]
    reasons = [reason for _, reason in result.refused or []]
    assert reasons[0].startswith("URL longer than 8,192 bytes (8,193): 'http://example.com/aaa")
    assert reasons[1].startswith("URL longer than 8,192 bytes (12,019)")
    assert reasons[2].startswith("URL longer than 8,192 bytes (5,000,020)")
    assert all(len(reason) < 200 for reason in reasons)  # records and logs quote the start only
    assert longest_entry(redis_conn, SITE) < 8300
    with pytest.raises(RefusedURL, match="longer than 8,192 bytes"):
        frontier.check(over)
    with pytest.raises(RefusedURL, match="longer than 8,192 bytes"):
        seed(frontier, ["http://example.com/seed", over])
    assert queued(frontier) == 2  # the seed queued nothing


def test_max_url_length_is_the_frontiers_own_and_holds_for_urls_checked_before(redis_conn: Redis) -> None:
    short = Frontier(redis_conn, "short", ["example.com"], 60, 60, max_url_length=40)
    ok, over = "http://example.com/" + "a" * 21, "http://example.com/" + "a" * 22
    assert short.check(ok) == ok
    result = short.add([Request(ok), Request(over)], checked=True)  # as a sitemap reader adds them
    assert result.enqueued == [ok]
    assert result.refused == [(over, f"URL longer than 40 bytes (41): {over!r}...")]


def test_a_sitemap_loc_of_5_mb_is_refused_and_the_other_urls_queued(redis_conn: Redis) -> None:
    """The issue's sitemap: a 5 MB ``<loc>`` was queued as a 5 MB frontier entry."""
    locs = ["http://127.0.0.1/p/1", "http://127.0.0.1/" + "x" * 5_000_000, "http://127.0.0.1/p/2"]
    urls = "".join(f"<url><loc>{loc}</loc></url>" for loc in locs)
    body = f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
    spider = type("S", (Spider,), {"name": "smap", "allowed_domains": ["127.0.0.1"]})()
    reader = SitemapReader(redis_conn, Frontier(redis_conn, "smap", ["127.0.0.1"], 60, 60), spider, 0)
    report = reader.read("http://127.0.0.1/sitemap.xml", zlib.compress(body.encode()))
    assert (report.queued, report.refused) == (2, 1)
    assert report.first_refusals[0].startswith("URL longer than 8,192 bytes (5,000,017)")
    assert 0 < longest_entry(redis_conn, "smap") < 100


class LongRedirect:
    """A loopback server whose every page redirects to a path of ``length`` bytes (robots.txt: 404)."""

    def __init__(self, length: int):
        owner = self
        self.length = length

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.send_response(404 if self.path == "/robots.txt" else 302)
                if self.path != "/robots.txt":
                    self.send_header("Location", "/" + "r" * (owner.length - 1))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)


@pytest.fixture
def long_redirect() -> Iterator[LongRedirect]:
    server = LongRedirect(9000)
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_a_redirect_to_a_url_over_max_url_length_is_refused_and_recorded(
    runtime: Runtime, redis_conn: Redis, long_redirect: LongRedirect
) -> None:
    url = f"{long_redirect.url}/start"
    jobs.download(DownloadTask("demo", url).to_json(), rt=runtime)
    (record,) = [r for r in runtime.store.fetch_rows("demo") if r["url"] == url]
    assert (record["outcome"], record["status"]) == (FAILED, 302)
    assert record["error"].startswith("redirect refused: URL longer than 8,192 bytes")
    assert len(record["error"]) < 250
    assert longest_entry(redis_conn, "demo") == 0
