"""Fleet-wide metrics kept in Redis and served in the Prometheus text format.

STUB: the interface jobs call is fixed (``count_job``); the exporter is being built.
"""

from __future__ import annotations

from typing import Any

from .store import FetchRecord


def count_job(pipe: Any, record: FetchRecord, gate_wait: float | None = None) -> None:
    """Add the Redis commands that count one finished job to ``pipe`` (not executed here)."""
