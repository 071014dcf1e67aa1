"""Many sites' frontiers at once: their seen-set calls, pushes and refills in a few round trips for them all.

A parse worker's batch of pages comes from as many sites, and ``crawler seed --all`` seeds
every site of a project, ``seeding.SEED_SITES`` at a time: what ``Frontier.enqueue`` and
``Frontier.refill`` do for one site is done here for all of them, each step's commands for
every site in one pipeline, so the round trips a call costs do not grow with its sites.
Every site's writes are those of its own ``enqueue`` or ``refill``, in the same transactions
or scripts, so what each leaves in Redis is the same. The frontiers of one call share a
connection (one Redis).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from redis import Redis
from redis.exceptions import NoScriptError

from . import keys
from .bulk import read_many, read_many_replies, transact_many
from .frontier import PUSH_CHUNK, AddResult, Candidate, Frontier, RefillRead
from .scheduler import JOBS_AHEAD, announce_work
from .seen import mark_seen_together, seen_key

#: Sites whose pushes one transaction carries at most (and at most ``PUSH_CHUNK`` entries in all), so
#: that one stays a short block on the server as a site's own push is.
PUSH_SITES = 200

#: A site's push, its last piece ready to go: (index in the call, frontier, (priority, entries), top priority).
_Last = tuple[int, Frontier, tuple[int, list[str]], int]


def enqueue_together(
    frontiers: Sequence[tuple[Frontier, Sequence[tuple[list[Candidate], int]]]], hops: int = 0
) -> list[list[AddResult]]:
    """``Frontier.enqueue`` for several sites at once (one ``Frontier`` each, with its pages): their
    seen-set calls in one round trip (``mark_seen_together``), the new pages of sites with
    ``max_pages`` admitted in another (``admit_together``), then their pushes (``push_together``).
    A parse worker's batch of pages comes from as many sites: a seen-set call of each was a round
    trip for nearly every page at 200 slow sites. Per site, per page, what was done."""
    flats = [[seen_key(url, request) for page, _ in pages for url, request in page] for _, pages in frontiers]
    fresh = mark_seen_together(
        [(frontier.seen, flat) for (frontier, _), flat in zip(frontiers, flats, strict=True) if flat]
    )
    answers = iter(fresh)
    found = [
        frontier.fresh(pages, next(answers) if flat else [])
        for (frontier, pages), flat in zip(frontiers, flats, strict=True)
    ]
    rooms = admit_together([(frontier, seen.taken) for (frontier, _), seen in zip(frontiers, found, strict=True)])
    entries = [
        (frontier, frontier.entries(seen, room, hops))
        for (frontier, _), seen, room in zip(frontiers, found, rooms, strict=True)
    ]
    for seen, dry in zip(found, push_together(entries), strict=True):
        if dry:
            seen.found_dry()
    return [seen.results for seen in found]


def admit_together(counts: Sequence[tuple[Frontier, int]]) -> list[int]:
    """How many of each site's new pages (frontier, how many) are admitted: all of them for a site
    without ``max_pages``, else as ``Frontier._admit`` counts them (an INCRBY of its admitted
    counter), the INCRBYs of every site in one round trip."""
    rooms = [count if frontier.max_pages is None else 0 for frontier, count in counts]
    asked = [
        (at, frontier, count) for at, (frontier, count) in enumerate(counts) if frontier.max_pages is not None and count
    ]
    if not asked:
        return rooms
    with asked[0][1].connection.pipeline(transaction=False) as pipe:
        for _, frontier, count in asked:
            pipe.incrby(keys.admitted(frontier.site), count)
        totals = pipe.execute()
    for (at, frontier, count), total in zip(asked, totals, strict=True):
        rooms[at] = frontier.room(count, int(total))
    return rooms


def push_together(pushes: Sequence[tuple[Frontier, dict[int, list[str]]]]) -> list[bool]:
    """``Frontier.push`` of entries already encoded (by priority) for several sites; per site, whether its
    RQ queue held no job as its push was made (False for a site with nothing to push).

    A site's pieces but the last go as its own push sends them (``Frontier.push_all_but_last``:
    a big push only); the last pieces of the sites go together, in transactions of at most
    ``PUSH_SITES`` sites and ``PUSH_CHUNK`` entries (``bulk.transact_many``); then the sites new to the ready set are
    announced in one round trip, and lower jobs handed back where a push outranks them.
    """
    lasts: list[_Last] = [
        (at, frontier, frontier.push_all_but_last(by_priority), max(by_priority))
        for at, (frontier, by_priority) in enumerate(pushes)
        if by_priority
    ]
    dry = [False] * len(pushes)
    if not lasts:
        return dry
    connection = lasts[0][1].connection
    added: list[str] = []
    ends: list[tuple[_Last, Any, Any]] = []
    for group in _transactions(lasts):
        with connection.pipeline(transaction=True) as pipe:
            spans = []
            for _, frontier, piece, top in group:
                start = len(pipe)
                frontier.queue_last_push(pipe, piece, top)
                spans.append((start, len(pipe)))
            replies = transact_many(connection, [args for args, _ in pipe.command_stack])  # queued, sent raw
        for last, (start, end) in zip(group, spans, strict=True):
            new, outranked, queued = last[1].last_push_replies(replies[start:end])
            if new:
                added.append(last[1].site)
            ends.append((last, outranked, queued))
    announce_work(connection, added)
    for (at, frontier, _, top), outranked, queued in ends:
        dry[at] = frontier.after_push(outranked, queued, top)
    return dry


def _transactions(lasts: list[_Last]) -> Iterator[list[_Last]]:
    """The sites' last pieces in groups of at most PUSH_SITES sites and PUSH_CHUNK entries (a piece
    alone may hold PUSH_CHUNK), in order: a transaction each."""
    group: list[_Last] = []
    entries = 0
    for last in lasts:
        size = len(last[2][1])
        if group and (len(group) >= PUSH_SITES or entries + size > PUSH_CHUNK):
            yield group
            group, entries = [], 0
        group.append(last)
        entries += size
    if group:
        yield group


def refill_together(frontiers: Sequence[Frontier], jobs_ahead: int = JOBS_AHEAD, also: Sequence[int] = ()) -> int:
    """``Frontier.refill`` for several sites at once: their reads in one round trip (``also``: priorities
    whose lists are read along with priority 0's, as ``Frontier.refill_reads`` does: a seed's), the
    second look of those that need one (other priorities waiting) in another, their moves in a
    third. A site whose move found its lists changed is refilled on its own; the moves that found
    the script not loaded are made again, one on its own (which loads it), the others together.
    Returns the jobs made.

    A parse worker refills the sites whose queue its links found dry (``AddResult.queue_dry``): a
    slow site crawled by following its links runs dry after nearly every page as it starts
    (home, listing, first products), and its next job was made only once a look found the site
    due and dry and handed it to a thread to refill, some five round trips between the gate
    opening and the send, each a wait for the interpreter on a loaded process: at 1,000 sites a
    whole 5 s interval at the first product. The links come an interval, less the answer's
    time, before the site's turn: the jobs are made then, off the path to the send.
    """
    if not frontiers:
        return 0
    connection = frontiers[0].connection
    asked = [frontier.refill_reads(jobs_ahead, also) for frontier in frontiers]
    replies = iter(read_many(connection, [command for commands in asked for command in commands]))
    reads: list[tuple[Frontier, RefillRead]] = []
    for frontier, commands in zip(frontiers, asked, strict=True):
        first = [next(replies) for _ in commands]
        if int(first[0]) >= jobs_ahead or not first[1]:  # enough jobs, or nothing to make them of
            continue
        read = frontier.refill_read(jobs_ahead, first, also)
        if read is not None:
            reads.append((frontier, read))
    _second_looks(connection, [(frontier, read) for frontier, read in reads if read.unread])
    made = 0
    alone: list[Frontier] = []
    for (frontier, read), outcome in zip(reads, _moves(connection, reads), strict=True):
        if isinstance(outcome, Exception) or not int(outcome):  # changed meanwhile (or an error: on its own)
            alone.append(frontier)
        else:
            made += read.made
    return made + sum(frontier.refill(jobs_ahead) for frontier in alone)


def _second_looks(connection: Redis, reads: list[tuple[Frontier, RefillRead]]) -> None:
    """The lists each read left unread (``RefillRead.unread``), read for them all in one round trip."""
    asked = [frontier.second_reads(read) for frontier, read in reads]
    replies = iter(read_many(connection, [command for commands in asked for command in commands]))
    for (frontier, read), commands in zip(reads, asked, strict=True):
        frontier.refill_take(read, [next(replies) for _ in commands])


def _moves(connection: Redis, moves: list[tuple[Frontier, RefillRead]]) -> list[Any]:
    """MOVE_TO_QUEUE of each read, by hash, in one pipeline: its reply (1 moved, 0 changed) or its error.

    Those that found the script not loaded (its first call on a Redis) are made again: the
    first on its own (``Frontier.move_to_queue``, which loads it), the others together.
    """
    replies = _move_all(connection, moves)
    missing = [at for at, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        frontier, read = moves[missing[0]]
        replies[missing[0]] = int(frontier.move_to_queue(read, due_now=False))
        again = _move_all(connection, [moves[at] for at in missing[1:]])
        for at, reply in zip(missing[1:], again, strict=True):
            replies[at] = reply
    return replies


def _move_all(connection: Redis, moves: list[tuple[Frontier, RefillRead]]) -> list[Any]:
    """The MOVE_TO_QUEUE calls sent together, raw (``bulk.read_many_replies``, without a pipeline's work a
    command); each reply or its error in its place. A call sent again after a lost connection finds its
    frontier changed (0)."""
    calls = []
    for frontier, read in moves:
        script_keys, args = frontier.move_call(read, due_now=False)
        calls.append(("EVALSHA", frontier.move.sha, len(script_keys), *script_keys, *args))
    return read_many_replies(connection, calls)
