"""Seeding from a file or stdin: every good URL queued once, bad lines counted, Redis work in bounded chunks."""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error, cli_reporting_peak_rss, waiting_tasks
from redis import Redis
from w3lib.url import canonicalize_url

from crawler.cli.app import cli
from crawler.coord.frontier import PUSH_CHUNK, SEED_PRIORITY, Frontier
from crawler.coord.scheduler import Scheduler, frontier_sizes
from crawler.coord.seeding import BAD_EXAMPLES, SEED_CHUNK, SeedReport, seed_lines
from crawler.coord.seen import stored
from crawler.errors import RefusedURL
from crawler.store.database import FAILED, FetchRecord, Store
from crawler.urls import canonicalize

COUNT = 20_000
DUPLICATES = 500
BAD = ["ftp://127.0.0.1/file", "http://elsewhere.example/p", "not a url", "http://"]


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ("REDIS_URL", "DATABASE_URL") or name.startswith("CRAWLER_"):
            monkeypatch.delenv(name)


def url_file_lines() -> tuple[list[bytes], set[str]]:
    """Lines of a seed file for the demo site and the canonical URLs it should queue.

    COUNT good URLs (half with a query, spelt unsorted), DUPLICATES of them again in
    another spelling, the BAD lines, a non-UTF-8 line, comments and blank lines, shuffled.
    """
    rng = random.Random(7)
    good = [
        f"http://127.0.0.1:8080/product/{i}?sort=price&page={i % 7}" if i % 2 else f"http://127.0.0.1:8080/product/{i}"
        for i in range(COUNT)
    ]
    expected = {canonicalize(url) for url in good}
    again = [
        url.replace("/product/", "/product/./").replace(":8080/", ":8080/x/../") + "#top"
        for url in rng.sample(good, DUPLICATES)
    ]
    lines = [f"  {url}\t".encode() for url in good + again] + [url.encode() for url in BAD]
    lines += [b"\xff\xfe/bad-bytes", b"# a comment", b"", b"   "]
    rng.shuffle(lines)
    return [line + b"\n" for line in lines], expected


def queued_urls(connection: Redis, site: str = "demo") -> list[str]:
    """Every URL waiting for ``site`` (RQ jobs, then frontier lists of every priority), repeats kept."""
    return [task.url for task in waiting_tasks(connection, site)]


def commands(connection: Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in connection.info("commandstats").items()}


def seed_cli(redis_url: str, sqlite_url: str, tmp_path: Path, *args: str, stdin: bytes | None = None) -> Result:
    (tmp_path / "sites").mkdir(exist_ok=True)
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]
    return CliRunner().invoke(cli, [*base, "seed", "demo", *args], input=stdin)


def check_seeded(result: Result, connection: Redis, expected: set[str]) -> None:
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"demo: {COUNT:,} enqueued, {DUPLICATES:,} already seen, {len(BAD) + 1} bad lines"
    warnings = result.stderr.splitlines()
    assert len(warnings) == len(BAD) + 1 and all(w.startswith("warning: line ") for w in warnings), warnings
    assert any("not UTF-8" in w for w in warnings) and any("outside the allowed domains" in w for w in warnings)
    urls = queued_urls(connection)
    assert len(urls) == COUNT and set(urls) == expected  # each once
    assert stored(connection, "demo")[1] == COUNT
    assert all(task.priority == SEED_PRIORITY for task in waiting_tasks(connection, "demo"))


def test_a_file_of_20000_urls_queues_each_good_one_once_and_counts_the_rest(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    lines, expected = url_file_lines()
    path = tmp_path / "urls.txt"
    path.write_bytes(b"".join(lines))
    before = commands(redis_conn)
    result = seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(path))
    after = commands(redis_conn)
    check_seeded(result, redis_conn, expected)
    # Streamed in chunks: one seen-set script call and one push per chunk, none for the whole file.
    chunks = -(-(COUNT + DUPLICATES + len(BAD)) // SEED_CHUNK)
    assert after["evalsha"] - before.get("evalsha", 0) >= chunks - 1
    assert after["rpush"] - before.get("rpush", 0) >= chunks - 1


def test_urls_from_stdin_and_from_a_gzipped_file(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    lines, expected = url_file_lines()
    check_seeded(seed_cli(redis_url, sqlite_url, tmp_path, "--from", "-", stdin=b"".join(lines)), redis_conn, expected)
    redis_conn.flushdb()
    path = tmp_path / "urls.txt.gz"
    path.write_bytes(gzip.compress(b"".join(lines)))
    check_seeded(seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(path)), redis_conn, expected)


def test_seeding_the_same_file_again_queues_nothing_new_unless_forced(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "urls.txt"
    path.write_text("".join(f"http://127.0.0.1/p/{i}\n" for i in range(3000)))
    assert (
        seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(path)).stdout.strip()
        == "demo: 3,000 enqueued, 0 already seen"
    )
    again = seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(path))
    assert again.exit_code == 0 and again.stdout.strip() == "demo: 0 enqueued, 3,000 already seen"
    forced = seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(path), "--force", "--priority", "50")
    assert forced.stdout.strip() == "demo: 3,000 enqueued, 0 already seen"
    waiting = waiting_tasks(redis_conn, "demo")
    assert len(waiting) == 6000 and sum(task.priority == 50 for task in waiting) == 3000
    assert [task.priority for task in waiting[:3000]] == [50] * 3000  # served first


def test_seeded_pages_go_to_the_callback_given(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "urls.txt"
    path.write_text("http://127.0.0.1/product/1\nhttp://127.0.0.1/product/2\n")
    result = seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(path), "--callback", "parse_product")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "demo: 2 enqueued, 0 already seen"
    tasks = waiting_tasks(redis_conn, "demo")
    assert [(t.url, t.callback) for t in tasks] == [
        ("http://127.0.0.1/product/1", "parse_product"),
        ("http://127.0.0.1/product/2", "parse_product"),
    ]
    assert_one_line_error(
        seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(path), "--callback", "nope"), "has no callback 'nope'"
    )


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        (b"ftp://127.0.0.1/x\nhttp://elsewhere.example/\n", ("no URL to seed", "2 bad lines", "line 1", "ftp://")),
        (b"# only a comment\n\n", ("no URL to seed", "the input is empty")),
    ],
)
def test_a_file_without_a_good_url_is_a_one_line_error(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path, content: bytes, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "urls.txt"
    path.write_bytes(content)
    assert_one_line_error(seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(path)), *fragments)
    assert queued_urls(redis_conn) == []


def test_a_missing_file_or_urls_with_from_are_one_line_errors(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.txt"
    assert_one_line_error(
        seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(missing)), "cannot read", "No such file"
    )
    assert_one_line_error(
        seed_cli(redis_url, sqlite_url, tmp_path, "http://127.0.0.1/", "--from", str(missing)), "not both"
    )
    broken = tmp_path / "cut.txt.gz"
    broken.write_bytes(gzip.compress(b"http://127.0.0.1/a\n" * 5000)[:-20])
    assert_one_line_error(seed_cli(redis_url, sqlite_url, tmp_path, "--from", str(broken)), "cannot read")


def test_a_byte_order_mark_and_windows_line_ends_are_no_bad_lines(redis_conn: Redis) -> None:
    frontier = Frontier(redis_conn, "demo", ["127.0.0.1"], 60, 60)
    report = seed_lines(frontier, [b"\xef\xbb\xbfhttp://127.0.0.1/a\r\n", b"http://127.0.0.1/b\r\n"])
    assert (report.enqueued, report.bad) == (2, 0)


def test_only_the_first_bad_lines_are_kept_but_all_are_counted(redis_conn: Redis) -> None:
    frontier = Frontier(redis_conn, "demo", ["127.0.0.1"], 60, 60)
    lines = [b"http://127.0.0.1/ok\n"] + [f"gopher://x/{i}\n".encode() for i in range(50)]
    report = seed_lines(frontier, lines, chunk=7)
    assert (report.enqueued, report.bad, len(report.examples)) == (1, 50, BAD_EXAMPLES)
    assert report.bad_lines()[0].startswith("line 2: not an http(s) URL")
    assert report.bad_lines()[-1] == f"... and {50 - BAD_EXAMPLES} more"
    assert SeedReport(enqueued=1, bad=1).summary("s") == "s: 1 enqueued, 0 already seen, 1 bad line"


def test_one_add_of_many_urls_pushes_in_bounded_pieces(redis_conn: Redis) -> None:
    """The API path (``Frontier.add`` of a big batch) never sends one RPUSH of the whole batch."""
    from crawler.spiders.spider import Request

    frontier = Frontier(redis_conn, "demo", ["127.0.0.1"], 60, 60)
    count = 2 * PUSH_CHUNK + 10
    before = commands(redis_conn)
    result = frontier.add([Request(f"http://127.0.0.1/x/{i}") for i in range(count)])
    after = commands(redis_conn)
    assert len(result.enqueued) == count and frontier_sizes(redis_conn, ["demo"]) == [count]
    assert after["rpush"] - before.get("rpush", 0) == 3
    assert [task.url for task in frontier.waiting()] == [f"http://127.0.0.1/x/{i}" for i in range(count)]


@pytest.mark.slow
def test_the_fast_path_for_simple_queries_matches_w3lib() -> None:
    """``canonicalize`` skips w3lib for simple queries; it must give exactly what w3lib gives."""
    rng = random.Random(3)
    alphabet = "ab.~+-_=&?#/%Z9 é"
    compared = 0
    for _ in range(20_000):
        query = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
        url = f"http://shop.example/p/{rng.randint(0, 9)}?{query}"
        try:
            fast = canonicalize(url)
        except RefusedURL:
            continue
        assert fast == canonicalize_url(url.strip()), url
        compared += 1
    assert compared > 19_000
    assert canonicalize("http://shop.example/p?b=2&a+b=1&a=3&a-b=0") == "http://shop.example/p?a=3&a+b=1&a-b=0&b=2"


def test_crawl_from_a_file_seeds_it_and_crawls_to_the_end(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    """``crawler crawl SITE --from FILE``: the file's product pages, and only them (worker processes)."""
    import subprocess

    from crawling import items_by_key

    from crawler.demo import ShopSite

    with ShopSite(products=12, faults=False) as shop:
        path = tmp_path / "products.txt"
        path.write_text("".join(f"{shop.url}/product/{i}\n" for i in range(1, 13, 2)))
        (tmp_path / "sites").mkdir(exist_ok=True)
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "from crawler.cli.app import main; main()",
                "--redis-url",
                redis_url,
                "--database-url",
                sqlite_url,
                "--sites",
                str(tmp_path / "sites"),
                "crawl",
                "demo",
                "--from",
                str(path),
                "-n",
                "1",
                "--threads",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("CRAWLER_") and k != "REDIS_URL"},
        )
        paths = sorted(entry.path for entry in shop.requests if entry.path != "/robots.txt")
    assert done.returncode == 0, done.stderr
    assert "demo: 6 enqueued, 0 already seen" in done.stdout
    # Seeded pages go to `parse` (the demo's listing callback, no item): it follows each one's
    # related product (the next ID) to `parse_product`, whose items are stored.
    assert {f"/product/{i}" for i in range(1, 13)} <= set(paths)
    assert set(items_by_key(sqlite_url)) == {f"SKU-{i:05d}" for i in range(2, 13, 2)}


def test_a_line_of_200_mb_is_skipped_unread_and_counted_bad_within_150_mib(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    """The issue's seed file: one 400 MB line took ``seed --from`` to 842 MiB before its length was checked."""
    path = tmp_path / "urls.txt"
    with path.open("wb") as out:
        out.write(b"http://127.0.0.1/a\nhttp://127.0.0.1/")
        for _ in range(200):
            out.write(b"x" * (1 << 20))
        out.write(b"\n  # a comment\nhttp://127.0.0.1/b\n")
    (tmp_path / "sites").mkdir(exist_ok=True)
    report = tmp_path / "peak"
    command = [*cli_reporting_peak_rss(report), "--redis-url", redis_url]
    command += ["--database-url", sqlite_url, "--sites", str(tmp_path / "sites"), "seed", "demo", "--from", str(path)]
    child = subprocess.run(command, capture_output=True, timeout=300)
    out, err = child.stdout, child.stderr
    path.unlink()
    peak = int(report.read_text()) / 1024
    print(f"seed --from a file with a 200 MB line: peak RSS {peak:.0f} MiB")
    assert child.returncode == 0, err
    assert peak < 150, f"peak RSS {peak:.0f} MiB"
    assert out.decode().strip() == "demo: 2 enqueued, 0 already seen, 1 bad line"
    assert err.decode().strip() == "warning: line 2: longer than 8,192 bytes (not read whole)"
    assert sorted(queued_urls(redis_conn)) == ["http://127.0.0.1/a", "http://127.0.0.1/b"]


def test_a_seed_makes_the_sites_first_jobs_so_the_first_look_for_it_takes_one(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    """Left to the first look, the queue was dry: NEXT_JOB said "refill", the worker refilled and
    asked again, four round trips more at each site's start of a crawl of many sites."""
    urls = [f"http://127.0.0.1/s/{i}" for i in range(3)]
    result = seed_cli(redis_url, sqlite_url, tmp_path, *urls)
    assert result.exit_code == 0, result.output
    queue = Frontier(redis_conn, "demo", [], 60, 60).queue
    assert queue.count >= 1
    assert queued_urls(redis_conn) == urls  # each once, in their order, the first in jobs
    first = queue.job_ids[0]
    step = Scheduler(redis_conn, ["demo"]).take("demo")
    assert step is not None and not step.refill and step.job_id == first


def test_a_seed_or_retry_of_a_url_over_max_url_length_is_a_one_line_error(
    redis_conn: Redis, redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    over = "http://127.0.0.1/" + "x" * 9000
    assert_one_line_error(seed_cli(redis_url, sqlite_url, tmp_path, over), "longer than 8,192 bytes (9,017)")
    failed = "http://127.0.0.1/" + "y" * 50
    store = Store(sqlite_url)
    now = datetime.now(UTC)
    store.record_fetches([FetchRecord("demo", failed, FAILED, now, now, error="HTTP 500")])
    store.close()
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(tmp_path / "sites")]
    retried = CliRunner().invoke(cli, [*base, "retry", "demo", failed], env={"CRAWLER_MAX_URL_LENGTH": "60"})
    assert_one_line_error(retried, "cannot requeue", "URL longer than 60 bytes (67)")
    assert queued_urls(redis_conn) == []
