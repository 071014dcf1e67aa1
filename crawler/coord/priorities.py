"""A site's frontier lists, one per priority: entries put back at their front, and whether higher work waits.

Each priority a site has entries of is a list ``keys.frontier(site, priority)``, named in the
site's levels set ``keys.levels(site)`` (scored by the priority); queued RQ jobs are scored in
``keys.queued(site)``. A paced batch asks between its URLs whether work of a higher priority
waits (``outranked``), so a seed waits for the request in flight, not for the rest of the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis import Redis

from . import keys
from .task import DownloadTask

#: Commands that ride in another call's pipeline (given the pipeline), and what takes their replies (None: nothing).
Rider = Callable[[Any], Callable[[list[Any]], None] | None]


def entries_by_priority(tasks: Iterable[DownloadTask]) -> dict[int, list[str]]:
    """The tasks' frontier entries, by priority, in their order."""
    by_priority: dict[int, list[str]] = {}
    for task in tasks:
        by_priority.setdefault(task.priority, []).append(task.to_entry())
    return by_priority


def push_to_front(pipe: Any, site: str, by_priority: dict[int, list[str]]) -> None:
    """Put entries at the front of ``site``'s frontier lists (in ``pipe``), in their order, and name their levels."""
    for priority, entries in by_priority.items():
        pipe.lpush(keys.frontier(site, priority), *reversed(entries))
        pipe.zadd(keys.levels(site), {str(priority): priority})


def outranked(connection: Redis, site: str, priority: int, also: Rider | None = None) -> bool:
    """Whether ``site`` has work of a higher priority than ``priority`` waiting: a queued job or a
    frontier entry (one round trip, which carries what ``also(pipeline)`` adds first; what it
    returns, if anything, is called with the replies to those commands). A paced batch asks it
    between its URLs, so a seed waits for the request in flight, not for the rest of the batch
    (riding in the write of the batch's last record, when it can: ``jobs.batch._Look``).
    A function of the connection, not of the site's ``Frontier``: the runtime's accessor for that
    reads the site's settings when due, which this look reads along."""
    with connection.pipeline(transaction=False) as pipe:
        keep = also(pipe) if also is not None else None
        look_for_higher(pipe, site)
        replies = pipe.execute()
    if keep is not None:
        keep(replies[:-2])
    return higher_waits(replies[-2:], priority)


def look_for_higher(pipe: Any, site: str) -> None:
    """Queue in ``pipe`` the two reads ``higher_waits`` answers from: ``site``'s best queued job and frontier level."""
    pipe.zrevrange(keys.queued(site), 0, 0, withscores=True)
    pipe.zrevrange(keys.levels(site), 0, 0, withscores=True)


def higher_waits(replies: Sequence[Any], priority: int) -> bool:
    """From the replies to ``look_for_higher``: whether work of a higher priority than ``priority`` waits."""
    return any(found and found[0][1] > priority for found in replies)
