"""The crawler's exceptions, named for what the crawler does about each.

    CrawlerError
    ├── ConfigError          stop: bad config, unknown site, unreachable service
    │   └── SpiderLoadError  a spider module failed to import (the others still load)
    ├── TransientError       retry later, with backoff
    │   ├── FetchTimeout     the whole request (DNS, connect, headers, body) outlasted the timeout
    │   ├── ConnectError
    │   │   └── ProxyError   the proxy could not be reached or refused the request (it is benched)
    │   ├── RetryableStatus  5xx, 429 (carries Retry-After when the server sent one)
    │   └── RobotsUnavailable  robots.txt 5xx or unreachable: the page waits (retry_after),
    │                        without spending one of its attempts, until robots.txt
    │                        has failed 1 + max_retries times in a row: then it fails
    └── PermanentError       record it and move on, never retried automatically
        ├── RefusedURL       off-domain, robots.txt, malformed
        │   ├── UnsupportedScheme  not http(s): file:, ftp:, …
        │   └── PrivateAddress     connected to a non-public address the spider did not allow
        ├── ClientStatus     4xx other than 429
        ├── BodyTooLarge     body or decompressed body over the cap
        ├── BadResponse      malformed or oversized headers, undecodable body, unknown coding
        ├── TooManyRedirects
        ├── BeforeSendFailed the spider's before_send raised: the page fails (the traceback
        │                    recorded), ``crawler retry`` sends it again
        └── RefusedRecord    the database refused a record's data (not an outage): the page fails

HTTP library exceptions are translated into this tree in one place
(``crawler.http.fetch``), so retry rules depend only on these classes; database errors
that refuse the data written (not the connection) become RefusedRecord in ``crawler.store.database``.
"""

from __future__ import annotations


class CrawlerError(Exception):
    """Base of every error the crawler raises on purpose."""


class ConfigError(CrawlerError):
    """The crawl cannot start or go on until a person fixes something."""


class SpiderLoadError(ConfigError):
    """A spider module failed to import, or a spider in it is invalid; carries the module's name.

    ``site`` is the name of the invalid spider, when the module imported but its spider
    did not pass the checks (``spidercheck``).
    """

    def __init__(self, module: str, reason: str, site: str | None = None):
        what = f"spider {site!r} in module {module!r} is invalid" if site else f"spider module {module!r} failed"
        super().__init__(f"{what}: {reason}" if site else f"{what} to load: {reason}")
        self.module = module
        self.reason = reason
        self.site = site


class TransientError(CrawlerError):
    """Worth retrying later; ``retry_after`` is the server's wish in seconds, if any."""

    retry_after: float | None = None


class FetchTimeout(TransientError):
    """The request or the body took longer than the time cap."""


class ConnectError(TransientError):
    """The connection could not be made or broke mid-response."""


class ProxyError(ConnectError):
    """The request's proxy could not be reached, dropped the connection, or refused it (a
    CONNECT or its credentials): the proxy is benched, the request tried again."""


class RetryableStatus(TransientError):
    """The server answered 5xx or 429."""

    def __init__(self, status: int, retry_after: float | None = None):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


class RobotsUnavailable(TransientError):
    """robots.txt answered 5xx or could not be reached: the origin is off limits until it can be
    read (RFC 9309 §2.3.1.4). ``retry_after`` is when it will be asked for again, in seconds;
    ``attempts``, how many times in a row it could not be read."""

    retry_after: float

    def __init__(self, message: str, retry_after: float, attempts: int = 1):
        super().__init__(message)
        self.retry_after = retry_after
        self.attempts = attempts


class PermanentError(CrawlerError):
    """Retrying would give the same answer: record and move on."""


class RefusedURL(PermanentError):
    """The URL is not one this spider may request."""


class UnsupportedScheme(RefusedURL):
    """The URL's scheme is not http or https."""


class PrivateAddress(RefusedURL):
    """The host resolved to a private, loopback, link-local or reserved address (DNS rebinding,
    SSRF), and neither the spider (``allow_private_addresses``) nor the URL (an IP address or
    ``localhost`` named outright) allows it."""


class ClientStatus(PermanentError):
    """The server answered 4xx (other than 429)."""

    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


class BodyTooLarge(PermanentError):
    """The body, or what it decompresses to, is larger than the cap."""


class BadResponse(PermanentError):
    """The response is malformed: headers over the size limit or unparsable, a body its
    Content-Encoding does not describe, or a content-coding the crawler does not decode."""


class TooManyRedirects(PermanentError):
    """The redirect chain is longer than the limit."""


class BeforeSendFailed(PermanentError):
    """The spider's ``before_send(request)`` raised (or returned something, or left a method or body of
    the wrong type): the request is not sent; its page fails, the record holding the traceback, and
    ``crawler retry`` sends it again (as a page whose callback raised)."""


class RefusedRecord(PermanentError):
    """The database refused the data written (a value too long to index, out of range, not
    JSON), as opposed to failing to answer: writing it again would fail again."""
