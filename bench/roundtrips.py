"""Sum the round-trip probe's counts (``bench/probe/sitecustomize.py``): ``python -m bench.roundtrips DIR PAGES [TOP]``.

Prints the round trips a page (a request on the wire: PAGES, as the benchmark reported it) of
every process command, then of the TOP call sites (default 30).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def main(argv: list[str]) -> None:
    directory, pages = Path(argv[0]), float(argv[1])
    top = int(argv[2]) if len(argv) > 2 else 30
    sites: Counter[str] = Counter()
    commands: Counter[str] = Counter()
    for path in directory.glob("*.json"):
        data = json.loads(path.read_text())
        command = " ".join(data["argv"])[-60:]
        for where, n in data["counts"].items():
            sites[where] += n
            commands[command] += n
    print(f"round trips a page: {sum(sites.values()) / pages:.3f}")
    for command, n in commands.most_common():
        print(f"  {n / pages:7.3f}  {command}")
    for where, n in sites.most_common(top):
        print(f"{n / pages:7.3f}  {where}")


if __name__ == "__main__":
    main(sys.argv[1:])
