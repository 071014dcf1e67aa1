"""Sessions the whole fleet shares: a site's cookie jar and its login, kept in Redis.

**The jar** (``Jar``, hash ``keys.cookies(SITE)``, a field per cookie ``[domain, path,
name]``) keeps a response's ``Set-Cookie`` as browsers keep them (RFC 6265 and the parts of
6265bis browsers apply, public suffixes refused, capped as Chromium caps it); only the
cookies a response changes are written, so concurrent updates merge, and no header,
however malformed, raises. **The login** (``Session``, hash ``keys.session(SITE)``): one
worker at a time logs in under a lease; ``end`` closes only the session generation a
logged-out page was sent with. Cookie values are secrets: shown only through
``redacted_set_cookie``. The rules, as the spider author sees them: docs/SPIDERS.md.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import redis
from publicsuffixlist import PublicSuffixList

from . import keys

log = logging.getLogger("crawler.session")

#: Seconds a page waits (in the delayed set) while another worker logs the site in, before it looks again.
LOGIN_WAIT = 0.5
#: A login's lease, seconds: past it, a worker that died while logging in is replaced by another.
LOGIN_LEASE = 60.0
#: ``state`` of a logged-in session.
LOGGED_IN = "ok"

#: Cookies the jar keeps for one registrable domain (``shop.example.co.uk`` and its subdomains), as
#: Chromium (``kDomainMaxCookies``; RFC 6265 section 6.1 asks at least 50): past it, its oldest go.
MAX_COOKIES_PER_DOMAIN = 180
#: Cookies a site's jar keeps in all, as Chromium (``kMaxCookies``; RFC 6265: at least 3000): past it, the oldest go.
MAX_COOKIES = 3300
#: Bytes of a cookie's name and value together, at most, as Chromium and Firefox (RFC 6265: at least
#: 4096): a larger cookie is refused, not cut.
MAX_COOKIE_BYTES = 4096
#: Bytes of an attribute's value (``Path``, ``Domain``...), at most, as Chromium (RFC 6265bis): a longer one is ignored.
MAX_ATTRIBUTE_BYTES = 1024
#: Seconds a cookie lives at most, whatever its ``Expires`` or ``Max-Age`` (400 days: RFC 6265bis, Chromium, Firefox).
MAX_COOKIE_AGE = 400 * 86400

#: The attributes a cookie keeps (RFC 6265bis section 5.6); others are ignored, as browsers ignore them.
_ATTRIBUTES = frozenset({"expires", "max-age", "domain", "path", "secure", "httponly", "samesite"})
#: Control characters that make a browser ignore a cookie (RFC 6265bis: any but the tab).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: Max-Age's value: digits, a minus sign allowed first (RFC 6265 section 5.2.2); anything else is ignored.
_MAX_AGE = re.compile(r"-?[0-9]+")
#: The tokens of an ``Expires`` date and the parts read from them (RFC 6265 section 5.1.1).
_DATE_TOKEN = re.compile(r"[^\x09\x20-\x2f\x3b-\x40\x5b-\x60\x7b-\x7e]+")
_TIME = re.compile(r"([0-9]{1,2}):([0-9]{1,2}):([0-9]{1,2})(?:[^0-9]|$)")
_DAY = re.compile(r"([0-9]{1,2})(?:[^0-9]|$)")
_YEAR = re.compile(r"([0-9]{2,4})(?:[^0-9]|$)")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def uses_cookies(spider: Any) -> bool:
    """Whether ``spider``'s requests carry the site's jar: ``cookies = True``, or a login (which needs one)."""
    return bool(getattr(spider, "cookies", False)) or logs_in(spider)


def logs_in(spider: Any) -> bool:
    """Whether the fleet logs in to ``spider``'s site before its other requests."""
    return getattr(spider, "login_url", None) is not None


@dataclass(frozen=True)
class StoredCookie:
    """A cookie as the jar keeps it (RFC 6265 section 5.3): ``name`` and ``value`` one character a byte
    received; ``domain`` the host it was set by (host-only) or ``.`` and its ``Domain`` (that domain and
    its subdomains); ``expires`` in epoch seconds, None for a cookie kept until the session ends (a
    fleet's never does); ``created`` in epoch seconds, which the caps evict by."""

    name: str
    value: str
    domain: str
    path: str
    secure: bool = False
    expires: int | None = None
    created: float = 0.0
    #: ``httponly`` and ``samesite`` as the site set them: kept, not enforced (no script reads the jar,
    #: and every request it goes with is the site's own).
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def field(self) -> str:
        """Its field in the jar's hash: what tells cookies apart (RFC 6265: name, domain, path)."""
        return json.dumps([self.domain, self.path, self.name])

    def expired(self, now: float) -> bool:
        return self.expires is not None and self.expires <= now

    def sent_to(self, host: str, path: str, secure: bool) -> bool:
        """Whether it goes with a request to ``host`` and ``path``, over https when ``secure``
        (RFC 6265 section 5.4: a host-only cookie to its host alone)."""
        if self.domain.startswith("."):
            within = host == self.domain[1:] or (host.endswith(self.domain) and not _is_ip(host))
        else:
            within = host == self.domain
        return within and (secure or not self.secure) and _path_matches(path, self.path)

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def _load(stored: bytes | str) -> StoredCookie:
    """A cookie as ``dumps`` wrote it, or as ``http.cookiejar`` kept it (the jar's rules before these:
    a cookie without a name kept under its value, with no value)."""
    data = json.loads(stored)
    if "domain_specified" not in data:
        return StoredCookie(**data)
    name, value = (data["name"], data["value"]) if data["value"] is not None else ("", data["name"])
    rest = {str(key).lower(): str(text or "") for key, text in (data.get("rest") or {}).items()}
    return StoredCookie(
        str(name), str(value), data["domain"], data["path"], bool(data["secure"]), data["expires"], attributes=rest
    )


class _Refused(ValueError):
    """A ``Set-Cookie`` browsers ignore; the message says why (never the cookie's value)."""


def _parse(header: str) -> tuple[str, str, dict[str, str]]:
    """A ``Set-Cookie`` header's name, value and attributes as browsers read it (RFC 6265bis section
    5.6): a pair without ``=`` is all value, its name empty; attribute names in lower case, the last
    one of a name kept, one longer than MAX_ATTRIBUTE_BYTES left out. Raises _Refused for a header
    with neither name nor value, or with a control character in them."""
    pair, _, rest = header.partition(";")
    name, equals, value = pair.partition("=")
    if not equals:
        name, value = "", name
    name, value = name.strip(" \t"), value.strip(" \t")
    if not name and not value:
        raise _Refused("no name and no value")
    if _CONTROL.search(name) or _CONTROL.search(value):
        raise _Refused("a control character in its name or value")
    attributes = {}
    for part in rest.split(";"):
        key, _, attribute = part.partition("=")
        key, attribute = key.strip(" \t").lower(), attribute.strip(" \t")
        if key in _ATTRIBUTES and len(attribute) <= MAX_ATTRIBUTE_BYTES:
            attributes[key] = attribute
    return name, value, attributes


def _cookie(header: str, url: str, now: float) -> StoredCookie:
    """The cookie a ``Set-Cookie`` header of the response to ``url`` sets (RFC 6265 section 5.3), created
    ``now``; one that expires by ``now`` deletes its namesake. Raises _Refused for a cookie browsers
    refuse: name and value over MAX_COOKIE_BYTES, or a ``Domain`` it may not have (``_domain``)."""
    name, value, attributes = _parse(_as_received(header))
    if len(name) + len(value) > MAX_COOKIE_BYTES:
        raise _Refused(f"name and value over {MAX_COOKIE_BYTES} bytes")
    parts = urlsplit(url)
    kept: dict[str, str] = {key: attributes[key] for key in ("httponly", "samesite") if key in attributes}
    return StoredCookie(
        name,
        value,
        _domain(attributes.get("domain", ""), parts.hostname or ""),
        _path(attributes.get("path", ""), parts.path),
        secure="secure" in attributes,
        expires=_expires(attributes, now),
        created=now,
        attributes=kept,
    )


def _as_received(header: str) -> str:
    """``header`` one character a byte, as ``Response.set_cookies`` holds it; text beyond Latin-1 (given
    another way) as its UTF-8 bytes, so that every cookie is kept, and sent back, as bytes."""
    try:
        header.encode("latin-1")
    except UnicodeEncodeError:
        return header.encode("utf-8", "replace").decode("latin-1")
    return header


def _domain(attribute: str, host: str) -> str:
    """The domain a cookie set by ``host`` is kept for: ``host`` (host-only) without a ``Domain``
    attribute, or with one naming the host itself where that is a public suffix or an IP address;
    else ``.`` and the attribute's domain. Raises _Refused for a domain that is not the host nor
    one it is within, a public suffix (``co.uk``, ``com``) or part of an IP address (RFC 6265
    section 5.3, steps 5 and 6; browsers and Scrapy refuse them so)."""
    domain = attribute.lower().removeprefix(".")
    if not domain:
        return host
    if _is_ip(host) or _is_public(domain):
        if domain != host:
            raise _Refused(f"Domain={domain} is {'part of an IP address' if _is_ip(host) else 'a public suffix'}")
        return host
    if host != domain and not host.endswith("." + domain):
        raise _Refused(f"Domain={domain} is not {host} nor a domain it is in")
    return "." + domain


def _path(attribute: str, request_path: str) -> str:
    """A cookie's path: its ``Path`` when that starts with ``/``, else the directory of the request's
    path (RFC 6265 section 5.1.4)."""
    if attribute.startswith("/"):
        return attribute
    if not request_path.startswith("/") or request_path.count("/") == 1:
        return "/"
    return request_path[: request_path.rindex("/")]


def _path_matches(request_path: str, path: str) -> bool:
    """RFC 6265 section 5.1.4: ``path`` is ``request_path`` or one of the directories above it."""
    if request_path == path:
        return True
    return request_path.startswith(path) and (path.endswith("/") or request_path[len(path)] == "/")


def _expires(attributes: Mapping[str, str], now: float) -> int | None:
    """When a cookie ends, in epoch seconds, at most MAX_COOKIE_AGE after ``now`` (a ``Max-Age`` of 0
    or less: at once); None without a ``Max-Age`` or ``Expires`` that reads (RFC 6265 section 5.3,
    step 3: ``Max-Age`` wins)."""
    latest = int(now) + MAX_COOKIE_AGE
    max_age = attributes.get("max-age", "")
    if _MAX_AGE.fullmatch(max_age):
        seconds = int(max_age)
        return min(int(now) + seconds, latest) if seconds > 0 else 0
    expires = _cookie_date(attributes["expires"]) if "expires" in attributes else None
    return None if expires is None else min(expires, latest)


def _cookie_date(text: str) -> int | None:
    """An ``Expires`` date in epoch seconds, read as browsers read it (RFC 6265 section 5.1.1: a time,
    a day, a month and a year among its tokens, in any order); None when it does not read."""
    found: dict[str, Any] = {}
    for token in _DATE_TOKEN.findall(text):
        if "time" not in found and (match := _TIME.match(token)):
            found["time"] = [int(part) for part in match.groups()]
        elif "day" not in found and (match := _DAY.match(token)):
            found["day"] = int(match[1])
        elif "month" not in found and token[:3].lower() in _MONTHS:
            found["month"] = _MONTHS.index(token[:3].lower()) + 1
        elif "year" not in found and (match := _YEAR.match(token)):
            year = int(match[1])
            found["year"] = year + 1900 if 70 <= year <= 99 else year + 2000 if year <= 69 else year
    if len(found) < 4 or found["year"] < 1601:
        return None
    hour, minute, second = found["time"]
    try:
        return int(datetime(found["year"], found["month"], found["day"], hour, minute, second, tzinfo=UTC).timestamp())
    except ValueError:  # a day the month has not, an hour past 23...
        return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@functools.cache
def _suffixes() -> PublicSuffixList:
    """The Public Suffix List as ``publicsuffixlist`` ships it (its private domains included, as in
    browsers; a name under an unknown top-level domain counts as one); read once, when first needed."""
    return PublicSuffixList()


def _is_public(domain: str) -> bool:
    return _suffixes().is_public(domain)


def _evicted(cookies: Iterable[StoredCookie]) -> list[str]:
    """The fields of the cookies the caps leave out, the oldest (by creation) first: past
    MAX_COOKIES_PER_DOMAIN of one registrable domain, then past MAX_COOKIES in all."""
    newest_first = sorted(cookies, key=lambda cookie: (cookie.created, cookie.field), reverse=True)
    if len(newest_first) <= MAX_COOKIES_PER_DOMAIN:
        return []
    kept: Counter[str] = Counter()
    evicted = []
    for cookie in newest_first:
        group = _registrable(cookie.domain.removeprefix("."))
        if kept[group] >= MAX_COOKIES_PER_DOMAIN or kept.total() >= MAX_COOKIES:
            evicted.append(cookie.field)
        else:
            kept[group] += 1
    return evicted


def _registrable(domain: str) -> str:
    """The domain a cookie of ``domain`` counts against (``example.co.uk`` for ``shop.example.co.uk``)."""
    if _is_ip(domain):
        return domain
    return _suffixes().privatesuffix(domain) or domain


class Jar:
    """``site``'s cookie jar in Redis (see the module docstring)."""

    def __init__(self, connection: redis.Redis, site: str):
        self.connection = connection
        self.key = keys.cookies(site)

    def _read(self) -> dict[str, StoredCookie]:
        """The jar as kept, by field, its expired cookies dropped (from Redis too), and any it cannot
        read (a value written by hand): a broken cookie costs itself, never the page."""
        jar: dict[str, StoredCookie] = {}
        dropped: list[bytes | str] = []
        moved = {}
        now = time.time()
        for name, value in self.connection.hgetall(self.key).items():
            try:
                cookie = _load(value)
            except Exception:  # any: whatever the value holds, the jar is read
                log.warning("%s: an unreadable cookie dropped from the jar", self.key)
                dropped.append(name)
                continue
            renamed = cookie.field != (name.decode("utf-8", "replace") if isinstance(name, bytes) else name)
            if cookie.expired(now) or renamed:
                dropped.append(name)
            if not cookie.expired(now):
                jar[cookie.field] = cookie
                if renamed:  # kept by http.cookiejar under its value for a cookie without a name
                    moved[cookie.field] = cookie.dumps()
        if dropped or moved:
            pipe = self.connection.pipeline(transaction=True)
            if dropped:
                pipe.hdel(self.key, *dropped)
            if moved:
                pipe.hset(self.key, mapping=moved)  # type: ignore[arg-type]
            pipe.execute()
        return jar

    def header(self, url: str) -> dict[str, str]:
        """The ``Cookie`` header to send with a request for ``url`` (empty when no cookie matches): its
        cookies by longer path first, then by creation (RFC 6265 section 5.4), a cookie without a
        name as its value alone, as browsers send it; one character a byte (``fetch.encode_headers``)."""
        try:
            parts = urlsplit(url)
            host, path, secure = parts.hostname or "", parts.path or "/", parts.scheme == "https"
        except ValueError:  # a URL the fetch refuses in turn, with a record
            return {}
        sent = [cookie for cookie in self._read().values() if cookie.sent_to(host, path, secure)]
        sent.sort(key=lambda cookie: (-len(cookie.path), cookie.created))
        header = "; ".join(f"{cookie.name}={cookie.value}" if cookie.name else cookie.value for cookie in sent)
        return {"cookie": header} if header else {}

    def update(self, url: str, set_cookies: Iterable[str]) -> None:
        """Apply a response's ``Set-Cookie`` headers (for a request of ``url``) to the jar.

        Only the cookies they set, delete or evict are written: another worker's update meanwhile
        is kept. A cookie browsers refuse (another domain, a public suffix, too large) is not
        stored; a header that cannot be read is ignored, with a note in the log: none raises.
        """
        headers = list(set_cookies)
        if not headers:
            return
        jar = self._read()
        stored, touched = set(jar), set()
        now = time.time()
        for position, header in enumerate(headers):
            try:
                # Each a microsecond after the one before: the later of two cookies is the newer, as in Chromium.
                cookie = _cookie(header, url, now + position / 1e6)
            except _Refused as exc:
                log.debug("%s: cookie refused (%s): %.300s", self.key, exc, redacted_set_cookie(header))
                continue
            except Exception as exc:  # any: no Set-Cookie, however malformed, may cost the page
                what = type(exc).__name__  # its message might quote the value
                log.warning("%s: Set-Cookie ignored (%s): %.300s", self.key, what, redacted_set_cookie(header))
                continue
            old = jar.pop(cookie.field, None)
            touched.add(cookie.field)
            if not cookie.expired(now):
                jar[cookie.field] = cookie if old is None else replace(cookie, created=old.created)
        for evicted in _evicted(jar.values()):
            del jar[evicted]
        changed = {name: jar[name].dumps() for name in touched if name in jar}
        deleted = [name for name in stored if name not in jar]
        if not changed and not deleted:
            return
        pipe = self.connection.pipeline(transaction=True)
        if changed:
            pipe.hset(self.key, mapping=changed)  # type: ignore[arg-type]
        if deleted:
            pipe.hdel(self.key, *deleted)
        pipe.execute()

    def names(self) -> list[str]:
        """The names of the cookies in force (never their values; "" for a cookie without a name)."""
        return sorted(cookie.name for cookie in self._read().values())


class Session:
    """``site``'s login, shared by the fleet (see the module docstring)."""

    def __init__(self, connection: redis.Redis, site: str, lease: float = LOGIN_LEASE):
        self.connection = connection
        self.key = keys.session(site)
        self.lease_key = keys.login_lease(site)
        self.lease = lease

    def generation(self) -> int | None:
        """The generation of the session in force, or None when the site is not logged in."""
        state, generation = self.connection.hmget(self.key, ["state", "generation"])
        if state is None or (state.decode() if isinstance(state, bytes) else state) != LOGGED_IN:
            return None
        return int(generation or 0)

    def lead(self) -> str | None:
        """Take the lease to log in (a token), or None when another worker holds it."""
        token = secrets.token_hex(8)
        taken = self.connection.set(self.lease_key, token, nx=True, px=max(1, int(self.lease * 1000)))
        return token if taken else None

    def logged_in(self, token: str) -> int:
        """Mark the site logged in (a new generation) and give the lease back; the new generation."""
        pipe = self.connection.pipeline(transaction=True)
        pipe.hincrby(self.key, "generation", 1)
        pipe.hset(self.key, "state", LOGGED_IN)
        generation = int(pipe.execute()[0])
        self.let_go(token)
        return generation

    def let_go(self, token: str) -> None:
        """Give the lease back, if it is still ours (a lease that expired may be another worker's now)."""
        key = self.lease_key
        self._compare_and_set(key, lambda pipe: pipe.get(key), token, lambda pipe: pipe.delete(key))

    def end(self, generation: int) -> bool:
        """End the session of ``generation`` (a page said it was logged out); False if it had ended already.

        Only the first worker to see a logged-out page of the session in force ends it: a
        page sent with an older session says nothing about the new one.
        """

        def current(pipe: Any) -> Any:
            state, number = pipe.hmget(self.key, ["state", "generation"])
            return f"{state.decode() if state else ''}:{int(number or 0)}"

        return self._compare_and_set(
            self.key, current, f"{LOGGED_IN}:{generation}", lambda pipe: pipe.hdel(self.key, "state")
        )

    def _compare_and_set(
        self, key: str, read: Callable[[Any], Any], expected: str, write: Callable[[Any], Any]
    ) -> bool:
        """``write`` in a transaction if ``read`` gives ``expected`` and ``key`` does not change meanwhile."""
        with self.connection.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                found = read(pipe)
                if (found.decode() if isinstance(found, bytes) else found) != expected:
                    return False
                pipe.multi()
                write(pipe)
                pipe.execute()
                return True
            except redis.WatchError:  # changed meanwhile: someone else did it
                return False


def redacted_set_cookie(value: str) -> str:
    """A ``Set-Cookie`` value fit to show: its name and attributes, its value replaced; a cookie without
    ``=`` is all value (an empty name, as browsers read it), shown ``(redacted)`` whole. Bytes that
    are UTF-8 are shown as its text."""
    pair, separator, attributes = _shown(value).partition(";")
    name, equals, _ = pair.partition("=")
    return f"{name.strip()}=(redacted){separator}{attributes}" if equals else f"(redacted){separator}{attributes}"


def _shown(value: str) -> str:
    """``value`` (one character a byte) as the UTF-8 text it holds, or as it is when it holds none."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value
