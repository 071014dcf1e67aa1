"""Shared fixtures: a private Redis server per session, a clean database per test.

Redis: ``CRAWLER_TEST_REDIS_URL`` if given, else a private embedded redis-server on
a unix socket, so the suite never touches a Redis it does not own by accident.
PostgreSQL: ``CRAWLER_TEST_POSTGRES_URL``; without it PostgreSQL tests skip, unless
``CRAWLER_REQUIRE_POSTGRES=1`` (set by ``.ci/run``), which makes them fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawling import postgres_server_url
from redis import Redis

from crawler.coord.connection import EmbeddedRedis, connect
from crawler.demo import ShopSite
from crawler.settings import Settings, load_settings
from crawler.work.runtime import Runtime, install


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a Redis server this test session owns."""
    given = os.environ.get("CRAWLER_TEST_REDIS_URL")
    if given:
        yield given
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_conn(redis_url: str) -> Iterator[Redis]:
    """A client on an emptied database."""
    connection = connect(redis_url)
    connection.flushdb()
    yield connection
    connection.close()


@pytest.fixture
def postgres_url() -> str:
    """URL of an emptied PostgreSQL database (skips, or fails in CI, when none is given)."""
    url = postgres_server_url()
    from sqlalchemy import create_engine

    from crawler.store.database import metadata

    engine = create_engine(url)
    metadata.drop_all(engine)
    engine.dispose()
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'crawl.db'}"


@pytest.fixture
def settings(sqlite_url: str, tmp_path: Path) -> Settings:
    """Settings for a fast test crawl: quick retries, an empty sites directory."""
    (tmp_path / "sites").mkdir(exist_ok=True)
    return load_settings(
        database_url=sqlite_url, backoff=0.2, sites_dir=str(tmp_path / "sites"), state_dir=str(tmp_path / "state")
    )


@pytest.fixture
def runtime(redis_conn: Redis, settings: Settings) -> Iterator[Runtime]:
    """A runtime installed in this process, as a worker process would have."""
    rt = Runtime(redis_conn, settings)
    install(rt)
    yield rt
    rt.close()


@pytest.fixture
def shop() -> Iterator[ShopSite]:
    """A small demo shop on loopback (60 products, with its faults)."""
    with ShopSite(products=60) as site:
        yield site
