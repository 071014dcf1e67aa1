"""Rendered pages: a loopback single-page app crawled through a real Chromium (Playwright).

The app (``crawler.demo.spa``) writes its product links and products from JSON with a
script; its stylesheet, image and third-party script (on 127.0.0.2) must never be
requested, and its requests must be spaced by the site's interval at the server.

Needs Playwright and a Chromium (``apt-get install chromium``); the tests skip without
them, unless ``CRAWLER_REQUIRE_BROWSER=1`` (set by ``.ci/run``), which makes them fail.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from crawling import assert_one_line_error, installed_runtime, items_by_key, join_all, start_in_threads
from redis import Redis

from crawler.cli.app import cli
from crawler.coord.frontier import seed
from crawler.demo.spa import SPIDER_SOURCE, SpaSite
from crawler.errors import BodyTooLarge, FetchTimeout
from crawler.http.fetch import Fetcher, Response
from crawler.settings import Settings
from crawler.store.database import FAILED, OK, REDIRECT, RETRY, Store
from crawler.work.chromium import BrowserNotFound, find_browser
from crawler.work.launcher import WorkerSpec, start_workers, stop_workers, wait_for
from crawler.work.render import RENDER_GRACE, Renderer, RenderFailed
from crawler.work.render_requests import Visit
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
    # 4 s: the other pages' renders (a cold context's first among them) fit in it under a loaded suite's run.
    settings = dataclasses.replace(settings, timeout=4.0, max_retries=1, backoff=0.1, sites={"spa": {"interval": 0.02}})
    with SpaSite(products=2, hang="/product/2") as site:
        write_spider(settings, site, render=True)
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("spa"), [site.url + "/"])
            threads, stop = start_in_threads(rt, 1, 1, sites=("spa",))
            join_all(threads, stop)
            rows = [r for r in rt.store.fetch_rows("spa") if r["url"] == site.url + "/product/2"]
    outcomes = [r["outcome"] for r in rows if r["kind"] == "download"]
    assert outcomes == [RETRY, FAILED], rows
    assert "render timed out" in (rows[-1]["error"] or "") and "h1.name" in rows[-1]["error"], rows[-1]
    assert set(items_by_key(settings.database_url, "spa")) == {"SPA-0001"}


def pages_open_at_once(paths: list[str]) -> int:
    """Most product pages open at the same time on the wire: a page is open from its own request's
    arrival to its API request's (its script's XHR, the render's last request)."""
    open_pages: set[str] = set()
    most = 0
    for path in paths:
        if path.startswith("/product/"):
            open_pages.add(path.removeprefix("/product/"))
        elif path.startswith("/api/product/"):
            open_pages.discard(path.removeprefix("/api/product/"))
        most = max(most, len(open_pages))
    return most


def test_several_pages_render_at_once_in_one_process_each_request_still_spaced_by_the_gate(
    redis_conn: Redis, settings: Settings, browser: str
) -> None:
    """Four download threads of one process render their pages at once in its one browser (the
    pages of one site's context, reused): the pages' requests interleave on the wire, yet no two
    arrive closer than the site's interval."""
    interval = 0.1
    settings = dataclasses.replace(settings, browser_path=browser, sites={"spa": {"interval": interval}})
    with SpaSite(products=8) as site:
        write_spider(settings, site, render=True)
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("spa"), [site.url + "/"])
            threads, stop = start_in_threads(rt, 4, 1, sites=("spa",))
            join_all(threads, stop)
            launches = rt.renderer.launches
        assert items_by_key(settings.database_url, "spa") == site.expected_items()
        paths = [a.path for a in sorted(site.arrivals, key=lambda a: a.time)]
        gap = site.min_gap()
    assert pages_open_at_once(paths) >= 2, paths
    assert gap is not None and gap >= interval, f"two requests {gap * 1000:.1f} ms apart"
    assert launches == 1


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
    return Visit(
        fetch=lambda url, headers, wait, is_page: fetcher.get(url, headers=headers, timeout=wait), domains=["127.0.0.1"]
    )


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


#: A page whose script keeps working after its content is written: an interval and animation frames
#: that count, and a request every 20 ms; it also keeps a mark in the site's storage.
BUSY_PAGE = b"""<!doctype html><html><body><div id="app"></div><script>
window.ticks = 0; window.frames = 0;
localStorage.setItem("seen", (localStorage.getItem("seen") || "") + location.pathname + " ");
setInterval(() => { window.ticks++; fetch("/tick?" + window.ticks).catch(() => {}); }, 20);
(function frame() { window.frames++; requestAnimationFrame(frame); })();
setTimeout(() => { document.getElementById("app").innerHTML =
  '<h1 class="name">busy</h1><p class="seen">' + localStorage.getItem("seen") + '</p>'; }, 50);
</script></body></html>"""


def recording_visit(fetcher: Fetcher, site: str | None, fetched: list[str]) -> Visit:
    def fetch(url: str, headers: Any, wait: float, is_page: bool) -> Response:
        fetched.append(url)
        return fetcher.get(url, headers=headers, timeout=wait)

    return Visit(fetch=fetch, domains=["127.0.0.1"], site=site)


@pytest.fixture
def fetcher() -> Iterator[Fetcher]:
    made = Fetcher(10.0, 1_000_000, "test")
    yield made
    made.close()


@pytest.fixture
def renderer(browser: str) -> Iterator[Renderer]:
    """A renderer of one page at a time (its renders share one page of each site's context)."""
    made = Renderer(browser, pages=1)
    yield made
    made.close()


def test_a_page_kept_for_its_sites_next_render_runs_nothing_of_the_last_document(
    renderer: Renderer, fetcher: Fetcher
) -> None:
    """Between two renders of a site its page is kept, its document stopped and emptied: the busy
    page's interval and animation frames count no more while the page waits, and the site's next
    render (in that page, which its storage shows) gets only its own requests."""
    second: list[str] = []

    def idle_page_counts() -> tuple[Any, Any]:
        (site,) = renderer._sites.values()
        (tab,) = site.idle
        assert renderer._loop is not None
        reading = tab.page.evaluate("[window.ticks, window.frames, document.documentElement === null]")
        return asyncio.run_coroutine_threadsafe(reading, renderer._loop).result(5)

    with SpaSite(products=1, pages={"/busy": ("text/html", BUSY_PAGE)}) as site:
        busy = renderer.render(site.url + "/busy", recording_visit(fetcher, "s", []), "h1.name", 10.0, 1_000_000)
        before = idle_page_counts()
        time.sleep(0.3)  # some 15 ticks and 18 frames, had they run on
        after = idle_page_counts()
        again = renderer.render(site.url + "/busy", recording_visit(fetcher, "s", second), "h1.name", 10.0, 1_000_000)
    assert b"busy" in busy.body
    assert before == after and before[2] is True, (before, after)
    assert second[0] == site.url + "/busy"
    ticks = [int(url.rsplit("?", 1)[1]) for url in second[1:]]
    assert ticks == list(range(1, len(ticks) + 1)), second  # its own interval's, from 1
    assert b"/busy /busy" in again.body  # the same site's page and storage, reused


def test_sites_rendered_in_turn_share_no_storage_and_each_keeps_its_own(renderer: Renderer, fetcher: Fetcher) -> None:
    """Each site's pages are its own browser context's: a mark one site's page keeps in storage is
    there for its next render, never for another site's."""
    bodies: dict[str, list[bytes]] = {"a": [], "b": []}
    with SpaSite(products=1, pages={"/busy": ("text/html", BUSY_PAGE)}) as site:
        for name in ("a", "b", "a", "b"):
            response = renderer.render(
                site.url + "/busy", recording_visit(fetcher, name, []), "h1.name", 10.0, 1_000_000
            )
            bodies[name].append(response.body)
    for name in ("a", "b"):
        first, second = bodies[name]
        assert b'<p class="seen">/busy </p>' in first, first
        assert b'<p class="seen">/busy /busy </p>' in second, second


def test_a_render_wait_that_is_no_css_selector_fails_the_render_in_one_line(
    renderer: Renderer, fetcher: Fetcher
) -> None:
    with SpaSite(products=1) as site:
        with pytest.raises(RenderFailed, match="render failed: SyntaxError") as failed:
            renderer.render(site.url + "/product/1", direct_visit(fetcher), "h1..name", 10.0, 1_000_000)
        after = renderer.render(site.url + "/product/1", direct_visit(fetcher), "h1.name", 10.0, 1_000_000)
    assert "\n" not in str(failed.value)
    assert b"Widget 1" in after.body


def test_a_render_wait_for_a_selector_that_never_matches_times_out_by_the_deadline(
    renderer: Renderer, fetcher: Fetcher
) -> None:
    with SpaSite(products=1) as site:
        renderer.render(site.url + "/product/1", direct_visit(fetcher), "h1.name", 10.0, 1_000_000)
        start = time.monotonic()
        # A deadline the page's load is well within even on a loaded machine (at 1.5 s the load itself ran
        # out once in a full run): the time out comes in the wait for the selector.
        with pytest.raises(FetchTimeout, match="render timed out after .* waiting for 'h2.never'"):
            renderer.render(site.url + "/product/1", direct_visit(fetcher), "h2.never", 4.0, 1_000_000)
        took = time.monotonic() - start
    assert 3.9 < took < 4.0 + RENDER_GRACE


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
            threads, stop = start_in_threads(rt, 1, 1, sites=("spa",))
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
            threads, stop = start_in_threads(rt, 1, 1, sites=("spa",))
            join_all(threads, stop)
            rows = [r for r in rt.store.fetch_rows("spa") if r["url"] == site.url + "/"]
        paths = site.paths()
    assert [r["outcome"] for r in rows] == [FAILED], rows
    assert "no-chromium' is not an executable file" in rows[0]["error"]
    assert paths == ["/robots.txt"]  # the page itself was never requested


# -- a render's bounds: its deadline, and no way out but the fetcher ---------------------


class TimedRenderer(Renderer):
    """A Renderer that keeps how long each ``render`` call took, in seconds (``took``)."""

    def __init__(self, browser_path: str | None = None):
        super().__init__(browser_path)
        self.took: list[float] = []

    def render(self, *args: Any, **kwargs: Any) -> Response:
        start = time.monotonic()
        try:
            return super().render(*args, **kwargs)
        finally:
            self.took.append(time.monotonic() - start)


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a thread of its own: what it returns or raises, or a test failure if it has
    not returned after ``seconds`` (a render that never ends must not hang the suite)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # any: re-raised in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds:g}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_a_render_whose_scripts_come_late_ends_by_its_deadline_and_is_recorded_timed_out(
    redis_conn: Redis, settings: Settings, browser: str
) -> None:
    """Five scripts that the server answers a minute late: each routed fetch gets only what is
    left of the render's one deadline, not a whole ``timeout`` of its own."""
    timeout = 2.0
    settings = dataclasses.replace(
        settings, browser_path=browser, timeout=timeout, max_retries=0, sites={"spa": {"interval": 0.02}}
    )
    fetcher = Fetcher(10.0, 1_000_000, "test")
    try:
        with SpaSite(products=1) as site:
            write_spider(settings, site, render=True)
            with installed_runtime(redis_conn, settings) as rt:
                renderer = rt.renderer = TimedRenderer(browser)  # type: ignore[misc]
                # The browser started beforehand: its start is not part of the render timed.
                renderer.render(site.url + "/product/1", direct_visit(fetcher), "h1.name", 10.0, 1_000_000)
                seed(rt.frontier("spa"), [site.url + "/slow-scripts"])
                threads, stop = start_in_threads(rt, 1, 1, sites=("spa",))
                join_all(threads, stop)
                rows = [r for r in rt.store.fetch_rows("spa") if r["url"] == site.url + "/slow-scripts"]
    finally:
        fetcher.close()
    assert [r["outcome"] for r in rows] == [FAILED], rows
    assert "render timed out" in (rows[0]["error"] or ""), rows[0]
    took = renderer.took[1]
    assert took < timeout + RENDER_GRACE + 1.0, f"the render took {took:.1f}s for a limit of {timeout:g}s"


def test_a_page_whose_script_never_yields_is_cut_at_its_deadline_and_the_next_page_renders(browser: str) -> None:
    """Loaded, its network idle, the page's thread taken by a script for good: taking its DOM
    waits forever (it takes no timeout), so the browser is killed past the deadline."""
    timeout = 2.0
    fetcher = Fetcher(10.0, 1_000_000, "test")
    renderer = Renderer(browser)
    try:
        with SpaSite(products=1) as site:
            renderer.render(site.url + "/product/1", direct_visit(fetcher), "h1.name", 10.0, 1_000_000)
            start = time.monotonic()
            with pytest.raises(FetchTimeout, match="render timed out: still running"):
                within(60, lambda: renderer.render(site.url + "/spin", direct_visit(fetcher), None, timeout, 1_000_000))
            took = time.monotonic() - start
            after = renderer.render(site.url + "/product/1", direct_visit(fetcher), "h1.name", 10.0, 1_000_000)
    finally:
        renderer.close()
        fetcher.close()
    assert took < timeout + RENDER_GRACE + 1.0, f"the render took {took:.1f}s for a limit of {timeout:g}s"
    assert b"Widget 1" in after.body
    assert renderer.launches == 2


#: An address outside the allowed domains (127.0.0.1), where a page's escapes are listened for.
ELSEWHERE = "127.0.0.3"

#: A worker's script: a WebSocket and a fetch of its own (``route`` sees neither from a shared or service worker).
WORKER_JS = """
new WebSocket('WS_URL');
try { fetch('FETCH_URL').catch(() => {}); } catch (e) {}
if (self.postMessage) postMessage('tried');
"""

#: A page that tries every way out of a render that does not go through ``route``.
ESCAPES_PAGE = """<!doctype html><html><head><title>escapes</title></head><body><div id="log"></div><script>
const log = (line) => document.getElementById('log').insertAdjacentHTML('beforeend', '<p>' + line + '</p>');
const attempt = (name, how) => {{
  try {{ how(); log(name + ' tried'); }} catch (e) {{ log(name + ' failed: ' + e); }}
}};
const worker = (kind) => URL.createObjectURL(new Blob([{workers}[kind]], {{type: 'text/javascript'}}));
attempt('page websocket', () => new WebSocket('ws://{host}:{ports[ws_page]}/'));
attempt('dedicated worker', () => {{ new Worker(worker('dedicated')).onmessage = (e) => log('script ' + e.data); }});
attempt('shared worker', () => {{ new SharedWorker(worker('shared')).port.start(); }});
attempt('service worker', () => {{
  navigator.serviceWorker.register('/sw.js').catch(() => {{}});
  const frame = document.createElement('iframe');  // a realm Playwright's blocking script may miss
  document.body.appendChild(frame);
  frame.contentWindow.navigator.serviceWorker.register('/sw.js').catch(() => {{}});
}});
attempt('webrtc', () => {{
  const pc = new RTCPeerConnection({{iceServers: [
    {{urls: 'stun:{host}:{ports[stun]}'}},
    {{urls: 'turn:{host}:{ports[turn_tcp]}?transport=tcp', username: 'u', credential: 'p'}}]}});
  pc.createDataChannel('x');
  pc.createOffer().then((offer) => pc.setLocalDescription(offer));
}});
attempt('webtransport', () => new WebTransport('https://{host}:{ports[webtransport]}/').ready.catch(() => {{}}));
setTimeout(() => document.body.setAttribute('data-done', ''), 2500);
</script></body></html>
"""


class Listeners:
    """Sockets on ELSEWHERE, one for each way out, counting the connections and bytes that reach them."""

    TCP = ("ws_page", "ws_dedicated", "ws_shared", "ws_service", "worker_fetch", "turn_tcp")
    UDP = ("stun", "webtransport")

    def __init__(self) -> None:
        self.received: dict[str, int] = {}
        self.ports: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        for name in self.TCP + self.UDP:
            sock = socket.socket(type=socket.SOCK_STREAM if name in self.TCP else socket.SOCK_DGRAM)
            sock.bind((ELSEWHERE, 0))
            if name in self.TCP:
                sock.listen(8)
            self._sockets.append(sock)
            self.ports[name] = sock.getsockname()[1]
            serve = self._accept if name in self.TCP else self._receive
            threading.Thread(target=serve, args=(sock, name), daemon=True).start()

    def _note(self, name: str, what: str, count: int) -> None:
        with self._lock:
            self.received[f"{name} {what}"] = self.received.get(f"{name} {what}", 0) + count

    def _accept(self, sock: socket.socket, name: str) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self._note(name, "connections", 1)
            threading.Thread(target=self._read, args=(conn, name), daemon=True).start()

    def _read(self, conn: socket.socket, name: str) -> None:
        with conn:
            while data := conn.recv(65536):
                self._note(name, "bytes", len(data))

    def _receive(self, sock: socket.socket, name: str) -> None:
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            self._note(name, "bytes", len(data))

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


def test_a_rendered_page_sends_no_byte_but_through_the_fetcher(browser: str) -> None:
    """A page, its dedicated, shared and service workers try every way out that ``route`` does not
    see (WebSockets, a worker's fetch, WebRTC's STUN over UDP and TURN over TCP, WebTransport over
    UDP) towards listeners outside the allowed domains: none receives a connection or a byte."""
    listeners = Listeners()
    host, ports = ELSEWHERE, listeners.ports

    def worker_js(kind: str) -> str:
        ws, fetched = f"ws://{host}:{ports['ws_' + kind]}/", f"http://{host}:{ports['worker_fetch']}/{kind}"
        return WORKER_JS.replace("WS_URL", ws).replace("FETCH_URL", fetched)

    workers = json.dumps({kind: worker_js(kind) for kind in ("dedicated", "shared")})
    page = ESCAPES_PAGE.format(host=host, ports=ports, workers=workers)
    pages = {
        "/escapes": ("text/html", page.encode()),
        "/sw.js": ("application/javascript", worker_js("service").encode()),
    }
    fetcher = Fetcher(10.0, 1_000_000, "test")
    renderer = Renderer(browser)
    visit = direct_visit(fetcher)
    try:
        with SpaSite(products=1, pages=pages) as site:
            rendered = renderer.render(site.url + "/escapes", visit, "body[data-done]", 20.0, 1_000_000)
            time.sleep(0.5)  # for a late packet
    finally:
        renderer.close()
        fetcher.close()
        listeners.close()
    body = rendered.body.decode()
    for tried in ("page websocket", "dedicated worker", "script", "shared worker", "service worker", "webrtc"):
        assert f"{tried} tried" in body, body  # each way out was tried
    assert listeners.received == {}, listeners.received
