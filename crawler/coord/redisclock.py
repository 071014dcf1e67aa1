"""The Redis server's clock, as read from this process without a round trip each time.

Scores, due times and seen-set buckets are on the Redis clock, the one clock every host
shares. A caller that must name keys from it before a script runs (the seen-set buckets
of ``frontier``) estimates it here: one ``TIME`` per connection gives the offset to the
local clock, and the caller asks again (``resync``) when a script finds the estimate off.
"""

from __future__ import annotations

import threading
import time
import weakref

from redis import Redis

_offsets: weakref.WeakKeyDictionary[Redis, float] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def now_ms(connection: Redis) -> float:
    """The Redis clock now, in ms, estimated from the local clock (one TIME on first use)."""
    with _lock:
        offset = _offsets.get(connection)
    if offset is None:
        offset = resync(connection)
    return time.time() * 1000 + offset


def resync(connection: Redis) -> float:
    """Read the Redis clock (TIME) again; the new offset to the local clock, in ms.

    The reply is taken to stand for the middle of the round trip, so the estimate is off
    by at most half of it (plus any step of either clock since).
    """
    before = time.time()
    seconds, micros = connection.time()
    after = time.time()
    offset = int(seconds) * 1000 + int(micros) / 1000 - (before + after) / 2 * 1000
    with _lock:
        _offsets[connection] = offset
    return offset
