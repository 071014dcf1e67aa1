"""Items: what a callback yields to be stored, and the user's code between the callback and the database.

An item (any kind itemadapter knows: dicts, dataclasses, attrs classes, pydantic models)
goes through the spider's ``process_item(item, page)``, then the site's pipelines in order,
and is stored as the JSON object of its fields. ``DropItem`` drops the item alone; any
other exception fails the page (``ItemError``, naming the step). A process opens a site's
pipelines once (``Pipelines.open``, within ``OPEN_TIMEOUT``), shares them between its
threads and closes them when it stops. The spider author's view: docs/SPIDERS.md.
"""

from __future__ import annotations

import json
import logging
import pkgutil
import threading
import time as clock
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time
from decimal import Decimal
from enum import Enum
from functools import cache
from typing import TYPE_CHECKING, Any

from .spider import Page, Request, Spider

if TYPE_CHECKING:
    from itemadapter import ItemAdapter

log = logging.getLogger("crawler.items")

#: Longest input value a validation error's summary quotes, in characters.
QUOTED_INPUT = 40
#: Seconds a pipeline's ``open(spider)`` may take before the page it is opened for fails; a pipeline
#: class sets ``open_timeout`` for its own (a remote database's connection that may take longer).
OPEN_TIMEOUT = 30.0


class DropItem(Exception):
    """Raised by a ``process_item`` (the spider's or a pipeline's): the item is not stored, the page goes on.

    The message is the reason (shown by ``crawler parse``); the site's ``dropped`` count
    goes up by one.
    """


class ItemError(Exception):
    """A step after the callback (``process_item``, a pipeline's ``open``) failed: the page fails with this
    one-line message, naming the step; the original exception is the cause."""


def is_item(obj: Any) -> bool:
    """Whether ``obj`` is an item: a dict, dataclass, attrs or pydantic instance (``ItemAdapter.is_item``)."""
    return isinstance(obj, dict) or _adapter().is_item(obj)


@cache
def _adapter() -> type[ItemAdapter]:
    # Imported on the first output that is not a dict: itemadapter imports pydantic and attrs when they are
    # installed (some 70 ms), which every command that loads the package (status, seed) would pay otherwise.
    from itemadapter import ItemAdapter

    return ItemAdapter


def item_data(item: Any) -> dict[str, Any]:
    """The JSON object stored for ``item``.

    A dict as it is; a pydantic model as ``model_dump(mode="json")`` (its own serializers,
    dates in ISO 8601); a dataclass or attrs instance as its fields, nested items made
    dicts, dates in ISO 8601, decimals, UUIDs and the like as strings, sets as lists.
    """
    if isinstance(item, dict):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        return dict(dump(mode="json"))
    data = json.loads(json.dumps(_adapter()(item).asdict(), default=_plain))
    return data if isinstance(data, dict) else {}


def _plain(value: Any) -> Any:
    """A value json cannot write, as one it can."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, Decimal):
        return str(value)
    return str(value)


def load_pipeline(entry: Any) -> type:
    """The pipeline class ``entry`` names: a class, or a dotted path (``package.module.Class`` or
    ``package.module:Class``) importable here; raises what the import raises, TypeError for anything else.
    """
    cls = pkgutil.resolve_name(entry) if isinstance(entry, str) else entry
    if not isinstance(cls, type):
        raise TypeError(f"not a class: {cls!r:.80}")
    if not callable(getattr(cls, "process_item", None)):
        raise TypeError(f"{cls.__qualname__} has no process_item(item, spider, page) method")
    for hook in ("open", "close"):
        if hasattr(cls, hook) and not callable(getattr(cls, hook)):
            raise TypeError(f"{cls.__qualname__}.{hook} is not a method")
    return cls


def pipeline_problem(entries: Any) -> str | None:
    """What is wrong with a ``pipelines`` value (``spidercheck``), or None: one line, naming the bad entry."""
    if isinstance(entries, str) or not isinstance(entries, list | tuple):
        return f"must be a list of pipeline classes or dotted paths, got {type(entries).__name__} {entries!r:.80}"
    for index, entry in enumerate(entries):
        if not isinstance(entry, str | type):
            return f"[{index}] must be a class or a dotted path, got {type(entry).__name__} {entry!r:.80}"
        try:
            load_pipeline(entry)
        except Exception as exc:  # the user's module: any import error is reported, not raised
            name = entry if isinstance(entry, str) else f"{entry.__module__}.{entry.__qualname__}"
            return f"[{index}] {name!r} cannot be used: {describe(exc)}"
    return None


@dataclass
class Sorted:
    """What one callback yielded on one page, past ``process_item`` and the pipelines."""

    #: The items to store, in order, each with its position among the items yielded (dropped ones too).
    items: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    #: Why each dropped item was dropped (``DropItem``'s message), in order.
    dropped: list[str] = field(default_factory=list)


class Pipelines:
    """A spider's ``process_item`` and its site's pipelines, opened: what every item of the site goes through.

    Built by ``open``; shared by the threads of one process (a pipeline's
    ``process_item`` may run in several at once); ``close`` once done with.
    """

    def __init__(self, spider: Spider, pipelines: Sequence[Any]):
        self.spider = spider
        self.pipelines = list(pipelines)
        # (name, process_item, passes the spider): the spider's own only when it overrides the default
        self._steps: list[tuple[str, Any, bool]] = []
        if type(spider).process_item is not Spider.process_item:
            self._steps.append((f"{type(spider).__name__}.process_item", spider.process_item, False))
        self._steps += [(f"{type(p).__name__}.process_item", p.process_item, True) for p in self.pipelines]

    @classmethod
    def open(cls, spider: Spider) -> Pipelines:
        """Make each of ``spider.pipelines`` and call its ``open(spider)``, in order, in a thread of its own.

        ItemError naming the pipeline if one cannot be loaded, made or opened (those
        opened before it are closed again), or if the opening takes longer than its
        timeout (``OPEN_TIMEOUT``, or the sum of the pipelines' ``open_timeout``). An
        opening that overran goes on in its thread: while it does, a call for the same
        spider instance raises at once (no second thread), and once it has ended a call
        takes what it made (or raised).
        """
        if not getattr(spider, "pipelines", None):
            return cls(spider, [])
        with _openings_lock:
            opening = _openings.get(id(spider))
            first = opening is None
            if opening is None:
                opening = _openings[id(spider)] = _Opening(cls, spider)
                opening.start()
        if not opening.done.wait(opening.timeout if first else 0):
            raise ItemError(
                f"pipeline {opening.current} did not open within {opening.timeout:g}s "
                f"(still opening, {clock.monotonic() - opening.started:.0f}s so far): the page is not parsed"
            )
        with _openings_lock:
            if _openings.get(id(spider)) is opening:
                del _openings[id(spider)]
        if opening.error is not None:
            raise opening.error
        assert opening.result is not None  # done without an error
        return opening.result

    @classmethod
    def _open_each(cls, spider: Spider, opening: _Opening) -> Pipelines:
        """``open``'s work, in the opening's thread: each pipeline made and opened in turn."""
        opened: list[Any] = []
        for entry in spider.pipelines:
            name = entry if isinstance(entry, str) else getattr(entry, "__qualname__", repr(entry))
            opening.current = name
            try:
                pipeline = load_pipeline(entry)()
                if callable(getattr(pipeline, "open", None)):
                    pipeline.open(spider)
            except Exception as exc:
                cls(spider, opened).close()
                raise ItemError(f"pipeline {name} failed to open: {describe(exc)}") from exc
            opened.append(pipeline)
        return cls(spider, opened)

    def process(self, item: Any, page: Page) -> dict[str, Any]:
        """``item`` through ``process_item`` and the pipelines, as the JSON object to store.

        DropItem propagates; any other exception, or a step that returns something
        other than an item, raises ItemError naming the step.
        """
        for name, step, with_spider in self._steps:
            try:
                item = step(item, self.spider, page) if with_spider else step(item, page)
            except DropItem:
                raise
            except Exception as exc:
                raise ItemError(f"{name}: {describe(exc)}") from exc
            if not is_item(item):
                raise ItemError(
                    f"{name} returned {type(item).__name__}; expected an item "
                    "(dict, dataclass, attrs or pydantic model), or raise DropItem"
                )
        return item_data(item)

    def sort(self, outputs: Iterable[Any], page: Page, callback: str) -> Sorted:
        """Sort a callback's ``outputs`` into requests, items (processed) and drops.

        TypeError for an output that is neither an item, a ``Request`` nor None; the
        callback's exceptions and ItemError propagate: the page fails as a whole.
        """
        result = Sorted()
        position = 0
        for output in outputs or ():
            if isinstance(output, Request):
                result.requests.append(output)
            elif is_item(output):
                try:
                    result.items.append((position, self.process(output, page)))
                except DropItem as exc:
                    result.dropped.append(str(exc) or "dropped")
                position += 1
            elif output is not None:
                raise TypeError(
                    f"{callback} yielded {type(output).__name__}; expected an item "
                    "(dict, dataclass, attrs or pydantic model) or Request"
                )
        return result

    def close(self) -> None:
        """Call each pipeline's ``close(spider)``, in order; an error is logged, never raised (the worker stops)."""
        for pipeline in self.pipelines:
            if callable(getattr(pipeline, "close", None)):
                try:
                    pipeline.close(self.spider)
                except Exception:
                    log.exception("pipeline %s of %s failed to close", type(pipeline).__name__, self.spider.name)


class _Opening:
    """One spider instance's pipelines being opened in a thread of their own (``Pipelines.open``)."""

    def __init__(self, pipelines: type[Pipelines], spider: Spider):
        self.pipelines = pipelines
        self.spider = spider  # held while the opening is known: its id stays this spider's
        self.timeout = sum(_open_timeout(entry) for entry in spider.pipelines)
        self.done = threading.Event()
        self.started = clock.monotonic()
        self.current = ""  # the pipeline being made or opened
        self.result: Pipelines | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        name = f"pipelines-open-{self.spider.name}"
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self.pipelines._open_each(self.spider, self)
        except BaseException as exc:  # handed to the caller, in its thread
            self.error = exc
        finally:
            self.done.set()


#: Openings under way or not yet taken, by ``id`` of the spider instance.
_openings: dict[int, _Opening] = {}
_openings_lock = threading.Lock()


def _open_timeout(entry: Any) -> float:
    """Seconds the pipeline ``entry`` names may take to open: its class's ``open_timeout``, else OPEN_TIMEOUT."""
    try:
        own = getattr(load_pipeline(entry), "open_timeout", None)
    except Exception:  # the opening itself says why it cannot be loaded
        return OPEN_TIMEOUT
    if isinstance(own, int | float) and not isinstance(own, bool) and 0 < own < float("inf"):
        return float(own)
    return OPEN_TIMEOUT


def describe(exc: BaseException) -> str:
    """``exc`` in one line: its type and the first line of its message; a validation error (pydantic's)
    as the model and, for each invalid field, where it is and what is wrong with it."""
    errors = _validation_errors(exc)
    if errors is not None:
        title = getattr(exc, "title", None)
        fields = "; ".join(_field_error(error) for error in errors)
        return f"{type(exc).__name__}{f' for {title}' if title else ''}: {fields}"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def failure_text(exc: BaseException) -> str:
    """What the record of a page whose parse raised ``exc`` keeps: the traceback, headed by one line
    (what ``crawler failed`` shows) for an ItemError or a validation error, whose traceback's
    last line is no summary (pydantic's is a link to its docs)."""
    trace = "".join(traceback.format_exception(exc, limit=20))
    if isinstance(exc, ItemError):
        return f"{exc}\n{trace}"
    if _validation_errors(exc) is not None:
        return f"{describe(exc)}\n{trace}"
    return trace


def _validation_errors(exc: BaseException) -> list[dict[str, Any]] | None:
    """A pydantic ValidationError's list of errors (``exc.errors()``), else None; pydantic is not imported."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ != "ValidationError" or not callable(errors):
        return None
    try:
        found = errors()
    except Exception:
        return None
    return found if isinstance(found, list) and all(isinstance(e, dict) for e in found) else None


def _field_error(error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc") or ()) or "(item)"
    text = f"{where}: {error.get('msg', 'invalid')}"
    if "input" in error and not isinstance(error["input"], dict):  # a dict input is the whole item: too long
        text += f" (got {error['input']!r:.{QUOTED_INPUT}})"
    return text
