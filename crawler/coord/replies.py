"""Redis replies as Python values (the crawler's clients return bytes, not decoded text)."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    """A reply as text: bytes decoded as UTF-8 (invalid bytes replaced), anything else as ``str``."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def text_map(value: Any) -> dict[str, str]:
    """A hash reply (``HGETALL``) as text keys and values."""
    return {text(k): text(v) for k, v in dict(value).items()}
