"""Export a site's items as JSON lines, a JSON array, CSV or Parquet, streamed in constant memory.

Items are read from the database as they are written (a streaming query), never held
all at once. CSV and Parquet need every column up front: unless ``fields`` names them,
a first pass over the items collects the field names (and, for Parquet, each field's
type), then a second pass writes the rows. Items stored between the two passes (a crawl
still running) may have fields the header lacks: those are left out; ``--fields`` avoids
the first pass.

Every format is written valid whatever the items hold: a NaN or an infinity (JSON has
neither) is written as null, a lone UTF-16 surrogate as U+FFFD, an integer past 64 bits
as its digits in Parquet (a string column). An item that still cannot be written is an
``ItemNotWritten`` naming its key.
"""

from __future__ import annotations

import codecs
import csv
import importlib.util
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from itertools import islice
from typing import IO, Any

from sqlalchemy import Text, cast, select

from ..errors import ConfigError
from .database import STREAM_ROWS, Store, finite
from .schema import items

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

#: Integers a Parquet int64 column holds; others make their column text (``bigint``).
INT64 = range(-(2**63), 2**63)
#: The codec error handler writing surrogates as UTF-8 can: a pair as its character, a lone one as U+FFFD.
SURROGATES = "crawler.surrogates"

#: An item and the key it is stored under (what an error names).
Keyed = tuple[str, dict[str, Any]]
#: Items to export, read anew at each call (CSV and Parquet read them twice).
ItemSource = Callable[[], Iterable[Keyed]]


class ItemNotWritten(ConfigError):
    """An item that cannot be read or written in the export's format; names its key (the caller adds the site)."""

    def __init__(self, key: str, problem: str, exc: BaseException):
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        super().__init__(f"item {key!r} cannot be {problem}: {reason}")
        self.key = key


#: What turning one item into its format can raise (pyarrow's errors derive from these).
ITEM_ERRORS = (ValueError, TypeError, ArithmeticError, RecursionError, NotImplementedError, csv.Error)


def _surrogates_to_utf8(exc: UnicodeError) -> tuple[bytes, int]:
    """``SURROGATES``: text decoded from JSON may hold ``"\\ud800"``, which UTF-8 cannot encode.

    As the WHATWG encoder (``TextEncoder``) does: a lone surrogate becomes U+FFFD.
    """
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    run = exc.object[exc.start : exc.end]
    return run.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode("utf-8"), exc.end


codecs.register_error(SURROGATES, _surrogates_to_utf8)


def valid_text(text: str) -> str:
    """``text`` as UTF-8 can encode it (lone surrogates as U+FFFD)."""
    return text.encode("utf-8", SURROGATES).decode("utf-8")


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


def keyed_items(store: Store, site: str, history: bool = False) -> Iterator[Keyed]:
    """The site's items with their keys, in key order, streamed; ``history``: as ``with_history`` gives them.

    The data is decoded here rather than by the driver, so that a row whose text is not
    JSON (written by hand) is an ItemNotWritten naming it. Its NaN and infinities (JSON
    text ``Infinity``, or ``1e400``, as Python writes and reads them) come back as floats.
    """
    columns = [items.c.key, cast(items.c.data, Text).label("data")]
    columns += [items.c[name] for name in HISTORY_COLUMNS if name != "key"] if history else []
    query = select(*columns).where(items.c.site == site).order_by(items.c.key)
    with store.engine.connect() as conn:
        for record in conn.execution_options(yield_per=STREAM_ROWS).execute(query):
            data = _decoded(record.key, record.data)
            yield record.key, with_history({**record._mapping, "data": data}) if history else data


def _decoded(key: str, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ItemNotWritten(key, "read from the database", exc) from None
    if not isinstance(data, dict):
        raise ItemNotWritten(key, "read from the database", TypeError(f"not a JSON object: {text[:40]!r}"))
    return data


def with_history(row: dict[str, Any]) -> dict[str, Any]:
    """An ``items`` row's data with its key, URL and history as ``_``-prefixed fields (UTC ISO 8601)."""
    item = dict(row["data"])
    for column in HISTORY_COLUMNS:
        value = row[column]
        if isinstance(value, datetime):
            value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
        item[f"_{column}"] = value
    return item


def write_jsonl(items: Iterable[Keyed], out: IO[str]) -> int:
    """One JSON object per line. Returns the number written."""
    count = 0
    for key, item in items:
        out.write(_json_of(key, item, "jsonl"))
        out.write("\n")
        count += 1
    return count


def write_json(items: Iterable[Keyed], out: IO[str]) -> int:
    """One JSON array, written item by item (one a line). Returns the number written."""
    count = 0
    out.write("[")
    for key, item in items:
        line = _json_of(key, item, "json")
        out.write(",\n" if count else "\n")
        out.write(line)
        count += 1
    out.write("\n]\n" if count else "]\n")
    return count


def _json_of(key: str, item: dict[str, Any], fmt: str) -> str:
    try:
        return _json(item)
    except ITEM_ERRORS as exc:
        raise ItemNotWritten(key, f"written as {fmt}", exc) from None


def _json(value: Any) -> str:
    """JSON text of ``value``, NaN and infinities as null (as ``JSON.stringify`` writes them)."""
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere inside: JSON has no such number
        return json.dumps(finite(value), ensure_ascii=False, sort_keys=True, default=str, allow_nan=False)


def field_names(items: Iterable[Keyed]) -> list[str]:
    """Every field of ``items``, in first-seen order (memory: the distinct names only)."""
    fields: dict[str, None] = {}
    for _, item in items:
        fields.update(dict.fromkeys(item))
    return list(fields)


def write_csv(items: Iterable[dict[str, Any]], out: IO[str], raw: bool = False, fields: list[str] | None = None) -> int:
    """A header of ``fields``, then one row per item; returns the number written.

    ``fields`` None: every field seen, first-seen order (``items`` is then held in
    memory; ``write_items`` reads a source twice instead). A field an item lacks is an
    empty cell, and so is a NaN or an infinity; one not in ``fields`` is left out. Nested
    values (lists, dicts) are written as JSON. A text cell (header included) that a
    spreadsheet would run as a formula, one starting with ``= + - @``, tab or CR, gets a
    leading ``'`` (``neutralize``), unless ``raw``. An error names an item by its position.
    """
    keyed: Iterable[Keyed] = ((f"#{number}", item) for number, item in enumerate(items, 1))
    if fields is None:
        keyed = list(keyed)
        fields = field_names(keyed)
    return _write_csv_rows(keyed, out, raw, fields)


def _write_csv_rows(items: Iterable[Keyed], out: IO[str], raw: bool, fields: list[str]) -> int:
    cell = _as_is if raw else neutralize
    writer = csv.writer(out)
    writer.writerow([cell(field) for field in fields])
    count = 0
    for key, row in items:
        try:
            cells = [cell(_flat(row[field])) if field in row else "" for field in fields]
        except ITEM_ERRORS as exc:
            raise ItemNotWritten(key, "written as csv", exc) from None
        writer.writerow(cells)
        count += 1
    return count


def neutralize(value: Any) -> Any:
    """``value`` with a ``'`` in front if it is text a spreadsheet would read as a formula."""
    return f"'{value}" if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def _as_is(value: Any) -> Any:
    return value


def _flat(value: Any) -> Any:
    """A CSV cell: nested values as JSON text, NaN and infinities empty (as null is in JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return _json(value) if isinstance(value, list | dict) else value


def write_parquet(source: ItemSource, out: IO[bytes], fields: list[str] | None = None) -> int:
    """Parquet, in row groups of PARQUET_BATCH items; returns the number written.

    Columns: ``fields``, or every field seen (a first pass). A column's type is what its
    values share (bool, int, float: int and float mix as float; text), found in the same
    first pass; a column of mixed or nested values (lists, dicts) holds them as JSON text,
    and one of integers past 64 bits (``INT64``) their decimal digits. NaN and infinities
    are null, as in every format. ConfigError when pyarrow is not installed
    (``pip install 'crawler[parquet]'``).
    """
    # The system allocator, unless the user chose one: pyarrow's default (mimalloc) keeps an
    # export's memory from staying constant.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(PARQUET_MISSING) from None
    kinds = _column_kinds(source(), fields)
    types = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64()}
    schema = pa.schema([(valid_text(name), types.get(kind, pa.string())) for name, kind in kinds.items()])
    count = 0
    with pq.ParquetWriter(out, schema) as writer:
        for batch in _batches(source(), PARQUET_BATCH):
            writer.write_table(_table(pa, batch, kinds, schema))
            count += len(batch)
    return count


def _table(pa: Any, batch: list[Keyed], kinds: dict[str, str], schema: Any) -> Any:
    """The rows of ``batch`` as a pyarrow table; ItemNotWritten naming the first item that cannot be."""

    def build(rows: list[Keyed], clean: bool) -> Any:
        columns = [[_cell(item.get(name), kind) for _, item in rows] for name, kind in kinds.items()]
        if clean:  # lone surrogates, which pyarrow's UTF-8 refuses
            columns = [[valid_text(value) if isinstance(value, str) else value for value in c] for c in columns]
        arrays = [pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)]
        return pa.Table.from_arrays(arrays, schema=schema)

    try:
        return build(batch, clean=False)
    except ITEM_ERRORS:
        pass  # cleaned, or the item found, below: only a batch that needs it pays for it
    try:
        return build(batch, clean=True)
    except ITEM_ERRORS:
        for key, item in batch:
            try:
                build([(key, item)], clean=True)
            except ITEM_ERRORS as exc:
                raise ItemNotWritten(key, "written as parquet", exc) from None
        raise


def _column_kinds(items: Iterable[Keyed], fields: list[str] | None) -> dict[str, str]:
    """Each column's kind: bool, int, bigint, float or text (JSON text for nested or mixed values)."""
    seen: dict[str, set[str]] = {name: set() for name in fields or ()}
    for _, item in items:
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
        return "int" if value in INT64 else "bigint"
    if isinstance(value, float):
        return "float"
    return "str" if isinstance(value, str) else "json"


def _combined(kinds: set[str]) -> str:
    if kinds == {"int", "float"}:
        return "float"
    if kinds == {"int", "bigint"}:
        return "bigint"
    if len(kinds) == 1:
        return next(iter(kinds))
    return "json" if kinds else "str"


def _cell(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if kind == "float":
        return float(value)
    if kind == "bigint":
        return str(value)
    if kind == "json" and not isinstance(value, str):
        return _json(value)
    return value


def _batches(items: Iterable[Keyed], size: int) -> Iterator[list[Keyed]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def write_items(
    source: ItemSource,
    out: IO[Any],
    fmt: str,
    raw_csv: bool = False,
    fields: list[str] | None = None,
) -> int:
    """Write the items of ``source`` to ``out`` in ``fmt``; returns the number written.

    ``out`` is text for jsonl, json and csv (UTF-8 with ``SURROGATES`` as its error
    handler, so that a lone surrogate is written as U+FFFD), binary for parquet.
    ``fields`` (csv, parquet) names the columns; without it they are found in a first
    pass over ``source``, which is then read twice (constant memory). ``raw_csv``:
    formulas left as they are. ItemNotWritten names an item the format cannot hold.
    """
    if fmt == "parquet":
        return write_parquet(source, out, fields)
    if fmt == "csv":
        return _write_csv_rows(source(), out, raw_csv, fields if fields is not None else field_names(source()))
    pairs = source() if fields is None else ((key, _only(item, fields)) for key, item in source())
    return write_json(pairs, out) if fmt == "json" else write_jsonl(pairs, out)


def _only(item: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    return {name: item[name] for name in fields if name in item}
