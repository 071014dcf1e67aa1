"""Round trips to Redis by call site, per process, when ``RT_TALLY_DIR`` names a directory.

Put this directory first on ``PYTHONPATH`` of a benchmark (its crawler subprocesses inherit it):
every process then counts each round trip its Redis clients start (redis-py's
``send_packed_command``: a command, a pipeline, a script) under the three innermost frames of
``crawler/`` that led to it, and writes the counts to ``RT_TALLY_DIR/PID.json`` every second.
``python -m bench.roundtrips DIR PAGES`` sums them. The stack walk costs CPU: a probed run's
CPU figures are not the plain run's.
"""

import os

if os.environ.get("RT_TALLY_DIR"):
    import json
    import sys
    import threading
    import time
    import traceback
    from collections import Counter

    import redis.connection

    _counts: Counter[str] = Counter()
    _out = os.environ["RT_TALLY_DIR"]
    _send = redis.connection.AbstractConnection.send_packed_command

    def _where() -> str:
        frames = traceback.extract_stack(limit=40)[:-2]
        ours = [f for f in frames if "/crawler/" in f.filename]
        if not ours:
            return "other: " + " < ".join(f"{os.path.basename(f.filename)}:{f.name}" for f in reversed(frames[-3:]))
        return " < ".join(f"{f.filename.split('/crawler/')[-1]}:{f.name}" for f in reversed(ours[-3:]))

    def _counted(self, command, check_health=True):  # type: ignore[no-untyped-def]
        _counts[_where()] += 1
        return _send(self, command, check_health)

    def _dump() -> None:
        while True:
            time.sleep(1.0)
            with open(f"{_out}/{os.getpid()}.json", "w") as f:
                json.dump({"argv": sys.argv, "counts": _counts}, f)

    def _start() -> None:
        _counts.clear()  # a forked child counts its own
        threading.Thread(target=_dump, name="round-trip-probe", daemon=True).start()

    redis.connection.AbstractConnection.send_packed_command = _counted
    _start()
    os.register_at_fork(after_in_child=_start)
