"""Export a site's items as JSON lines or CSV."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

FORMATS = ("jsonl", "csv")

#: Columns of the ``items`` table added to each item by ``with_history``, as ``_NAME``.
HISTORY_COLUMNS = ("key", "url", "first_seen", "last_seen", "changed")


def with_history(row: dict[str, Any]) -> dict[str, Any]:
    """An ``items`` row's data with its key, URL and history as ``_``-prefixed fields (UTC ISO 8601)."""
    item = dict(row["data"])
    for column in HISTORY_COLUMNS:
        value = row[column]
        if isinstance(value, datetime):
            value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
        item[f"_{column}"] = value
    return item


def write_jsonl(items: Iterable[dict[str, Any]], out: TextIO) -> int:
    """One JSON object per line. Returns the number written."""
    count = 0
    for item in items:
        out.write(json.dumps(item, ensure_ascii=False, sort_keys=True, default=str))
        out.write("\n")
        count += 1
    return count


def write_csv(items: Iterable[dict[str, Any]], out: TextIO) -> int:
    """A header of every field seen (first-seen order), then one row per item.

    Nested values (lists, dicts) are written as JSON.
    """
    rows = list(items)
    fields: dict[str, None] = {}
    for row in rows:
        fields.update(dict.fromkeys(row))
    writer = csv.DictWriter(out, fieldnames=list(fields), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()})
    return len(rows)


def write_items(items: Iterable[dict[str, Any]], out: TextIO, fmt: str) -> int:
    """Write ``items`` to ``out`` in ``fmt`` (jsonl or csv)."""
    if fmt == "csv":
        return write_csv(items, out)
    return write_jsonl(items, out)
