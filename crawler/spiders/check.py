"""Mistakes in a spider module, caught when it loads and reported by file and line.

``check_spider`` validates a spider class's attributes (an ``interval`` of -1, a
``start_urls`` that is one string, a ``refresh`` naming a callback that does not
exist, a ``pipelines`` entry whose module does not import) and names the attribute
and where it is set; ``import_failure`` turns an exception raised while importing a
module into ``FILE, line N: Exception: message``.
"""

from __future__ import annotations

import ast
import functools
import re
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..settings import MAX_INTERVAL, Auto, interval_problem
from .items import pipeline_problem
from .rules import rules_problem

#: What a site name may look like: it names Redis keys, RQ queues and files.
SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

#: Priorities a refresh may have (as ``task.PRIORITY_RANGE``; not imported, to keep loading light).
_PRIORITY_RANGE = (-1000, 1000)


def import_failure(file: Path, exc: BaseException) -> str:
    """``exc``, raised while importing ``file``, as ``FILE, line N: Type: message``.

    The line is where the error happened in the spider's own file (a syntax error's
    line, or the deepest frame of the traceback in that file); without one, the
    message alone.
    """
    what = traceback.format_exception_only(type(exc), exc)[-1].strip()
    line = _line_in(file, exc)
    return f"{_shown(file)}, line {line}: {what}" if line else f"{_shown(file)}: {what}"


def _line_in(file: Path, exc: BaseException) -> int | None:
    if isinstance(exc, SyntaxError) and exc.lineno and _same(exc.filename, file):
        return exc.lineno
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if _same(frame.filename, file)]
    return lines[-1] if lines else None


def _same(filename: str | None, file: Path) -> bool:
    if not filename:
        return False
    try:
        return Path(filename).resolve() == file.resolve()
    except OSError:
        return False


def _shown(file: Path) -> str:
    """``file`` relative to the working directory when it is under it, else as given."""
    try:
        return str(file.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(file)


#: Per base class, the problems the checks that look at a value alone (``VALUE_ONLY``) found with it,
#: by index in ``CHECKS``: a subclass that leaves such an attribute to it has the same (``check_spider``).
Verdicts = dict[type, dict[int, str]]


def check_spider(cls: type, file: Path | None = None, verdicts: Verdicts | None = None) -> str | None:
    """What is wrong with spider class ``cls`` (the first problem found), or None.

    The message names the class, the attribute and, when ``file`` is given, the line
    that sets it: ``sites/shop.py, line 9: Shop.interval must be ...``.

    ``verdicts``: a dict kept over several classes (a module's: ``load_spiders``). An attribute
    whose check looks at its value alone (``VALUE_ONLY``), which ``cls`` leaves to its one base
    class, has the base's verdict: found once a base (``_base_problems``), not again for each
    of 10,000 spiders of one base that set a name, a start URL and little else.
    """
    found = _first_problem(cls, verdicts)
    if found is None:
        return None
    attribute, problem = found
    separator = "" if problem.startswith("[") else " "
    return f"{_where(cls, attribute, file)}{cls.__name__}.{attribute}{separator}{problem}"


def _first_problem(cls: type, verdicts: Verdicts | None) -> tuple[str, str] | None:
    """The first attribute of ``CHECKS`` whose check finds a problem with ``cls``, and the problem."""
    inherited: dict[int, str] = {}
    indices: Iterable[int] = range(len(CHECKS))
    if verdicts is not None and len(cls.__bases__) == 1 and type(cls) is type:
        own = frozenset(cls.__dict__.keys() & VALUE_ONLY)  # the rest of VALUE_ONLY is the base's: its verdicts hold
        problems = _base_problems(cls.__bases__[0], verdicts)
        if problems:
            inherited = {index: problem for index, problem in problems.items() if CHECKS[index][0] not in own}
        indices = _checks_of(own)
    first = min(inherited) if inherited else len(CHECKS)
    for index in indices:
        if index > first:
            break
        attribute, check = CHECKS[index]
        problem = check(cls, getattr(cls, attribute, None))
        if problem:
            return attribute, problem
    return (CHECKS[first][0], inherited[first]) if inherited else None


@functools.cache
def _checks_of(own: frozenset[str]) -> tuple[int, ...]:
    """The indices in ``CHECKS``, in order, of a class's checks when it sets ``own`` of ``VALUE_ONLY`` itself: the
    checks that look at the class, and those of ``own`` (10,000 spiders of one base: a few sets of them)."""
    return tuple(sorted([*_CLASS_CHECKS, *(_INDEX[name] for name in own)]))


def _base_problems(base: type, verdicts: Verdicts) -> dict[int, str]:
    """What the ``VALUE_ONLY`` checks find wrong with ``base``, by index in ``CHECKS``: found once, kept in
    ``verdicts``."""
    if base not in verdicts:
        verdicts[base] = {
            index: problem
            for index, (attribute, check) in enumerate(CHECKS)
            if attribute in VALUE_ONLY and (problem := check(base, getattr(base, attribute, None)))
        }
    return verdicts[base]


def _where(cls: type, attribute: str, file: Path | None) -> str:
    if file is None:
        return ""
    line = attribute_line(file, cls.__name__, attribute)
    return f"{_shown(file)}, line {line}: " if line else f"{_shown(file)}: "


def attribute_line(file: Path, class_name: str, attribute: str) -> int | None:
    """Line of ``file`` where class ``class_name`` last sets ``attribute`` (else the class's line), or None."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            found = node.lineno
            for statement in node.body:  # the last assignment is the one in force
                targets = (
                    statement.targets
                    if isinstance(statement, ast.Assign)
                    else ([statement.target] if isinstance(statement, ast.AnnAssign) else [])
                )
                if any(isinstance(t, ast.Name) and t.id == attribute for t in targets):
                    found = statement.lineno
            return found
    return None


# -- the checks: each returns what is wrong, or None --------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _name(cls: type, value: Any) -> str | None:
    if not isinstance(value, str) or not SITE_NAME.match(value):
        return f"must be 1 to 64 letters, digits, '_', '.' or '-' (it names the site's queue and keys), got {value!r}"
    return None


def _url_list(cls: type, value: Any) -> str | None:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        return f"must be a list of URLs, got {type(value).__name__} {value!r:.80}"
    for url in value:
        if not isinstance(url, str):
            return f"must hold URL strings, got {type(url).__name__} {url!r:.80}"
        if _PLAIN_URL.match(url):  # what urlsplit would take too, found quicker: most start URLs
            continue
        parts = urlsplit(url.strip())
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            return f"must hold absolute http(s) URLs, got {url!r}"
    return None


#: The start of an absolute http(s) URL whose host is a name or an IPv4 address (letters, digits, dots,
#: dashes), a port of digits at most after it, then its path, query, fragment or end: ``urlsplit`` would
#: split it into that scheme and host, so ``_url_list`` passes it unsplit.
_PLAIN_URL = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]*)?(?:[/?#]|\Z)", re.IGNORECASE)


#: A port (or a bare colon) ending a host name.
_PORT_AT_END = re.compile(r":\d*$")


def _domains(cls: type, value: Any) -> str | None:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        return f"must be a list of host names, got {type(value).__name__} {value!r:.80}"
    for domain in value:
        if not isinstance(domain, str) or not domain.strip():
            return f"must hold host names, got {domain!r}"
        if "/" in domain or _PORT_AT_END.search(domain):
            return f"must hold host names without scheme, port or path, got {domain!r}"
    return None


def _interval(cls: type, value: Any) -> str | None:
    if isinstance(value, Auto):
        return None  # checked when made: finite, 0 < min <= max <= MAX_INTERVAL
    if not _is_number(value) or not value > 0:  # NaN fails the comparison
        return f"must be a number of seconds greater than 0, or Auto(min=, max=), got {value!r}"
    if interval_problem(value):
        return f"must be at most {MAX_INTERVAL:g} seconds (a day), got {value!r}"
    return None


def _gate_by(cls: type, value: Any) -> str | None:
    return None if value in (None, "site", "ip") else f"must be 'site', 'ip' or None, got {value!r}"


def _positive_seconds_or_none(cls: type, value: Any) -> str | None:
    if value is not None and (not _is_number(value) or not value > 0):
        return f"must be a number of seconds greater than 0, or None, got {value!r}"
    return None


def _concurrency(cls: type, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be a whole number of at least 1 (or None), got {value!r}"
    return None


def _optional_text(cls: type, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        return f"must be a non-empty string or None, got {value!r}"
    return None


def _flag(cls: type, value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be True or False, got {value!r}"


def _refresh(cls: type, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        for callback, seconds in value.items():
            if not isinstance(callback, str) or not callable(getattr(cls, callback, None)):
                return f"names {callback!r}, which is not a callback of {cls.__name__}"
            if not _is_number(seconds) or not seconds > 0:
                return f"[{callback!r}] must be a number of seconds greater than 0, got {seconds!r}"
        return None
    if not _is_number(value) or not value > 0:
        return f"must be seconds greater than 0, a mapping of callback name to seconds, or None, got {value!r}"
    return None


def _priority(cls: type, value: Any) -> str | None:
    low, high = _PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"must be a whole number from {low} to {high}, got {value!r}"
    return None


def _pipelines(cls: type, value: Any) -> str | None:
    return pipeline_problem(value)


def _process_item(cls: type, value: Any) -> str | None:
    return None if callable(value) else f"must be a method (item, page) -> item, got {value!r:.80}"


#: A content type as ``Spider.content_types`` names it: ``type/subtype`` in lower case, or ``type/*``.
_CONTENT_TYPE = re.compile(r"^(\*/\*|[a-z0-9][a-z0-9.+_-]*/(\*|[a-z0-9][a-z0-9.+_-]*))$")


def _content_types(cls: type, value: Any) -> str | None:
    if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
        return f"must be a non-empty tuple of content types like 'text/html', got {value!r:.80}"
    for item in value:
        if not isinstance(item, str) or not _CONTENT_TYPE.match(item):
            return f"must hold lower-case content types like 'application/json' or 'text/*', got {item!r:.80}"
    return None


def _extensions(cls: type, value: Any) -> str | None:
    if isinstance(value, str) or not isinstance(value, set | frozenset | list | tuple):
        return f"must be a set of file extensions like {{'pdf', 'zip'}} (empty: follow every link), got {value!r:.80}"
    for item in value:
        if not isinstance(item, str) or not item.strip(".") or "/" in item:
            return f"must hold file extensions like 'pdf' or 'tar.gz', got {item!r:.80}"
    return None


#: A header name: an HTTP token (RFC 9110).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _headers(cls: type, value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return f"must be a dict of header names to values, got {type(value).__name__} {value!r:.80}"
    for name, text in value.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            return f"has a header name that is not an HTTP token: {name!r:.80}"
        if not isinstance(text, str) or not text.isascii() or not text.isprintable():
            return f"[{name!r}] must be printable ASCII text, got {text!r:.80}"
    return None


def _positive_count_or_none(cls: type, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be a whole number of at least 1, or None for no limit, got {value!r}"
    return None


def _login_url(cls: type, value: Any) -> str | None:
    if value is None:
        if callable(getattr(cls, "logged_out", None)):
            return "must be set for logged_out to be used (the fleet logs in again there), got None"
        return None
    if not isinstance(value, str) or urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc:
        return f"must be an absolute http(s) URL or None, got {value!r:.80}"
    if not callable(getattr(cls, "login", None)):
        return "needs a login(self, page) method returning the Request that submits the login"
    return None


def _logged_out(cls: type, value: Any) -> str | None:
    return None if value is None or callable(value) else f"must be a method (page) -> bool, got {value!r:.80}"


def _rules(cls: type, value: Any) -> str | None:
    return rules_problem(cls, value)


def _errback(cls: type, value: Any) -> str | None:
    """None, a method (``def errback(self, failure)``), or the name of a method of the spider."""
    if value is None or callable(value):
        return None
    if not isinstance(value, str) or not callable(getattr(cls, value, None)):
        return f"must name a method of the spider (failure) -> items and requests, or be one, got {value!r:.80}"
    return None


def _parse(cls: type, value: Any) -> str | None:
    return None if callable(value) else f"must be a method (the default callback), got {value!r}"


CHECKS: tuple[tuple[str, Callable[[type, Any], str | None]], ...] = (
    ("name", _name),
    ("start_urls", _url_list),
    ("allowed_domains", _domains),
    ("interval", _interval),
    ("concurrency", _concurrency),
    ("item_key", _optional_text),
    ("obey_robots", _flag),
    ("follow_meta_refresh", _flag),
    ("user_agent", _optional_text),
    ("content_types", _content_types),
    ("deny_extensions", _extensions),
    ("headers", _headers),
    ("depth_limit", _positive_count_or_none),
    ("max_pages", _positive_count_or_none),
    ("max_links_per_page", _positive_count_or_none),
    ("allow_private_addresses", _flag),
    ("refresh", _refresh),
    ("refresh_priority", _priority),
    ("gate_by", _gate_by),
    ("gate", _optional_text),
    ("revisit_after", _positive_seconds_or_none),
    ("parse", _parse),
    ("rules", _rules),
    ("errback", _errback),
    ("cookies", _flag),
    ("login_url", _login_url),
    ("logged_out", _logged_out),
    ("pipelines", _pipelines),
    ("process_item", _process_item),
)

#: The attributes whose check looks at the value alone, never at the class (``check_spider``'s ``verdicts``).
VALUE_ONLY = frozenset(name for name, _ in CHECKS) - {"refresh", "rules", "errback", "login_url"}
#: Each checked attribute's index in ``CHECKS``, and those of the checks that look at the class too.
_INDEX = {name: index for index, (name, _) in enumerate(CHECKS)}
_CLASS_CHECKS = [index for index, (name, _) in enumerate(CHECKS) if name not in VALUE_ONLY]
