"""The seen set: the requests a site has admitted, for good or, with ``revisit_after``, for a while.

A request counts by its fingerprint (``task.fingerprint`` of the canonical URL of a GET without
a body, else ``task.request_fingerprint`` of method, URL and body). Seen for good: one set,
``keys.seen(site)`` (ADD_SEEN). Seen for a while: buckets ``revisit_after / SEEN_BUCKETS``
wide named from the Redis clock (ADD_SEEN_FOR_A_WHILE), so a URL stays seen from
``revisit_after`` to a quarter more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from redis import Redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ..spiders.spider import Request
from . import keys, redisclock
from .task import fingerprint, request_fingerprint

#: Fingerprints per ADD_SEEN call: a 100,000-link page blocks Redis in short steps, not one long one.
SEEN_CHUNK = 5000
#: Seen-set buckets per ``revisit_after``: a URL stays seen from revisit_after to 1 + 1/SEEN_BUCKETS of it.
SEEN_BUCKETS = 4
#: How far (ms) this process's estimate of the Redis clock may be off before naming seen-set
#: buckets takes a second look at it (``redisclock``).
CLOCK_SLACK_MS = 50

#: What tells requests apart in the seen set: the canonical URL of a GET without a body, else (method, URL, body).
SeenKey = str | tuple[str, str, bytes | None]


def seen_key(canonical_url: str, request: Request) -> SeenKey:
    """What tells ``request`` (for ``canonical_url``) apart in the seen set."""
    if request.method == "GET" and not request.body:
        return canonical_url
    return (request.method, canonical_url, request.body)


def seen_chunks(urls: list[SeenKey]) -> tuple[list[int], list[bytes]]:
    """``urls``' first occurrences (their indexes) and their fingerprints, in chunks of SEEN_CHUNK."""
    first: dict[SeenKey, int] = {}
    for index, url in enumerate(urls):
        first.setdefault(url, index)
    members = [
        fingerprint(key) if isinstance(key, str) else request_fingerprint(key[1], key[0], key[2]) for key in first
    ]
    chunks = [b"".join(members[start : start + SEEN_CHUNK]) for start in range(0, len(members), SEEN_CHUNK)]
    return list(first.values()), chunks


class SeenSet:
    """One site's seen set, through its two scripts: ``add_seen`` (ADD_SEEN) and ``add_seen_buckets``
    (ADD_SEEN_FOR_A_WHILE, when ``revisit_after`` is not None)."""

    def __init__(
        self, connection: Redis, site: str, revisit_after: float | None, add_seen: Script, add_seen_buckets: Script
    ):
        self.connection = connection
        self.site = site
        self.revisit_after = revisit_after
        self.add_seen = add_seen
        self.add_seen_buckets = add_seen_buckets

    def add_for_a_while(self, chunk: bytes) -> bytes:
        """ADD_SEEN_FOR_A_WHILE of ``chunk``, its buckets named from the Redis clock as estimated here.

        The buckets passed reach CLOCK_SLACK_MS (at least one bucket) beyond both ends of
        those the script uses; when the estimate is off by more, the script adds nothing
        and the clock is read again.
        """
        width = self.bucket_width_ms
        slack = 1 + math.ceil(CLOCK_SLACK_MS / width)
        for _ in range(3):
            current = int(redisclock.now_ms(self.connection) // width)
            first = current - SEEN_BUCKETS - slack
            buckets = [keys.seen_bucket(self.site, index) for index in range(first, current + slack + 1)]
            reply = self.add_seen_buckets(keys=buckets, args=[chunk, width, SEEN_BUCKETS, first])
            if reply is not None:
                return as_bytes(reply)
            redisclock.resync(self.connection)
        raise RuntimeError("the Redis clock moved by more than a seen-set bucket at each of three reads")

    @property
    def bucket_width_ms(self) -> int:
        assert self.revisit_after is not None
        return max(1, round(self.revisit_after * 1000 / SEEN_BUCKETS))

    def keys(self) -> list[str]:
        """The keys that say which URLs are seen now: the plain set, and the live buckets with ``revisit_after``."""
        found = [keys.seen(self.site)]
        if self.revisit_after is not None:
            seconds, micros = self.connection.time()
            current = (int(seconds) * 1000 + int(micros) // 1000) // self.bucket_width_ms
            found += [keys.seen_bucket(self.site, current - i) for i in range(SEEN_BUCKETS + 1)]
        return found

    def forget(self, member: bytes) -> None:
        """Drop the fingerprint ``member`` from the seen set (or sets)."""
        with self.connection.pipeline(transaction=False) as pipe:
            for key in self.keys():
                pipe.srem(key, member)
            pipe.execute()


def mark_seen_together(sets: Sequence[tuple[SeenSet, list[SeenKey]]]) -> list[list[bool]]:
    """Add the requests' fingerprints (``urls``: ``seen_key``s) to each site's seen set; per site, per
    request, whether it was new (in order; one repeated is new at most once, and only its first
    occurrence is sent). The plain seen sets' ADD_SEEN calls go in one pipeline
    (by hash: a script Redis had not loaded is run again on its own, which loads it); a site whose
    URLs are seen for a while only (``revisit_after``) in calls of its own."""
    chunked = [(seen, urls, *seen_chunks(urls)) for seen, urls in sets]
    added: list[bytes] = [b""] * len(chunked)
    plain = [
        (at, seen, chunk)
        for at, (seen, _, _, chunks) in enumerate(chunked)
        if seen.revisit_after is None
        for chunk in chunks
    ]
    if plain:
        _add_plain(plain, added)
    for at, (seen, _, _, chunks) in enumerate(chunked):
        if seen.revisit_after is not None:
            for chunk in chunks:
                added[at] += seen.add_for_a_while(chunk)
    results = []
    for (_, urls, firsts, _), flags in zip(chunked, added, strict=True):
        new = {index for index, flag in zip(firsts, flags, strict=True) if flag == ord("1")}
        results.append([index in new for index in range(len(urls))])
    return results


def _add_plain(plain: list[tuple[int, SeenSet, bytes]], added: list[bytes]) -> None:
    """ADD_SEEN of each (index in ``added``, seen set, chunk) in one pipeline; its flags appended to ``added``."""
    connection = plain[0][1].connection
    script = plain[0][1].add_seen
    with connection.pipeline(transaction=False) as pipe:
        for _, seen, chunk in plain:
            pipe.evalsha(script.sha, 1, keys.seen(seen.site), chunk)
        replies = pipe.execute(raise_on_error=False)
    for (at, seen, chunk), reply in zip(plain, replies, strict=True):
        if isinstance(reply, NoScriptError):  # a Redis restarted mid-crawl, or this process's first call
            reply = seen.add_seen(keys=[keys.seen(seen.site)], args=[chunk])
        elif isinstance(reply, Exception):
            raise reply
        added[at] += as_bytes(reply)


def as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value
