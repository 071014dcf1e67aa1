"""Adaptive politeness: a site's interval that follows the site's health, shared by the fleet.

A spider sets ``interval = Auto(min=0.5, max=30)``. After every request to the site,
the worker that made it updates the site's **pace** in Redis (``PACE``, one Lua call),
in the site's ``crawler:conf:{SITE}`` hash, where every worker on every host reads it:
the gate scripts take it at each take and each rearm (``Gate(pace_key=…)``), so the
gap after a request is at least the pace in force when it was sent; ``NEXT_JOB``
spaces its hand-outs by it too. The rule, after Heritrix's ``delayFactor`` but counted
from the send, as the gate counts:

- a healthy answer (any status but 429 and 5xx): the pace becomes ``factor`` × the
  request's elapsed time if that is more (up at once), else it eases down by ``ease``
  (10%) of itself per answer (down slowly);
- 429, 503, 504, a timeout or a failed connection: the pace doubles;
- any other 5xx: it goes up to ``factor`` × elapsed, never down;
- always within [``min``, ``max``]; with no pace yet, ``min`` is in force.

Why 5: Heritrix's default delay factor. Counted from the send, one connection then
keeps the site busy with our requests at most 1/5 of the time, and a site whose
response time doubles under load sees our rate halve.

Separately, for every site (adaptive or not), a 429 or 503 *without* ``Retry-After``
closes the site's gate for every worker for ``throttle_pause`` (exponential in the
site's run of errors, with jitter); see ``jobs.outcomes.retry_or_fail``.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis import Redis

from ..backoff import backoff
from ..settings import Auto
from . import lua

#: Statuses that say "too much" (or "too slow"): the pace doubles.
THROTTLE_STATUSES = (429, 503, 504)
#: Most milliseconds a field of a site's conf hash may hold (a year), as ``lua/_conf.lua`` reads them.
MAX_CONF_MS = 31_536_000_000

log = logging.getLogger(__name__)
#: A whole number of ms as the crawler writes one (``lua/_conf.lua`` also takes what Lua's ``tonumber`` does).
_WHOLE = re.compile(r"[0-9]{1,16}")
#: (site, field, value) of conf fields already warned about in this process; cleared past ``_WARNED_MOST``.
_warned: set[tuple[str, str, str]] = set()
_WARNED_MOST = 1_000


def throttle_pause(first: float, errors_in_a_row: int, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to close a site's gate after a 429/503 without Retry-After.

    ``first`` × 2^(n−1) for the n-th transient error in a row, at most ``cap``, with
    "equal jitter": a uniform draw from half that to all of it, so the pause is never
    under half its step and clients that were throttled together do not come back together.
    """
    return backoff(first, errors_in_a_row, cap, jitter=True, rng=rng)


@dataclass(frozen=True)
class Pace:
    """A site's adaptive interval as stored in Redis: seconds, and why."""

    seconds: float
    why: str

    def __str__(self) -> str:
        return f"auto {self.seconds:g}s ({self.why})"


def classify(status: int | None, error: str | None) -> str:
    """The PACE event of a request's outcome: 'ok', 'error' or 'throttle'.

    ``status`` is the HTTP status (None when there was no answer); ``error`` names a
    failure without one ('timeout', 'connection').
    """
    if status is None:
        return "throttle" if error else "ok"
    if status in THROTTLE_STATUSES:
        return "throttle"
    return "error" if status >= 500 else "ok"


class Pacer:
    """Client of ``PACE`` for one process."""

    def __init__(self, connection: Redis):
        self.connection = connection
        self._pace = lua.script(connection, "pace")

    def observe(
        self,
        conf_key: str,
        gate_key: str,
        auto: Auto,
        *,
        elapsed: float,
        status: int | None,
        error: str | None,
        margin: float,
        since_send: float,
    ) -> Pace:
        """Update the site's pace after one request (see the module docstring); returns the new pace.

        ``since_send`` is how long ago the request was sent: the gate is kept closed until
        the send + the new pace + ``margin``, so a pace that grows applies to the next request.
        """
        event = classify(status, error)
        what = str(status) if status is not None else (error or "")
        reply: Any = self._pace(
            keys=[conf_key, gate_key],
            args=[
                event,
                max(0, round(elapsed * 1000)),
                round(auto.min * 1000),
                round(auto.max * 1000),
                f"{auto.factor:g}",
                repr(auto.ease),
                what,
                round(margin * 1000),
                max(0, round(since_send * 1000)),
            ],
        )
        return Pace(int(reply[0]) / 1000.0, _text(reply[1]))


def read_pace(fields: Mapping[str, str], site: str = "") -> Pace | None:
    """The pace in ``site``'s conf hash (decoded fields), or None when it has none (or one that does not hold)."""
    ms = conf_ms(fields, "pace_ms", site)
    return None if ms is None else Pace(ms / 1000.0, fields.get("pace_why", ""))


def conf_ms(fields: Mapping[str, str], name: str, site: str = "", most: int = MAX_CONF_MS) -> int | None:
    """Field ``name`` of ``site``'s conf hash (``keys.conf``, decoded fields): a whole number of ms
    from 0 to ``most``, as the crawler writes it; None when absent.

    Anyone can HSET the hash: a value that is anything else ('abc', 'inf', '1e999', '-1') is
    ignored, as the Lua scripts ignore it (``lua/_conf.lua``), with a warning once per value
    and process, not at every read. The crawler writes the field again in time (the conf is
    published by every worker every ``runtime.REPUBLISH_EVERY``).
    """
    raw = fields.get(name)
    if raw is None:
        return None
    if _WHOLE.fullmatch(raw.strip()) and int(raw) <= most:
        return int(raw)
    if (site, name, raw) not in _warned:
        if len(_warned) >= _WARNED_MOST:
            _warned.clear()
        _warned.add((site, name, raw))
        log.warning("%s: conf field %s=%.40r ignored: not a whole number of ms (written by hand?)", site, name, raw)
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
