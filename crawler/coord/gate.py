"""The gate: a time-limited distributed mutex per site, in the Redis::DistMutex style.

``acquire`` is ``SET <key> <token> NX PX <expire_ms>``. With ``auto_release`` off (the
gate's use) the lock is never released early: it simply expires, so at most one holder
starts per ``expire`` seconds, whatever the number of workers or hosts and however long
each holder takes. With ``auto_release`` on it is an ordinary mutex with a lease.

A blocked acquirer sleeps exactly the lock's remaining PTTL (read in the same round
trip as the failed SET), never a fixed poll.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from redis import Redis
from redis.exceptions import NoScriptError

from . import failover, keys, lua

log = logging.getLogger("crawler.gate")

#: Seconds between two warnings of sends that outlived their grace (``_LateSends``).
LATE_SEND_WARN_EVERY = 10.0


class _LateSends:
    """Warns that sends outlived their grace (``Gate.before_send``): the first at once, then at most
    one line per LATE_SEND_WARN_EVERY with how many there were (an overloaded process meets
    hundreds at once; a line each would queue its threads on the log handler's lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._warned_at = -math.inf

    def note(self, key: str) -> None:
        with self._lock:
            self._count += 1
            now = time.monotonic()
            if now - self._warned_at < LATE_SEND_WARN_EVERY:
                return
            count, self._count, self._warned_at = self._count, 0, now
        log.warning(
            "%s: the send grace ran out between taking the gate and sending (a frozen or slow process): "
            "taking the gate again before sending%s",
            key,
            f" ({count} such sends since the last warning)" if count > 1 else "",
        )


_late_sends = _LateSends()

P = ParamSpec("P")
R = TypeVar("R")

#: Longest sleep of a blocked acquirer of an auto-release mutex (its holder may release early).
RELEASE_POLL = 0.05

#: Seconds added to every time this process works out for a lock to open (``Turn.opens_at``, the
#: sleep after a PTTL): Redis expires a key once its whole-millisecond clock is past the deadline,
#: not at it, so an ask at the deadline itself would find the gate closed and ask again.
EXPIRY_TICK = 0.001


#: Reads a take asks along (given the pipeline, it queues them) and what tells, from their replies,
#: whether to give the take up (``Gate.try_acquire``).
Unless = Callable[[Any], Callable[[list[Any]], bool]]


def _raised(reply: Any) -> int:
    if isinstance(reply, Exception):
        raise reply
    return int(reply)


class GateTimeout(Exception):
    """``acquire`` with a timeout could not take the gate in time."""


class Gate:
    """A named, time-limited mutex in Redis.

    ``expire`` (seconds) is the lock's lifetime: for a site's gate, its interval plus
    a safety margin plus a grace for sending. ``rearm()`` restarts the lifetime as
    ``rearm_expire`` (default ``expire``) from now: a site's gate is rearmed when its
    request is on the wire, so the interval counts from the send, not from the
    acquisition. ``auto_release`` makes the context manager and ``synchronize`` release
    on exit; otherwise the lock expires on its own.

    ``pace_key`` names a Redis hash whose ``pace_ms`` field, when present, lengthens every
    lifetime the gate sets, read in the same Lua call that sets it: a rearm lasts at least
    ``pace_ms`` + ``pace_margin``, a take (or retake) that plus the send grace (``expire -
    rearm_expire``). A site's adaptive interval is kept there (see ``pacing``).

    The lock's key is ``keys.gate(name)``, or ``key`` when given (a short lock: ``keys.lock``).

    ``hold_on_failover`` (a site's gate: ``site_gate``): once the connection's Redis is found to be
    a new server (``failover``), the gate is not taken until ``expire`` after that finding, and is
    closed in Redis for as long, for every worker.
    """

    def __init__(
        self,
        connection: Redis,
        name: str,
        expire: float,
        *,
        auto_release: bool = False,
        rearm_expire: float | None = None,
        pace_key: str | None = None,
        pace_margin: float = 0.0,
        key: str | None = None,
        ready_member: str | None = None,
        hold_on_failover: bool = False,
    ):
        if expire <= 0:
            raise ValueError(f"expire must be greater than 0, got {expire!r}")
        self.connection = connection
        self.name = name
        self.key = key or keys.gate(name)
        self.expire = expire
        self.rearm_expire = expire if rearm_expire is None else rearm_expire
        self.auto_release = auto_release
        self.pace_key = pace_key
        self.pace_margin = pace_margin
        #: The site whose requests take the gate, as a member of the ready set: a late rearm
        #: (``rearm_sent``) moves its next turn to when the gate opens.
        self.ready_member = ready_member
        self.token: str | None = None
        #: Whether the last ``try_acquire``'s ``unless`` said to give the take up.
        self.gave_up = False
        #: ``time.monotonic()`` just before the SET that took the gate (the lock's lifetime
        #: started at or after it, on the Redis clock).
        self.acquired_at: float | None = None
        #: ``time.monotonic()`` just before the last ``rearm`` (the request was on the wire).
        self.rearmed_at: float | None = None
        #: This process's turn at the gate and its ticket, while held (``Runtime.take_gate``): passed on at the send.
        self.turn: tuple[Turn, int] | None = None
        self._acquire = lua.script(connection, "acquire_or_pttl")
        self._release = lua.script(connection, "release_if_owner")
        self._rearm = lua.script(connection, "rearm")
        self._rearm_sent = lua.script(connection, "rearm_sent")
        #: ``time.monotonic()`` when the request went out with its rearm left for later (``sent``).
        self.sent_at: float | None = None
        self._sent_turn: Turn | None = None
        self._sent_left_ms = 0
        self._watch = failover.watch_of(connection) if hold_on_failover else None
        if self._watch is not None:
            self._held = failover.HeldGate(
                max(1, int(round(expire * 1000))), pace_key, self._pace_extra_ms(take=True) if pace_key else 0
            )
            self._watch.know(self.key, self._held)

    def try_acquire(self, unless: Unless | None = None) -> float:
        """Take the gate if open. Returns 0.0 if taken, else seconds until it opens.

        ``unless`` queues reads in the same round trip (given the pipeline) and returns what
        says, from their replies, whether to give the take up: ``gave_up`` then tells so
        (``acquire`` lets the lock go: no request follows that take).
        """
        self.gave_up = False
        seen = 0 if self._watch is None else self._watch.generation
        if seen and (held := self._failover_hold()):
            return held
        token = secrets.token_hex(8)
        expire_ms = max(1, int(round(self.expire * 1000)))
        args: list[str | int] = [token, expire_ms, self._pace_extra_ms(take=True)]
        asked_at = time.monotonic()
        if unless is None:
            wait_ms = int(self._acquire(keys=self._keys, args=args))
        else:
            with self.connection.pipeline(transaction=False) as pipe:
                verdict = unless(pipe)
                pipe.evalsha(self._acquire.sha, len(self._keys), *self._keys, *args)
                replies = pipe.execute(raise_on_error=False)
            error = next((reply for reply in replies[:-1] if isinstance(reply, Exception)), None)
            if isinstance(replies[-1], NoScriptError):  # a Redis restarted mid-crawl: loaded, run alone
                replies[-1] = self._acquire(keys=self._keys, args=args)
            wait_ms = _raised(replies[-1])
            if error is not None:
                raise error
            self.gave_up = verdict(replies[:-1])
        if self._watch is not None and self._watch.generation != seen and (held := self._failover_hold()):
            # A new server was found as this take went out: the take counts for nothing (the lock,
            # if taken, is left to expire: it closes the gate the longer).
            return held
        if wait_ms == 0:
            self.token, self.acquired_at = token, asked_at
            return 0.0
        return wait_ms / 1000.0

    def _failover_hold(self) -> float:
        """Seconds this gate is still held after the last failover found (0.0: not held); the first
        ask of a hold also closes the gate in Redis for what is left of it (``HOLD_GATES``)."""
        assert self._watch is not None
        left = self._watch.hold_left(self.expire)
        if left <= 0 or not self._watch.first_hold(self.key):
            return left
        elapsed = self.expire - left
        gate_keys, args = failover.hold_arguments([(self.key, self._held)], elapsed)
        closed_ms = int(lua.script(self.connection, "hold_gates")(keys=gate_keys, args=args))
        return max(left, closed_ms / 1000.0)

    def acquire(self, blocking: bool = True, timeout: float | None = None, unless: Unless | None = None) -> bool:
        """Take the gate; wait for it unless ``blocking`` is False.

        Waits at most ``timeout`` seconds (forever when None). Returns whether the
        gate was taken. Each wait is the lock's remaining PTTL. ``unless``: asked along with
        each try (``try_acquire``); once it says give up, False, and a lock just taken is
        released (nothing was sent through it, so the next request may go at once: the last
        one went at least its interval ago, or the gate would not have been open).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = self.try_acquire() if unless is None else self.try_acquire(unless)
            if unless is not None and self.gave_up:
                if wait == 0.0:
                    self.release()
                return False
            if wait == 0.0:
                return True
            if not blocking:
                return False
            # A lock not yet rearmed still counts its send grace: it may open as soon as
            # one rearm lifetime from now. A mutex (auto_release) may be released any time.
            wait = min(wait + EXPIRY_TICK, self.rearm_expire, RELEASE_POLL if self.auto_release else math.inf)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wait = min(wait, left)
            time.sleep(wait)

    def release(self) -> bool:
        """Delete the lock if this gate's token still holds it. Returns whether it did."""
        if self.token is None:
            return False
        released = bool(self._release(keys=[self.key], args=[self.token]))
        self.token = None
        return released

    def rearm(self) -> bool:
        """Restart the held lock's lifetime (``rearm_expire``) from now.

        Returns False if another holder took the gate meanwhile: the time between
        ``acquire`` and this call outlasted ``expire``, and spacing may have been lost.
        """
        if self.token is None:
            return False
        expire_ms = max(1, int(round(self.rearm_expire * 1000)))
        self.rearmed_at = time.monotonic()
        try:
            held = int(self._rearm(keys=self._keys, args=[self.token, expire_ms, self._pace_extra_ms(take=False)])) != 0
            if held and self.turn is not None:  # rearmed before the reply: the lock lives at least this long
                self.turn[0].opens_at = time.monotonic() + expire_ms / 1000 + EXPIRY_TICK
            return held
        finally:
            self.let_go()

    def sent(self) -> None:
        """The request is on the wire, its rearm left for later (``rearm_sent``, in the pipeline of its
        record): the turn passes on now. Meanwhile the lock lives on as taken, ``expire`` from
        the take, which outlasts ``rearm_expire`` from the send (``before_send``): spacing holds
        whenever the rearm comes, or if it never does."""
        self.sent_at = self.rearmed_at = time.monotonic()
        self._sent_turn = self.turn[0] if self.turn is not None else None
        if self._sent_turn is not None:
            # Known now, not only once the rearm's reply comes: the lock, held until ``expire`` after the
            # take, is cut to no sooner than this. What is timed by it before then (the record that carries
            # the rearm, above all: ``jobs.batch._soon_records``) was timed by the last send's, long past.
            self._sent_turn.opens_at = self.sent_at + self.rearm_expire + EXPIRY_TICK
        self.let_go()

    def rearm_sent(self, pipe: Any) -> None:
        """Queue in ``pipe`` the rearm of the request ``sent`` earlier: the lock, if this token still holds
        it, ends ``rearm_expire`` after the send (counted on this process's clock up to now, so it
        ends no sooner), or now if that is past. Pass the reply to ``check_rearm_sent``."""
        assert self.sent_at is not None and self.token is not None, "rearm_sent without sent"
        self._sent_left_ms = self._left_ms()
        pipe.evalsha(self._rearm_sent.sha, len(self._sent_keys), *self._sent_keys, *self._sent_args(self._sent_left_ms))

    def check_rearm_sent(self, replies: list[Any]) -> list[Any]:
        """The pipeline's replies from ``rearm_sent``'s on, given back: a script Redis had not loaded (a
        Redis restarted mid-crawl, a process's first call) is run on its own instead. Tells this
        process's turn at the gate when it opens (``Turn.opens_at``), as ``rearm`` does."""
        if isinstance(replies[0], NoScriptError):
            replies[0] = self.rearm_sent_now()
        elif not isinstance(replies[0], Exception):  # another error is the caller's to raise
            self._opens_in(int(replies[0]) != 0, self._sent_left_ms)
        return replies

    def rearm_sent_now(self) -> int:
        """``rearm_sent`` on its own (no record took it along): 1 if this token still held the lock, else 0."""
        assert self.sent_at is not None and self.token is not None, "rearm_sent_now without sent"
        left_ms = self._left_ms()
        held = int(self._rearm_sent(keys=self._sent_keys, args=self._sent_args(left_ms))) != 0
        self._opens_in(held, left_ms)
        return int(held)

    @property
    def _sent_keys(self) -> list[str]:
        """REARM_SENT's keys: the gate, and the ready set when the gate knows its site's member."""
        return [self.key] if self.ready_member is None else [self.key, keys.ready()]

    def _sent_args(self, left_ms: int) -> list[Any]:
        assert self.token is not None
        return [self.token, left_ms] if self.ready_member is None else [self.token, left_ms, self.ready_member]

    def _left_ms(self) -> int:
        assert self.sent_at is not None
        return math.ceil((self.rearm_expire - (time.monotonic() - self.sent_at)) * 1000)

    def _opens_in(self, held: bool, left_ms: int) -> None:
        # Counted from the reply, which came after Redis set the lifetime: the lock is surely
        # closed until then, and the turn's next ask finds it open instead of asking twice.
        if held and self._sent_turn is not None:
            self._sent_turn.opens_at = time.monotonic() + max(0, left_ms) / 1000 + EXPIRY_TICK

    def let_go(self) -> None:
        """Pass this process's turn at the gate on (see ``Turn``): the request is sent, or will not be."""
        turn, self.turn = self.turn, None
        if turn is not None:
            turn[0].give(turn[1])

    def lapsed(self) -> bool:
        """Whether the send grace ran out since the gate was taken (or it is not taken): a send now
        would take it again first (``before_send``). No Redis call."""
        if self.token is None or self.acquired_at is None:
            return True
        return time.monotonic() - self.acquired_at >= self.expire - self.rearm_expire - SEND_SAFETY

    def before_send(self) -> None:
        """Make sure the gate is held, for at least ``rearm_expire`` from now: call it right before sending.

        No Redis call while the holder's own clock says it took the gate less than the send
        grace ago (``expire - rearm_expire``, less ``SEND_SAFETY``). Past it (a frozen process),
        another worker may have taken the gate meanwhile, so it is taken again first (``retake``).
        """
        if self.token is None or self.acquired_at is None:
            self.acquire()
        while self.lapsed():
            _late_sends.note(self.key)
            self.retake()

    def retake(self) -> None:
        """Take the gate afresh for a full ``expire``: renewed if this token still holds it, else waited for."""
        asked_at = time.monotonic()
        expire_ms = max(1, int(round(self.expire * 1000)))
        if self.token is not None:
            renew: list[str | int] = [self.token, expire_ms, self._pace_extra_ms(take=True)]
            if int(self._rearm(keys=self._keys, args=renew)) != 0:
                self.acquired_at = asked_at
                return
        self.acquire()

    @property
    def _keys(self) -> list[str]:
        return [self.key] if self.pace_key is None else [self.key, self.pace_key]

    def _pace_extra_ms(self, take: bool) -> int:
        """Ms the scripts add to the pace: the margin, and for a take the send grace as well."""
        extra = self.pace_margin + (self.expire - self.rearm_expire if take else 0.0)
        return max(0, int(round(extra * 1000)))

    def locked(self) -> bool:
        """Whether anyone holds the gate now."""
        return bool(self.connection.exists(self.key))

    def remaining(self) -> float:
        """Seconds until the gate opens (0.0 if open now)."""
        ttl = int(self.connection.pttl(self.key))
        return max(ttl, 0) / 1000.0

    def __enter__(self) -> Gate:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self.auto_release:
            self.release()

    def synchronize(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``fn`` wrapped to run holding the gate (released after if ``auto_release``)."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return fn(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return f"<Gate {self.key} expire={self.expire}s auto_release={self.auto_release}>"


class Turn:
    """Which thread of this process is at one gate: waiting for it in Redis, or holding it until its send.

    The threads of a process that want one gate queue here, and only the one whose turn
    it is asks Redis. The turn lasts from its first ask until its request is on the wire
    (``Gate.rearm``) or will not be sent (``Gate.let_go``), so no thread of the process
    asks while another has the gate and has not yet sent: such an ask can only fail. The
    gate is still taken in Redis, by each request, so the spacing between requests of all
    processes and hosts is unchanged. A turn not passed on within ``lease`` seconds of
    taking the gate (a thread that died between the take and the send) lapses.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: ``time.monotonic()`` before which the gate is surely closed: rearmed by this process's last
        #: send (``Gate.rearm``). The next turn sleeps until then before it asks Redis, once, not twice.
        self.opens_at = 0.0
        #: ``time.monotonic()`` at which the current turn lapses (inf while its thread waits for Redis; 0: free).
        self._until = 0.0
        self._holder = 0
        self._tickets = 0

    def take(self, timeout: float | None = None) -> int | None:
        """Wait for the turn (at most ``timeout`` seconds); its ticket, or None if it did not come in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (left := self._until - time.monotonic()) > 0:
                if deadline is not None:
                    left = min(left, deadline - time.monotonic())
                    if left <= 0:
                        return None
                self._cond.wait(left if left != float("inf") else None)
            self._tickets += 1
            self._holder, self._until = self._tickets, float("inf")
            return self._holder

    def hold(self, ticket: int, lease: float) -> None:
        """The gate is taken: the turn lapses ``lease`` seconds from now unless given back before."""
        with self._cond:
            if self._holder == ticket:
                self._until = time.monotonic() + lease

    def give(self, ticket: int | None = None) -> None:
        """End the turn (``ticket``'s only, if given: a lapsed turn may be another thread's now)."""
        with self._cond:
            if ticket is None or self._holder == ticket:
                self._until, self._holder = 0.0, 0
                self._cond.notify()


#: Seconds of the send grace kept in reserve: a holder past ``grace - SEND_SAFETY`` since it
#: took the gate takes it again before sending (``Gate.before_send``).
SEND_SAFETY = 0.05

#: Seconds a site's gate stays closed beyond its interval until the request is sent
#: (connection set-up); the rearm at send time then counts the interval from the send.
SEND_GRACE = 0.25


def site_gate(
    connection: Redis,
    site: str,
    interval: float,
    margin: float = 0.0,
    pace_key: str | None = None,
    ready_member: str | None = None,
) -> Gate:
    """The gate that spaces requests to ``site`` by ``interval`` (+ ``margin``) seconds.

    Taken before a request, it stays closed for interval + margin + SEND_GRACE; rearmed
    when the request is sent, it then closes interval + margin from that moment. With
    ``pace_key`` (the site's conf hash, for an adaptive interval), the ``pace_ms`` stored
    there replaces ``interval`` when longer, read by Redis at the take and at the rearm.
    ``site`` may also name a gate several sites share (``keys.shared_gate_name``).
    ``ready_member``: the site whose request takes it (``Gate.ready_member``).
    """
    return Gate(
        connection,
        site,
        interval + margin + SEND_GRACE,
        rearm_expire=interval + margin,
        pace_key=pace_key,
        pace_margin=margin,
        key=keys.gate(site),
        ready_member=ready_member,
        hold_on_failover=True,
    )
