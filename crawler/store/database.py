"""The database: items upserted on a key, and a fetch record for every request.

One schema (``schema``) for SQLite (the default, a file) and PostgreSQL (``DATABASE_URL``), written
with SQLAlchemy Core, created or migrated when a ``Store`` starts (``migrations``).
Items are upserted on (site, key), so a re-parse never duplicates an item;
``first_seen``/``last_seen``/``changed`` keep the history a recrawl needs. URLs and item
keys are indexed by their md5 (``url_hash``, ``key_hash``), not as they are: a btree
entry holds at most ~2.7 KB on PostgreSQL, and the crawler takes longer URLs. NUL
characters are dropped from text columns (PostgreSQL text cannot hold them). An error
that refuses the data written, not the connection, is raised as ``RefusedRecord``
(``refused``). See docs/DATABASE.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from sqlalchemy import (
    Column,
    Table,
    and_,
    case,
    create_engine,
    event,
    exists,
    func,
    literal,
    select,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DataError,
    DBAPIError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
    ProgrammingError,
    StatementError,
)

from ..backoff import backoff
from ..errors import ConfigError, RefusedRecord
from ..settings import redact_url, url_error
from . import migrations
from .schema import MIGRATIONS, fetches, items, metadata, schema_versions, text_hash
from .write_turns import WriteTurns

#: What to install for PostgreSQL, named in the error when its driver is missing.
POSTGRES_INSTALL = "pip install 'crawler[postgres]'"

#: Outcomes of a fetch record.
OK, REDIRECT, RETRY, FAILED, REFUSED, SKIPPED = "ok", "redirect", "retry", "failed", "refused", "skipped"
#: Outcome of a refresh the server answered 304 Not Modified: nothing downloaded, nothing parsed.
UNCHANGED = "unchanged"
#: Outcome of the record ``crawler retry`` leaves (kind ``retry``): the failed page is queued again.
REQUEUED = "requeued"

#: Most values bound in one SQL ``IN (...)`` (SQLite caps a statement's parameters).
_IN_BATCH = 500


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class FetchRecord:
    """One row of ``fetches``: what happened to one request (or one parse)."""

    site: str
    url: str
    outcome: str
    started: datetime
    finished: datetime
    kind: str = "download"
    status: int | None = None
    bytes: int | None = None
    elapsed: float | None = None
    worker: str | None = None
    attempt: int = 1
    error: str | None = None
    callback: str | None = None
    meta: dict[str, Any] | None = None
    #: What the record keeps of the request to send it again (``DownloadTask.recorded``); None for a plain GET.
    request: dict[str, Any] | None = None


@dataclass
class Item:
    """An item as the parse step hands it to the store."""

    key: str
    url: str
    data: dict[str, Any]


def finite(value: Any) -> Any:
    """``value`` with every NaN and infinity, at any depth, as None (JSON has no such number)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {name: finite(inner) for name, inner in value.items()}
    if isinstance(value, list | tuple):
        return [finite(inner) for inner in value]
    return value


def json_text(value: Any) -> str:
    """The JSON a JSON column stores for ``value``: strict JSON, NaN and infinities as null, on either database."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:  # PostgreSQL refuses NaN and Infinity, SQLite would keep text no JSON reader takes
        return json.dumps(finite(value), allow_nan=False)


def item_digest(data: dict[str, Any]) -> str:
    """Stable digest of an item's data, to tell a changed item from a re-seen one."""
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


#: Rows a streaming query (``items``, the exports) fetches at a time: a server-side cursor on PostgreSQL.
STREAM_ROWS = 1000


class Store:
    """Items and fetch records in one SQL database; creates the schema on first use."""

    def __init__(self, url: str):
        self.url = url
        try:
            target = engine_url(url)
            # A server's connection may have been cut (a restart, an idle timeout): pinged before use.
            # A SQLite file has no server: no ping.
            self.engine: Engine = create_engine(
                target,
                future=True,
                pool_pre_ping=target.get_backend_name() != "sqlite",
                json_serializer=json_text,
            )
        except (ArgumentError, NoSuchModuleError, ValueError) as exc:
            raise ConfigError(f"invalid database URL {redact_url(url)}: {url_error(url, exc)}") from None
        except ImportError as exc:
            raise ConfigError(
                f"database driver {exc.name} is not installed for {redact_url(url)}{_install_hint(url)}"
            ) from None
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        elif self.engine.dialect.name != "postgresql":
            raise ConfigError(
                f"unsupported database {self.engine.dialect.name!r} in {redact_url(url)}: use SQLite or PostgreSQL"
            )
        # SQLite: writers queue for their turn rather than poll for the lock (``write_turns``).
        self._turns = WriteTurns(target.database, self._checkpoint) if self.engine.dialect.name == "sqlite" else None
        self._upgrade()

    @contextmanager
    def _writing(self) -> Iterator[Any]:
        """A write transaction (``engine.begin()``), committed in the writer's turn on SQLite (``write_turns``)."""
        with self._turns.turn() if self._turns is not None else nullcontext(), self.engine.begin() as conn:
            yield conn

    def _checkpoint(self) -> None:
        """A PASSIVE WAL checkpoint of the SQLite file: it copies what it can and waits for no one."""
        with self.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def _upgrade(self) -> None:
        """Create or migrate the schema (``migrations``); ConfigError if the database cannot be reached.

        SQLite: workers starting at once on a new file race to switch it to WAL and to
        take its write lock, and SQLite answers "database is locked" at once to some of
        them rather than making them wait; they try again, a few times, with backoff.
        """
        for attempt in range(SQLITE_LOCKED_TRIES):
            try:
                migrations.upgrade(self.engine, metadata, schema_versions, MIGRATIONS)
                return
            except OperationalError as exc:
                locked = self.engine.dialect.name == "sqlite" and "database is locked" in str(exc)
                if not locked or attempt + 1 == SQLITE_LOCKED_TRIES:
                    raise ConfigError(f"cannot reach database {redact_url(self.url)}: {_first_line(exc)}") from None
                time.sleep(backoff(SQLITE_LOCKED_WAIT, attempt + 1))
            except DBAPIError as exc:
                raise ConfigError(f"cannot reach database {redact_url(self.url)}: {_first_line(exc)}") from None

    def upsert_items(self, site: str, batch: Iterable[Item], seen: datetime | None = None) -> int:
        """Insert or update items on (site, key), seen at ``seen`` (default now). Returns how many were written.

        Of repeated keys in one batch the last wins. Whatever order concurrent writers
        commit in, ``first_seen`` is the earliest ``seen`` of a key, ``last_seen`` the
        latest, and url, data and digest are those of the latest-seen write. ``changed``
        is the ``seen`` of the write that brought the current digest: a write that commits
        late (seen before the latest) never moves it forward, and moves it back only when
        it is the earliest of all and finds the same data never changed since.
        """
        return self.upsert_pages([(site, batch, seen)])

    def upsert_pages(
        self, pages: Sequence[tuple[str, Iterable[Item], datetime | None]], records: Sequence[FetchRecord] = ()
    ) -> int:
        """``upsert_items`` of several pages' (site, items, seen) at once, ``records`` appended with them.

        One transaction and one statement for the items when no key is on two of the
        pages, their rows in key order as ``upsert_items``'s; else one transaction a
        page, as separate calls would. The records go in the (last) transaction. Returns
        how many item rows were written. RefusedRecord when the database refuses the data
        (``refused``): nothing of that transaction is written.
        """
        per_page = [rows for site, batch, seen in pages if (rows := self._item_rows(site, batch, seen))]
        merged = sorted((row for rows in per_page for row in rows), key=lambda row: (row["site"], row["key"]))
        distinct = len({(row["site"], row["key"]) for row in merged}) == len(merged)
        transactions = ([merged] if distinct else per_page) if merged else []
        if records and not transactions:
            transactions = [[]]
        for index, rows in enumerate(transactions, start=1):
            with _refusals(), self._writing() as conn:
                if rows:
                    conn.execute(self._upsert_statement, rows)
                if records and index == len(transactions):
                    self._insert_records(conn, records)
        return len(merged)

    @staticmethod
    def _item_rows(site: str, batch: Iterable[Item], seen: datetime | None) -> list[dict[str, Any]]:
        now = seen or utcnow()
        if now.tzinfo is None:
            raise ValueError("seen must be a timezone-aware datetime")
        rows = {}
        site = _clean(site)
        for item in batch:
            key, url = _clean(item.key), _clean(item.url)
            rows[key] = {
                "site": site,
                "key": key,
                "key_hash": text_hash(key),
                "url": url,
                "url_hash": text_hash(url),
                "data": item.data,
                "digest": item_digest(item.data),
                "first_seen": now,
                "last_seen": now,
                "changed": now,
            }
        # One key once per statement (PostgreSQL refuses to update a row twice in one
        # INSERT … ON CONFLICT), and keys in one order in every batch, so that concurrent
        # batches with keys in common lock their rows in the same order and never deadlock.
        return [rows[key] for key in sorted(rows)]

    @staticmethod
    def _record_rows(records: Sequence[FetchRecord]) -> list[dict[str, Any]]:
        rows = []
        for record in records:
            row = vars(record).copy()
            for name in _RECORD_TEXT:
                if row[name] is not None:
                    row[name] = _clean(row[name])
            row["url_hash"] = text_hash(row["url"])
            rows.append(row)
        return rows

    @cached_property
    def _upsert_statement(self) -> Any:
        # Built once per Store: building it is most of an upsert's CPU, and one statement
        # object keeps its SQL cache key memoized between executions.
        postgres = self.engine.dialect.name == "postgresql"
        stmt: Any
        if postgres:  # imported here: a SQLite process has no use for the dialect (some 2 MiB)
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            stmt = pg_insert(items)
        else:
            stmt = sqlite_insert(items)
        # SQLite's min and max of several arguments are PostgreSQL's least and greatest.
        earliest = getattr(func, "least" if postgres else "min")
        latest = getattr(func, "greatest" if postgres else "max")
        new, old = stmt.excluded, items.c
        # A write that commits after a later-seen one (a slow parser) only widens the history.
        newer = new.last_seen >= old.last_seen
        same = old.digest == new.digest
        # Seen before the item's first sighting, with the data it has had all along.
        earlier_same = and_(new.first_seen < old.first_seen, same, old.changed == old.first_seen)
        return stmt.on_conflict_do_update(
            index_elements=["site", "key_hash"],
            set_={
                "url": case((newer, new.url), else_=old.url),
                "url_hash": case((newer, new.url_hash), else_=old.url_hash),
                "data": case((newer, new.data), else_=old.data),
                "digest": case((newer, new.digest), else_=old.digest),
                "first_seen": earliest(old.first_seen, new.first_seen),
                "last_seen": latest(old.last_seen, new.last_seen),
                "changed": case((and_(newer, ~same), new.changed), (earlier_same, new.changed), else_=old.changed),
            },
        )

    def touch_items(self, site: str, url: str, seen: datetime) -> int:
        """Mark the items of page ``url`` seen again at ``seen`` (the page did not change). Returns how many.

        ``last_seen`` only moves forward; data, digest and ``changed`` stay as they are.
        """
        if seen.tzinfo is None:
            raise ValueError("seen must be a timezone-aware datetime")
        latest = getattr(func, "greatest" if self.engine.dialect.name == "postgresql" else "max")
        moment = literal(seen, items.c.last_seen.type)
        site, url = _clean(site), _clean(url)
        query = (
            items.update()
            .where(items.c.site == site, items.c.url_hash == text_hash(url), items.c.url == url)
            .values(last_seen=latest(items.c.last_seen, moment))
        )
        with _refusals(), self._writing() as conn:
            return int(conn.execute(query).rowcount)

    def record_fetches(self, records: Sequence[FetchRecord]) -> None:
        """Append fetch records (in one transaction: RefusedRecord, and none written, if one is refused)."""
        if records:
            with _refusals(), self._writing() as conn:
                self._insert_records(conn, records)

    def _insert_records(self, conn: Any, records: Sequence[FetchRecord]) -> None:
        rows = self._record_rows(records)
        # One row (a job's record) as a plain execute, not an executemany of one.
        conn.execute(self._insert_fetch, rows[0] if len(rows) == 1 else rows)

    def record_fetches_once(self, records: Sequence[FetchRecord]) -> int:
        """Append the records not already there (same site, URL, kind and start); returns how many.

        For records written again after a write whose answer was lost (the connection cut
        after the commit: ``outbox``), which must not be recorded twice. RefusedRecord,
        and none written, if the database refuses one.
        """
        if not records:
            return 0
        rows = self._record_rows(records)
        with _refusals(), self._writing() as conn:
            present: set[tuple[str, str, str, datetime]] = set()
            for site in {row["site"] for row in rows}:
                hashes = sorted({row["url_hash"] for row in rows if row["site"] == site})
                for start in range(0, len(hashes), _IN_BATCH):
                    query = select(fetches.c.url, fetches.c.kind, fetches.c.started).where(
                        fetches.c.site == site, fetches.c.url_hash.in_(hashes[start : start + _IN_BATCH])
                    )
                    present.update((site, url, kind, _as_utc(started)) for url, kind, started in conn.execute(query))
            fresh = [r for r in rows if (r["site"], r["url"], r["kind"], _as_utc(r["started"])) not in present]
            if fresh:
                conn.execute(self._insert_fetch, fresh)
        return len(fresh)

    @cached_property
    def _insert_fetch(self) -> Any:
        return fetches.insert()

    def items(self, site: str) -> Iterator[dict[str, Any]]:
        """The site's item data, in key order, streamed (``STREAM_ROWS`` rows held at a time)."""
        query = select(items.c.data).where(items.c.site == site).order_by(items.c.key)
        with self.engine.connect() as conn:
            for (data,) in conn.execution_options(yield_per=STREAM_ROWS).execute(query):
                yield data

    def stream_item_rows(self, site: str) -> Iterator[dict[str, Any]]:
        """``item_rows``, streamed (``STREAM_ROWS`` rows held at a time)."""
        query = select(*_shown(items)).where(items.c.site == site).order_by(items.c.key)
        with self.engine.connect() as conn:
            for row in conn.execution_options(yield_per=STREAM_ROWS).execute(query):
                yield dict(row._mapping)

    def item_rows(self, site: str) -> list[dict[str, Any]]:
        """The site's items with key, url and history columns."""
        query = select(*_shown(items)).where(items.c.site == site).order_by(items.c.key)
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]

    def count_items(self, site: str) -> int:
        query = select(func.count()).select_from(items).where(items.c.site == site)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def fetch_rows(self, site: str, outcome: str | None = None) -> list[dict[str, Any]]:
        """The site's fetch records, oldest first (only one outcome's when given)."""
        query = select(*_shown(fetches)).where(fetches.c.site == site).order_by(fetches.c.id)
        if outcome is not None:
            query = query.where(fetches.c.outcome == outcome)
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]

    def outcome_counts(self, site: str) -> dict[str, int]:
        """Number of fetch records per outcome for ``site``."""
        query = (
            select(fetches.c.outcome, func.count())
            .where(fetches.c.site == site, fetches.c.kind == "download")
            .group_by(fetches.c.outcome)
        )
        with self.engine.connect() as conn:
            return {outcome: int(n) for outcome, n in conn.execute(query)}

    def failed_pages(
        self,
        site: str | None = None,
        limit: int | None = None,
        urls: Iterable[str] | None = None,
        outcomes: tuple[str, ...] = (FAILED,),
    ) -> list[dict[str, Any]]:
        """Pages whose latest fetch record (download or parse) failed, by site then age.

        A page that failed and later succeeded, or is being retried, is not listed.
        ``site`` (None for every site) and ``urls`` narrow the pages looked at; ``outcomes``
        names the latest outcomes looked for (``REQUEUED`` too: pages ``crawler retry`` queued).
        """
        later = fetches.alias("later")
        newer_record = exists().where(
            later.c.site == fetches.c.site,
            later.c.url_hash == fetches.c.url_hash,
            later.c.url == fetches.c.url,
            later.c.id > fetches.c.id,
        )
        # Only failed records are visited (index on site, outcome); each is checked for a later
        # record of its page (index on site, url_hash), so the cost follows the failures, not the crawl.
        query = (
            select(*_shown(fetches))
            .where(fetches.c.outcome.in_(outcomes), ~newer_record)
            .order_by(fetches.c.site, fetches.c.id)
        )
        if site is not None:
            query = query.where(fetches.c.site == site)
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            if urls is None:
                return [dict(row._mapping) for row in conn.execute(query)]
            wanted = {_clean(url): text_hash(_clean(url)) for url in urls}
            hashes = sorted(set(wanted.values()))
            rows = []
            for start in range(0, len(hashes), _IN_BATCH):
                batch = hashes[start : start + _IN_BATCH]
                found = conn.execute(query.where(fetches.c.url_hash.in_(batch)))
                rows += [dict(row._mapping) for row in found if row.url in wanted]
            return sorted(rows, key=lambda row: (row["site"], row["id"]))[:limit]

    def ping(self) -> None:
        """ConfigError unless the database answers."""
        try:
            with self.engine.connect() as conn:
                conn.execute(select(1))
        except (OperationalError, DBAPIError) as exc:
            raise ConfigError(f"cannot reach database {redact_url(self.url)}: {_first_line(exc)}") from None

    def close(self) -> None:
        self.engine.dispose()


def engine_url(url: str) -> URL:
    """The SQLAlchemy URL for a ``DATABASE_URL``: ``postgresql://`` and ``postgres://`` mean psycopg 3.

    SQLAlchemy 2.0 reads a bare ``postgresql://`` as psycopg2 and rejects ``postgres://``;
    the ``postgres`` extra ships psycopg 3. A URL naming its driver is left as it is.
    """
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    return parsed


#: Tries of a schema upgrade that SQLite answered "database is locked" (see ``Store._upgrade``).
SQLITE_LOCKED_TRIES = 6
#: Seconds before the second such try; each next one waits twice as long.
SQLITE_LOCKED_WAIT = 0.1


def _as_utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive one (SQLite gives them back so) is taken to be UTC already."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _install_hint(url: str) -> str:
    return f": {POSTGRES_INSTALL}" if url.lower().startswith("postgres") else ""


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets parse and download workers in several processes write without
    # "database is locked"; the busy timeout (set first, so that the switch to WAL
    # waits for it too) makes writers queue instead of failing.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    # Not at a commit, in the writer's turn: a Store checkpoints outside it (``write_turns``).
    cursor.execute("PRAGMA wal_autocheckpoint=0")
    cursor.close()


def _shown(table: Table) -> list[Column[Any]]:
    """The table's columns but the hashes (an index's business, not a reader's)."""
    return [column for column in table.columns if not column.name.endswith("_hash")]


#: Text columns of a fetch record, written without NUL characters (``_clean``).
_RECORD_TEXT = ("site", "url", "kind", "outcome", "worker", "error", "callback")

#: Classes of PostgreSQL SQLSTATE that refuse the data written: 22 data exception (NUL,
#: out of range, invalid JSON), 23 integrity constraint violation, 54 program limit
#: exceeded (an index entry over the btree's ~2.7 KB). Others (08 connection, 40
#: deadlock, 53 disk full or too many connections, 57 shutdown, 25 read-only) are outages.
REFUSING_SQLSTATES = ("22", "23", "54")


def _clean(text: str) -> str:
    """``text`` without NUL characters, which PostgreSQL text cannot hold (dropped on SQLite too, for one data set)."""
    return text.replace("\x00", "") if "\x00" in text else text


def refused(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a write, refuses the data written rather than fails to reach the database.

    A refusal would come back at every try; an outage (a lost connection, a locked
    database, a server shutting down) ends. On PostgreSQL the SQLSTATE class tells
    (``REFUSING_SQLSTATES``); errors without one are the driver's own checks (psycopg's
    NUL, sqlite3's constraints and bindings: DataError, IntegrityError, ProgrammingError).
    A value that cannot be bound at all (not JSON, a lone surrogate, an integer past
    64 bits) is a refusal too.
    """
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return False
        sqlstate = getattr(exc.orig, "sqlstate", None)
        if sqlstate:
            return str(sqlstate)[:2] in REFUSING_SQLSTATES
        return isinstance(exc, DataError | IntegrityError | ProgrammingError)
    return isinstance(exc, StatementError | TypeError | ValueError | OverflowError)


@contextmanager
def _refusals() -> Iterator[None]:
    """Raise what the database refuses (``refused``) as RefusedRecord; outages go through as they are."""
    try:
        yield
    except (StatementError, TypeError, ValueError, OverflowError) as exc:
        if not refused(exc):
            raise
        raise RefusedRecord(f"database refused the data: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
