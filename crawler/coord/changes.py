"""One token the writers of live settings and spider arguments renew, so readers need not re-read.

Every writer of a site's live settings (``policy``) or spider arguments (``spiderargs``)
puts a new random token in one key after its write (``announce``); a process reads the
token at most a few times per ``policy.LIVE_REFRESH`` (``ChangeWatch``), and while it is the
same, what the process read of a site stands. A token, not a counter: whatever is written
there by hand only makes readers read again. A change announced by no one (written by
hand, or by a writer that died before announcing) is read within ``RECHECK`` seconds. The
key is global (no hash tag): the write and the announcement are made in that order, so a
reader that sees the new token reads the write.
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
    """A process's view of the token, shared by its threads: read again when older than asked.

    ``token()`` is taken before a site's hashes are read and kept with what was read;
    ``confirms(seen, first_read)`` then says until when that read is known to hold.
    """

    def __init__(self, connection: Redis, recheck: float = RECHECK):
        self.connection = connection
        self.recheck = recheck
        #: The token and when it was read, replaced together: a thread never pairs one's token with another's time.
        self._last: tuple[bytes | None, float] = (None, float("-inf"))
        self._lock = threading.Lock()

    def token(self, max_age: float) -> tuple[bytes | None, float]:
        """The token (None when there is none) and when it was read (``time.monotonic()``): read again
        (a round trip) when that was ``max_age`` seconds ago or more."""
        last = self._last
        if time.monotonic() - last[1] < max_age:
            return last
        with self._lock:  # one thread reads it; the others waiting take its answer
            if time.monotonic() - self._last[1] >= max_age:
                asked = time.monotonic()
                try:
                    token = self.connection.get(keys.settings_changes())
                except ResponseError:  # not a string (written by hand): nothing stands, every read is made
                    token = uuid.uuid4().hex.encode()
                self._last = (token if isinstance(token, bytes) else None, asked)
            return self._last

    def confirms(self, seen: bytes | None, first_read: float, max_age: float) -> float | None:
        """Until when hashes first read at ``first_read`` (``time.monotonic()``), the token then ``seen``,
        are known to hold: when the token, read at most ``max_age`` seconds ago, was still ``seen``.
        None when they must be read again: the token changed, or they are ``recheck`` seconds old."""
        if time.monotonic() - first_read >= self.recheck:
            return None
        token, read_at = self.token(max_age)
        return read_at if token == seen else None
