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

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_args(pairs: tuple[str, ...] | list[str], cls: type[Spider]) -> dict[str, str]:
    """``key=value`` pairs as a dict, each checked against ``cls``; ConfigError naming the bad one.

    A name must be an identifier not starting with ``_``, neither a method nor an
    attribute of ``crawler.Spider`` (settings such as ``interval`` have their own
    places: the config file, ``crawler set``); a value at most MAX_VALUE_LENGTH
    characters, converting to its annotated type when the attribute has one.
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
    if callable(inspect.getattr_static(cls, name, None)):
        raise ConfigError(f"-a {name}: {cls.__name__}.{name} is a method")
    if hasattr(Spider, name):
        raise ConfigError(f"-a {name}: {name} is a setting of every spider, not an argument")
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


def _annotation(cls: type, name: str) -> str | None:
    for klass in cls.__mro__:
        annotation = klass.__dict__.get("__annotations__", {}).get(name)
        if annotation is not None:
            return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None)
    return None


def build_spider(cls: type[Spider], args: Mapping[str, str]) -> Spider:
    """An instance of ``cls`` with ``args`` (converted by annotation) set as attributes before ``__init__`` runs."""
    spider = cls.__new__(cls)
    for name, value in args.items():
        setattr(spider, name, convert(cls, name, value))
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
    """``args`` without those that do not hold for ``cls`` (written by hand, or the spider changed since)."""
    usable = {}
    for name, value in args.items():
        try:
            check_arg(cls, name, value)
        except ConfigError:
            continue
        usable[name] = value
    return usable
