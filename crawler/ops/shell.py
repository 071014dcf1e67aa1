"""``crawler shell``: an interactive prompt with a spider, a page and two helpers bound.

IPython when it is installed (``--plain`` or no IPython: Python's own ``code``
console). In the namespace: ``spider``, ``page`` (None until a URL is fetched),
``fetch(url)`` (download as a worker would and bind ``page``), ``parse(callback,
meta)`` (run a callback on ``page`` and show its items and where its requests would
go), and ``Request``.
"""

from __future__ import annotations

from typing import Any

from ..spiders.spider import Page, Request
from ..work.runtime import Runtime
from .devtools import Outputs, fetch_as_worker, page_of, route, run_callback, seen_in, summary_lines, verdict

BANNER = """crawler shell for site {site!r}
  spider             the spider instance ({cls})
  page               the page fetched last ({page})
  fetch(url)         download url as a worker would (robots.txt, gate), bind page
  fetch(url, {{"render": True}})  the same, rendered in the browser
  parse(callback="parse", meta=None)
                     run a callback on page: its items, and where its requests would go
  page.css(...), page.css_first(...), page.text(...), page.follow(...)
Ctrl-D to leave."""


class Shell:
    """The helpers bound in the shell's namespace, for one site."""

    def __init__(self, rt: Runtime, site: str, echo: Any = print):
        self.rt = rt
        self.site = site
        self.spider = rt.spider(site)
        self.page: Page | None = None
        self.echo = echo
        self.namespace: dict[str, Any] = {
            "spider": self.spider,
            "page": None,
            "fetch": self.fetch,
            "parse": self.parse,
            "Request": Request,
        }

    def fetch(self, url: str, meta: dict[str, Any] | None = None) -> Page:
        """Download ``url`` as a worker would and bind it as ``page`` (rendered in the browser
        when the spider or ``meta``'s ``render`` says so: ``fetch(url, {"render": True})``)."""
        response = fetch_as_worker(self.rt, self.site, url, meta)
        self.echo(
            f"HTTP {response.status} {response.url} ({len(response.body)} bytes in "
            f"{response.elapsed:.3f}s): {verdict(response, self.spider.content_types, self.spider.follow_meta_refresh)}"
        )
        self.page = page_of(response, meta, self.spider.content_types, self.spider.follow_meta_refresh)
        self.namespace["page"] = self.page
        return self.page

    def parse(self, callback: str = "parse", meta: dict[str, Any] | None = None) -> Outputs:
        """Run ``callback`` on ``page``; print its items and where its requests would go."""
        page = self.namespace.get("page") or self.page
        if page is None:
            raise RuntimeError("no page yet: fetch(url) first")
        if meta is not None:
            page.meta = meta
        outputs = run_callback(self.spider, page, callback)
        routed = route(outputs.requests, self.spider.domains(), seen_in(self.rt.connection, self.site))
        for line in summary_lines(outputs, routed):
            self.echo(line)
        return outputs

    def banner(self) -> str:
        return BANNER.format(site=self.site, cls=type(self.spider).__name__, page=self.page or "none yet")

    def interact(self, plain: bool = False) -> None:
        """Run the prompt until Ctrl-D: IPython unless ``plain`` or not installed."""
        if not plain:
            try:
                from IPython import start_ipython
            except ImportError:
                pass
            else:
                self.echo(self.banner())
                start_ipython(argv=["--no-banner"], user_ns=self.namespace)
                return
        import code

        code.interact(banner=self.banner(), local=self.namespace, exitmsg="")
