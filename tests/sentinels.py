"""A Sentinel-managed Redis for tests (``crawler.demo.sentinel.LocalSentinel``), skipped without its binaries.

Without Debian's ``redis-server`` and ``redis-sentinel``, ``sentinel_binaries`` skips, unless
``CRAWLER_REQUIRE_SENTINEL=1`` (set by ``.ci/run``), which makes it fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crawler.demo.sentinel import LocalSentinel, find_binaries, free_port, wait_until

__all__ = ["SentinelSet", "free_port", "sentinel_binaries", "wait_until"]


def sentinel_binaries() -> tuple[str, str]:
    """The two binaries; skips without them (fails under ``CRAWLER_REQUIRE_SENTINEL=1``)."""
    found = find_binaries()
    if found:
        return found
    reason = "redis-server and redis-sentinel (Debian's packages) are not installed"
    if os.environ.get("CRAWLER_REQUIRE_SENTINEL") == "1":
        pytest.fail(f"{reason} (CRAWLER_REQUIRE_SENTINEL=1)")
    pytest.skip(reason)


class SentinelSet(LocalSentinel):
    """``LocalSentinel`` with the binaries found, or the test skipped."""

    def __init__(self, directory: Path):
        super().__init__(directory, *sentinel_binaries())

    def close(self) -> None:
        self.stop()
