"""robots.txt per RFC 9309: fetched through the site's gate, cached in Redis, parsed with protego.

One worker at a time fetches an origin's robots.txt (a short lock); the others wait for
the cached copy or the outage it leaves. A fetch that leaves a copy leaves the lock to
expire (``ROBOTS_LOCK_FOR``), since every worker reads the copy first; any other outcome
releases it. What the answer means (RFC 9309 §2.3.1):

- **2xx**: its rules. The first ``ROBOTS_MAX_BYTES`` (500 KiB) are parsed, the rest is
  not read (§2.5 asks for at least 500 KiB).
- **3xx**: followed, up to ``ROBOTS_MAX_REDIRECTS`` (5) hops (§2.3.1.2), each through the
  site's gate, to http(s) URLs only and not from a public host to a private address; the
  rules found apply to the first origin. One more hop, or a hop that may not be followed,
  counts as "unavailable" (as the RFC allows).
- **4xx** other than 429 ("unavailable", §2.3.1.3): no rules, everything allowed.
- **5xx, 429, or unreachable** (timeout, no connection, a malformed answer; §2.3.1.4):
  everything disallowed until robots.txt can be read. 429 is a 4xx, but it says "not now",
  not "there is no file", so it is taken as a server error, as Google does. Pages are not
  refused: ``allowed`` raises ``RobotsUnavailable`` with the seconds until robots.txt is
  asked again (1 minute, doubling to 1 hour), and the download job puts the page back for
  then. The outage is kept in Redis, so the fleet shares one backoff. Once it has lasted
  ``ROBOTS_OUTAGE_GRACE`` (30 days), the last copy read is used, or, with none, everything
  is allowed (both allowed by §2.3.1.4), while robots.txt is still asked for hourly.
  ``RobotsUnavailable.attempts`` counts the failures in a row: once robots.txt has failed
  1 + ``max_retries`` times, the download job records the site's pages failed
  ("robots.txt unreachable") instead of putting them back, so a crawl drains rather than
  waits for the grace; ``crawler retry`` requeues them and has robots.txt asked again at
  once (``ask_again``).

A readable answer (2xx or "unavailable") is cached for ``ROBOTS_TTL`` (24 h) and also kept
as the origin's last copy for ``ROBOTS_COPY_TTL`` (60 days), for a long outage.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import redis
from protego import Protego
from redis import Redis

from ..backoff import backoff
from ..coord import keys, lua
from ..coord.gate import RELEASE_POLL, Gate
from ..coord.replies import text_map
from ..errors import CrawlerError, ProxyError, RefusedURL, RobotsUnavailable
from ..http.addresses import is_private_host, names_its_address
from ..http.fetch import Fetcher
from ..http.proxies import ProxyPool
from .gated_fetch import Outgoing, send

TakeTurn = Callable[[], Gate]
OnFetch = Callable[[str, int | None, str | None], None]

#: Seconds a robots.txt read (2xx, or 4xx = no rules) is trusted.
ROBOTS_TTL = 24 * 3600
#: Largest part of a robots.txt read and parsed (RFC 9309 asks for at least 500 KiB).
ROBOTS_MAX_BYTES = 500 * 1024
#: Redirects of robots.txt followed (RFC 9309: at least five).
ROBOTS_MAX_REDIRECTS = 5
#: Seconds before an unreachable robots.txt is asked again, after its first failure.
ROBOTS_RETRY_FIRST = 60.0
#: Longest wait between two attempts to read an unreachable robots.txt (the wait doubles up to it).
ROBOTS_RETRY_MAX = 3600.0
#: Seconds of outage after which the last copy (or, with none, no rules) is used instead.
ROBOTS_OUTAGE_GRACE = 30 * 24 * 3600
#: Seconds the last copy of an origin's robots.txt, and the record of an outage, are kept.
ROBOTS_COPY_TTL = 60 * 24 * 3600
#: Longest a process keeps parsed rules without looking at Redis again.
LOCAL_TTL = 300
#: Parsed rules a process holds before it first drops those past LOCAL_TTL.
FORGET_EXPIRED_AT = 1024
#: Seconds an origin's robots.txt lock lasts: one fetch, its redirects included; a worker frozen
#: while holding it holds up the others that long.
ROBOTS_LOCK_FOR = 60


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class Outage:
    """An origin's robots.txt that could not be read: since when, how often, when to ask again."""

    since: float
    failures: int
    retry_at: float
    reason: str

    @classmethod
    def load(cls, connection: Redis, site: str, origin: str) -> Outage | None:
        return cls.of(connection.hgetall(keys.robots_outage(site, origin)))

    @classmethod
    def of(cls, reply: Any) -> Outage | None:
        """The outage an ``HGETALL`` of its record replied, None when there is none."""
        fields = text_map(reply)
        if not fields:
            return None
        return cls(float(fields["since"]), int(fields["failures"]), float(fields["retry_at"]), fields["reason"])

    def next(self, reason: str, now: float, retry_after: float | None = None) -> Outage:
        """This outage after one more failed attempt at ``now`` (the server's Retry-After, if
        longer than the backoff, is honoured up to ``ROBOTS_RETRY_MAX``)."""
        delay = max(backoff(ROBOTS_RETRY_FIRST, self.failures + 1, ROBOTS_RETRY_MAX), retry_after or 0.0)
        return Outage(self.since, self.failures + 1, now + min(delay, ROBOTS_RETRY_MAX), reason)

    def save(self, connection: Redis, site: str, origin: str) -> None:
        key = keys.robots_outage(site, origin)
        with connection.pipeline(transaction=True) as pipe:
            pipe.hset(
                key,
                mapping={
                    "since": self.since,
                    "failures": self.failures,
                    "retry_at": self.retry_at,
                    "reason": self.reason,
                },
            )
            pipe.expire(key, ROBOTS_COPY_TTL)
            pipe.execute()


def ask_again(connection: Redis, site: str, origins: Iterable[str]) -> None:
    """Have the robots.txt of each of ``site``'s ``origins`` that cannot be read asked again at
    the next page, not after its backoff (``crawler retry``). The outage's start and count
    stay: one more failure fails the page again."""
    origins = list(dict.fromkeys(origins))
    with connection.pipeline(transaction=False) as pipe:
        for origin in origins:
            pipe.exists(keys.robots_outage(site, origin))
        found = pipe.execute()
    with connection.pipeline(transaction=False) as pipe:
        for origin, exists in zip(origins, found, strict=True):
            if exists:
                pipe.hset(keys.robots_outage(site, origin), "retry_at", 0)
        pipe.execute()


@dataclass(frozen=True)
class _Answer:
    """What one robots.txt download came to: rules text ("" for none), or None with why it is unreachable."""

    text: str | None
    reason: str = ""
    retry_after: float | None = None


class RobotsCache:
    """robots.txt rules per origin for one process, backed by the Redis copy."""

    def __init__(self, connection: Redis, fetcher: Fetcher, proxies: ProxyPool | None = None):
        self.connection = connection
        self.fetcher = fetcher
        #: Where a proxy robots.txt could not be asked through is benched (``gated_fetch.send``).
        self.proxies = proxies
        self._parsed: dict[tuple[str, str], tuple[float, Protego]] = {}
        #: Rules held when expired ones are next dropped (``_forget_expired``).
        self._forget_at = FORGET_EXPIRED_AT
        self._published_delay: dict[str, float] = {}

    def allowed(
        self,
        site: str,
        url: str,
        user_agent: str,
        take_turn: TakeTurn,
        on_fetch: OnFetch | None = None,
        allow_private: bool = False,
        proxy: str | None = None,
    ) -> bool:
        """Whether robots.txt lets ``user_agent`` fetch ``url``.

        When the rules are not cached, robots.txt is fetched after ``take_turn()`` (the
        site's gate, once per hop); ``on_fetch(url, status, error)`` is told about each
        request. ``allow_private`` is the spider's ``allow_private_addresses``; ``proxy``, the
        proxy robots.txt is fetched through (the page's). A
        ``Crawl-delay`` longer than the site's interval becomes its interval. Raises
        RobotsUnavailable while robots.txt cannot be read (its ``retry_after`` says
        when it will be asked again).
        """
        rules = self._rules(site, origin_of(url), take_turn, on_fetch, allow_private, proxy)
        delay = rules.crawl_delay(user_agent)
        if delay and self._published_delay.get(site) != delay:  # once per process and value
            self._published_delay[site] = delay
            self.connection.hset(keys.conf(site), "robots_delay_ms", int(float(delay) * 1000))
        return bool(rules.can_fetch(url, user_agent))

    def refuses(self, site: str, url: str, user_agent: str) -> bool:
        """Whether the rules this process holds for ``url``'s origin, still fresh, disallow it; False when
        none are held (nothing is read or fetched here)."""
        cached = self._parsed.get((site, origin_of(url)))
        return cached is not None and cached[0] > time.monotonic() and not cached[1].can_fetch(url, user_agent)

    def crawl_delay(self, site: str) -> float:
        """The site's robots.txt Crawl-delay for our user agent as this process last read it (0 if none)."""
        return float(self._published_delay.get(site) or 0.0)

    def _rules(
        self,
        site: str,
        origin: str,
        take_turn: TakeTurn,
        on_fetch: OnFetch | None,
        allow_private: bool,
        proxy: str | None = None,
    ) -> Protego:
        now = time.monotonic()
        cached = self._parsed.get((site, origin))
        if cached is not None and cached[0] > now:
            return cached[1]
        text, ttl = self._text(site, origin, take_turn, on_fetch, allow_private, proxy)
        rules = Protego.parse(text.decode("utf-8", errors="replace"))
        self._parsed[(site, origin)] = (now + max(1, min(ttl, LOCAL_TTL)), rules)
        if len(self._parsed) >= self._forget_at:
            self._forget_expired(now)
        return rules

    def _forget_expired(self, now: float) -> None:
        """Drop the rules past their time, and look again once the rules held have doubled: a broad crawl
        holds those of the origins met in the last LOCAL_TTL, not of every one it met. A thread's rules
        added meanwhile may be dropped too: read again from Redis."""
        kept = {origin: held for origin, held in list(self._parsed.items()) if held[0] > now}
        self._parsed = kept
        self._forget_at = max(FORGET_EXPIRED_AT, 2 * len(kept))

    def _text(
        self,
        site: str,
        origin: str,
        take_turn: TakeTurn,
        on_fetch: OnFetch | None,
        allow_private: bool,
        proxy: str | None = None,
    ) -> tuple[bytes, int]:
        """The robots.txt in force for ``origin``, and for how many seconds it holds.

        Raises RobotsUnavailable while an outage's wait runs (see the module docstring).
        """
        cached, outage = self._cached(site, origin)
        token, looks = None, 0
        while True:
            settled = cached is not None or (outage is not None and outage.retry_at > time.time())
            if settled or token is not None:
                break
            if looks:
                time.sleep(RELEASE_POLL)  # another worker fetches it: what it leaves is read again
            token, cached, outage = self._lock(site, origin)
            looks += 1
        if settled:
            if token is not None:
                self._unlock(site, origin, token)  # another worker's fetch ended between the two reads
            if cached is not None:
                return cached, LOCAL_TTL
            assert outage is not None
            return self._during(site, origin, outage)
        assert token is not None
        kept = False
        try:
            answer = self._download(site, origin, take_turn, on_fetch, allow_private, proxy)
            if answer.text is not None:
                self._keep(site, origin, answer.text, outage is not None)
                kept = True
                return answer.text.encode(), ROBOTS_TTL
            now = time.time()
            outage = (outage or Outage(now, 0, now, "")).next(answer.reason, now, answer.retry_after)
            outage.save(self.connection, site, origin)
        finally:
            if not kept:  # the next attempt, when due, must not wait for the lock's end
                with contextlib.suppress(redis.RedisError):  # an error that stopped the fetch is the one told
                    self._unlock(site, origin, token)
        return self._during(site, origin, outage)

    def _lock(self, site: str, origin: str) -> tuple[str | None, bytes | None, Outage | None]:
        """Take the origin's robots.txt lock (``SET NX``) and read what ``_cached`` reads, in one round trip:
        the lock's token (None if another worker holds it), the cached copy and the outage. The lock is
        not released once robots.txt is cached: every worker reads the copy first."""
        token = secrets.token_hex(8)
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.set(keys.robots_lock(site, origin), token, nx=True, ex=ROBOTS_LOCK_FOR)
            pipe.get(keys.robots(site, origin))
            pipe.hgetall(keys.robots_outage(site, origin))
            taken, text, outage = pipe.execute()
        return (token if taken else None), text, Outage.of(outage)

    def _unlock(self, site: str, origin: str, token: str) -> None:
        lua.script(self.connection, "release_if_owner")(keys=[keys.robots_lock(site, origin)], args=[token])

    def _cached(self, site: str, origin: str) -> tuple[bytes | None, Outage | None]:
        """The robots.txt cached for ``origin`` (None when none is), and the record of its outage (None
        when none is), in one round trip. Its time left is not read: a copy read LOCAL_TTL before its
        day ends is as good for LOCAL_TTL more (``ROBOTS_TTL``)."""
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.get(keys.robots(site, origin))
            pipe.hgetall(keys.robots_outage(site, origin))
            text, outage = pipe.execute()
        return text, Outage.of(outage)

    def _keep(self, site: str, origin: str, text: str, ended: bool) -> None:
        """Cache a readable robots.txt, keep it as the last copy, and end its outage (``ended``: the caller
        read one) in one round trip; no transaction: the caller holds the origin's lock (no outage is
        recorded meanwhile), and a reader that sees the cache stops there."""
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.set(keys.robots(site, origin), text, ex=ROBOTS_TTL)
            pipe.set(keys.robots_copy(site, origin), text, ex=ROBOTS_COPY_TTL)
            if ended:
                pipe.delete(keys.robots_outage(site, origin))
            pipe.execute()

    def _during(self, site: str, origin: str, outage: Outage) -> tuple[bytes, int]:
        """What holds while robots.txt cannot be read: nothing (RobotsUnavailable) for the first
        30 days, then the last copy read, or no rules if there is none."""
        now = time.time()
        wait = max(1.0, outage.retry_at - now)
        if now - outage.since < ROBOTS_OUTAGE_GRACE:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(outage.since))
            raise RobotsUnavailable(
                f"robots.txt of {origin} cannot be read ({outage.reason}; "
                f"{outage.failures} attempt(s) since {since} UTC)",
                retry_after=wait,
                attempts=outage.failures,
            )
        copy = self.connection.get(keys.robots_copy(site, origin))
        return (b"" if copy is None else bytes(copy)), int(wait)  # type: ignore[arg-type]

    def _download(
        self,
        site: str,
        origin: str,
        take_turn: TakeTurn,
        on_fetch: OnFetch | None,
        allow_private: bool,
        proxy: str | None = None,
    ) -> _Answer:
        """Fetch ``origin``'s robots.txt, following redirects (see the module docstring): each hop sent
        through ``site``'s gate by ``gated_fetch.send``, as a page is."""
        url = origin + "/robots.txt"
        for _ in range(ROBOTS_MAX_REDIRECTS + 1):
            gate = take_turn()
            request = Outgoing(site, url, proxy=proxy, allow_private=allow_private)
            try:
                response = send(self.fetcher, gate, request, proxies=self.proxies, truncate_at=ROBOTS_MAX_BYTES)
            except RefusedURL as exc:  # not to be fetched at all (a private address): as no file
                _tell(on_fetch, url, None, str(exc))
                return _Answer("", str(exc))
            except ProxyError:  # the proxy's fault, not the origin's: no outage, the page is retried
                raise
            except CrawlerError as exc:
                _tell(on_fetch, url, None, str(exc))
                return _Answer(None, str(exc))
            status = response.status
            if 300 <= status < 400 and response.location:
                target = urljoin(url, response.location.strip())
                refusal = _unfollowable(url, target, allow_private)
                _tell(on_fetch, url, status, refusal)
                if refusal:
                    return _Answer("", refusal)
                url = target
                continue
            _tell(on_fetch, url, status, None)
            if 200 <= status < 300:
                return _Answer(response.body.decode("utf-8", errors="replace"))
            if status < 500 and status != 429:
                return _Answer("")
            return _Answer(None, f"HTTP {status}", response.retry_after())
        return _Answer("", f"more than {ROBOTS_MAX_REDIRECTS} redirects")


def _tell(on_fetch: OnFetch | None, url: str, status: int | None, error: str | None) -> None:
    if on_fetch:
        on_fetch(url, status, error)


def _unfollowable(source: str, target: str, allow_private: bool) -> str | None:
    """Why a robots.txt redirect from ``source`` to ``target`` is not followed, or None."""
    if urlsplit(target).scheme not in ("http", "https"):
        return f"redirect to {target} not followed: not an http(s) URL"
    if not allow_private and _names_private_address(target) and not _names_private_address(source):
        return f"redirect to {target} not followed: a private address"
    return None


def _names_private_address(url: str) -> bool:
    """Whether ``url``'s host is a non-public IP address or localhost, named outright (no DNS asked)."""
    return names_its_address(url) and is_private_host((urlsplit(url).hostname or "").rstrip("."))
