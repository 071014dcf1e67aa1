"""Schema versions: a number recorded in the database, and the ordered steps between them.

Every ``Store`` runs ``upgrade`` when it starts. A database at the newest version costs
one read. Otherwise, holding a lock that every host's workers share (PostgreSQL:
``pg_advisory_xact_lock``; SQLite: ``BEGIN IMMEDIATE``), the first starter creates the
missing tables, applies the steps past the recorded version with Alembic's
``Operations`` (dialect-aware DDL, no alembic.ini or env.py), records each step and
commits; the others wait for it, then find the database up to date. DDL is
transactional on both databases, so a step that fails leaves the database as it was.

Version ``BASELINE`` is the schema of the release before versions were recorded: a
database with the crawler's tables and no version table is taken to be at it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, UniqueConstraint, func, inspect, select
from sqlalchemy.engine import Connection, Engine

from ..errors import ConfigError

if TYPE_CHECKING:  # alembic (some 100 ms to import) is loaded only when a step is to be applied
    from alembic.operations import Operations

#: The schema of the first release, the last one that recorded no version.
BASELINE = 1

#: The table that records the versions a database went through, one row each.
VERSION_TABLE = "crawler_schema"

#: PostgreSQL advisory lock key of schema upgrades: b"crawler\0" read as a number.
PG_LOCK_KEY = 0x637261776C657200


@dataclass(frozen=True)
class Migration:
    """One step: ``apply`` brings a database from ``version - 1`` to ``version``; it runs after the tables
    the code defines are created, so it must leave a table that already has its change alone."""

    version: int
    description: str
    apply: Callable[[Operations], None]


def add_column(version: int, column: Column) -> Migration:
    """The step that adds ``column``, a column of a table the schema defines, where missing.

    A NOT NULL column needs a ``server_default`` to be added to a table with rows.
    """
    table = column.table.name

    def apply(ops: Operations) -> None:
        present = {c["name"] for c in inspect(ops.get_bind()).get_columns(table)}
        if column.name not in present:
            ops.add_column(
                table, Column(column.name, column.type, nullable=column.nullable, server_default=column.server_default)
            )

    return Migration(version, f"add {table}.{column.name}", apply)


def add_index(version: int, table: str, name: str, columns: Sequence[str]) -> Migration:
    """The step that creates index ``name`` on ``table``'s ``columns``, where missing."""

    def apply(ops: Operations) -> None:
        present = {i["name"] for i in inspect(ops.get_bind()).get_indexes(table)}
        if name not in present:
            ops.create_index(name, table, list(columns))

    return Migration(version, f"add index {name} on {table}", apply)


def index_hashes(version: int, tables: Sequence[Table], replaced: Sequence[str]) -> Migration:
    """The step that indexes text columns by their hash: for each of ``tables``, every column
    ``X_hash`` is added where missing and filled with ``md5(X)`` (PostgreSQL's own; the store
    registers the same function in SQLite), made NOT NULL, and the table's indexes and unique
    constraints are created where missing; the indexes and constraints named in ``replaced``
    are dropped. SQLite cannot drop a constraint or change a column in place: its tables are
    rebuilt (Alembic's batch mode copies the rows).
    """

    def apply(ops: Operations) -> None:
        for table in tables:
            _fill_hashes(ops, table)
            if ops.get_bind().dialect.name == "sqlite":
                _rebuild_sqlite(ops, table, replaced)
            else:
                _reindex(ops, table, replaced)

    return Migration(version, f"index {', '.join(t.name for t in tables)} by URL and key hashes", apply)


def _hashed(table: Table) -> list[Column]:
    return [c for c in table.columns if c.name.endswith("_hash")]


def md5(text: str | None) -> str | None:
    """PostgreSQL's ``md5(text)``: the md5 of the UTF-8 text in hex (None for NULL)."""
    if text is None:
        return None
    return hashlib.md5(str(text).encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()


def _fill_hashes(ops: Operations, table: Table) -> None:
    bind = ops.get_bind()
    if bind.dialect.name == "sqlite":  # PostgreSQL has md5(); SQLite gets this one, on this connection
        bind.connection.driver_connection.create_function("md5", 1, md5, deterministic=True)  # type: ignore[union-attr]
    present = {c["name"] for c in inspect(bind).get_columns(table.name)}
    for column in _hashed(table):
        if column.name not in present:
            ops.add_column(table.name, Column(column.name, column.type, nullable=True))
        source = column.name.removesuffix("_hash")
        ops.execute(f"UPDATE {table.name} SET {column.name} = md5({source}) WHERE {column.name} IS NULL")


def _present(ops: Operations, table: str) -> tuple[set[str], set[str], dict[str, bool]]:
    """Names of the table's indexes and unique constraints, and whether each column is nullable."""
    inspector = inspect(ops.get_bind())
    indexes = {str(i["name"]) for i in inspector.get_indexes(table)}
    uniques = {str(u["name"]) for u in inspector.get_unique_constraints(table) if u["name"]}
    return indexes, uniques, {c["name"]: bool(c["nullable"]) for c in inspector.get_columns(table)}


def _reindex(ops: Operations, table: Table, replaced: Sequence[str]) -> None:
    indexes, uniques, nullable = _present(ops, table.name)
    for column in _hashed(table):
        if nullable[column.name]:
            ops.alter_column(table.name, column.name, nullable=False, existing_type=column.type)
    for unique in _uniques(table):
        if unique.name not in uniques:
            ops.create_unique_constraint(str(unique.name), table.name, [c.name for c in unique.columns])
    for index in table.indexes:
        if index.name not in indexes:
            ops.create_index(str(index.name), table.name, [c.name for c in index.columns])
    for name in replaced:
        if name in uniques:
            ops.drop_constraint(name, table.name, type_="unique")
        elif name in indexes:
            ops.drop_index(name, table_name=table.name)


def _rebuild_sqlite(ops: Operations, table: Table, replaced: Sequence[str]) -> None:
    indexes, uniques, nullable = _present(ops, table.name)
    stale = [name for name in replaced if name in indexes | uniques]
    if not stale and not any(nullable[c.name] for c in _hashed(table)):
        return
    with ops.batch_alter_table(table.name, recreate="always") as batch:
        for column in _hashed(table):
            batch.alter_column(column.name, nullable=False, existing_type=column.type)
        for name in stale:
            if name in uniques:
                batch.drop_constraint(name, type_="unique")
            else:
                batch.drop_index(name)
        for unique in _uniques(table):
            if unique.name not in uniques:
                batch.create_unique_constraint(str(unique.name), [c.name for c in unique.columns])
        for index in table.indexes:
            if index.name not in indexes:
                batch.create_index(str(index.name), [c.name for c in index.columns])


def _uniques(table: Table) -> list[UniqueConstraint]:
    return [c for c in table.constraints if isinstance(c, UniqueConstraint)]


def version_table(metadata: MetaData) -> Table:
    """Define the version table in ``metadata`` (so it is created and dropped with the rest)."""
    return Table(
        VERSION_TABLE,
        metadata,
        Column("version", Integer, primary_key=True, autoincrement=False),
        Column("description", String(200), nullable=False),
        Column("applied", DateTime(timezone=True), nullable=False),
    )


def latest(steps: Sequence[Migration]) -> int:
    """The version the code is written for."""
    return steps[-1].version if steps else BASELINE


def check_steps(steps: Sequence[Migration]) -> None:
    """ValueError unless the steps number BASELINE + 1, + 2, … in order."""
    for expected, step in enumerate(steps, start=BASELINE + 1):
        if step.version != expected:
            raise ValueError(f"migration {step.description!r} is numbered {step.version}, expected {expected}")


def upgrade(engine: Engine, metadata: MetaData, versions: Table, steps: Sequence[Migration]) -> int:
    """Create or migrate the schema to ``latest(steps)``; returns the version found before.

    0 means the database was empty. ConfigError when the database is newer than the code.
    """
    check_steps(steps)
    with engine.connect() as conn:
        found = _recorded(conn, versions)
    if found is not None and found >= latest(steps):
        _refuse_newer(found, steps)
        return found
    with _schema_lock(engine) as conn:
        return _upgrade_locked(conn, metadata, versions, steps)


def _upgrade_locked(conn: Connection, metadata: MetaData, versions: Table, steps: Sequence[Migration]) -> int:
    versions.create(conn, checkfirst=True)
    found = _recorded(conn, versions)
    if found is None:  # nothing recorded: an empty database, or one from before versions
        tables = set(inspect(conn).get_table_names()) & set(metadata.tables) - {versions.name}
        found = BASELINE if tables else 0
    _refuse_newer(found, steps)
    metadata.create_all(conn, checkfirst=True)
    if found == 0:
        _record(conn, versions, latest(steps), "schema created")
        return found
    pending = [step for step in steps if step.version > found]
    if not pending and _recorded(conn, versions) is None:
        _record(conn, versions, found, "schema version recorded")
    if not pending:
        return found
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    ops = Operations(MigrationContext.configure(conn))
    for step in pending:
        step.apply(ops)
        _record(conn, versions, step.version, step.description)
    return found


def _recorded(conn: Connection, versions: Table) -> int | None:
    if not inspect(conn).has_table(versions.name):
        return None
    value = conn.execute(select(func.max(versions.c.version))).scalar()
    return None if value is None else int(value)


def _record(conn: Connection, versions: Table, version: int, description: str) -> None:
    conn.execute(versions.insert().values(version=version, description=description, applied=datetime.now(UTC)))


def _refuse_newer(found: int, steps: Sequence[Migration]) -> None:
    if found > latest(steps):
        raise ConfigError(
            f"database schema is version {found}, newer than this crawler's {latest(steps)}: "
            f"upgrade the crawler on this host"
        )


@contextmanager
def _schema_lock(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction that holds the fleet-wide schema lock; commits on success."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            # Released at commit or rollback, so a starter that dies cannot leave it held.
            conn.execute(select(func.pg_advisory_xact_lock(PG_LOCK_KEY)))
            yield conn
        return
    # SQLite: the driver's own transaction handling would begin only at the first write;
    # BEGIN IMMEDIATE takes the database's write lock before the version is read.
    with engine.connect() as raw:
        conn = raw.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.exec_driver_sql("ROLLBACK")
            raise
        conn.exec_driver_sql("COMMIT")
