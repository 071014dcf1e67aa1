"""Rendering pages in a headless Chromium (Playwright), for sites whose content JavaScript writes.

One browser per process, started on the first rendered page only and restarted if it
dies; a new browser context per page, so no cookie or storage passes from one page to the
next. Every request the page makes goes through ``Visit.fetch`` or is aborted: the
browser itself never opens a connection. Requests of a blocked resource type (images,
fonts, media, stylesheets by default), other than GET, outside the allowed domains, and
websockets are aborted; the rest are fetched by the crawler's own fetcher (its address
rules, body cap and proxies) through the site's gate, and handed to the browser
(``route.fulfill``). A redirect of the page itself ends the render: the download job sends
its target through the frontier, as for a plain fetch; a script's or an XHR's redirect is
followed here, each hop checked and fetched the same way.

Two bounds hold whatever the page does:

- **Time.** A render has one deadline, ``timeout`` seconds, that its context, navigation,
  waits and routed fetches share: each fetch (gate wait included) gets only what is left of
  it. The steps Playwright gives no timeout (``page.content()``, closing the context), which
  a script that never yields holds forever, are cut by a watchdog that kills the browser
  ``RENDER_GRACE`` seconds past the deadline; the page is a FetchTimeout either way.
- **Network.** No byte leaves the browser but through ``route`` and the fetcher: it is
  launched (``_confinement``) with every connection of its own sent to a proxy at a local
  port that refuses it, loopback included (a dedicated, shared or service worker's
  WebSocket or fetch, which ``route`` does not see, WebRTC's TURN over TCP), WebRTC kept
  off UDP outside a proxy (STUN), and no host name resolved. Page WebSockets are answered
  by ``route_web_socket`` and never connected.

Playwright's sync API is not thread-safe, so the browser lives in one thread of its own
(``Renderer``), and the worker threads of a download process hand it their pages in turn.
Playwright is an optional dependency (``pip install -e '.[browser]'``): imported when the
first page is rendered.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import logging
import os
import queue
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin

from ..errors import BodyTooLarge, ConfigError, CrawlerError, FetchTimeout, RefusedURL, TransientError
from ..http.fetch import Response
from ..urls import check_url

log = logging.getLogger("crawler.render")

#: Resource types (Playwright's names) aborted unless a spider says otherwise (``Spider.render_block``).
DEFAULT_BLOCK = ("image", "font", "media", "stylesheet")
#: Executables looked for on ``PATH`` when no ``browser_path`` is set, in order.
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Redirect hops of one script or XHR followed inside a render.
MAX_SUBRESOURCE_REDIRECTS = 5
#: Request headers of the browser not passed on to the fetcher (it sets its own, or they are per connection).
DROPPED_REQUEST_HEADERS = frozenset({"accept-encoding", "user-agent", "host", "connection", "content-length"})
#: Response headers not handed to the browser: the body it gets is decoded and whole.
DROPPED_RESPONSE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection"})
#: Seconds a render may run past its deadline before its browser is killed (a render ends within
#: ``timeout`` plus about this much): ``page.content()`` and closing a context take no timeout.
RENDER_GRACE = 1.0


class BrowserNotFound(ConfigError):
    """No Chromium to render with, or Playwright is not installed."""


class RenderFailed(TransientError):
    """The browser failed or died during a render (it is restarted for the next page)."""


def find_browser(browser_path: str | None = None) -> str:
    """The Chromium executable: ``browser_path`` if given, else the first of BROWSER_NAMES on ``PATH``.

    Raises BrowserNotFound, with a one-line message saying what to do, when there is none.
    """
    if browser_path:
        if os.path.isfile(browser_path) and os.access(browser_path, os.X_OK):
            return browser_path
        raise BrowserNotFound(f"browser_path {browser_path!r} is not an executable file")
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise BrowserNotFound(
        "no Chromium found for rendering: install it (Debian/Ubuntu: apt-get install chromium) "
        "or set browser_path / CRAWLER_BROWSER_PATH"
    )


@dataclass
class Visit:
    """What one render may fetch, and how.

    ``fetch(url, headers, wait, is_page)`` fetches one request the page makes (through the
    site's gate, leaving a fetch record for the page's requests but not for the page itself,
    whose record is the download job's) and returns the response, or raises a
    ``CrawlerError``, within ``wait`` seconds, the gate's wait and the request together:
    what is left of the render's deadline. ``domains``: requests elsewhere are
    aborted; ``block``: resource types aborted.
    """

    fetch: Callable[[str, Mapping[str, str], float, bool], Response]
    domains: list[str]
    block: frozenset[str] = frozenset(DEFAULT_BLOCK)
    user_agent: str | None = None
    #: What the page asked for and was not let fetch: (resource type, URL, why); for ``crawler fetch --render``.
    aborted: list[tuple[str, str, str]] = field(default_factory=list)


class _Navigation:
    """What the page's own request came to, read after ``goto``."""

    def __init__(self) -> None:
        #: The page's response when it is not to be rendered (a redirect, an error status, not HTML).
        self.unrendered: Response | None = None
        #: Why the page's own request failed.
        self.error: CrawlerError | None = None
        self.response: Response | None = None


class Renderer:
    """One headless Chromium for this process, in a thread of its own, started on first use.

    ``render`` may be called from any thread; pages are rendered one at a time.
    ``launches`` counts the browsers started (a crash makes another).
    """

    def __init__(self, browser_path: str | None = None):
        self.browser_path = browser_path
        self.launches = 0
        self._jobs: queue.Queue[tuple[concurrent.futures.Future[Response], tuple[Any, ...]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._browser: Any = None
        self._browser_pid: int | None = None
        #: A local port bound and never listened on: the browser's proxy, which refuses every connection.
        self._refuser: socket.socket | None = None
        self._pid = os.getpid()

    def render(self, url: str, visit: Visit, wait_for: str | None, timeout: float, max_bytes: int) -> Response:
        """Load ``url`` in a fresh context and return its DOM as an HTML ``Response`` (utf-8).

        The DOM is taken once ``wait_for`` (a CSS selector) is in it, or, without one, once
        the network has been idle for 500 ms after the load event (or at the deadline, if it
        never is). The render ends within ``timeout`` seconds (plus ``RENDER_GRACE`` at most),
        a FetchTimeout when it is not done by then; a DOM over ``max_bytes`` (utf-8) is BodyTooLarge.
        A page whose own response is a redirect, an error status or not HTML is returned
        unrendered, as fetched.
        """
        future: concurrent.futures.Future[Response] = concurrent.futures.Future()
        self._start()
        self._jobs.put((future, (url, visit, wait_for, timeout, max_bytes)))
        return future.result()

    def close(self) -> None:
        """Close the browser and stop its thread (a no-op when none was started)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout=30)
        if self._refuser is not None:
            self._refuser.close()
            self._refuser = None

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._pid != os.getpid():  # forked: the thread stayed in the parent
                self._thread, self._browser = None, None
                self._jobs = queue.Queue()
            if self._thread is None:
                # One-line errors in the caller's thread, before anything starts.
                if importlib.util.find_spec("playwright") is None:
                    raise BrowserNotFound("rendering needs Playwright: pip install -e '.[browser]'")
                find_browser(self.browser_path)
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="renderer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        from playwright.sync_api import sync_playwright

        try:
            with sync_playwright() as playwright:
                while (job := self._jobs.get()) is not None:
                    future, args = job
                    if not future.set_running_or_notify_cancel():
                        continue
                    try:
                        future.set_result(self._render_fresh(playwright, *args))
                    except BaseException as exc:  # any: it belongs to the thread that asked
                        future.set_exception(exc)
                if self._browser is not None and self._browser.is_connected():
                    self._browser.close()
        except Exception as exc:  # Playwright's driver did not start, or died: no page waits for it forever
            self._fail_all(RenderFailed(f"Playwright failed: {str(exc).splitlines()[0] if str(exc) else exc!r}"))

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            self._thread = None
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job[0].set_exception(error)

    def _render_fresh(
        self, playwright: Any, url: str, visit: Visit, wait_for: str | None, timeout: float, max_bytes: int
    ) -> Response:
        """``_render`` in a connected browser (started if there is none, restarted if it died), killed
        if the render is not over ``RENDER_GRACE`` past its deadline (a FetchTimeout)."""
        from playwright.sync_api import Error

        for attempt in (1, 2):
            if self._browser is None or not self._browser.is_connected():
                self._launch(playwright)
            deadline = time.monotonic() + timeout
            with _Watchdog(self._browser, self._browser_pid, deadline + RENDER_GRACE) as watchdog:
                try:
                    context = self._browser.new_context(user_agent=visit.user_agent, service_workers="block")
                except Error as exc:  # the browser died between two pages: once more with a new one
                    self._browser = None
                    if watchdog.fired:
                        raise _overran(timeout) from exc
                    if attempt == 2:
                        raise RenderFailed(f"browser failed: {exc}") from exc
                    continue
                try:
                    return _render(context, url, visit, wait_for, deadline, timeout, max_bytes)
                except (Error, RenderFailed) as exc:
                    if watchdog.fired:
                        raise _overran(timeout) from exc
                    if isinstance(exc, Error):  # the browser died as the DOM was taken
                        raise RenderFailed(f"render failed: {str(exc).splitlines()[0]}") from exc
                    raise
                finally:
                    try:
                        context.close()
                    except Error:  # the browser died during the render: the next page starts another
                        self._browser = None
                    if watchdog.fired:
                        self._browser = None
        raise AssertionError("unreachable")

    def _launch(self, playwright: Any) -> None:
        executable = find_browser(self.browser_path)
        if self._refuser is None:
            self._refuser = socket.socket()
            self._refuser.bind(("127.0.0.1", 0))  # never listened on: a connection to it is refused
        try:
            args = _confinement(self._refuser.getsockname()[1])
            self._browser = playwright.chromium.launch(executable_path=executable, headless=True, args=args)
            self._browser_pid = _browser_pid(self._browser)
        except Exception as exc:  # Playwright's Error: the browser did not start
            raise RenderFailed(f"browser {executable} did not start: {str(exc).splitlines()[0]}") from exc
        if self._browser_pid is None:
            log.warning("browser %s gave no process id: a render past its deadline cannot be cut", executable)
        self.launches += 1
        log.info("browser started: %s", executable)


def _confinement(refusing_port: int) -> list[str]:
    """Chromium's switches that leave a page no way out but ``route``: the browser's own connections
    (and WebRTC's over TCP) go to a proxy at ``refusing_port`` on loopback, which refuses them,
    loopback addresses included (``<-loopback>``, else bypassed); WebRTC sends no UDP outside a proxy
    (the ``webrtc.ip_handling_policy`` preference); no host name is resolved."""
    return [
        f"--proxy-server=http://127.0.0.1:{refusing_port}",
        "--proxy-bypass-list=<-loopback>",
        "--webrtc-ip-handling-policy=disable_non_proxied_udp",
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ]


def _browser_pid(browser: Any) -> int | None:
    """The browser process's id, as Chromium gives it (``SystemInfo.getProcessInfo``)."""
    session = browser.new_browser_cdp_session()
    try:
        processes = session.send("SystemInfo.getProcessInfo").get("processInfo", [])
    finally:
        session.detach()
    return next((p["id"] for p in processes if p.get("type") == "browser"), None)


class _Watchdog:
    """Kills the browser process ``pid`` at ``when`` (``time.monotonic()``) unless the ``with`` is left
    first; ``fired`` says it did."""

    def __init__(self, browser: Any, pid: int | None, when: float):
        self.fired = False
        self._browser, self._pid = browser, pid
        self._left = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, when - time.monotonic()), self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        if self._pid is not None:
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._left = True
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            # A browser that is gone already may have left its pid to another process.
            if self._left or self._pid is None or not self._browser.is_connected():
                return
            self.fired = True
            log.warning("render past its deadline: browser %d killed", self._pid)
            try:
                os.kill(self._pid, signal.SIGKILL)
            except OSError:
                pass


def _overran(timeout: float) -> FetchTimeout:
    return FetchTimeout(
        f"render timed out: still running {RENDER_GRACE:g}s past its limit of {timeout:g}s (browser killed)"
    )


def _render(
    context: Any, url: str, visit: Visit, wait_for: str | None, deadline: float, timeout: float, max_bytes: int
) -> Response:
    """Render ``url`` in ``context`` by ``deadline`` (``time.monotonic()``; see ``Renderer.render``)."""
    from playwright.sync_api import Error
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    started, clock = datetime.now(UTC), deadline - timeout
    navigation = _Navigation()
    page = context.new_page()
    context.route("**/*", lambda route: _route(route, page, visit, navigation, deadline))
    page.route_web_socket("**/*", lambda ws: None)  # never connected to a server
    loaded = False
    try:
        page.goto(url, timeout=_ms_left(deadline), wait_until="load")
        loaded = True
        if wait_for:
            page.wait_for_selector(wait_for, state="attached", timeout=_ms_left(deadline))
        else:
            page.wait_for_load_state("networkidle", timeout=_ms_left(deadline))
    except (PlaywrightTimeout, Error) as exc:
        if navigation.unrendered is not None:
            return navigation.unrendered
        if navigation.error is not None:
            raise navigation.error
        if isinstance(exc, PlaywrightTimeout):
            if not loaded or wait_for:  # loaded with no selector to wait for, the network never quiet: the DOM as is
                what = f"waiting for {wait_for!r}" if loaded else "loading"
                took = time.monotonic() - clock
                raise FetchTimeout(f"render timed out after {took:.1f}s {what} (limit {timeout:g}s)") from exc
        elif not page.is_closed() and context.browser and context.browser.is_connected():
            raise RenderFailed(f"render failed: {str(exc).splitlines()[0]}") from exc
        else:
            raise RenderFailed(f"browser died during the render: {str(exc).splitlines()[0]}") from exc
    html = page.content().encode("utf-8")
    if len(html) > max_bytes:
        raise BodyTooLarge(f"rendered DOM over {max_bytes:,} bytes ({len(html):,})")
    document = navigation.response
    headers = dict(document.headers) if document else {}
    headers["content-type"] = "text/html; charset=utf-8"
    return Response(
        url=page.url,
        status=document.status if document else 200,
        headers=headers,
        body=html,
        started=started,
        elapsed=time.monotonic() - clock,
        encoding="utf-8",
    )


def _ms_left(deadline: float) -> float:
    return max(1.0, (deadline - time.monotonic()) * 1000)


def _route(route: Any, page: Any, visit: Visit, navigation: _Navigation, deadline: float) -> None:
    """Fetch one request of the page through ``visit`` and hand the browser the answer, or abort it."""
    request = route.request
    is_page = request.is_navigation_request() and request.frame == page.main_frame
    try:
        why = _refusal(request, visit, is_page and navigation.response is None)
        if why is None and is_page and navigation.response is not None:
            why = "a second navigation of the page"  # script-driven: one render is one page
        if why is None and time.monotonic() >= deadline:
            why = "past the render's deadline"
        if why is not None:
            visit.aborted.append((request.resource_type, request.url, why))
            route.abort("blockedbyclient")
            return
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED_REQUEST_HEADERS}
        try:
            response = _fetch(request.url, headers, visit, deadline, is_page)
        except CrawlerError as exc:
            if is_page:
                navigation.error = exc
            route.abort("failed")
            return
        if is_page:
            navigation.response = response
            if not 200 <= response.status < 300 or not response.is_html:
                navigation.unrendered = response
                route.abort("aborted")
                return
        kept = {k: v for k, v in response.headers.items() if k not in DROPPED_RESPONSE_HEADERS}
        route.fulfill(status=response.status, headers=kept, body=response.body)
    except Exception as exc:  # the page may be gone (deadline): nothing to answer, and the render says why
        log.debug("request %s not answered: %s", request.url, exc)


def _refusal(request: Any, visit: Visit, is_page: bool) -> str | None:
    """Why ``request`` is not to be fetched, or None."""
    if not is_page and request.resource_type in visit.block:
        return f"{request.resource_type} blocked"
    if request.method != "GET":
        return f"{request.method} not sent"
    try:
        check_url(request.url, visit.domains)
    except RefusedURL as exc:
        return str(exc)
    return None


def _fetch(url: str, headers: Mapping[str, str], visit: Visit, deadline: float, is_page: bool) -> Response:
    """``visit.fetch``, following a script's or XHR's redirects (each hop checked); the page's own are not."""
    response = visit.fetch(url, headers, _time_left(deadline, url), is_page)
    hops = 0
    while not is_page and 300 <= response.status < 400 and response.location:
        hops += 1
        target = urljoin(url, response.location.strip())
        if hops > MAX_SUBRESOURCE_REDIRECTS:
            raise RefusedURL(f"more than {MAX_SUBRESOURCE_REDIRECTS} redirects from {url}")
        check_url(target, visit.domains)
        url, response = target, visit.fetch(target, headers, _time_left(deadline, target), False)
    return response


def _time_left(deadline: float, url: str) -> float:
    """Seconds left before the render's ``deadline`` for requesting ``url``; FetchTimeout when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchTimeout(f"the render's deadline passed before {url} was requested")
    return left


def rendering(spider: Any, meta: Mapping[str, Any]) -> tuple[bool, str | None]:
    """Whether a request is rendered, and the selector waited for: the request's ``render`` /
    ``render_wait`` (carried in its meta), else the spider's."""
    render = meta.get("render", getattr(spider, "render", False))
    wait = meta.get("render_wait", getattr(spider, "render_wait", None))
    return bool(render), (str(wait) if render and wait else None)
