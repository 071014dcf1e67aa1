"""Spider arguments (``crawl``/``seed -a key=value``): attributes every worker's spider instance gets.

They are kept with the crawl in a Redis hash (``keys.spider_args``), so every worker on
every host builds its spider with them; ``crawler reset`` clears them. Values are
strings, as in Scrapy; a spider converts one in ``__init__`` (the attributes are set
before it runs) or by annotating the attribute (``max_price: int = 100``: ``int``,
``float``, ``bool`` and ``str`` annotations convert the string).

Every write is announced (``changes``); a worker looks for an announcement at most once
per ``ARGS_REFRESH`` seconds and builds a new spider instance when the arguments changed,
so arguments set while workers run reach them within that time.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

from redis import Redis

from ..errors import ConfigError
from ..spiders.spider import Spider
from . import keys
from .changes import announce
from .replies import text_map

#: Seconds a worker uses the spider arguments it read before reading Redis again.
ARGS_REFRESH = 1.0
#: Longest value of one argument, in characters.
MAX_VALUE_LENGTH = 10_000
#: Most arguments one crawl may have.
MAX_ARGS = 100

#: What an argument may replace: an attribute holding one of these (or none at all).
_PLAIN = (str, int, float, bool, type(None))
_MISSING = object()
_TRUE = {"1", "true", "yes", "on"}

log = logging.getLogger(__name__)
_FALSE = {"0", "false", "no", "off", ""}


def parse_args(pairs: tuple[str, ...] | list[str], cls: type[Spider]) -> dict[str, str]:
    """``key=value`` pairs as a dict, each checked against ``cls``; ConfigError naming the bad one.

    A name must be an identifier not starting with ``_``, neither a method nor an
    attribute of ``crawler.Spider`` (settings such as ``interval`` have their own
    places: the config file, ``crawler set``), and the attribute it replaces, if any,
    plain data (str, int, float, bool or None: not a property, a class, a list...); a
    value at most MAX_VALUE_LENGTH characters, converting to its annotated type when the
    attribute has one.
    """
    args: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"-a {pair!r}: give key=value")
        check_arg(cls, name.strip(), value)
        args[name.strip()] = value
    if len(args) > MAX_ARGS:
        raise ConfigError(f"{len(args)} spider arguments: at most {MAX_ARGS}")
    return args


def check_arg(cls: type[Spider], name: str, value: str) -> None:
    """ConfigError if ``name=value`` may not be an argument of spider ``cls`` (see ``parse_args``)."""
    if not name.isidentifier() or name.startswith("_"):
        raise ConfigError(f"-a {name}: a spider argument's name is an identifier not starting with _")
    static = inspect.getattr_static(cls, name, _MISSING)
    if callable(static) and not isinstance(static, type):
        raise ConfigError(f"-a {name}: {cls.__name__}.{name} is a method")
    if hasattr(Spider, name):
        raise ConfigError(f"-a {name}: {name} is a setting of every spider, not an argument")
    if static is not _MISSING and not isinstance(static, _PLAIN):
        plain = "not a str, int, float or bool an argument can replace"
        raise ConfigError(f"-a {name}: {cls.__name__}.{name} is {_kind(static)}, {plain}")
    if len(value) > MAX_VALUE_LENGTH:
        raise ConfigError(f"-a {name}: a value of {len(value)} characters (at most {MAX_VALUE_LENGTH})")
    convert(cls, name, value)


def convert(cls: type[Spider], name: str, value: str) -> Any:
    """``value`` as the type ``cls`` annotates ``name`` with (int, float, bool, str), else the string."""
    kind = _annotation(cls, name)
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        raise ConfigError(f"-a {name}={value!r}: {cls.__name__}.{name} is {kind}") from None
    if kind == "bool":
        if value.lower() not in _TRUE | _FALSE:
            raise ConfigError(f"-a {name}={value!r}: {cls.__name__}.{name} is bool (true/false, yes/no, 1/0)")
        return value.lower() in _TRUE
    return value


def _kind(value: object) -> str:
    """What ``value`` is, in words: 'a property', 'a class', 'a list'."""
    kind = "class" if isinstance(value, type) else type(value).__name__
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _annotation(cls: type, name: str) -> str | None:
    for klass in cls.__mro__:
        annotation = klass.__dict__.get("__annotations__", {}).get(name)
        if annotation is not None:
            return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None)
    return None


def build_spider(cls: type[Spider], args: Mapping[str, str]) -> Spider:
    """An instance of ``cls`` with ``args`` (converted by annotation) set as attributes before ``__init__`` runs.

    An argument the instance refuses (a setter that raises, ``__slots__``) is left out with a
    warning, as ``usable_args`` leaves out those that do not hold: a stored value never
    stops the site's spider from being built.
    """
    spider = cls.__new__(cls)
    for name, value in args.items():
        try:
            setattr(spider, name, convert(cls, name, value))
        except Exception as exc:  # noqa: BLE001  # the spider's own code (a setter) may raise anything
            log.warning("%s: spider argument %s=%.40r ignored: %s", cls.name, name, value, exc)
    spider.__init__()  # type: ignore[misc]  # the arguments are in place for the spider's own __init__
    return spider


def store_args(connection: Redis, site: str, args: Mapping[str, str]) -> None:
    """Make ``args`` the spider arguments of ``site``'s crawl (replacing any set before)."""
    with connection.pipeline(transaction=True) as pipe:
        pipe.delete(keys.spider_args(site))
        if args:
            pipe.hset(keys.spider_args(site), mapping=dict(args))  # type: ignore[arg-type]  # str values are fine
        pipe.execute()
    announce(connection)


def read_args(connection: Redis, site: str) -> dict[str, str]:
    """``site``'s spider arguments (empty when none)."""
    return text_map(connection.hgetall(keys.spider_args(site)))


def usable_args(cls: type[Spider], args: Mapping[str, str]) -> dict[str, str]:
    """``args`` without those that do not hold for ``cls`` (written by hand, stored by an earlier version,
    or the spider changed since), each left out with a one-line warning."""
    usable = {}
    for name, value in args.items():
        try:
            check_arg(cls, name, value)
        except ConfigError as exc:
            log.warning("%s: spider argument ignored (`crawler reset %s` clears it): %s", cls.name, cls.name, exc)
            continue
        usable[name] = value
    return usable
