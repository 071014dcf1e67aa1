"""``seed --all``, ``status`` and ``sites`` of 2,001 sites: their Redis round trips a fixed few a chunk of sites,
not one or more a site (issue 46: at 10,000 sites ``status --json`` took 12 s, ``sites`` 8 s), and what they print
unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.connection
from click.testing import CliRunner, Result
from crawling import waiting_tasks
from redis import Redis
from rich.console import Console
from rich.table import Table
from rich.text import Text

from crawler.cli.app import cli
from crawler.coord import keys
from crawler.coord.seeding import SEED_SITES
from crawler.coord.together import PUSH_SITES
from crawler.ops.status import STATUS_CHUNK

#: Sites: two chunks of the every-site reads and one more, four and a bit of seeding's.
COUNT = 2 * STATUS_CHUNK + 1
#: A module of COUNT spiders, as a project with one site a class has it (``bench economy``'s shape).
MODULE = """
from crawler import Spider


class Base(Spider):
    interval = 1.0

    def parse(self, page):
        return []
"""
SITE = """

class Site{i}(Base):
    name = "many{i:04d}"
    start_urls = ["https://www.site{i:04d}.example/"]
    allowed_domains = ["www.site{i:04d}.example"]
"""


@pytest.fixture
def many(tmp_path: Path, redis_url: str, redis_conn: Redis, sqlite_url: str) -> Iterator[tuple[list[str], list[str]]]:
    """The sites' names, and the global options that point a command at them, this test's Redis and database."""
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "many.py").write_text(MODULE + "".join(SITE.format(i=i) for i in range(COUNT)))
    yield (
        [f"many{i:04d}" for i in range(COUNT)],
        ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(sites)],
    )


def run(base: list[str], *args: str) -> Result:
    result = CliRunner().invoke(cli, [*base, *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result


class Trips:
    """The round trips (a command, a pipeline, a ``read_many``: a send each) and commands of a command run."""

    def __init__(self, connection: Redis, monkeypatch: pytest.MonkeyPatch):
        self.connection = connection
        self.sends: list[int] = []
        send = redis.connection.AbstractConnection.send_packed_command

        def counted(conn, command, check_health=True):  # type: ignore[no-untyped-def]
            self.sends.append(1)
            return send(conn, command, check_health)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)

    def of(self, base: list[str], *args: str) -> tuple[Result, int, int]:
        before = int(self.connection.info("stats")["total_commands_processed"])
        self.sends.clear()
        result = run(base, *args)
        trips = len(self.sends)
        return result, trips, int(self.connection.info("stats")["total_commands_processed"]) - before - 1


def test_seed_status_and_sites_of_2001_sites_cost_a_few_round_trips_a_chunk(
    many: tuple[list[str], list[str]], redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    names, base = many
    trips = Trips(redis_conn, monkeypatch)
    seeded, seed_trips, seed_commands = trips.of(base, "seed", "--all")
    assert seeded.stdout.splitlines() == [f"{name}: 1 enqueued, 0 already seen" for name in names]
    # A chunk of sites at a time, a round trip each: their spider arguments, policies, seen-set calls,
    # pushes (a transaction a PUSH_SITES of them), announcements, first jobs' reads and moves; and the
    # scripts' first loads. A round trip a site was 12,039 for these 2,001.
    chunks = -(-COUNT // SEED_SITES)
    assert seed_trips <= (7 + -(-SEED_SITES // PUSH_SITES)) * chunks + 30
    assert seed_commands <= 35 * COUNT + 100
    assert [len(waiting_tasks(redis_conn, name)) for name in (names[0], names[1000], names[-1])] == [1, 1, 1]
    again = run(base, "seed", "--all")
    assert again.stdout.splitlines() == [f"{name}: 0 enqueued, 1 already seen" for name in names]

    chunks = -(-COUNT // STATUS_CHUNK)
    status, status_trips, status_commands = trips.of(base, "status", "--json")
    listed = json.loads(status.stdout)["sites"]
    assert [(s["site"], s["queued"], s["interval"], s["state"]) for s in listed] == [
        (name, 1, 1.0, "running") for name in names
    ]
    # the counts and the politeness a round trip a chunk each (every frontier is empty: its jobs were made),
    # and a fixed few: the sites seeded, the workers, the pages stream, a suspension, the client's hello
    assert status_trips <= 2 * chunks + 12, status_trips
    assert status_commands <= 7 * COUNT + 40, status_commands
    plain, plain_trips, _ = trips.of(base, "status")
    rows = plain.stdout.splitlines()
    assert len(rows) == 1 + COUNT + 2 and rows[1].split("\t")[:3] == [names[0], "1", "0"]
    assert plain_trips == status_trips

    table, sites_trips, _ = trips.of(base, "sites")
    assert sites_trips == 0  # the spiders only: no Redis
    assert table.stdout == rich_sites_table(names)


def rich_sites_table(names: list[str]) -> str:
    """``crawler sites`` as rich renders its table (at COLUMNS=200, off a terminal), every cell rendered."""
    console = Console(width=200, force_terminal=False)
    table = Table("site", "interval (s)", "from", "robots", "allowed domains", "start URLs")
    for i, name in enumerate(names):
        table.add_row(Text(name), Text("1"), Text("spider"), "yes", Text(f"www.site{i:04d}.example"), "1")
    with console.capture() as capture:
        console.print(table)
    return capture.get()


STOPPING = """
from crawler import Spider


class Base(Spider):
    interval = 1.0
    start_urls = []

    def parse(self, page):
        return []


class A(Base):
    name = "stop0"
    start_urls = ["https://a.example/"]


class B(Base):
    name = "stop1"  # no start URL: a warning, and on to the next


class C(Base):
    name = "stop2"
    start_urls = ["https://c.example/"]


class D(Base):
    name = "stop3"
    start_urls = ["https://d.example/"]
    allowed_domains = ["elsewhere.example"]  # refused: the seed stops here


class E(Base):
    name = "stop4"
    start_urls = ["https://e.example/"]
"""


def test_seed_all_stops_at_the_first_site_it_cannot_seed_those_before_it_seeded(
    tmp_path: Path, redis_url: str, redis_conn: Redis, sqlite_url: str
) -> None:
    """As a site at a time did: each site's line in order (a warning for one with nothing to seed), and the
    error of the first whose start URL is refused, whose policy was published; none after it is touched."""
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "stop.py").write_text(STOPPING)
    base = ["--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(sites)]
    result = CliRunner().invoke(cli, [*base, "seed", "--all"])
    assert result.exit_code == 1
    assert result.stdout.splitlines() == ["stop0: 1 enqueued, 0 already seen", "stop2: 1 enqueued, 0 already seen"]
    warning, error = result.stderr.splitlines()
    assert warning == "warning: stop1: no start_urls or sitemap_urls, nothing seeded"
    assert error.startswith("Error: ") and "d.example" in error
    assert [len(waiting_tasks(redis_conn, f"stop{i}")) for i in range(5)] == [1, 0, 1, 0, 0]
    assert redis_conn.exists(keys.conf("stop3")) and not redis_conn.exists(keys.conf("stop4"))
