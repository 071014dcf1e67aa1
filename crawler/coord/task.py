"""The plain-data payload of a download job (``DownloadTask``): its JSON, its compact frontier entry, its checks.

What a download job carries through Redis, read back by the frontier, the vetting of
jobs and the download job itself.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import RefusedURL
from ..http.conditional import Validators, check_validators
from ..urls import canonicalize
from .scheduler import decode_entry, encode_entry

#: Bytes of a fingerprint (``ADD_SEEN`` reads them in steps of 8).
FINGERPRINT_BYTES = 8


def fingerprint(canonical_url: str) -> bytes:
    """8-byte digest of a canonical URL: the member stored in the seen set for a GET without a body."""
    return hashlib.blake2b(canonical_url.encode(), digest_size=FINGERPRINT_BYTES).digest()


def request_fingerprint(canonical_url: str, method: str = "GET", body: bytes | None = None) -> bytes:
    """The seen-set member of a request: ``fingerprint(canonical_url)`` for a GET without a body (so
    the seen sets of crawls begun before requests had methods stay valid), else an 8-byte digest
    of method, URL and body (Scrapy's fingerprint: headers do not count), personalized so that
    it is never a URL's digest."""
    if method == "GET" and not body:
        return fingerprint(canonical_url)
    digest = hashlib.blake2b(digest_size=FINGERPRINT_BYTES, person=b"crawler.request")
    digest.update(f"{method} {canonical_url}\n".encode())
    digest.update(body or b"")
    return digest.digest()


COUNTERS = (("depth", 0), ("hops", 0), ("attempt", 1), ("priority", 0))
#: Priorities a request may have (each one used is a list per site in Redis).
PRIORITY_RANGE = (-1000, 1000)


@dataclass(frozen=True)
class DownloadTask:
    """The plain-data payload of one download job."""

    site: str
    url: str
    callback: str = "parse"
    meta: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    hops: int = 0
    attempt: int = 1
    priority: int = 0
    #: Seconds after which the page is to be fetched again (None: never).
    refresh: float | None = None
    #: (ETag, Last-Modified epoch seconds) of the page's last fetch, on a scheduled refresh (``conditional``).
    validators: Validators | None = None
    #: The request's HTTP method, own headers (the spider's are added when it is sent) and body.
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    #: The spider method called should the request finally fail (``spiders.failure``); None: the spider's.
    errback: str | None = None
    #: The URL as the spider wrote it, sent so (``urls.as_written``); None: ``url``, the canonical one,
    #: which dedup, records and items keep to. Its canonical form is ``url`` (``from_json`` checks).
    sent_url: str | None = None

    @property
    def url_to_send(self) -> str:
        """The URL the request goes to: as the spider wrote it."""
        return self.sent_url or self.url

    @property
    def fingerprint(self) -> bytes:
        """The request's seen-set member (``request_fingerprint``)."""
        return request_fingerprint(self.url, self.method, self.body)

    def extra(self) -> dict[str, Any]:
        """The request's method, headers, body and errback as plain JSON data, each left out at its default."""
        return request_data(self.method, self.headers, self.body, self.errback, self.sent_url)

    def recorded(self) -> dict[str, Any] | None:
        """What a fetch record keeps of the request, to send it again (``crawler retry``): ``extra``
        without the headers of RECORDED_NOT (credentials stay out of the database); None for a
        plain GET."""
        kept = {name: value for name, value in self.headers.items() if name.lower() not in RECORDED_NOT}
        return request_data(self.method, kept, self.body, self.errback, self.sent_url) or None

    def to_json(self) -> dict[str, Any]:
        data = {
            "site": self.site,
            "url": self.url,
            "callback": self.callback,
            "meta": self.meta or {},
            "depth": self.depth,
            "hops": self.hops,
            "attempt": self.attempt,
            "priority": self.priority,
        }
        if self.refresh is not None:
            data["refresh"] = self.refresh
        if self.validators is not None:
            data["validators"] = list(self.validators)
        data.update(self.extra())
        return data

    def to_entry(self) -> str:
        """The compact frontier entry for this task (site and priority are implied by the list)."""
        return encode_entry(
            self.url,
            self.callback,
            self.depth,
            self.hops,
            self.attempt,
            self.meta,
            self.refresh,
            self.validators,
            self.extra(),
        )

    @classmethod
    def from_entry(cls, site: str, entry: str | bytes, priority: int = 0) -> DownloadTask:
        """Rebuild a task from a compact frontier entry; ValueError for a malformed one."""
        return cls.from_json({"site": site, "priority": priority, **decode_entry(entry)})

    @classmethod
    def from_json(cls, data: Any) -> DownloadTask:
        """Rebuild a task from a job argument; ValueError unless it has the right shape."""
        if not isinstance(data, dict) or not isinstance(data.get("site"), str) or not isinstance(data.get("url"), str):
            raise ValueError(f"not a download task: {data!r:.200}")
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError("download task meta must be an object")
        try:
            counters = {name: int(data.get(name, default)) for name, default in COUNTERS}
            refresh = check_refresh(data.get("refresh"))
            validators = check_validators(data.get("validators"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad download task counters: {data!r:.200}") from exc
        method, headers, body = read_request_data(data)
        return cls(
            site=data["site"],
            url=data["url"],
            callback=str(data.get("callback") or "parse"),
            meta=meta,
            refresh=refresh,
            validators=validators,
            method=method,
            headers=headers,
            body=body,
            errback=read_errback(data),
            sent_url=read_sent_url(data, data["url"]),
            **counters,
        )


#: Request headers a fetch record leaves out (``DownloadTask.recorded``): credentials. A request
#: sent again by ``crawler retry`` goes without them (a site's session adds its cookies again).
RECORDED_NOT = frozenset({"authorization", "proxy-authorization", "cookie"})


def request_data(
    method: str,
    headers: Mapping[str, str],
    body: bytes | None,
    errback: str | None = None,
    sent_url: str | None = None,
) -> dict[str, Any]:
    """A request's method, headers, body, errback and URL as written (``as_written``) as plain JSON data,
    defaults left out: ``body`` as text when it is UTF-8, else ``body64`` in base64."""
    data: dict[str, Any] = {}
    if errback:
        data["errback"] = errback
    if sent_url:
        data["as_written"] = sent_url
    if method != "GET":
        data["method"] = method
    if headers:
        data["headers"] = dict(headers)
    if body:
        try:
            data["body"] = body.decode()
        except UnicodeDecodeError:
            data["body64"] = base64.b64encode(body).decode()
    return data


def read_request_data(data: Mapping[str, Any]) -> tuple[str, dict[str, str], bytes | None]:
    """``request_data``'s method, headers and body back; ValueError unless they have its shape."""
    method = data.get("method", "GET")
    headers = data.get("headers") or {}
    if not isinstance(method, str) or not method.isalpha():
        raise ValueError(f"bad download task method: {method!r:.100}")
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in [*headers, *headers.values()]):
        raise ValueError(f"bad download task headers: {headers!r:.200}")
    body: bytes | None = None
    if isinstance(data.get("body"), str):
        body = data["body"].encode()
    elif isinstance(data.get("body64"), str):
        try:
            body = base64.b64decode(data["body64"], validate=True)
        except ValueError as exc:
            raise ValueError(f"bad download task body64: {exc}") from None
    elif data.get("body", data.get("body64")) is not None:
        raise ValueError(f"bad download task body: {data.get('body', data.get('body64'))!r:.100}")
    return method.upper(), headers, body or None


def read_errback(data: Mapping[str, Any]) -> str | None:
    """``request_data``'s errback back (a method name, or None); ValueError for anything else."""
    errback = data.get("errback")
    if errback is None:
        return None
    if not isinstance(errback, str) or not errback.isidentifier():
        raise ValueError(f"bad download task errback: {errback!r:.100}")
    return errback


def read_sent_url(data: Mapping[str, Any], url: str) -> str | None:
    """``request_data``'s URL as written back, or None; ValueError unless its canonical form is ``url``
    (what was checked against the site's domains: an entry written by hand cannot send elsewhere)."""
    sent = data.get("as_written")
    if sent is None:
        return None
    try:
        if not isinstance(sent, str) or canonicalize(sent) != url:
            raise ValueError
    except (RefusedURL, ValueError):
        raise ValueError(f"bad download task URL as written: {sent!r:.200} is not {url!r:.200}") from None
    return sent


def check_priority(value: Any) -> int:
    """``value`` as a request priority; ValueError unless an integer within PRIORITY_RANGE."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"priority must be an integer, not {value!r}")
    low, high = PRIORITY_RANGE
    if not low <= value <= high:
        raise ValueError(f"priority must be between {low} and {high}, not {value}")
    return value


def check_refresh(value: Any) -> float | None:
    """``value`` as a refresh interval in seconds (None: never); ValueError unless positive."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"refresh must be a positive number of seconds, not {value!r}")
    return float(value)
