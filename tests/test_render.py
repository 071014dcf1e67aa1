"""Rendered pages: a loopback single-page app crawled through a real Chromium (Playwright).

The app (``crawler.demo.spa``) writes its product links and products from JSON with a
script; its stylesheet, image and third-party script (on 127.0.0.2) must never be
requested, and its requests must be spaced by the site's interval at the server.

Needs Playwright and a Chromium (``apt-get install chromium``); the tests skip without
them, unless ``CRAWLER_REQUIRE_BROWSER=1`` (set by ``.ci/run``), which makes them fail.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error, installed_runtime, items_by_key, join_all, start_in_threads
from redis import Redis

from crawler.cli.app import cli
from crawler.coord.frontier import seed
from crawler.demo.spa import SPIDER_SOURCE, SpaSite
from crawler.errors import BodyTooLarge
from crawler.http.fetch import Fetcher
from crawler.settings import Settings
from crawler.store.database import FAILED, OK, REDIRECT, RETRY, Store
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.work.render import BrowserNotFound, Renderer, Visit, find_browser
from crawler.work.runtime import Runtime

#: Paths of the app a rendering crawl must never request.
BLOCKED = {"/style.css", "/logo.png"}


@pytest.fixture
def browser() -> str:
    """The Chromium to render with (skips without one or without Playwright, fails in CI)."""
    try:
        import playwright  # noqa: F401

        return find_browser(os.environ.get("CRAWLER_BROWSER_PATH"))
    except ImportError:
        reason = "Playwright not installed: pip install -e '.[browser]'"
    except BrowserNotFound as exc:
        reason = str(exc)
    if os.environ.get("CRAWLER_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (CRAWLER_REQUIRE_BROWSER=1)")
    pytest.skip(reason)


@pytest.fixture
def counted_browser(browser: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A wrapper of ``browser`` that writes a line to a file each time a browser starts."""
    starts = tmp_path / "browser-starts"
    wrapper = tmp_path / "chromium-counted"
    wrapper.write_text(f'#!/bin/sh\necho "$$" >> {starts}\nexec {browser} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    yield str(wrapper), starts


def write_spider(settings: Settings, site: SpaSite, render: bool) -> None:
    (Path(settings.sites_dir) / "spa.py").write_text(
        SPIDER_SOURCE.format(name="spa", url=site.url + "/", render=render)
    )


def crawl_in_processes(settings: Settings, redis_url: str, redis_conn: Redis, url: str) -> None:
    """Seed ``url`` and crawl to the end with two download processes and a parse process."""
    rt = Runtime(redis_conn, settings)
    try:
        seed(rt.frontier("spa"), [url])
    finally:
        rt.close()
    specs = [WorkerSpec("download", ("spa",), threads=1, burst=True)] * 2
    specs += [WorkerSpec("parse", ("spa",), threads=1, burst=True)]
    processes = start_workers(specs, settings, redis_url)
    done = threading.Event()

    def watchdog() -> None:
        if not done.wait(150):
            stop_workers(processes, timeout=10)

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        assert wait_for(processes) == 0
    finally:
        done.set()


def test_a_single_page_app_is_crawled_rendered_politely_and_without_blocked_requests(
    redis_url: str, redis_conn: Redis, settings: Settings, counted_browser: tuple[str, Path]
) -> None:
    path, starts = counted_browser
    interval = 0.2
    settings = dataclasses.replace(settings, browser_path=path, sites={"spa": {"interval": interval}})
    with SpaSite(products=5) as site:
        write_spider(settings, site, render=True)
        # Seeded with a redirect to the app; the app's XHR is redirected too (each hop through the gate).
        crawl_in_processes(settings, redis_url, redis_conn, site.url + "/old")
        assert items_by_key(settings.database_url, "spa") == site.expected_items()
        paths = site.paths()
        gap = site.min_gap()
        assert site.tracker_arrivals == [], "the third-party script was requested"
    assert not BLOCKED & set(paths), paths
    assert {"/old", "/", "/app.js", "/api/products", "/api/v2/products", "/product/1", "/api/product/5"} <= set(paths)
    assert gap is not None and gap >= interval, f"two requests {gap * 1000:.1f} ms apart"
    started = starts.read_text().split()
    assert 1 <= len(started) <= 2, started  # one browser per download process, at most

    store = Store(settings.database_url)
    try:
        rows = store.fetch_rows("spa")
    finally:
        store.close()
    sent = [r for r in rows if r["kind"] == "download" and r["outcome"] in (OK, REDIRECT)]
    recorded = {r["url"].removeprefix(site.url) for r in sent}
    # Each request the browser made through the gate left a record (robots.txt's included).
    assert set(paths) == recorded | {"/robots.txt"}, (sorted(paths), sorted(recorded))


def test_a_rendered_site_with_cookies_carries_its_jar_in_the_browsers_requests(
    redis_url: str, redis_conn: Redis, settings: Settings, browser: str
) -> None:
    """The shell sets a consent cookie that the app's XHRs need: the browser's requests, made by
    the fetcher, send the site's jar and update it (``cookies = True``)."""
    settings = dataclasses.replace(settings, browser_path=browser, sites={"spa": {"interval": 0.05}})
    with SpaSite(products=3, consent=True) as site:
        spider = SPIDER_SOURCE.format(name="spa", url=site.url + "/", render=True).replace(
            "    render = True\n", "    render = True\n    cookies = True\n"
        )
        (Path(settings.sites_dir) / "spa.py").write_text(spider)
        crawl_in_processes(settings, redis_url, redis_conn, site.url + "/")
        assert items_by_key(settings.database_url, "spa") == site.expected_items()


def test_a_crawl_without_rendering_never_starts_a_browser(
    redis_url: str, redis_conn: Redis, settings: Settings, counted_browser: tuple[str, Path]
) -> None:
    path, starts = counted_browser
    settings = dataclasses.replace(settings, browser_path=path, sites={"spa": {"interval": 0.02}})
    with SpaSite(products=3) as site:
        write_spider(settings, site, render=False)
        crawl_in_processes(settings, redis_url, redis_conn, site.url + "/ssr/")
        paths = site.paths()
    assert "/ssr/" in paths  # crawled: the shell's links are not there without a browser, so that is all
    assert not starts.exists(), starts.read_text()


def test_a_render_that_times_out_is_retried_then_recorded_failed(
    redis_conn: Redis, settings: Settings, browser: str
) -> None:
    settings = dataclasses.replace(settings, timeout=2.0, max_retries=1, backoff=0.1, sites={"spa": {"interval": 0.02}})
    with SpaSite(products=2, hang="/product/2") as site:
        write_spider(settings, site, render=True)
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("spa"), [site.url + "/"])
            threads, stop = start_in_threads(redis_conn, 1, 1, sites=("spa",))
            join_all(threads, stop)
            rows = [r for r in rt.store.fetch_rows("spa") if r["url"] == site.url + "/product/2"]
    outcomes = [r["outcome"] for r in rows if r["kind"] == "download"]
    assert outcomes == [RETRY, FAILED], rows
    assert "render timed out" in (rows[-1]["error"] or "") and "h1.name" in rows[-1]["error"], rows[-1]
    assert set(items_by_key(settings.database_url, "spa")) == {"SPA-0001"}


def crawler_cli(redis_url: str, settings: Settings, *args: str, env: dict[str, str] | None = None) -> Result:
    base = ["--redis-url", redis_url, "--database-url", settings.database_url, "--sites", settings.sites_dir]
    return CliRunner().invoke(cli, [*base, *args], env={"CRAWLER_BROWSER_PATH": "", **(env or {})})


def test_fetch_render_shows_the_rendered_page(redis_url: str, settings: Settings, browser: str) -> None:
    with SpaSite(products=3) as site:
        fetch = ("fetch", "--site", "demo", site.url + "/")  # the bundled demo allows loopback
        result = crawler_cli(redis_url, settings, *fetch, "--render", "--render-wait", "a.product")
        plain = crawler_cli(redis_url, settings, *fetch)
    assert result.exit_code == 0, result.output
    assert 'href="/product/3"' in result.stdout and "Loading..." not in result.stdout
    assert plain.exit_code == 0 and "Loading..." in plain.stdout and "/product/3" not in plain.stdout


def test_fetch_render_without_a_browser_is_a_one_line_error(redis_url: str, settings: Settings, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-chromium")
    with SpaSite(products=1) as site:
        result = crawler_cli(
            redis_url,
            settings,
            "fetch",
            "--site",
            "demo",
            site.url + "/",
            "--render",
            env={"CRAWLER_BROWSER_PATH": missing},
        )
    assert_one_line_error(result, "no-chromium", "not an executable file")


# -- the renderer alone -----------------------------------------------------------------


def direct_visit(fetcher: Fetcher) -> Visit:
    return Visit(fetch=lambda url, headers, wait, is_page: fetcher.get(url, headers=headers), domains=["127.0.0.1"])


def browsers_of_this_process() -> list[int]:
    """Pids of the browsers this process's Playwright driver started (its children's children)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    drivers = {pid for pid, parent in parents.items() if parent == os.getpid()}
    return [pid for pid, parent in parents.items() if parent in drivers]


def test_a_crashed_browser_is_restarted_for_the_next_page(browser: str) -> None:
    fetcher = Fetcher(10.0, 1_000_000, "test")
    renderer = Renderer(browser)
    try:
        with SpaSite(products=2) as site:
            first = renderer.render(site.url + "/product/1", direct_visit(fetcher), "h1.name", 10.0, 1_000_000)
            killed = browsers_of_this_process()
            assert killed
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            second = renderer.render(site.url + "/product/2", direct_visit(fetcher), "h1.name", 10.0, 1_000_000)
    finally:
        renderer.close()
        fetcher.close()
    assert b"Widget 1" in first.body and b"Widget 2" in second.body
    assert renderer.launches == 2


def test_a_dom_over_the_body_cap_is_refused(browser: str) -> None:
    fetcher = Fetcher(10.0, 1_000_000, "test")
    renderer = Renderer(browser)
    try:
        with SpaSite(products=300) as site:
            with pytest.raises(BodyTooLarge, match="rendered DOM over 10,000 bytes"):
                # The shell is under the cap; the DOM the script writes from the JSON is not.
                renderer.render(site.url + "/", direct_visit(fetcher), "a.product", 10.0, 10_000)
    finally:
        renderer.close()
        fetcher.close()


MIXED = """
from crawler import Request, Spider


class Spa(Spider):
    name = "spa"
    start_urls = ["{url}/ssr/"]
    allowed_domains = ["127.0.0.1"]
    item_key = "sku"

    def parse(self, page):
        # A plain page; one link of it needs the browser.
        yield Request("{url}/product/2", self.parse_product, render=True, render_wait="#app h1.name")

    def parse_product(self, page):
        yield {{"sku": page.text(".sku"), "name": page.text("h1.name"), "price": float(page.text(".price"))}}
"""


def test_one_request_rendered_on_a_site_that_does_not_render(
    redis_conn: Redis, settings: Settings, browser: str
) -> None:
    settings = dataclasses.replace(settings, sites={"spa": {"interval": 0.02}})
    with SpaSite(products=2) as site:
        (Path(settings.sites_dir) / "spa.py").write_text(MIXED.format(url=site.url))
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("spa"), [site.url + "/ssr/"])
            threads, stop = start_in_threads(redis_conn, 1, 1, sites=("spa",))
            join_all(threads, stop)
        paths = site.paths()
    assert items_by_key(settings.database_url, "spa") == {"SPA-0002": site.expected_items()["SPA-0002"]}
    assert "/api/product/2" in paths and "/app.js" in paths  # the product page's script ran
    assert paths.count("/ssr/") == 1 and "/api/v2/products" not in paths


def test_shell_render_binds_the_rendered_page(redis_url: str, settings: Settings, browser: str) -> None:
    with SpaSite(products=2) as site:
        shell = ["shell", "demo", site.url + "/product/2", "--render", "--render-wait", "h1.name"]
        base = ["--redis-url", redis_url, "--database-url", settings.database_url, "--sites", settings.sites_dir]
        result = CliRunner().invoke(cli, [*base, *shell], input='print("name:", page.text("h1.name"))\n')
    assert result.exit_code == 0, result.output
    assert "name: Widget 2" in result.output


def test_a_rendered_page_with_no_browser_is_recorded_failed_with_the_reason(
    redis_conn: Redis, settings: Settings, tmp_path: Path
) -> None:
    settings = dataclasses.replace(
        settings, browser_path=str(tmp_path / "no-chromium"), sites={"spa": {"interval": 0.02}}
    )
    with SpaSite(products=1) as site:
        write_spider(settings, site, render=True)
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("spa"), [site.url + "/"])
            threads, stop = start_in_threads(redis_conn, 1, 1, sites=("spa",))
            join_all(threads, stop)
            rows = [r for r in rt.store.fetch_rows("spa") if r["url"] == site.url + "/"]
        paths = site.paths()
    assert [r["outcome"] for r in rows] == [FAILED], rows
    assert "no-chromium' is not an executable file" in rows[0]["error"]
    assert paths == ["/robots.txt"]  # the page itself was never requested
