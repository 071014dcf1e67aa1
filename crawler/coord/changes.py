"""One token the writers of live settings and spider arguments renew, so readers need not re-read.

Every worker process keeps each site's live settings (``policy``) and spider arguments
(``spiderargs``) and must see a change within a second. Re-reading both hashes of every
site every second cost four ``HGETALL`` a request at 200 slow sites (both processes,
each site's requests a second apart), for hashes that almost never change. So every
writer puts a new random token in one key after it writes (``announce``: ``crawler set``,
``pause``, ``resume``, ``crawl``/``seed -a``, ``reset``, the quarantine of a junk value),
and a process reads the token at most once per ``policy.LIVE_REFRESH`` (``ChangeWatch``): while
it is the same, what the process read of a site stands too, and is not read again. A
token, not a counter: whatever is written there by hand only makes readers read again.

Two cases still need a read by the clock: a value written by hand (``redis-cli HSET``)
announces nothing, and a writer that died between its write and its announcement
announced nothing. A site's hashes are read again at least every ``RECHECK`` seconds
whatever the token says, so such a change reaches the workers within that time.

The key is global (no hash tag): in Redis Cluster the write and the announcement are two
commands in two slots, made in that order, so a reader that sees the new token reads the
write.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from redis import Redis
from redis.exceptions import ResponseError

from . import keys

#: Seconds after which a site's hashes are read again whatever the token says (a change
#: written by hand, or by a writer that died before it announced it).
RECHECK = 30.0


def announce(connection: Any) -> None:
    """Put a new token (``connection`` a client or a pipeline): call it after the write it announces."""
    connection.set(keys.settings_changes(), uuid.uuid4().hex)


class ChangeWatch:
    """A process's view of the token, read again when older than ``every`` seconds.

    ``current()`` is taken before a site's hashes are read and kept with what was read;
    ``stands(seen, read_at)`` then says whether that read still holds.
    """

    def __init__(self, connection: Redis, every: float, recheck: float = RECHECK):
        self.connection = connection
        self.every = every
        self.recheck = recheck
        self._token: bytes | None = None
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def current(self) -> bytes | None:
        """The token (None when there is none), as read at most ``every`` seconds ago (a round trip when older)."""
        if time.monotonic() - self._read_at < self.every:
            return self._token
        with self._lock:  # one thread reads it; the others waiting take its answer
            if time.monotonic() - self._read_at >= self.every:
                asked = time.monotonic()
                try:
                    token = self.connection.get(keys.settings_changes())
                except ResponseError:  # not a string (written by hand): nothing stands, every read is made
                    token = uuid.uuid4().hex.encode()
                self._token = token if isinstance(token, bytes) else None
                self._read_at = asked
            return self._token

    def stands(self, seen: bytes | None, read_at: float, now: float | None = None) -> bool:
        """Whether hashes read at ``read_at`` (``time.monotonic()``), the token then ``seen``, still hold:
        the token is the same, and they are younger than ``recheck`` seconds."""
        now = time.monotonic() if now is None else now
        return now - read_at < self.recheck and self.current() == seen
