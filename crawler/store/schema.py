"""The database's schema: the ``items`` and ``fetches`` tables, and the migrations that bring a database to it.

Written with SQLAlchemy Core for SQLite and PostgreSQL alike. URLs and item keys are
indexed by their md5 (``url_hash``, ``key_hash``: ``text_hash``), not as they are: a btree
entry holds at most ~2.7 KB on PostgreSQL, and the crawler takes longer URLs.
"""

from __future__ import annotations

import hashlib
from typing import Any

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
)

from . import migrations

metadata = MetaData()


def text_hash(text: str) -> str:
    """The md5 of ``text`` (UTF-8) in hex: what PostgreSQL's ``md5(text)`` gives (``migrations.md5``)."""
    return hashlib.md5(text.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()


def _hash_of(column: str) -> Any:
    """A column default: the hash of ``column``'s value in the row inserted (for inserts that leave it out)."""

    def default(context: Any) -> str | None:
        value = context.get_current_parameters().get(column)
        return None if value is None else text_hash(value)

    return default


items = Table(
    "items",
    metadata,
    Column("id", Integer().with_variant(BigInteger(), "postgresql"), primary_key=True, autoincrement=True),
    Column("site", String(200), nullable=False),
    Column("key", Text, nullable=False),
    Column("url", Text, nullable=False),
    Column("key_hash", String(32), nullable=False, default=_hash_of("key")),  # text_hash(key): unique, indexed
    Column("url_hash", String(32), nullable=False, default=_hash_of("url")),  # text_hash(url): indexed
    Column("data", JSON, nullable=False),
    Column("digest", String(32), nullable=False),
    Column("first_seen", DateTime(timezone=True), nullable=False),
    Column("last_seen", DateTime(timezone=True), nullable=False),
    Column("changed", DateTime(timezone=True), nullable=False),
    # Keys and URLs of any length: their hashes are indexed (a btree entry holds ~2.7 KB on PostgreSQL).
    UniqueConstraint("site", "key_hash", name="items_site_key_hash"),
    Index("items_site_url_hash", "site", "url_hash"),  # a page's items, when a refresh finds it unchanged
)

fetches = Table(
    "fetches",
    metadata,
    Column("id", Integer().with_variant(BigInteger(), "postgresql"), primary_key=True, autoincrement=True),
    Column("site", String(200), nullable=False),
    Column("url", Text, nullable=False),
    Column("url_hash", String(32), nullable=False, default=_hash_of("url")),  # text_hash(url): indexed
    Column("kind", String(16), nullable=False),  # download | parse | retry (crawler retry requeued the page)
    Column("outcome", String(16), nullable=False),  # ok | unchanged | redirect | retry | failed | refused | skipped
    Column("status", Integer),
    Column("bytes", Integer),
    Column("elapsed", Float),
    Column("started", DateTime(timezone=True), nullable=False),
    Column("finished", DateTime(timezone=True), nullable=False),
    Column("worker", String(200)),
    Column("attempt", Integer, nullable=False, default=1),
    Column("error", Text),
    Column("callback", String(200)),  # the spider method the page was for, so it can be retried
    Column("meta", JSON),  # the request's meta (None when empty), so a retry hands it to the callback again
    # The request's method, own headers and body (``DownloadTask.recorded``; None for a plain GET), so a
    # retry sends the same request, not a GET of its URL.
    Column("request", JSON),
    Index("fetches_site_outcome", "site", "outcome"),
    Index("fetches_site_url_hash", "site", "url_hash"),
)

schema_versions = migrations.version_table(metadata)

#: Changes to the schema since the first release, oldest first. A new column is the column
#: in its table above plus one entry here; a database is brought up to date when a Store starts.
MIGRATIONS: tuple[migrations.Migration, ...] = (
    migrations.add_column(2, fetches.c.callback),
    migrations.add_column(3, fetches.c.meta),
    migrations.add_index(4, "items", "items_site_url", ["site", "url"]),
    # URLs and keys longer than a PostgreSQL btree entry (~2.7 KB) broke these three.
    migrations.index_hashes(5, [fetches, items], ["fetches_site_url", "items_site_url", "items_site_key"]),
    migrations.add_column(6, fetches.c.request),
)

#: The schema version this code writes.
SCHEMA_VERSION = migrations.latest(MIGRATIONS)
