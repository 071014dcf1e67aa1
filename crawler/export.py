"""Export a site's items as JSON lines or CSV."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

FORMATS = ("jsonl", "csv")
#: First characters that make a spreadsheet read a CSV cell as a formula (OWASP's "CSV injection" list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

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


def write_csv(items: Iterable[dict[str, Any]], out: TextIO, raw: bool = False) -> int:
    """A header of every field seen (first-seen order), then one row per item.

    Nested values (lists, dicts) are written as JSON. A text cell (header included) that a
    spreadsheet would run as a formula, one starting with ``= + - @``, tab or CR, gets a
    leading ``'`` (``neutralize``), unless ``raw``.
    """
    rows = list(items)
    fields: dict[str, None] = {}
    for row in rows:
        fields.update(dict.fromkeys(row))
    cell = _as_is if raw else neutralize
    writer = csv.writer(out)
    writer.writerow([cell(field) for field in fields])
    for row in rows:
        writer.writerow([cell(_flat(row[field])) if field in row else "" for field in fields])
    return len(rows)


def neutralize(value: Any) -> Any:
    """``value`` with a ``'`` in front if it is text a spreadsheet would read as a formula."""
    return f"'{value}" if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def _as_is(value: Any) -> Any:
    return value


def _flat(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def write_items(items: Iterable[dict[str, Any]], out: TextIO, fmt: str, raw_csv: bool = False) -> int:
    """Write ``items`` to ``out`` in ``fmt`` (jsonl or csv; ``raw_csv``: formulas left as they are)."""
    if fmt == "csv":
        return write_csv(items, out, raw=raw_csv)
    return write_jsonl(items, out)
