"""What one URL's download knows of its site (``SiteContext``): read once as the URL starts, then passed down."""

from __future__ import annotations

import dataclasses

from ...coord.policy import SitePolicy
from ...coord.session import logs_in, uses_cookies
from ...coord.task import DownloadTask
from ...http.headers import user_agent_of
from ...spiders.spider import Spider
from .. import runtime
from ..batching import Batching
from ..gated_fetch import sent_headers


@dataclasses.dataclass(frozen=True)
class SiteContext:
    """``site`` as one URL's download sees it, from its start to its record (``site_context``).

    The URL's steps take the spider, the policy and what follows from them here, rather than
    asking the runtime again (each ask may be a Redis read once the site's settings are due).
    Immutable: the next URL of a batch gets a context of its own, read when its turn comes.
    The gate a request takes is named at the take, by this policy: with ``gate_by = "ip"`` it
    follows the address of the URL asked for (a redirect's, a login's, robots.txt's).
    """

    site: str
    spider: Spider
    #: The politeness in force (``coord.policy``): interval, pause, robots.txt, gate.
    policy: SitePolicy
    #: How the site's jobs carry its URLs, and its interval in force (margin and Crawl-delay included).
    batching: Batching
    #: The proxy of the URL's requests (None: direct), chosen once: its page's, robots.txt's, login's
    #: and browser's requests all go through it.
    proxy: str | None
    #: The User-Agent of a request that names none: the spider's, else the crawl's.
    user_agent: str
    #: The allowed domains: the URL, a redirect's target and a rendered page's requests stay within them.
    domains: tuple[str, ...]
    #: The fleet logs in to the site before its pages (``session.logs_in``).
    logs_in: bool
    #: The site's requests carry its cookie jar (``session.uses_cookies``).
    uses_cookies: bool

    def user_agent_for(self, task: DownloadTask) -> str:
        """The User-Agent ``task``'s request goes with: a header of its own or the spider's, else ``user_agent``."""
        return user_agent_of(sent_headers(self.spider, task), self.user_agent)


def site_context(rt: runtime.Runtime, site: str) -> SiteContext:
    """``site``'s context for the URL about to start: its spider and policy as this process holds them
    (read from Redis only when due, both in one read: ``Runtime.spider``), the batching they make,
    and the next proxy of the site's rotation."""
    spider = rt.spider(site)
    policy = rt.policy(site)
    return SiteContext(
        site=site,
        spider=spider,
        policy=policy,
        batching=rt.batching(site, policy),
        proxy=rt.proxy(site),
        user_agent=spider.user_agent or rt.settings.user_agent,
        domains=tuple(spider.domains()),
        logs_in=logs_in(spider),
        uses_cookies=uses_cookies(spider),
    )
