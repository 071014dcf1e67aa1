"""Which commands a crawl sends, by key: a ``MONITOR`` of a Redis tallied by command and key shape.

``INFO commandstats`` counts commands by name only; this tells an ``HSET`` of a site's conf
from one of a job's meta. Each command (a script's inner calls too, marked ``lua``) is
counted under its name and its first key with the run's site names, job ids and numbers
replaced by ``{SITE}``, ``{ID}`` and ``N``. Used by ``bench fleet`` when ``BENCH_FLEET_MONITOR``
names a file (the tally as JSON; the top shapes a request printed); MONITOR itself costs the
server, so CPU figures of a monitored run are not the plain run's.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from pathlib import Path

from redis import Redis

from crawler.coord.connection import connect

_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ID = re.compile(r"[0-9a-f]{16,}")
_NUMBER = re.compile(r"\d+")
#: Commands whose first argument is not a key: their second is shown instead (a script's sha, a subcommand).
_KEY_AT = {"evalsha": 3, "eval": 3, "script": 1, "client": 1, "config": 1, "xreadgroup": 4, "xread": 3}


def shape(line: str, site: re.Pattern[str]) -> str:
    """``line`` of MONITOR's output as ``[lua ]COMMAND key-shape``."""
    args = _ARG.findall(line)
    if not args:
        return "?"
    name = args[0].lower()
    at = _KEY_AT.get(name, 1)
    key = args[at] if len(args) > at else ""
    if name in ("evalsha", "eval"):
        key = f"{args[1][:8]} {key}" if len(args) > 1 else key
    key = _NUMBER.sub("N", _ID.sub("{ID}", site.sub("{SITE}", key)))
    return f"{'lua ' if ' lua]' in line else ''}{name} {key}"


class CommandTally:
    """Tallies every command ``url``'s server runs from ``start`` to ``stop``, by ``shape``."""

    def __init__(self, url: str, site_pattern: str):
        self._site = re.compile(site_pattern)
        self._connection: Redis = connect(url)
        self.counts: Counter[str] = Counter()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> Counter[str]:
        self._stopping.set()
        self._connection.ping()  # a line for the reader to wake on
        self._thread.join(timeout=30)
        return self.counts

    def _run(self) -> None:
        with self._connection.monitor() as monitor:
            reader = monitor.connection
            while not self._stopping.is_set():
                line = reader.read_response()
                text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
                if text != "OK":
                    self.counts[shape(text, self._site)] += 1


def report(counts: Counter[str], requests: int, path: Path, top: int = 40) -> list[str]:
    """Writes ``counts`` as JSON to ``path``; the ``top`` shapes as lines of commands a request."""
    path.write_text(json.dumps(dict(counts.most_common()), indent=1))
    total = sum(counts.values())
    lines = [f"monitored: {total / max(requests, 1):.1f} commands a request over {requests} requests"]
    lines += [f"  {n / max(requests, 1):7.2f}  {what}" for what, n in counts.most_common(top)]
    return lines
