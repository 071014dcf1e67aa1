"""The seen set: the requests a site has admitted, for good or, with ``revisit_after``, for a while.

A request counts by its fingerprint (``task.fingerprint`` of the canonical URL of a GET without
a body, else ``task.request_fingerprint`` of method, URL and body), 64 bits, kept exactly: as a
signed decimal integer in a seen table (``lua/_seen_table.lua``: sub-sets of at most a few hundred
integers, which Redis stores as intsets, about 9 B a URL; their number grows with the site by
linear hashing). Seen for good: one table, ``keys.seen_table(site)`` (ADD_SEEN). Seen for a while:
a table a time bucket ``revisit_after / SEEN_BUCKETS`` wide named from the Redis clock
(``keys.seen_window``, ADD_SEEN_FOR_A_WHILE), so a URL stays seen from ``revisit_after`` to a
quarter more. The sets of before seen tables (``keys.seen``, ``keys.seen_bucket``: 8-byte members)
are read while they exist; a member ADD_SEEN meets there moves into the table, and ``migrate``
moves the rest; the time buckets expire as they did.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from redis import Redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ..spiders.spider import Request
from . import keys, lua, redisclock
from .replies import text
from .task import fingerprint, request_fingerprint

#: Fingerprints per ADD_SEEN call: a 100,000-link page blocks Redis in short steps, not one long one.
SEEN_CHUNK = 5000
#: Seen-set buckets per ``revisit_after``: a URL stays seen from revisit_after to 1 + 1/SEEN_BUCKETS of it.
SEEN_BUCKETS = 4
#: Members a seen table's sub-set holds on average at most: an unsplit one holds up to twice as
#: many (linear hashing), so 200 keeps every one under 512 (``set-max-intset-entries``), an intset.
SUBSET_LOAD = 200
#: How far (ms) this process's estimate of the Redis clock may be off before naming seen-set
#: buckets takes a second look at it (``redisclock``).
CLOCK_SLACK_MS = 50

#: What tells requests apart in the seen set: the canonical URL of a GET without a body, else (method, URL, body).
SeenKey = str | tuple[str, str, bytes | None]
#: Fingerprints as the scripts take them (``chunk_of``): as table members with their addresses (and
#: sub-sets' numbers), 8 raw bytes each, and the shape the numbers are for (b"" without them).
Chunk = tuple[bytes, bytes, bytes]
#: The shape (level, split pointer) of each seen table (by name) in the last reply this process had:
#: the next call names its members' sub-sets from it, which ADD_SEEN uses while the shape holds.
_shapes: dict[str, tuple[int, int]] = {}
#: msgpack's header of a string of 0 to 31 bytes (fixstr), by length.
_FIXSTR = [bytes([0xA0 | length]) for length in range(32)]


def seen_key(canonical_url: str, request: Request) -> SeenKey:
    """What tells ``request`` (for ``canonical_url``) apart in the seen set."""
    if request.method == "GET" and not request.body:
        return canonical_url
    return (request.method, canonical_url, request.body)


def member(fingerprint_: bytes) -> bytes:
    """A fingerprint (8 bytes) as a seen table holds it: a signed 64-bit decimal integer."""
    return b"%d" % int.from_bytes(fingerprint_, "big", signed=True)


def address(value: bytes) -> int:
    """A table member's address (``lua/_seen_table.lua``): its last nine decimal digits."""
    return abs(int(value)) % 10**9


def chunk_of(fingerprints: Sequence[bytes], shape: tuple[int, int] | None = None) -> Chunk:
    """``fingerprints`` as ADD_SEEN takes them: one msgpack array of the members (strings), their
    addresses (uint32) and, given the table's ``shape`` (level, split) when it has as many sub-sets as
    members (the script looks one at a time), each one's sub-set's number (strings), so that the
    script reads them in one C call; 8 raw bytes each; the shape the numbers are for."""
    values = [int.from_bytes(fp, "big", signed=True) for fp in fingerprints]
    members = [b"%d" % value for value in values]
    addresses = [abs(value) % 10**9 for value in values]  # address()
    named = shape is not None and 2 ** shape[0] + shape[1] >= len(values)
    packed = [b"\xdd" + ((3 if named else 2) * len(values)).to_bytes(4, "big")]
    packed += [_FIXSTR[len(m)] + m for m in members]
    packed += [b"\xce" + h.to_bytes(4, "big") for h in addresses]
    if shape is not None and named:
        level, split = shape
        for h in addresses:
            number = b"%d" % (h % (2 << level) if h % (1 << level) < split else h % (1 << level))
            packed.append(_FIXSTR[len(number)] + number)
        return b"".join(packed), b"".join(fingerprints), b"%d %d" % shape
    return b"".join(packed), b"".join(fingerprints), b""


def seen_chunks(urls: list[SeenKey], shape: tuple[int, int] | None = None) -> tuple[list[int], list[Chunk]]:
    """``urls``' first occurrences (their indexes) and their fingerprints, in chunks of SEEN_CHUNK
    (``chunk_of``, for the table's ``shape`` if known)."""
    first: dict[SeenKey, int] = {}
    for index, url in enumerate(urls):
        first.setdefault(url, index)
    members = [
        fingerprint(key) if isinstance(key, str) else request_fingerprint(key[1], key[0], key[2]) for key in first
    ]
    chunks = [chunk_of(members[start : start + SEEN_CHUNK], shape) for start in range(0, len(members), SEEN_CHUNK)]
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

    def add_for_a_while(self, chunk: Chunk) -> bytes:
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
            indexes = range(first, current + slack + 1)
            names = [keys.seen_window(self.site, i) for i in indexes]
            names += [keys.seen_bucket(self.site, i) for i in indexes]
            args: list[bytes | int] = [chunk[0], width, SEEN_BUCKETS, first, chunk[1], SUBSET_LOAD]  # no shape
            reply = self.add_seen_buckets(keys=names, args=args)
            if reply is not None:
                return as_bytes(reply)
            redisclock.resync(self.connection)
        raise RuntimeError("the Redis clock moved by more than a seen-set bucket at each of three reads")

    @property
    def bucket_width_ms(self) -> int:
        assert self.revisit_after is not None
        return max(1, round(self.revisit_after * 1000 / SEEN_BUCKETS))

    def tables_and_old_sets(self) -> tuple[list[str], list[str]]:
        """The seen tables that say which URLs are seen now (the plain one, or the live time buckets'
        with ``revisit_after``), and the sets of before seen tables that do too."""
        if self.revisit_after is None:
            return [keys.seen_table(self.site)], [keys.seen(self.site)]
        seconds, micros = self.connection.time()
        current = (int(seconds) * 1000 + int(micros) // 1000) // self.bucket_width_ms
        indexes = [current - i for i in range(SEEN_BUCKETS + 1)]
        return [keys.seen_window(self.site, i) for i in indexes], [keys.seen_bucket(self.site, i) for i in indexes]

    def shape(self) -> tuple[int, int] | None:
        """The plain table's shape in the last reply this process had (None with ``revisit_after``)."""
        return None if self.revisit_after is not None else _shapes.get(keys.seen_table(self.site))

    def keys(self) -> list[str]:
        """The keys that say which URLs are seen now (``tables_and_old_sets``), tables first."""
        tables, olds = self.tables_and_old_sets()
        return tables + olds

    def forget(self, fingerprint_: bytes) -> None:
        """Drop the fingerprint (8 bytes) from the seen set (or sets): FORGET_SEEN."""
        tables, olds = self.tables_and_old_sets()
        forget = lua.script(self.connection, "forget_seen")
        forget(keys=tables + olds, args=[member(fingerprint_), fingerprint_, len(tables)])


def mark_seen_together(sets: Sequence[tuple[SeenSet, list[SeenKey]]]) -> list[list[bool]]:
    """Add the requests' fingerprints (``urls``: ``seen_key``s) to each site's seen set; per site, per
    request, whether it was new (in order; one repeated is new at most once, and only its first
    occurrence is sent). The plain seen sets' ADD_SEEN calls go in one pipeline
    (by hash: a script Redis had not loaded is run again on its own, which loads it); a site whose
    URLs are seen for a while only (``revisit_after``) in calls of its own."""
    chunked = [(seen, urls, *seen_chunks(urls, seen.shape())) for seen, urls in sets]
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


def _add_plain(plain: list[tuple[int, SeenSet, Chunk]], added: list[bytes]) -> None:
    """ADD_SEEN of each (index in ``added``, seen set, chunk) in one pipeline; its flags appended to ``added``.

    Calls that found the script not loaded (a Redis restarted mid-crawl, or its first call
    there) are made again in order: the first on its own, which loads it, the others together
    (at the first seed of 10,000 sites, one at a time, they were a round trip a site).
    """
    replies = _add_seen_all(plain)
    missing = [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        _, seen, chunk = plain[missing[0]]
        replies[missing[0]] = seen.add_seen(keys=_plain_keys(seen.site), args=_add_seen_args(chunk))
        replies[missing[0] + 1 :] = _add_seen_all(plain[missing[0] + 1 :])  # in order: those after it again
    for (at, seen, chunk), reply in zip(plain, replies, strict=True):
        if isinstance(reply, NoScriptError):  # unloaded again meanwhile (SCRIPT FLUSH): on its own
            reply = seen.add_seen(keys=_plain_keys(seen.site), args=_add_seen_args(chunk))
        elif isinstance(reply, Exception):
            raise reply
        added[at] += _flags(seen.site, as_bytes(reply))


def _add_seen_all(plain: Sequence[tuple[int, SeenSet, Chunk]]) -> list[Any]:
    """The replies of ADD_SEEN of each chunk, by hash, in one pipeline (errors as replies)."""
    if not plain:
        return []
    connection = plain[0][1].connection
    script = plain[0][1].add_seen
    with connection.pipeline(transaction=False) as pipe:
        for _, seen, chunk in plain:
            pipe.evalsha(script.sha, 2, *_plain_keys(seen.site), *_add_seen_args(chunk))
        return list(pipe.execute(raise_on_error=False))


def _add_seen_args(chunk: Chunk) -> list[bytes | int]:
    return [chunk[0], chunk[1], SUBSET_LOAD, b"", chunk[2]]


def _flags(site: str, reply: bytes) -> bytes:
    """ADD_SEEN's flags, the table's shape after its ``:`` kept for the next call."""
    flags, _, shape = reply.partition(b":")
    level, split = shape.split()
    _shapes[keys.seen_table(site)] = (int(level), int(split))
    return flags


def _plain_keys(site: str) -> list[str]:
    return [keys.seen_table(site), keys.seen(site)]


def as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def contains(connection: Redis, site: str, fingerprint_: bytes) -> bool:
    """Whether ``site``'s seen set for good (its table, or its set of before tables) holds the fingerprint.

    Reads the table's level and split pointer, the sub-set, then them again: a split in
    between (they changed) and it looks again.
    """
    table, value = keys.seen_table(site), member(fingerprint_)
    h = address(value)
    state = connection.hmget(table, "l", "s")
    while True:
        level, split = (int(field or 0) for field in state)
        sub = h % 2**level
        if sub < split:
            sub = h % 2 ** (level + 1)
        with connection.pipeline(transaction=False) as pipe:
            pipe.sismember(f"{table}:{sub}", value)  # type: ignore[arg-type]  # redis-py types members as str
            pipe.sismember(keys.seen(site), fingerprint_)  # type: ignore[arg-type]
            pipe.hmget(table, "l", "s")
            found, old, again = pipe.execute()
        if again == state:
            return bool(found or old)
        state = again


def fingerprints_of(connection: Redis, site: str) -> set[bytes]:
    """The fingerprints (8 bytes each) ``site``'s seen set for good holds (its table, its set of before tables)."""
    found = {as_bytes(fp) for fp in connection.smembers(keys.seen(site))}
    subsets = re.compile(re.escape(keys.seen_table(site)) + r":\d+")
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", keys.seen_table(site)) + ":*"
    for key in connection.scan_iter(match=pattern, count=1000):
        if subsets.fullmatch(text(key)):
            found |= {int(m).to_bytes(8, "big", signed=True) for m in connection.smembers(key)}
    return found


def stored(connection: Redis, site: str) -> tuple[list[str], int]:
    """Every key of ``site``'s seen URLs (tables, their sub-sets, the sets of before tables, time
    buckets included), and how many URLs they hold (a table's count, a set's size)."""
    found = [keys.seen(site)]
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", keys.seen(site)) + ":*"
    found += [text(key) for key in connection.scan_iter(match=pattern, count=1000)]
    tables = re.compile(re.escape(keys.seen(site)) + r":(i|w:\d+)")
    olds = re.compile(re.escape(keys.seen(site)) + r"(:\d+)?")
    with connection.pipeline(transaction=False) as pipe:
        for key in found:
            if tables.fullmatch(key):
                pipe.hget(key, "n")
            elif olds.fullmatch(key):
                pipe.scard(key)
        counts = pipe.execute()
    return found, sum(int(count or 0) for count in counts)


def migrate(connection: Redis, site: str) -> int:
    """Move ``site``'s seen set of before seen tables (``keys.seen``) into its table, SEEN_CHUNK
    fingerprints an ADD_SEEN call ("move": added and removed in one step, so every one stays seen
    throughout); how many were moved. Time buckets of before tables are left to expire."""
    script, moved = lua.script(connection, "add_seen"), 0
    while batch := connection.srandmember(keys.seen(site), SEEN_CHUNK):
        fingerprints = [as_bytes(fp) for fp in batch]  # type: ignore[arg-type]  # a list, given a count
        packed, raw, _ = chunk_of(fingerprints)
        script(keys=_plain_keys(site), args=[packed, raw, SUBSET_LOAD, "move", ""])
        moved += len(fingerprints)
    return moved
