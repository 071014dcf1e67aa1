"""Many reads in one round trip, without a client's work a command: ``read_many``, for the every-site commands.

A redis-py pipeline spends some 8 µs of Python on a command (queued, packed, its reply parsed
and converted, one at a time). Here hiredis packs the commands, they go on one connection of the client's pool at once,
and their replies are read from the connection's parser as it gives them (not through the
connection's ``read_response``, which formats its host's name for an error message at every
reply: at 10,000 sites, 0.05-0.1 s of ``crawler status``): some 1 µs a command. For reads,
whose replies the caller takes raw (``pairs`` for a hash), and for a transaction's writes
(``transact_many``: MULTI ... EXEC, retried whole as the client retries a transaction); other
writes go through the client. ``any_exist`` says which of many groups of keys (a site's each) name a
key in a few commands, not one a group: Redis keeps no empty list, set or hash.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import hiredis
from redis import Redis
from redis.connection import AbstractConnection
from redis.exceptions import ConnectionError, ResponseError

#: An argument of a command, as hiredis packs it.
Arg = str | bytes | int | float


def read_many(connection: Redis, commands: Iterable[Sequence[Arg]]) -> list[Any]:
    """The replies of ``commands`` (reads, each a name and its arguments), in order, as sent together.

    Replies come raw, as the connection's parser makes them (bytes, integers, lists; a hash a
    flat list of fields and values, or a dict over RESP3: ``pairs`` reads either). An error
    reply raises its ``ResponseError`` once every reply is read; a connection lost on the way
    is retried as the client's commands are (its ``retry``), everything sent again.
    """
    return _raised(read_many_replies(connection, commands))


def read_many_replies(connection: Redis, commands: Iterable[Sequence[Arg]]) -> list[Any]:
    """``read_many``'s replies, an error reply as its ``ResponseError`` in its place (not raised)."""
    commands = list(commands)
    if not commands:
        return []
    packed = _packed(commands)
    pool: Any = connection.connection_pool
    conn = _connection(pool)
    try:
        return conn.retry.call_with_retry(lambda: _send_and_read(conn, packed, len(commands)), _dropped(conn))
    except BaseException:  # replies may be left unread on it: never handed out again as it is
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def transact_many(connection: Redis, commands: Iterable[Sequence[Arg]]) -> list[Any]:
    """The replies of ``commands`` run as one transaction (MULTI, the commands, EXEC), raw, in order; sent
    together as ``read_many`` sends its reads (a redis-py transaction's ``command_stack`` holds them so).

    A command Redis refuses as it queues it fails the transaction (EXECABORT: nothing ran) and
    raises; one that fails as it runs raises its ``ResponseError`` after the others ran, as a
    client's transaction does (Redis does not roll back). A connection lost on the way is retried
    as the client retries a transaction: everything sent again.
    """
    commands = list(commands)
    if not commands:
        return []
    *queued, done = read_many_replies(connection, [("MULTI",), *commands, ("EXEC",)])
    for reply in [*queued, done]:
        if isinstance(reply, ResponseError):
            raise reply
    for reply in done:
        if isinstance(reply, ResponseError):
            raise reply
    return list(done)


def _connection(pool: Any) -> AbstractConnection:
    """A connection of ``pool`` (before redis-py 5.3 it takes the name of the command it is for)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("PIPELINE")


def read_chunks(connection: Redis, chunks: Iterable[Iterable[Sequence[Arg]]]) -> Iterator[list[Any]]:
    """``read_many`` of each chunk of ``chunks``, in order, on one connection; a chunk is sent before the
    replies of the one before it are read, so that Redis runs it meanwhile (on another core) while the
    caller reads and uses those: two chunks in flight at most, their replies no more than two chunks'.

    At 10,000 sites ``crawler status`` sends 14 chunks of 5,000 commands: Redis spends some 0.1 s on
    them, which the command waited for, a chunk at a time. A connection lost on the way is retried as
    ``read_many`` retries it: the chunks in flight sent again. A generator left before its end closes
    its connection (replies may be left unread on it).
    """
    chunks = iter(chunks)
    first = next(chunks, None)
    if first is None:  # nothing to read: no connection taken
        return
    pool: Any = connection.connection_pool
    flight = _Flight(_connection(pool))
    finished = False
    try:
        for chunk in itertools.chain([first], chunks):
            flight.send(list(chunk))
            if len(flight.pending) > 1:
                yield _raised(flight.read())
        while flight.pending:
            yield _raised(flight.read())
        finished = True
    finally:
        if not finished:
            flight.conn.disconnect()
        pool.release(flight.conn)


class _Flight:
    """The chunks sent on a connection whose replies are not read yet (``read_chunks``), sent again when the
    connection is lost."""

    def __init__(self, conn: AbstractConnection):
        self.conn = conn
        self.pending: deque[tuple[bytes, int]] = deque()  # each chunk packed, and its number of commands
        self.lost = False  # the connection was closed: what ``pending`` holds is to be sent again

    def send(self, commands: list[Sequence[Arg]]) -> None:
        self.pending.append((_packed(commands), len(commands)))
        self.conn.retry.call_with_retry(lambda: self._send(self.pending[-1]), self._dropped)

    def read(self) -> list[Any]:
        """The replies of the first chunk in flight."""
        replies = self.conn.retry.call_with_retry(self._read, self._dropped)
        self.pending.popleft()
        return replies

    def _send(self, chunk: tuple[bytes, int]) -> None:
        if self.lost:
            self._send_again()
        elif chunk[1]:
            self.conn.send_packed_command([chunk[0]])

    def _read(self) -> list[Any]:
        if self.lost:
            self._send_again()
        return _replies(self.conn, self.pending[0][1])

    def _send_again(self) -> None:
        self.lost = False
        for packed, count in self.pending:
            if count:
                self.conn.send_packed_command([packed])

    def _dropped(self, error: Exception) -> None:
        self.conn.disconnect()
        self.lost = True


def _packed(commands: Sequence[Sequence[Arg]]) -> bytes:
    # hiredis's stub takes a tuple of one argument for a tuple of any number of them
    return b"".join(hiredis.pack_command(tuple(command)) for command in commands)  # type: ignore[arg-type]


def _raised(replies: list[Any]) -> list[Any]:
    """``replies``; the first error reply among them raised."""
    for reply in replies:
        if isinstance(reply, ResponseError):
            raise reply
    return replies


def _send_and_read(conn: AbstractConnection, packed: bytes, count: int) -> list[Any]:
    conn.send_packed_command([packed])
    return _replies(conn, count)


def _replies(conn: AbstractConnection, count: int) -> list[Any]:
    """The next ``count`` replies of ``conn``, an error reply as its ``ResponseError`` (not raised)."""
    parser = getattr(conn, "_parser", None)
    if type(conn).read_response is not AbstractConnection.read_response or parser is None:  # fakeredis's, say
        return [_reply(conn) for _ in range(count)]
    replies: list[Any] = []
    try:
        for _ in range(count):
            replies.append(parser.read_response())  # an error reply comes as its ResponseError, not raised
    except OSError as exc:  # as the connection's read_response says it: retried as the client retries
        raise ConnectionError(f"Error while reading from socket: {exc.args}") from exc
    return replies


def _reply(conn: AbstractConnection) -> Any:
    """The connection's next reply, an error reply as its ``ResponseError`` (not raised)."""
    try:
        return conn.read_response()
    except ResponseError as exc:  # its reply read: the next ones follow
        return exc


def _dropped(conn: AbstractConnection) -> Any:
    """What a failed try does before the next: the connection closed, so no reply of it is read later."""
    return lambda error: conn.disconnect()


def pairs(reply: Any) -> dict[Any, Any]:
    """A hash's reply (``HGETALL``) as a dict: a flat list of fields and values (RESP2), or a dict (RESP3)."""
    if isinstance(reply, dict):
        return reply
    fields = iter(reply)
    return dict(zip(fields, fields, strict=False))


#: Keys one EXISTS of ``any_exist`` names at most.
KEYS_AT_ONCE = 1000


def any_exist(connection: Redis, groups: Sequence[Sequence[str]]) -> list[bool]:
    """For each group of keys, whether any of them exists (an empty list, set or hash is no key).

    One EXISTS names the keys of as many groups as KEYS_AT_ONCE allows; only the groups of a batch that
    named a key are asked again, an EXISTS a group: ten commands for 2,000 groups of five keys when none
    exists. A group of no keys exists not. Two round trips at most.
    """
    batches: list[list[int]] = [[]]
    size = 0
    for index, group in enumerate(groups):
        if size and size + len(group) > KEYS_AT_ONCE:
            batches.append([])
            size = 0
        batches[-1].append(index)
        size += len(group)
    asked = [batch for batch in batches if any(groups[i] for i in batch)]
    found = read_many(connection, [("EXISTS", *(key for i in batch for key in groups[i])) for batch in asked])
    again = [i for batch, n in zip(asked, found, strict=True) if n for i in batch if groups[i]]
    exists = [False] * len(groups)
    for i, n in zip(again, read_many(connection, [("EXISTS", *groups[i]) for i in again]), strict=True):
        exists[i] = bool(n)
    return exists
