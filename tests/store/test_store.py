"""The store on SQLite and PostgreSQL: item upserts with history, fetch records, errors."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from crawler.errors import ConfigError
from crawler.store.database import FAILED, OK, RETRY, FetchRecord, Item, Store, engine_url, item_digest

SITE = "shop"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def database_url(request: pytest.FixtureRequest) -> str:
    """The same test on each supported database (PostgreSQL skips unless configured)."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    s = Store(database_url)
    yield s
    s.close()


def as_utc(moment: datetime) -> datetime:
    """SQLite hands back naive UTC datetimes, PostgreSQL aware ones: compare them alike."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def tick() -> None:
    """Let the clock move, so a timestamp that should change visibly does."""
    time.sleep(0.01)


def test_upsert_twice_keeps_one_row_with_the_new_data(store: Store) -> None:
    assert store.upsert_items(SITE, [Item("sku-1", "http://shop.example/1", {"price": 10})]) == 1
    assert store.upsert_items(SITE, [Item("sku-1", "http://shop.example/1b", {"price": 12})]) == 1
    assert store.count_items(SITE) == 1
    (row,) = store.item_rows(SITE)
    assert row["data"] == {"price": 12}
    assert row["url"] == "http://shop.example/1b"
    assert row["digest"] == item_digest({"price": 12})


def test_an_item_holding_nan_or_infinity_is_stored_with_null_there_on_either_database(store: Store) -> None:
    data = {"price": float("inf"), "rating": float("nan"), "deep": [{"low": float("-inf"), "ok": 1.5}]}
    assert store.upsert_items(SITE, [Item("sku-1", "http://shop.example/1", data)]) == 1
    (row,) = store.item_rows(SITE)
    assert row["data"] == {"price": None, "rating": None, "deep": [{"low": None, "ok": 1.5}]}


def test_changed_moves_only_when_the_data_changes_and_first_seen_stays(store: Store) -> None:
    store.upsert_items(SITE, [Item("sku-1", "http://shop.example/1", {"price": 10, "stock": 3})])
    (first,) = store.item_rows(SITE)
    tick()
    # Same data, keys in another order: not a change.
    store.upsert_items(SITE, [Item("sku-1", "http://shop.example/1", {"stock": 3, "price": 10})])
    (same,) = store.item_rows(SITE)
    assert same["first_seen"] == first["first_seen"]
    assert same["changed"] == first["changed"]
    assert same["last_seen"] > first["last_seen"]
    tick()
    store.upsert_items(SITE, [Item("sku-1", "http://shop.example/1", {"price": 9, "stock": 3})])
    (moved,) = store.item_rows(SITE)
    assert moved["first_seen"] == first["first_seen"]
    assert moved["changed"] > same["changed"]
    assert moved["changed"] == moved["last_seen"]


def test_repeated_keys_in_one_batch_keep_the_last(store: Store) -> None:
    written = store.upsert_items(
        SITE,
        [
            Item("a", "http://shop.example/a", {"v": 1}),
            Item("b", "http://shop.example/b", {"v": 2}),
            Item("a", "http://shop.example/a", {"v": 3}),
        ],
    )
    assert written == 2
    assert list(store.items(SITE)) == [{"v": 3}, {"v": 2}]


T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def history(store: Store) -> tuple[dict, datetime, datetime, datetime]:
    (row,) = store.item_rows(SITE)
    return row["data"], as_utc(row["first_seen"]), as_utc(row["last_seen"]), as_utc(row["changed"])


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))), ids=str)
def test_writes_of_the_same_data_give_one_history_whatever_order_they_commit_in(
    store: Store, order: tuple[int, ...]
) -> None:
    # Three parsers saw the item at 1, 2 and 3 s; a slow one may commit last.
    for i in order:
        store.upsert_items(SITE, [Item("k", "http://shop.example/k", {"price": 5})], seen=at(i + 1))
    assert history(store) == ({"price": 5}, at(1), at(3), at(1))


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["in-order", "late-commit"])
def test_the_latest_seen_data_wins_even_when_it_commits_first(store: Store, order: tuple[int, ...]) -> None:
    writes = [(at(1), {"price": 5}), (at(2), {"price": 6})]
    for i in order:
        seen, data = writes[i]
        store.upsert_items(SITE, [Item("k", f"http://shop.example/{i}", data)], seen=seen)
    assert history(store) == ({"price": 6}, at(1), at(2), at(2))
    assert store.item_rows(SITE)[0]["url"] == "http://shop.example/1"


def test_a_late_commit_does_not_hide_a_change_seen_in_between(store: Store) -> None:
    store.upsert_items(SITE, [Item("k", "http://shop.example/k", {"price": 5})], seen=at(1))
    store.upsert_items(SITE, [Item("k", "http://shop.example/k", {"price": 6})], seen=at(2))
    store.upsert_items(SITE, [Item("k", "http://shop.example/k", {"price": 6})], seen=at(4))
    store.upsert_items(SITE, [Item("k", "http://shop.example/k", {"price": 5})], seen=at(3))  # stale
    assert history(store) == ({"price": 6}, at(1), at(4), at(2))


def test_pages_upserted_together_give_what_one_call_each_gives(store: Store, sqlite_url: str) -> None:
    pages = [
        (SITE, [Item("b", "http://shop.example/b", {"v": 1}), Item("a", "http://shop.example/a", {"v": 2})], at(1)),
        ("other", [Item("a", "http://other.example/a", {"v": 3})], at(2)),
        (SITE, [Item("c", "http://shop.example/c", {"v": 4})], at(3)),
    ]
    statements: list[int] = []

    def count(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.startswith("INSERT INTO items"):
            statements.append(len(parameters) if executemany else 1)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        assert store.upsert_pages(pages) == 4
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    assert statements == [4]  # one statement for the three pages
    assert [row["key"] for row in store.item_rows(SITE)] == ["a", "b", "c"]
    assert [as_utc(row["first_seen"]) for row in store.item_rows(SITE)] == [at(1), at(1), at(3)]
    assert list(store.items("other")) == [{"v": 3}]


def test_a_key_on_two_of_the_pages_upserted_together_keeps_its_history(store: Store) -> None:
    pages = [
        (SITE, [Item("k", "http://shop.example/1", {"price": 5})], at(2)),
        (SITE, [Item("k", "http://shop.example/0", {"price": 4})], at(1)),  # seen earlier, written later
    ]
    assert store.upsert_pages(pages) == 2
    assert history(store) == ({"price": 5}, at(1), at(2), at(2))


def test_seen_must_be_timezone_aware(store: Store) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        store.upsert_items(SITE, [Item("k", "http://shop.example/k", {})], seen=datetime(2025, 1, 1))


def test_empty_batch_writes_nothing(store: Store) -> None:
    assert store.upsert_items(SITE, []) == 0
    assert store.count_items(SITE) == 0


def test_same_key_on_two_sites_is_two_items(store: Store) -> None:
    store.upsert_items("one", [Item("k", "http://one.example/", {"site": 1})])
    store.upsert_items("two", [Item("k", "http://two.example/", {"site": 2})])
    assert list(store.items("one")) == [{"site": 1}]
    assert list(store.items("two")) == [{"site": 2}]


def test_items_keep_nested_and_unicode_data(store: Store) -> None:
    data = {"title": "Crème brûlée — 日本", "tags": ["a", "b"], "dims": {"w": 1.5, "h": None}, "ok": True}
    store.upsert_items(SITE, [Item("x", "http://shop.example/x", data)])
    assert list(store.items(SITE)) == [data]


def test_fetch_records_round_trip(store: Store) -> None:
    started = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    record = FetchRecord(
        site=SITE,
        url="http://shop.example/p/1",
        outcome=FAILED,
        started=started,
        finished=started + timedelta(seconds=1.5),
        status=503,
        bytes=1234,
        elapsed=1.5,
        worker="host.1234",
        attempt=2,
        error="HTTP 503; retry in 4s\nsecond line",
    )
    parse = FetchRecord(
        site=SITE, url="http://shop.example/p/1", outcome=OK, kind="parse", started=started, finished=started
    )
    store.record_fetches([record, parse])
    first, second = store.fetch_rows(SITE)
    columns = ("site", "url", "kind", "outcome", "status", "bytes", "elapsed", "worker", "attempt", "error")
    assert {k: first[k] for k in columns} == {
        "site": SITE,
        "url": "http://shop.example/p/1",
        "kind": "download",
        "outcome": FAILED,
        "status": 503,
        "bytes": 1234,
        "elapsed": 1.5,
        "worker": "host.1234",
        "attempt": 2,
        "error": "HTTP 503; retry in 4s\nsecond line",
    }
    assert as_utc(first["started"]) == started
    assert as_utc(first["finished"]) == started + timedelta(seconds=1.5)
    assert (second["kind"], second["status"], second["attempt"]) == ("parse", None, 1)
    assert [r["outcome"] for r in store.fetch_rows(SITE, outcome=OK)] == [OK]


def test_outcome_counts_count_downloads_per_outcome(store: Store) -> None:
    now = datetime.now(UTC)

    def record(outcome: str, kind: str = "download", site: str = SITE) -> FetchRecord:
        return FetchRecord(site=site, url="http://shop.example/", outcome=outcome, started=now, finished=now, kind=kind)

    store.record_fetches(
        [record(OK), record(OK), record(RETRY), record(FAILED), record(OK, kind="parse"), record(OK, site="other")]
    )
    assert store.outcome_counts(SITE) == {OK: 2, RETRY: 1, FAILED: 1}
    assert store.outcome_counts("nobody") == {}


def test_second_store_on_the_same_database_reuses_the_schema(store: Store, database_url: str) -> None:
    store.upsert_items(SITE, [Item("k", "http://shop.example/", {"v": 1})])
    again = Store(database_url)
    try:
        assert again.count_items(SITE) == 1
        again.ping()
    finally:
        again.close()


@pytest.mark.parametrize(
    "given, used",
    [
        ("postgresql://u:pw@db.internal:5433/crawl", "postgresql+psycopg://u:pw@db.internal:5433/crawl"),
        ("postgres://u@db.internal/crawl?sslmode=require", "postgresql+psycopg://u@db.internal/crawl?sslmode=require"),
        ("postgresql+psycopg2://u@db.internal/crawl", "postgresql+psycopg2://u@db.internal/crawl"),
        ("postgresql+psycopg://u@db.internal/crawl", "postgresql+psycopg://u@db.internal/crawl"),
        ("sqlite:///crawler.db", "sqlite:///crawler.db"),
    ],
)
def test_a_bare_postgresql_url_means_psycopg_3(given: str, used: str) -> None:
    assert engine_url(given).render_as_string(hide_password=False) == used


@pytest.mark.parametrize(
    "url", ["postgresql://crawler:Sup3rS3cret@127.0.0.1:1/crawl", "postgres://crawler:Sup3rS3cret@127.0.0.1:1/crawl"]
)
def test_missing_postgres_driver_names_the_extra_to_install(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ImportError
    with pytest.raises(ConfigError) as info:
        Store(url)
    message = str(info.value)
    assert "psycopg" in message and "pip install 'crawler[postgres]'" in message
    assert "\n" not in message and "Sup3rS3cret" not in message


@pytest.mark.parametrize("url", ["not a url", "nosuchdb://host/db", "postgresql+nosuchdriver://u:pw@host/db"])
def test_invalid_database_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        Store(url)
    assert "pw@" not in str(info.value)


def test_unreachable_postgres_is_a_config_error_without_the_password() -> None:
    pytest.importorskip("psycopg")
    url = "postgresql+psycopg://crawler:Sup3rS3cret@127.0.0.1:1/crawl?connect_timeout=3"
    started = time.monotonic()
    with pytest.raises(ConfigError, match="cannot reach database") as info:
        Store(url)
    assert "Sup3rS3cret" not in str(info.value)
    assert "***@127.0.0.1:1" in str(info.value)
    assert time.monotonic() - started < 10


def test_unwritable_sqlite_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot reach database"):
        Store(f"sqlite:///{tmp_path}/no/such/dir/crawl.db")


def test_touching_a_page_moves_only_its_items_last_seen_forward(store: Store) -> None:
    start = datetime(2026, 1, 1, 12, tzinfo=UTC)
    page, other_page = "http://shop.example/1", "http://shop.example/2"
    store.upsert_items(
        SITE, [Item("a", page, {"p": 1}), Item("b", page, {"p": 2}), Item("c", other_page, {"p": 3})], seen=start
    )
    store.upsert_items("other", [Item("a", "http://shop.example/1", {"p": 1})], seen=start)
    later = start + timedelta(hours=1)
    assert store.touch_items(SITE, "http://shop.example/1", later) == 2
    rows = {row["key"]: row for row in store.item_rows(SITE)}
    assert [as_utc(rows[k]["last_seen"]) for k in "abc"] == [later, later, start]
    assert all(as_utc(rows[k]["changed"]) == start and rows[k]["data"]["p"] for k in "abc")
    assert as_utc(store.item_rows("other")[0]["last_seen"]) == start
    assert store.touch_items(SITE, "http://shop.example/1", start) == 2  # an older sighting moves nothing back
    assert as_utc(store.item_rows(SITE)[0]["last_seen"]) == later
    assert store.touch_items(SITE, "http://shop.example/none", later) == 0


def test_records_written_again_after_a_lost_answer_are_recorded_once(store: Store) -> None:
    """``outbox``: a record whose write went through but whose answer was lost is parked and flushed again."""
    started = datetime(2026, 11, 23, 1, 2, 3, 456789, tzinfo=UTC)
    first = FetchRecord(site="s", url="http://x/1", outcome="ok", started=started, finished=started, kind="download")
    later = dataclasses.replace(first, started=started + timedelta(microseconds=1))
    parse = dataclasses.replace(first, kind="parse")
    store.record_fetches([first])
    assert store.record_fetches_once([first, later, parse, first]) == 2  # first is there already

    def naive_utc(moment: datetime) -> datetime:
        return moment if moment.tzinfo is None else moment.astimezone(UTC).replace(tzinfo=None)

    rows = sorted((r["kind"], naive_utc(r["started"])) for r in store.fetch_rows("s"))
    assert rows == sorted((r.kind, naive_utc(r.started)) for r in (first, later, parse))


def test_a_server_database_is_pinged_before_each_use_and_a_sqlite_file_is_not(store: Store) -> None:
    """A connection to a server may have been cut meanwhile (a restart): pinged before use. A SQLite
    file has no server: the ping was a statement per transaction for nothing (a download job's record)."""
    pinged = store.engine.pool._pre_ping  # type: ignore[attr-defined]
    assert pinged == (store.engine.dialect.name == "postgresql")
    store.record_fetches([])  # still usable
