"""The headless Chromium a renderer drives: found on disk, launched confined, killed when a render overruns.

Confined: the browser's own connections (and WebRTC's over TCP) go to a proxy on loopback
that refuses them, WebRTC sends no UDP outside a proxy, and no host name is resolved, so a
page has no way out but Playwright's ``route`` (``crawler.work.render``). Imports the
errors only; Playwright is the caller's.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from typing import Any

from ..errors import ConfigError

log = logging.getLogger("crawler.render")

#: Executables looked for on ``PATH`` when no ``browser_path`` is set, in order.
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Chromium's switches for CPU and memory, nothing the confinement relies on: a site's pages share
#: one renderer process (a browser context's processes are its own, whatever the limit).
SPEED_SWITCHES = ("--renderer-process-limit=1",)


class BrowserNotFound(ConfigError):
    """No Chromium to render with, or Playwright is not installed."""


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


def confinement(refusing_port: int) -> list[str]:
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


async def browser_pid(browser: Any) -> int | None:
    """The browser process's id, as Chromium gives it (``SystemInfo.getProcessInfo``)."""
    session = await browser.new_browser_cdp_session()
    try:
        processes = (await session.send("SystemInfo.getProcessInfo")).get("processInfo", [])
    finally:
        await session.detach()
    return next((p["id"] for p in processes if p.get("type") == "browser"), None)


class KillTimer:
    """Kills the browser process ``pid`` at ``when`` (``time.monotonic()``) unless the ``with`` is left
    first; ``fired`` says it did."""

    def __init__(self, browser: Any, pid: int | None, when: float):
        self.fired = False
        self._browser, self._pid = browser, pid
        self._left = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, when - time.monotonic()), self._fire)
        self._timer.daemon = True

    def __enter__(self) -> KillTimer:
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
