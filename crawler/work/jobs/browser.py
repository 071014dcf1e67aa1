"""The browser's requests for a rendered page: each through the site's gate, as a download sends one."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ...coord.session import Jar, uses_cookies
from ...errors import CrawlerError, FetchTimeout
from ...http.fetch import Response
from ...store.database import FAILED, OK
from .state import AttemptState, rearm


def browser_fetch(attempt: AttemptState) -> Callable[[str, Mapping[str, str], float, bool], Response]:
    """``Visit.fetch`` for a download: each request through the site's gate, as ``Attempt.fetch``
    sends one, with the site's headers and, for a site with cookies, its jar (updated from each
    answer); a record for each but the page's own (``Attempt.conclude`` writes that one)."""
    rt, task, spider, record = attempt.rt, attempt.task, attempt.spider, attempt.record
    proxy = rt.proxy(task.site)
    site_headers = dict(getattr(spider, "headers", None) or {})
    jar = Jar(rt.connection, task.site) if uses_cookies(spider) else None

    def fetch(url: str, headers: Mapping[str, str], wait: float, is_page: bool) -> Response:
        deadline = time.monotonic() + wait  # the gate's wait and the request share it
        gate = rt.take_gate_within(task.site, url, wait)
        if gate is None:
            raise FetchTimeout(f"the site's gate stayed closed until the render's deadline: {url}")
        try:
            response = rt.fetcher.get(
                url,
                user_agent=spider.user_agent,
                on_sent=lambda: rearm(gate, task),
                before_send=gate.before_send,
                headers={**site_headers, **headers, **(jar.header(url) if jar is not None else {})},
                allow_private=spider.allow_private_addresses,
                proxy=proxy,
                timeout=deadline - time.monotonic(),
            )
        except CrawlerError as exc:
            if not is_page:
                record(FAILED, url=url, error=f"requested by the rendered page {task.url}: {exc}")
            raise
        finally:
            gate.let_go()
        if jar is not None:
            jar.update(url, response.set_cookies)
        if not is_page:
            record(OK if response.status < 400 else FAILED, url=url, response=response)
        return response

    return fetch
