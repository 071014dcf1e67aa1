"""PostgreSQL in production shape: a bare ``postgresql://`` URL, schema migrations on start,
several worker processes writing at once.

Every PostgreSQL test works in a schema of its own (``search_path`` in the URL) and drops
it afterwards, so tests that share the database never see each other's tables. The
migration tests run on SQLite too: the mechanism is the same for both.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from crawling import items_by_key, postgres_server_url
from redis import Redis
from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import make_url

from crawler.coord.frontier import seed
from crawler.demo import ShopSite
from crawler.demo.shop import BROKEN_ID
from crawler.errors import ConfigError
from crawler.settings import Settings
from crawler.store import migrations
from crawler.store.database import FetchRecord, Item, Store, engine_url, utcnow
from crawler.store.schema import MIGRATIONS, SCHEMA_VERSION, items, metadata, schema_versions
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.work.runtime import Runtime

SITE = "shop"


# -- databases ----------------------------------------------------------------------------


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A bare ``postgresql://`` URL, as DATABASE_URL is given in production, on a private schema."""
    server = postgres_server_url()
    schema = f"crawler_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(engine_url(server))
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(server).set(drivername="postgresql").update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'crawl.db'}"
    return str(request.getfixturevalue("pg_url"))


def previous_release_schema() -> MetaData:
    """The tables as the last release before schema versions created them (no fetches.callback)."""
    old = MetaData()
    Table(
        "items",
        old,
        Column("id", Integer().with_variant(BigInteger(), "postgresql"), primary_key=True, autoincrement=True),
        Column("site", String(200), nullable=False),
        Column("key", Text, nullable=False),
        Column("url", Text, nullable=False),
        Column("data", JSON, nullable=False),
        Column("digest", String(32), nullable=False),
        Column("first_seen", DateTime(timezone=True), nullable=False),
        Column("last_seen", DateTime(timezone=True), nullable=False),
        Column("changed", DateTime(timezone=True), nullable=False),
        UniqueConstraint("site", "key", name="items_site_key"),
    )
    Table(
        "fetches",
        old,
        Column("id", Integer().with_variant(BigInteger(), "postgresql"), primary_key=True, autoincrement=True),
        Column("site", String(200), nullable=False),
        Column("url", Text, nullable=False),
        Column("kind", String(16), nullable=False),
        Column("outcome", String(16), nullable=False),
        Column("status", Integer),
        Column("bytes", Integer),
        Column("elapsed", Float),
        Column("started", DateTime(timezone=True), nullable=False),
        Column("finished", DateTime(timezone=True), nullable=False),
        Column("worker", String(200)),
        Column("attempt", Integer, nullable=False, default=1),
        Column("error", Text),
        Index("fetches_site_outcome", "site", "outcome"),
        Index("fetches_site_url", "site", "url"),
    )
    return old


OLD_ITEM = {
    "site": SITE,
    "key": "sku-1",
    "url": "http://shop.example/1",
    "data": {"price": 10},
    "digest": "0" * 32,
    "first_seen": datetime(2024, 1, 1, tzinfo=UTC),
    "last_seen": datetime(2024, 2, 1, tzinfo=UTC),
    "changed": datetime(2024, 1, 15, tzinfo=UTC),
}
OLD_FETCH = {
    "site": SITE,
    "url": "http://shop.example/1",
    "kind": "parse",
    "outcome": "failed",
    "status": 200,
    "started": datetime(2024, 2, 1, tzinfo=UTC),
    "finished": datetime(2024, 2, 1, tzinfo=UTC),
    "attempt": 1,
    "error": "Traceback: boom",
}


#: What the migration steps record when they bring a previous-release database up to date.
MIGRATED = [(step.version, step.description) for step in MIGRATIONS]


def make_previous_release_database(url: str) -> None:
    """A database as the previous release left it: its tables, one item, one failed page."""
    engine = create_engine(engine_url(url))
    old = previous_release_schema()
    with engine.begin() as conn:
        old.create_all(conn)
        conn.execute(old.tables["items"].insert(), OLD_ITEM)
        conn.execute(old.tables["fetches"].insert(), OLD_FETCH)
    engine.dispose()


def columns(url: str, table: str) -> set[str]:
    engine = create_engine(engine_url(url))
    try:
        return {c["name"] for c in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def recorded_versions(url: str) -> list[tuple[int, str]]:
    """The versions recorded in the database ([] when it has no version table)."""
    engine = create_engine(engine_url(url))
    try:
        if not inspect(engine).has_table(schema_versions.name):
            return []
        with engine.connect() as conn:
            query = select(schema_versions.c.version, schema_versions.c.description).order_by("version")
            return [tuple(row) for row in conn.execute(query)]
    finally:
        engine.dispose()


def as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# -- URL forms ----------------------------------------------------------------------------


def test_a_bare_postgresql_url_works_with_psycopg_3(pg_url: str) -> None:
    assert pg_url.startswith("postgresql://")
    store = Store(pg_url)
    try:
        assert store.engine.dialect.driver == "psycopg"
        store.upsert_items(SITE, [Item("k", "http://shop.example/k", {"v": 1})])
        assert list(store.items(SITE)) == [{"v": 1}]
    finally:
        store.close()


# -- schema created or migrated on start --------------------------------------------------


def test_an_empty_database_gets_the_whole_schema_at_the_newest_version(empty_db: str) -> None:
    Store(empty_db).close()
    assert recorded_versions(empty_db) == [(SCHEMA_VERSION, "schema created")]
    assert columns(empty_db, "fetches") >= {"callback", "error", "attempt"}
    assert columns(empty_db, "items") >= {"key", "data", "digest", "first_seen", "last_seen", "changed"}


def test_a_previous_release_database_is_migrated_on_start_with_its_data_intact(empty_db: str) -> None:
    make_previous_release_database(empty_db)
    assert "callback" not in columns(empty_db, "fetches")
    store = Store(empty_db)
    try:
        assert {"callback", "meta", "request"} <= columns(empty_db, "fetches")
        assert recorded_versions(empty_db) == MIGRATED
        (item,) = store.item_rows(SITE)
        assert {k: as_utc(v) if isinstance(v, datetime) else v for k, v in item.items() if k != "id"} == OLD_ITEM
        (fetch,) = store.fetch_rows(SITE)
        assert (fetch["error"], fetch["outcome"], fetch["callback"]) == ("Traceback: boom", "failed", None)
        assert [p["url"] for p in store.failed_pages(SITE)] == ["http://shop.example/1"]
        # The new column is in use at once: a failed page now keeps its callback.
        now = utcnow()
        store.record_fetches(
            [
                FetchRecord(
                    site=SITE,
                    url="http://shop.example/2",
                    outcome="failed",
                    kind="parse",
                    started=now,
                    finished=now,
                    callback="parse_product",
                    meta={"from": "listing"},
                    request={"method": "POST", "body": "q=1"},
                )
            ]
        )
        latest = store.fetch_rows(SITE)[-1]
        assert (latest["callback"], latest["meta"], latest["request"]) == (
            "parse_product",
            {"from": "listing"},
            {"method": "POST", "body": "q=1"},
        )
        store.upsert_items(SITE, [Item("sku-1", "http://shop.example/1", {"price": 11})])
        assert as_utc(store.item_rows(SITE)[0]["first_seen"]) == OLD_ITEM["first_seen"]
        # The rows there got their hashes: the old page's items are found by its URL.
        assert store.touch_items(SITE, OLD_ITEM["url"], utcnow()) == 1
        # URLs and keys past a btree entry's ~2.7 KB are written and found (the old indexes refused them).
        long_url = "http://shop.example/long?" + "".join(secrets.token_hex(8) for _ in range(500))
        store.record_fetches([FetchRecord(SITE, long_url, "failed", now, now, kind="parse", error="x")])
        store.upsert_items(SITE, [Item(long_url, long_url, {"price": 1})])
        assert store.touch_items(SITE, long_url, utcnow()) == 1
        assert long_url in [p["url"] for p in store.failed_pages(SITE, urls=[long_url])]
    finally:
        store.close()
    Store(empty_db).close()  # a second start finds it up to date
    assert recorded_versions(empty_db) == MIGRATED
    engine = create_engine(engine_url(empty_db))
    try:
        found = inspect(engine)
        indexed = {i["name"] for t in ("items", "fetches") for i in found.get_indexes(t)}
        indexed |= {u["name"] for u in found.get_unique_constraints("items")}
    finally:
        engine.dispose()
    assert {"items_site_key_hash", "items_site_url_hash", "fetches_site_url_hash"} <= indexed
    assert not {"items_site_key", "items_site_url", "fetches_site_url"} & indexed


def test_an_unversioned_database_that_already_has_the_column_is_only_stamped(empty_db: str) -> None:
    # What the code between the callback column and schema versions created.
    engine = create_engine(engine_url(empty_db))
    with engine.begin() as conn:
        metadata.create_all(conn, tables=[t for t in metadata.sorted_tables if t is not schema_versions])
    engine.dispose()
    Store(empty_db).close()
    assert recorded_versions(empty_db) == MIGRATED


def future_schema() -> tuple[MetaData, Table, tuple[migrations.Migration, ...]]:
    """The schema of a next release: one new column, and the one migration entry it takes."""
    future = MetaData()
    for table in metadata.sorted_tables:
        table.to_metadata(future)
    future.tables["items"].append_column(Column("category", String(100)))
    steps = (*MIGRATIONS, migrations.add_column(SCHEMA_VERSION + 1, future.tables["items"].c.category))
    return future, future.tables[schema_versions.name], steps


def test_a_new_column_is_one_migration_entry(empty_db: str) -> None:
    make_previous_release_database(empty_db)
    future, versions, steps = future_schema()
    engine = create_engine(engine_url(empty_db))
    try:
        assert migrations.upgrade(engine, future, versions, steps) == migrations.BASELINE
    finally:
        engine.dispose()
    assert "category" in columns(empty_db, "items") and "callback" in columns(empty_db, "fetches")
    assert recorded_versions(empty_db) == [*MIGRATED, (SCHEMA_VERSION + 1, "add items.category")]


def test_a_database_newer_than_the_code_is_refused(empty_db: str) -> None:
    Store(empty_db).close()
    future, versions, steps = future_schema()
    engine = create_engine(engine_url(empty_db))
    migrations.upgrade(engine, future, versions, steps)
    engine.dispose()
    newer = f"schema is version {SCHEMA_VERSION + 1}, newer than this crawler's {SCHEMA_VERSION}"
    with pytest.raises(ConfigError, match=newer) as info:
        Store(empty_db)
    assert "\n" not in str(info.value)


def test_a_failing_step_leaves_the_database_as_it_was(empty_db: str) -> None:
    make_previous_release_database(empty_db)

    def boom(ops: Any) -> None:
        raise RuntimeError("the last step failed")

    future, versions, steps = future_schema()
    steps = (*steps[:-1], steps[-1], migrations.Migration(SCHEMA_VERSION + 2, "boom", boom))
    engine = create_engine(engine_url(empty_db))
    try:
        with pytest.raises(RuntimeError, match="the last step failed"):
            migrations.upgrade(engine, future, versions, steps)
    finally:
        engine.dispose()
    # DDL is transactional on both databases: neither column, nor a version, was kept.
    assert not {"callback", "meta"} & columns(empty_db, "fetches") and "category" not in columns(empty_db, "items")
    assert recorded_versions(empty_db) == []


def test_migration_steps_are_numbered_in_order() -> None:
    migrations.check_steps(MIGRATIONS)
    assert SCHEMA_VERSION == migrations.BASELINE + len(MIGRATIONS)
    gap = (*MIGRATIONS, migrations.add_column(SCHEMA_VERSION + 2, items.c.url))
    with pytest.raises(ValueError, match=f"expected {SCHEMA_VERSION + 1}"):
        migrations.check_steps(gap)


def start_store(url: str, ready: Any) -> None:
    """Process body: open a Store once every process is ready (so several start at the same moment)."""
    ready.wait(60)
    Store(url).close()


def run_processes(target: Any, args: list[tuple[Any, ...]], timeout: float = 120) -> list[int | None]:
    """Run ``target(*a, ready)`` for each ``a`` in its own (spawned) process; their exit codes.

    ``ready``: a barrier of them all, which a target waits on to go on at the same moment as
    the others, once every interpreter has started (however long that took)."""
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(len(args))
    processes = [context.Process(target=target, args=(*a, ready)) for a in args]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    return [process.exitcode for process in processes]


@pytest.mark.integration
def test_workers_starting_at_once_on_hosts_migrate_the_database_once(empty_db: str) -> None:
    make_previous_release_database(empty_db)
    assert run_processes(start_store, [(empty_db,)] * 4) == [0, 0, 0, 0]
    assert recorded_versions(empty_db) == MIGRATED
    assert "callback" in columns(empty_db, "fetches")
    store = Store(empty_db)
    try:
        assert store.count_items(SITE) == 1 and len(store.fetch_rows(SITE)) == 1
    finally:
        store.close()


def test_the_cli_refuses_a_newer_database_in_one_line(pg_url: str, redis_url: str, tmp_path: Path) -> None:
    Store(pg_url).close()
    engine = create_engine(engine_url(pg_url))
    with engine.begin() as conn:
        conn.execute(schema_versions.insert().values(version=SCHEMA_VERSION + 5, description="later", applied=utcnow()))
    engine.dispose()
    (tmp_path / "sites").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith("CRAWLER_")}
    env["DATABASE_URL"] = pg_url
    script = Path(sys.executable).with_name("crawler")
    result = subprocess.run(
        [str(script), "--redis-url", redis_url, "--sites", str(tmp_path / "sites"), "export", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"Error: database schema is version {SCHEMA_VERSION + 5}, newer than this crawler's {SCHEMA_VERSION}: "
        f"upgrade the crawler on this host"
    ]


# -- several writers at once --------------------------------------------------------------

#: Keys every writer writes with the same data (one product on many pages).
SAME_KEYS = [f"same-{i:03d}" for i in range(100)]
#: Keys every writer writes with its own data (the latest seen must win).
OWN_KEYS = [f"own-{i:03d}" for i in range(100)]


def write_overlapping_batches(url: str, writer: int, rounds: int, log_path: str, ready: Any) -> None:
    """Process body: ``rounds`` batches of half the keys each, in a random order, logged as written."""
    store = Store(url)
    rng = random.Random(writer)
    log = []
    ready.wait(60)
    for _ in range(rounds):
        keys = rng.sample(SAME_KEYS + OWN_KEYS, 100)
        seen = utcnow()
        batch = [
            Item(
                k,
                f"http://shop.example/{k}",
                {"v": k} if k.startswith("same") else {"seen": seen.isoformat(), "writer": writer},
            )
            for k in keys
        ]
        store.upsert_items(SITE, batch + batch[:10], seen=seen)  # a key twice in one batch, too
        log.append((seen.isoformat(), keys))
    store.close()
    Path(log_path).write_text(json.dumps(log))


def test_concurrent_upserts_of_overlapping_keys_lose_and_duplicate_nothing(pg_url: str, tmp_path: Path) -> None:
    Store(pg_url).close()
    writers, rounds = 4, 40
    logs = [tmp_path / f"writer-{w}.json" for w in range(writers)]
    exits = run_processes(write_overlapping_batches, [(pg_url, w, rounds, str(logs[w])) for w in range(writers)])
    assert exits == [0] * writers, "a writer failed (deadlock, or a row updated twice in one statement?)"
    seen: dict[str, list[datetime]] = {}
    for log in logs:
        for moment, keys in json.loads(log.read_text()):
            for key in keys:
                seen.setdefault(key, []).append(datetime.fromisoformat(moment))
    store = Store(pg_url)
    try:
        rows = {row["key"]: row for row in store.item_rows(SITE)}
        with store.engine.connect() as conn:
            (count,) = conn.execute(select(func.count()).select_from(items)).one()
    finally:
        store.close()
    assert count == len(rows) == len(seen) and set(rows) == set(seen)  # none lost, none twice
    for key, row in rows.items():
        first, last, changed = (as_utc(row[c]) for c in ("first_seen", "last_seen", "changed"))
        assert (first, last) == (min(seen[key]), max(seen[key])), key
        if key.startswith("same"):
            assert row["data"] == {"v": key} and changed == first, key  # never changed
        else:
            assert datetime.fromisoformat(row["data"]["seen"]) == last and changed == last, key


# -- a real crawl -------------------------------------------------------------------------


def test_a_crawl_with_several_download_and_parse_processes_stores_every_item_once(
    pg_url: str, redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    settings = dataclasses.replace(settings, database_url=pg_url, sites={"demo": {"interval": 0.005}})
    with ShopSite(products=150, per_page=10) as shop:
        rt = Runtime(redis_conn, settings)
        try:
            seed(rt.frontier("demo"), [shop.url + "/"])
        finally:
            rt.close()
        processes = start_workers(
            [WorkerSpec("download", ("demo",), threads=2, burst=True)] * 2
            + [WorkerSpec("parse", ("demo",), burst=True)] * 3,
            settings,
            redis_url,
        )
        try:
            assert wait_for(processes) == 0
        finally:
            stop_workers(processes, timeout=10)
        expected = shop.expected_items()
        pages = {"/"} | {f"/products?page={n}" for n in range(1, shop.pages + 1)}
        pages |= {f"/product/{i}" for i in range(1, shop.products + 1) if i != BROKEN_ID}
    assert items_by_key(pg_url) == expected  # also fails if a key is stored twice
    store = Store(pg_url)
    try:
        fetches = store.fetch_rows("demo", outcome="ok")
        workers = {r["worker"] for r in fetches if r["kind"] == "parse"}
    finally:
        store.close()

    def path(url: str) -> str:
        parts = urlsplit(url)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    for kind in ("download", "parse"):
        done = {path(r["url"]) for r in fetches if r["kind"] == kind}
        assert pages <= done, f"pages without an ok {kind}: {sorted(pages - done)[:5]}"
    assert len(workers) >= 2, f"parsing was not spread over processes: {workers}"
