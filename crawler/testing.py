"""Helpers for testing spiders: one page without Redis or a database, or a whole small crawl.

::

    from crawler.testing import crawl, run_page

    def test_product_page():
        out = run_page(Shop, "https://shop.example/p/1", body=Path("tests/pages/p1.html"),
                       callback="parse_product")
        assert out.items == [{"sku": "P1", "price": "9.99"}]
        assert out.links("parse_product") == ["https://shop.example/p/2"]

    def test_whole_crawl(local_shop_url):
        result = crawl(Shop, start_urls=[local_shop_url + "/"], allowed_domains=["127.0.0.1"], interval=0.01)
        assert len(result.items) == 60 and not result.failed

``run_page`` runs one callback on one page: a saved copy (bytes, text or a file) or,
without a body, the URL downloaded from a local server with the crawler's own fetcher
(no robots.txt, no gate: nothing else is crawling). ``crawl`` runs the real pipeline
(frontier, gate, download and parse workers in threads) on a private embedded Redis and
a temporary SQLite database, both thrown away afterwards, and returns what was stored.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .ops.devtools import Outputs, page_of, run_callback
from .spiders.loading import SpiderSet
from .spiders.spider import Page, Spider

if TYPE_CHECKING:  # imported where used: ``import crawler.testing`` stays light
    from .work.runtime import Runtime

__all__ = ["CrawlResult", "Outputs", "crawl", "run_page"]

#: Seconds ``crawl`` waits for the crawl to drain before it gives up.
CRAWL_TIMEOUT = 60.0


def _instance(spider: type[Spider] | Spider) -> Spider:
    return spider() if isinstance(spider, type) else spider


def run_page(
    spider: type[Spider] | Spider,
    url: str,
    body: bytes | str | os.PathLike[str] | None = None,
    *,
    callback: str = "parse",
    meta: Mapping[str, Any] | None = None,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    encoding: str | None = None,
) -> Outputs:
    """Run ``spider``'s ``callback`` on the page at ``url``; its items and requests, in order.

    Items are what a crawl would store: past the spider's ``process_item`` and its
    pipelines (opened for this page and closed after it); ``dropped`` says why each
    dropped item was. A failing step raises ``crawler.spiders.items.ItemError`` (its cause the
    original exception, e.g. pydantic's ValidationError).

    ``body``: the page as bytes, as text, or a path to a saved file; None downloads
    ``url`` (a local test server) as a worker would, minus robots.txt and the gate, and
    raises ``ConfigError`` if a worker would not hand the response to a callback.
    Needs neither Redis nor a database. The callback's exceptions propagate.
    """
    if body is None:
        page = _download(url, meta, _instance(spider).content_types)
    else:
        if isinstance(body, os.PathLike):
            body = Path(body).read_bytes()
        data = body.encode(encoding or "utf-8") if isinstance(body, str) else body
        page = Page(
            url,
            data,
            status=status,
            headers=headers or {"content-type": "text/html"},
            meta=dict(meta or {}),
            encoding=encoding,
        )
    return run_callback(_instance(spider), page, callback)


def _download(url: str, meta: Mapping[str, Any] | None, content_types: tuple[str, ...]) -> Page:
    from .http.fetch import Fetcher
    from .settings import Settings

    defaults = Settings()
    fetcher = Fetcher(defaults.timeout, defaults.max_body_bytes, defaults.user_agent)
    try:
        return page_of(fetcher.get(url), dict(meta or {}), content_types)
    finally:
        fetcher.close()


@dataclass
class CrawlResult:
    """What a test crawl stored: items, and every fetch record (downloads and parses)."""

    site: str
    #: Item data by item key (``item_key``'s value, or page URL and position).
    keyed: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Fetch records as dicts (``kind``, ``url``, ``outcome``, ``status``, ``error``, ...), oldest first.
    fetches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def items(self) -> list[dict[str, Any]]:
        """The items stored, in key order."""
        return list(self.keyed.values())

    @property
    def failed(self) -> list[dict[str, Any]]:
        """Fetch records of pages that failed (download or parse), e.g. a callback that raised."""
        return [r for r in self.fetches if r["outcome"] == "failed"]

    def urls(self, kind: str = "download") -> list[str]:
        """URLs with a fetch record of ``kind`` (``download`` or ``parse``), in order, robots.txt included."""
        return [r["url"] for r in self.fetches if r["kind"] == kind]


def crawl(
    spider: type[Spider],
    start_urls: Iterable[str] | None = None,
    *,
    interval: float | None = None,
    timeout: float = CRAWL_TIMEOUT,
    downloaders: int = 2,
    settings: Mapping[str, Any] | None = None,
    **attributes: Any,
) -> CrawlResult:
    """Crawl from ``start_urls`` (the spider's own when None) until drained; what was stored.

    Everything runs in this process: a private embedded Redis and a SQLite file in a
    temporary directory, ``downloaders`` download workers and one parse worker in
    threads. ``interval`` overrides the spider's (keep it short against a local server);
    other keyword arguments override spider attributes for this crawl
    (``allowed_domains=["127.0.0.1"]``); ``settings`` overrides crawler settings
    (``{"max_retries": 0}``). Raises TimeoutError if the crawl has not drained within
    ``timeout`` seconds.
    """
    from .coord.connection import EmbeddedRedis, connect
    from .coord.frontier import seed
    from .coord.seeding import seed_start
    from .errors import ConfigError
    from .settings import load_settings
    from .spiders.check import check_spider
    from .store.database import Store

    if attributes:
        spider = type(spider.__name__, (spider,), attributes)
    problem = check_spider(spider)
    if problem:
        raise ConfigError(problem)
    site = spider.name
    with tempfile.TemporaryDirectory(prefix="crawler-test-") as directory:
        server = EmbeddedRedis(Path(directory) / "redis", persistent=False)
        server.start()
        connection = connect(server.url)
        database_url = f"sqlite:///{Path(directory) / 'crawl.db'}"
        overrides = dict(settings or {})
        if interval is not None:
            overrides["sites"] = {**overrides.get("sites", {}), site: {"interval": interval}}
        config = load_settings(database_url=database_url, state_dir=directory, sites_dir=directory, **overrides)
        try:
            with _runtime(connection, config, SpiderSet({site: spider}, [])) as rt:
                rt.publish(site)  # the site's politeness, where the scheduler reads it, as ``crawler seed`` does
                if start_urls is not None:
                    seed(rt.frontier(site), list(start_urls))
                else:  # the spider's start requests, as ``crawler seed SITE`` queues them (POSTs too)
                    seed_start(rt.frontier(site), rt.spider(site))
                _run_workers(rt, site, downloaders, timeout)
            store = Store(database_url)
            try:
                keyed = {row["key"]: row["data"] for row in store.item_rows(site)}
                return CrawlResult(site, keyed, store.fetch_rows(site))
            finally:
                store.close()
        finally:
            connection.close()
            server.stop()


@contextmanager
def _runtime(connection: Any, settings: Any, spiders: SpiderSet) -> Iterator[Runtime]:
    """The Runtime the crawl's in-thread workers run against, closed afterwards."""
    from .work.runtime import Runtime

    rt = Runtime(connection, settings, spiders)
    try:
        yield rt
    finally:
        rt.close()


def start_burst_workers(
    rt: Runtime, sites: Sequence[str], downloaders: int = 2, parsers: int = 1
) -> tuple[list[threading.Thread], threading.Event]:
    """Burst download and parse workers in threads of this process, as a worker process runs them,
    against the runtime ``rt``.

    Returns the threads (started) and the event that stops them; ``join_burst_workers`` waits.
    """
    from .work.download_worker import DownloadWorker
    from .work.parse_worker import ParseWorker

    stop = threading.Event()
    workers: list[DownloadWorker | ParseWorker] = [
        DownloadWorker(rt.connection, tuple(sites), stop_event=stop, rt=rt) for _ in range(downloaders)
    ]
    workers += [ParseWorker(rt.connection, tuple(sites), stop_event=stop, rt=rt) for _ in range(parsers)]
    threads = [
        threading.Thread(target=w.work, kwargs={"burst": True}, name=f"crawler-test-{i}", daemon=True)
        for i, w in enumerate(workers)
    ]
    for thread in threads:
        thread.start()
    return threads, stop


def join_burst_workers(threads: list[threading.Thread], stop: threading.Event, timeout: float) -> None:
    """Wait for burst workers to drain the crawl; TimeoutError (after stopping them) if they do not in time."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        stop.set()
        for thread in threads:
            thread.join(10)
        raise TimeoutError(f"burst workers did not drain the crawl within {timeout:g}s")


def _run_workers(rt: Runtime, site: str, downloaders: int, timeout: float) -> None:
    threads, stop = start_burst_workers(rt, (site,), downloaders)
    try:
        join_burst_workers(threads, stop, timeout)
    except TimeoutError:
        raise TimeoutError(f"the crawl of {site!r} did not drain within {timeout:g}s") from None
