"""Export a site's items as JSON lines, a JSON array, CSV or Parquet, streamed in constant memory.

Items are read from the database as they are written (a streaming query), never held
all at once. CSV and Parquet need every column up front: unless ``fields`` names them,
a first pass over the items collects the field names (and, for Parquet, each field's
type), then a second pass writes the rows. Items stored between the two passes (a crawl
still running) may have fields the header lacks: those are left out; ``--fields`` avoids
the first pass.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from itertools import islice
from typing import IO, Any

from ..errors import ConfigError

FORMATS = ("jsonl", "json", "csv", "parquet")
#: The format a file's suffix selects.
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
#: Formats written as bytes (the others as UTF-8 text).
BINARY_FORMATS = ("parquet",)
#: First characters that make a spreadsheet read a CSV cell as a formula (OWASP's "CSV injection" list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
PARQUET_MISSING = "Parquet export needs pyarrow: pip install 'crawler[parquet]'"
#: Rows in one Parquet row group: what an export holds in memory at once.
PARQUET_BATCH = 10_000

#: Columns of the ``items`` table added to each item by ``with_history``, as ``_NAME``.
HISTORY_COLUMNS = ("key", "url", "first_seen", "last_seen", "changed")

#: Items to export, read anew at each call (CSV and Parquet read them twice).
ItemSource = Callable[[], Iterable[dict[str, Any]]]


def format_for(path: str | None, fmt: str | None) -> str:
    """The format to write ``path`` in: ``fmt`` when given, else from the suffix (stdout: jsonl).

    ConfigError for a file whose suffix names no format and no ``fmt``, and for Parquet
    without pyarrow installed.
    """
    if fmt is None and path not in (None, "-"):
        suffix = "." + path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
        if suffix not in SUFFIXES:
            raise ConfigError(
                f"cannot tell the format of {path!r} from its suffix: name it .jsonl, .json, .csv or .parquet, "
                "or give --format"
            )
        fmt = SUFFIXES[suffix]
    if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:  # now, before a file is opened
        raise ConfigError(PARQUET_MISSING)
    return fmt or "jsonl"


def with_history(row: dict[str, Any]) -> dict[str, Any]:
    """An ``items`` row's data with its key, URL and history as ``_``-prefixed fields (UTC ISO 8601)."""
    item = dict(row["data"])
    for column in HISTORY_COLUMNS:
        value = row[column]
        if isinstance(value, datetime):
            value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
        item[f"_{column}"] = value
    return item


def write_jsonl(items: Iterable[dict[str, Any]], out: IO[str]) -> int:
    """One JSON object per line. Returns the number written."""
    count = 0
    for item in items:
        out.write(_json(item))
        out.write("\n")
        count += 1
    return count


def write_json(items: Iterable[dict[str, Any]], out: IO[str]) -> int:
    """One JSON array, written item by item (one a line). Returns the number written."""
    count = 0
    out.write("[")
    for item in items:
        out.write(",\n" if count else "\n")
        out.write(_json(item))
        count += 1
    out.write("\n]\n" if count else "]\n")
    return count


def _json(item: dict[str, Any]) -> str:
    return json.dumps(item, ensure_ascii=False, sort_keys=True, default=str)


def field_names(items: Iterable[dict[str, Any]]) -> list[str]:
    """Every field of ``items``, in first-seen order (memory: the distinct names only)."""
    fields: dict[str, None] = {}
    for item in items:
        fields.update(dict.fromkeys(item))
    return list(fields)


def write_csv(items: Iterable[dict[str, Any]], out: IO[str], raw: bool = False, fields: list[str] | None = None) -> int:
    """A header of ``fields``, then one row per item; returns the number written.

    ``fields`` None: every field seen, first-seen order (the items are then read twice
    when ``items`` is an ``ItemSource``; a plain iterable is held in memory). A field an
    item lacks is an empty cell; one not in ``fields`` is left out. Nested values (lists,
    dicts) are written as JSON. A text cell (header included) that a spreadsheet would
    run as a formula, one starting with ``= + - @``, tab or CR, gets a leading ``'``
    (``neutralize``), unless ``raw``.
    """
    if fields is None:
        items = list(items)
        fields = field_names(items)
    return _write_csv_rows(items, out, raw, fields)


def _write_csv_rows(items: Iterable[dict[str, Any]], out: IO[str], raw: bool, fields: list[str]) -> int:
    cell = _as_is if raw else neutralize
    writer = csv.writer(out)
    writer.writerow([cell(field) for field in fields])
    count = 0
    for row in items:
        writer.writerow([cell(_flat(row[field])) if field in row else "" for field in fields])
        count += 1
    return count


def neutralize(value: Any) -> Any:
    """``value`` with a ``'`` in front if it is text a spreadsheet would read as a formula."""
    return f"'{value}" if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def _as_is(value: Any) -> Any:
    return value


def _flat(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def write_parquet(source: ItemSource, out: IO[bytes], fields: list[str] | None = None) -> int:
    """Parquet, in row groups of PARQUET_BATCH items; returns the number written.

    Columns: ``fields``, or every field seen (a first pass). A column's type is what its
    values share (bool, int, float: int and float mix as float; text), found in the same
    first pass; a column of mixed or nested values (lists, dicts) holds them as JSON text.
    ConfigError when pyarrow is not installed (``pip install 'crawler[parquet]'``).
    """
    # The system allocator, unless the user chose one: with pyarrow's default (mimalloc) an
    # export's peak grew by some 13 MB from 20,000 items to 200,000 and started 35 MB higher.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(PARQUET_MISSING) from None
    kinds = _column_kinds(source(), fields)
    types = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64()}
    schema = pa.schema([(name, types.get(kind, pa.string())) for name, kind in kinds.items()])
    count = 0
    with pq.ParquetWriter(out, schema) as writer:
        for batch in _batches(source(), PARQUET_BATCH):
            columns = {name: [_cell(item.get(name), kind) for item in batch] for name, kind in kinds.items()}
            writer.write_table(pa.Table.from_pydict(columns, schema=schema))
            count += len(batch)
    return count


def _column_kinds(items: Iterable[dict[str, Any]], fields: list[str] | None) -> dict[str, str]:
    """Each column's kind: bool, int, float or text (JSON text for nested or mixed values)."""
    seen: dict[str, set[str]] = {name: set() for name in fields or ()}
    for item in items:
        for name, value in item.items():
            if fields is None or name in seen:
                kinds = seen.setdefault(name, set())
                if value is not None and len(kinds) < 3:
                    kinds.add(_kind(value))
    return {name: _combined(kinds) for name, kinds in seen.items()}


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "str" if isinstance(value, str) else "json"


def _combined(kinds: set[str]) -> str:
    if kinds == {"int", "float"}:
        return "float"
    if len(kinds) == 1:
        return next(iter(kinds))
    return "json" if kinds else "str"


def _cell(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "float":
        return float(value)
    if kind == "json" and not isinstance(value, str):
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return value


def _batches(items: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def write_items(
    source: ItemSource | Iterable[dict[str, Any]],
    out: IO[Any],
    fmt: str,
    raw_csv: bool = False,
    fields: list[str] | None = None,
) -> int:
    """Write the items of ``source`` to ``out`` in ``fmt``; returns the number written.

    ``out`` is text for jsonl, json and csv, binary for parquet. ``fields`` (csv,
    parquet) names the columns; without it they are found in a first pass over
    ``source``, which is read twice when it is an ``ItemSource`` (constant memory).
    ``raw_csv``: formulas left as they are.
    """
    if not callable(source):
        held = list(source) if fmt in ("csv", "parquet") and fields is None else source
        source = lambda: held  # noqa: E731  # a plain iterable serves a single pass
    if fmt == "parquet":
        return write_parquet(source, out, fields)
    if fmt == "csv":
        return _write_csv_rows(source(), out, raw_csv, fields if fields is not None else field_names(source()))
    items = source() if fields is None else (_only(item, fields) for item in source())
    return write_json(items, out) if fmt == "json" else write_jsonl(items, out)


def _only(item: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    return {name: item[name] for name in fields if name in item}
