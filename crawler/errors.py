"""The crawler's exceptions, named for what the crawler does about each.

    CrawlerError
    ├── ConfigError          stop: bad config, unknown site, unreachable service
    │   └── SpiderLoadError  a spider module failed to import (the others still load)
    ├── TransientError       retry later, with backoff
    │   ├── FetchTimeout
    │   ├── ConnectError
    │   └── RetryableStatus  5xx, 429 (carries Retry-After when the server sent one)
    └── PermanentError       record it and move on, never retried automatically
        ├── RefusedURL       off-domain, bad scheme, robots.txt, malformed
        ├── ClientStatus     4xx other than 429
        ├── BodyTooLarge     body or decompressed body over the cap
        └── TooManyRedirects

HTTP library exceptions are translated into this tree in one place
(``crawler.fetch``), so retry rules depend only on these classes.
"""

from __future__ import annotations


class CrawlerError(Exception):
    """Base of every error the crawler raises on purpose."""


class ConfigError(CrawlerError):
    """The crawl cannot start or go on until a person fixes something."""


class SpiderLoadError(ConfigError):
    """A spider module failed to import; carries the module's name."""

    def __init__(self, module: str, reason: str):
        super().__init__(f"spider module {module!r} failed to load: {reason}")
        self.module = module
        self.reason = reason


class TransientError(CrawlerError):
    """Worth retrying later; ``retry_after`` is the server's wish in seconds, if any."""

    retry_after: float | None = None


class FetchTimeout(TransientError):
    """The request or the body took longer than the time cap."""


class ConnectError(TransientError):
    """The connection could not be made or broke mid-response."""


class RetryableStatus(TransientError):
    """The server answered 5xx or 429."""

    def __init__(self, status: int, retry_after: float | None = None):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


class PermanentError(CrawlerError):
    """Retrying would give the same answer: record and move on."""


class RefusedURL(PermanentError):
    """The URL is not one this spider may request."""


class ClientStatus(PermanentError):
    """The server answered 4xx (other than 429)."""

    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


class BodyTooLarge(PermanentError):
    """The body, or what it decompresses to, is larger than the cap."""


class TooManyRedirects(PermanentError):
    """The redirect chain is longer than the limit."""
