"""Moving a site to another shard on a live crawl: ``crawler move SITE --to SHARD``.

A move pauses the site on its shard, waits until none of its downloads is in flight and
none of its pages waits for a parser (their links are then in its frontier), and until the
workers' counters are written; then copies every key of the site (all carry its ``{SITE}``
tag: queues, RQ jobs, seen set, schedule, retries, cookies, live settings, counters, the
gate with its time left) and its members of the shard's shared sets, with ``DUMP`` and
``RESTORE``, to the other shard, in one transaction there; deletes them from the first in
one transaction; and resumes the site there unless it was paused before. Scores kept in
Redis clock milliseconds are shifted by the difference of the two servers' clocks.

The workers of every shard follow: the site is simply in the other shard's ready set. A
site seeded while it moves may lose those URLs (the move says so); a move cut short leaves
the site on both shards, paused, and the same move run again finishes it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
from redis import Redis
from rq.defaults import RQ_KEY_PREFIX
from rq.job import Job
from rq.queue import Queue

from ..coord import keys, redisclock
from ..coord.changes import announce
from ..coord.policy import read_live, set_live
from ..coord.replies import text
from ..errors import ConfigError
from .status import site_status

#: Seconds a move waits for the site's downloads in flight and pages to parse, before it gives up.
QUIET_WAIT = 120.0
#: Seconds a move waits once the site is quiet, for the counts workers hold to be written
#: (counters every second, metrics every few: ``coord.counters``).
SETTLE = 5.0
#: Seconds the note of a move in progress (``keys.moving``) outlasts the longest a move may take.
TRANSIT_SLACK = 60.0
#: The shards' sets and sorted sets that hold a site among others', with what a member of the site is.
_SCORED = ("ready", "claims")
_PREFIXED = ("delayed", "recrawls")


@dataclass(frozen=True)
class Moved:
    """What a move carried: the site's keys and RQ jobs, and how long the site was paused for it."""

    keys: int
    jobs: int
    paused_for: float


def move_site(
    source: Redis,
    target: Redis,
    site: str,
    publish: Callable[[Redis], None],
    quiet_wait: float = QUIET_WAIT,
    settle: float = SETTLE,
) -> Moved:
    """Move ``site``'s crawl from ``source`` to ``target`` (see the module docstring).

    ``publish(connection)``: make the site's live settings (its pause, or its end) known to the
    workers of that shard (the CLI publishes the site's policy there). ConfigError, the site resumed where
    it was, if it does not quiet down within ``quiet_wait`` seconds or the other shard refuses the copy
    (then nothing of it is left there).
    """
    started = time.monotonic()
    was_paused = read_live(source, site).get("paused") == "1"
    try:
        _in_transit(source, target, site, quiet_wait + settle + TRANSIT_SLACK)
    except redis.RedisError as exc:
        _arrived(source, target, site, quiet=True)
        raise ConfigError(f"{site}: the other shard refused the move ({_first_line(exc)}): not moved") from None
    set_live(source, site, paused=True)
    publish(source)

    def give_up(why: str) -> ConfigError:
        if not was_paused:
            set_live(source, site, paused=False)
            publish(source)
        _arrived(source, target, site, quiet=True)
        return ConfigError(f"{site}: {why}: not moved")

    if not _wait_quiet(source, site, quiet_wait):
        raise give_up(f"still busy after {quiet_wait:g}s (downloads or pages in flight)")
    time.sleep(settle)
    names = list(_site_keys(source, site))
    jobs = _job_keys(source, names)
    # Its last reset's epoch is the source's (``keys.reset_epoch``): none moves, as its counts were written there.
    copied = [name for name in names if name != keys.reset_at(site)]
    try:
        _copy(source, target, site, copied + jobs)
    except redis.RedisError as exc:  # a RESTORE refused (another Redis version's DUMP, a key in the way)
        try:
            _forget(target, site, names + jobs)  # what the transaction did write there
        except redis.RedisError:
            pass  # the shard refuses writes (out of memory): it wrote none of the copy either
        raise give_up(f"the other shard refused the copy ({_first_line(exc)})") from None
    _forget(source, site, names + jobs)
    if not was_paused:
        set_live(target, site, paused=False)
    publish(target)
    announce(target)
    _arrived(source, target, site)
    return Moved(len(names), len(jobs), time.monotonic() - started)


def _in_transit(source: Redis, target: Redis, site: str, seconds: float) -> None:
    """Note ``site`` as moving on both shards (burst workers of neither end meanwhile: ``keys.moving``), and
    drop a drain verdict of before on each (``keys.drained``), which would stand for a count that saw no move."""
    for connection in (source, target):
        with connection.pipeline(transaction=True) as pipe:
            pipe.sadd(keys.moving(), site)
            pipe.pexpire(keys.moving(), int(seconds * 1000))  # a move killed midway holds no burst for good
            pipe.delete(keys.drained())
            pipe.execute()


def _arrived(source: Redis, target: Redis, site: str, quiet: bool = False) -> None:
    """The move's note off both shards (``quiet``: a shard that refuses it is left to its note's expiry)."""
    for connection in (target, source):
        try:
            connection.srem(keys.moving(), site)
        except redis.RedisError:
            if not quiet:
                raise


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _wait_quiet(connection: Redis, site: str, wait: float) -> bool:
    """Whether ``site`` has no download in flight and no page in the pages stream, within ``wait`` seconds.

    Once its downloads are done, its pages are at or before the stream's last entry then (``last``):
    the stream is read only for what came after it (one entry's look for what came before), not
    every page body of a parse backlog at each look.
    """
    deadline = time.monotonic() + wait
    last: str | None = None
    while True:
        (status,) = site_status(connection, [site])
        if status.in_flight:
            last = None
        else:
            last = last or _last_entry(connection)
            parsed_before = not last or not connection.xrange(keys.pages(), max=last, count=1)
            if parsed_before and not _pages_of(connection, site, after=last):
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _last_entry(connection: Redis) -> str:
    """The id of the pages stream's last entry ('' when it is empty)."""
    newest: list[Any] = connection.xrevrange(keys.pages(), count=1) or []
    return text(newest[0][0]) if newest else ""


def _pages_of(connection: Redis, site: str, after: str = "") -> int:
    """How many entries of the pages stream after ``after`` (read or not) are ``site``'s pages (a parse
    worker that stops hands its entries back at the end of the stream)."""
    count, start = 0, f"({after}" if after else "-"
    while True:
        batch: list[Any] = connection.xrange(keys.pages(), min=start, count=200) or []
        for _, fields in batch:
            try:
                count += json.loads((fields or {}).get(b"task", b"{}")).get("site") == site
            except (ValueError, AttributeError):
                continue  # not a page: the parse workers quarantine it
        if len(batch) < 200:
            return count
        start = "(" + text(batch[-1][0])


def _site_keys(connection: Redis, site: str) -> Iterator[str]:
    """Every key holding ``site``'s hash tag: the crawler's and RQ's for its queue."""
    tag = re.sub(r"([*?\[\]\\])", r"\\\1", "{" + site + "}")
    for name in connection.scan_iter(match=f"*{tag}*", count=1000):
        yield text(name)


def _job_keys(connection: Redis, names: list[str]) -> list[str]:
    """The RQ job hashes the site's queue and registries name (``rq:job:ID``, RQ's names), those that exist."""
    ids: set[str] = set()
    with connection.pipeline(transaction=False) as pipe:
        kinds = [(name, pipe.type(name)) for name in names if name.startswith(RQ_KEY_PREFIX + ":")]
        found = pipe.execute()
    with connection.pipeline(transaction=False) as pipe:
        for (name, _), kind in zip(kinds, found, strict=True):
            if text(kind) == "list":
                pipe.lrange(name, 0, -1)
            elif text(kind) == "zset":
                pipe.zrange(name, 0, -1)
        for members in pipe.execute():
            ids.update(text(member) for member in members)
    candidates = sorted(Job.key_for(job_id) for job_id in ids)
    with connection.pipeline(transaction=False) as pipe:
        for name in candidates:
            pipe.exists(name)
        return [name for name, there in zip(candidates, pipe.execute(), strict=True) if there]


def _copy(source: Redis, target: Redis, site: str, names: list[str]) -> None:
    """``names`` and the site's members of the shared sets, from ``source`` to ``target`` in one transaction."""
    with source.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.pttl(name)
            pipe.dump(name)
        dumped = pipe.execute()
    shift = redisclock.now_ms(target) - redisclock.now_ms(source)  # the two servers' clocks, in ms
    members = _shared_members(source, site)
    with target.pipeline(transaction=True) as pipe:
        for name, ttl, payload in zip(names, dumped[::2], dumped[1::2], strict=True):
            if payload is not None:  # gone meanwhile (a key that expired)
                pipe.restore(name, max(int(ttl), 0), payload, replace=True)
        for kind, scored in members.items():
            if scored:
                pipe.zadd(getattr(keys, kind)(), {member: score + shift for member, score in scored})
        pipe.sadd(keys.sites(), site)
        pipe.sadd(Queue.redis_queues_keys, Queue.redis_queue_namespace_prefix + keys.download_queue(site))
        pipe.delete(keys.drained())  # a drain verdict of before: the site's work is now here
        pipe.publish(keys.wake(), site)
        pipe.execute()


def _shared_members(connection: Redis, site: str) -> dict[str, list[tuple[str, float]]]:
    """The site's members (with their scores) of the shard's sorted sets shared by every site."""
    found: dict[str, list[tuple[str, float]]] = {}
    for kind in _SCORED:
        score = connection.zscore(getattr(keys, kind)(), site)
        found[kind] = [] if score is None else [(site, float(score))]
    prefix = f"{site}\t"
    for kind in _PREFIXED:
        found[kind] = [
            (text(member), float(score))
            for member, score in connection.zscan_iter(getattr(keys, kind)(), match=_glob_prefix(prefix) + "*")
        ]
    return found


def _glob_prefix(prefix: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", prefix)


def _forget(connection: Redis, site: str, names: list[str]) -> None:
    """Delete the site from ``connection``'s shard: its keys and its members of the shared sets, in one transaction."""
    members = _shared_members(connection, site)
    with connection.pipeline(transaction=True) as pipe:
        for start in range(0, len(names), 1000):
            pipe.delete(*names[start : start + 1000])
        for kind, scored in members.items():
            if scored:
                pipe.zrem(getattr(keys, kind)(), *(member for member, _ in scored))
        pipe.srem(keys.sites(), site)
        pipe.srem(Queue.redis_queues_keys, Queue.redis_queue_namespace_prefix + keys.download_queue(site))
        pipe.execute()


def describe(moved: Moved, site: str, source: str, target: str) -> str:
    """One line telling what a move did."""
    return (
        f"{site}: moved from shard {source} to {target} ({moved.keys} keys, {moved.jobs} queued jobs; "
        f"paused {moved.paused_for:.1f}s)"
    )
