"""The Redis server's clock, as read from this process without a round trip each time.

Scores, due times and seen-set buckets are on the Redis clock, the one clock every host
shares. A caller that must name keys from it before a script runs (the seen-set buckets
of ``frontier``) estimates it here: one ``TIME`` per connection gives the offset to the
local clock, and the caller asks again (``resync``) when a script finds the estimate off, as
``now_ms`` does itself once the connection's Redis is found to be a new server (``failover``:
a promoted replica's clock is another host's).
"""

from __future__ import annotations

import threading
import time
import weakref

from redis import Redis

from . import failover

#: Per client: the offset to the local clock (ms), and the failover generation it was read in.
_offsets: weakref.WeakKeyDictionary[Redis, tuple[float, int]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def now_ms(connection: Redis) -> float:
    """The Redis clock now, in ms, estimated from the local clock (one TIME on first use, and again
    on the first use after a new server was found)."""
    with _lock:
        known = _offsets.get(connection)
    if known is None or known[1] != failover.generation(connection):
        return time.time() * 1000 + resync(connection)
    return time.time() * 1000 + known[0]


def resync(connection: Redis) -> float:
    """Read the Redis clock (TIME) again; the new offset to the local clock, in ms.

    The reply is taken to stand for the middle of the round trip, so the estimate is off
    by at most half of it (plus any step of either clock since).
    """
    before = time.time()
    seconds, micros = connection.time()
    after = time.time()
    offset = int(seconds) * 1000 + int(micros) / 1000 - (before + after) / 2 * 1000
    with _lock:  # read after TIME: a new server found as TIME connected is the one it read
        _offsets[connection] = (offset, failover.generation(connection))
    return offset
