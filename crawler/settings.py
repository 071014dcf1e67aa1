"""Settings: named defaults, the config file, the environment, and their precedence.

Precedence, highest first: CLI flag > environment (``REDIS_URL``, ``DATABASE_URL``,
``CRAWLER_<KEY>``) > config file > spider attribute > default. Every value is checked
when the settings are built, and a wrong one is named in the error.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .errors import ConfigError

DEFAULT_DATABASE_URL = "sqlite:///crawler.db"
"""SQLite file in the working directory: zero set-up for one machine."""

DEFAULT_SITES_DIR = "sites"
"""Directory scanned for spider modules."""

DEFAULT_STATE_DIR = ".crawler"
"""Where the embedded Redis server keeps its socket, pid and log."""

DEFAULT_TIMEOUT = 30.0
"""Seconds allowed for a whole request: connecting, TLS, headers and body, as one deadline."""

DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024
"""Largest body accepted, after decompression; larger ones are refused and recorded."""

DEFAULT_MAX_URL_LENGTH = 8192
"""Longest URL let into the frontier, in bytes of its canonical form (the common browser and server limit)."""

DEFAULT_MAX_REQUEST_BODY_BYTES = 64 * 1024
"""Largest request body (POST data, JSON) a request may carry; a request with a larger one is refused.
Every queued request holds its body in Redis (its frontier entry, then its job): forms and JSON
queries take a few kilobytes, so 64 KiB leaves room while a page of a thousand such requests
still costs Redis megabytes, not a gigabyte."""

DEFAULT_MAX_LINKS_PER_PAGE = 0
"""Requests taken from one page's callback, the rest dropped (the page's parse record says so); 0: no cap,
every link queued (a page's links go to the frontier a chunk at a time: memory stays bounded without one)."""

DEFAULT_MAX_REDIRECTS = 5
"""Redirect hops followed from one URL before the chain is refused."""

DEFAULT_MAX_RETRIES = 3
"""Retries of a timeout, connection error, 5xx or 429 before the page is failed."""

DEFAULT_BACKOFF = 2.0
"""Seconds before the first retry; doubled each attempt unless Retry-After says more."""

DEFAULT_MAX_RETRY_AFTER = 3600.0
"""Longest Retry-After honoured, in seconds; longer ones are capped to this."""

DEFAULT_GATE_MARGIN = 0.005
"""Seconds added to every site interval for network jitter (0.5% of a 1 s interval); raise it across hosts.

One host needs none: the gate counts the interval from after the send (docs/GATE.md, "The margin")."""

DEFAULT_FAILURE_TTL = 7 * 24 * 3600
"""Seconds a failed RQ job is kept in Redis for inspection."""

DEFAULT_DOWNLOAD_TIMEOUT = 300
"""RQ job timeout for one download job, seconds (covers a gate wait and the fetch)."""

DEFAULT_PARSE_TIMEOUT = 120
"""Seconds one page's parse may take (callback, items, links) before it is failed."""

DEFAULT_JOB_LEASE = 10
"""Seconds a running job's claim lasts without a heartbeat; a killed worker's page returns after about this."""

DEFAULT_USER_AGENT = "crawler/0.1 (+https://example.invalid/crawler)"
"""User-Agent sent when the spider names none."""

DEFAULT_PROXY = None
"""No proxy: requests go direct unless a spider or ``sites.NAME.proxy`` names one."""

DEFAULT_HTTP_CACHE = False
"""Development cache off: every request goes to the site (``http_cache``)."""

DEFAULT_BROWSER_PATH = None
"""Chromium for rendered pages: none set, ``chromium``, ``chromium-browser`` or ``google-chrome`` on ``PATH``."""

MAX_INTERVAL = 86_400.0
"""Longest interval between two requests to a site anywhere (spider, config, CLI, live): a day."""

MAX_CONCURRENCY = 10_000
"""Largest concurrency cap of a site: more requests at once than any fleet runs."""

REDIS_EMBEDDED = "embedded"
"""``REDIS_URL`` value that asks for a private embedded Redis server."""


@dataclass(frozen=True)
class Settings:
    """Global settings of one crawler process. Build with ``load_settings``."""

    redis_url: str | None = None
    database_url: str = DEFAULT_DATABASE_URL
    sites_dir: str = DEFAULT_SITES_DIR
    state_dir: str = DEFAULT_STATE_DIR
    timeout: float = DEFAULT_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    max_url_length: int = DEFAULT_MAX_URL_LENGTH
    max_links_per_page: int = DEFAULT_MAX_LINKS_PER_PAGE
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    max_retries: int = DEFAULT_MAX_RETRIES
    backoff: float = DEFAULT_BACKOFF
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER
    gate_margin: float = DEFAULT_GATE_MARGIN
    failure_ttl: int = DEFAULT_FAILURE_TTL
    job_lease: int = DEFAULT_JOB_LEASE
    user_agent: str = DEFAULT_USER_AGENT
    #: Proxy URL(s) for every site, comma-separated, rotated per request (``proxies``).
    proxy: str | None = DEFAULT_PROXY
    #: Development HTTP cache: replay responses stored under ``state_dir`` instead of refetching.
    http_cache: bool = DEFAULT_HTTP_CACHE
    #: Chromium executable for rendered pages (``render``); None: looked for on ``PATH``.
    browser_path: str | None = DEFAULT_BROWSER_PATH
    #: Per-site overrides from the config file: {site: {"interval": 2.0, ...}}.
    sites: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("timeout", "backoff", "max_retry_after", "gate_margin"):
            _require(math.isfinite(getattr(self, name)), name, "must be a finite number of seconds")
        for name in ("timeout", "backoff", "max_retry_after"):
            _require(getattr(self, name) > 0, name, "must be greater than 0")
        _require(self.gate_margin >= 0, "gate_margin", "must be 0 or more")
        _require(self.job_lease >= 3, "job_lease", "must be at least 3 seconds (heartbeats come every second)")
        for name in ("max_body_bytes", "failure_ttl"):
            _require(getattr(self, name) > 0, name, "must be greater than 0")
        for name in ("max_url_length", "max_request_body_bytes"):
            _require(getattr(self, name) > 0, name, "must be greater than 0")
        _require(self.max_links_per_page >= 0, "max_links_per_page", "must be 0 (no cap) or more")
        for name in ("max_redirects", "max_retries"):
            _require(getattr(self, name) >= 0, name, "must be 0 or more")
        # Sent in every request's header, which httpx refuses outside ASCII (the first fetch would raise).
        ua = self.user_agent
        _require(bool(ua.strip()) and ua.isascii() and ua.isprintable(), "user_agent", "must be printable ASCII text")
        check_proxy("proxy", self.proxy)
        shards = split_shards(self.redis_url)
        for site, overrides in self.sites.items():
            if not isinstance(overrides, Mapping):
                raise ConfigError(f"config: sites.{site} must be a mapping")
            for key, value in overrides.items():
                if key not in SITE_KEYS:
                    raise ConfigError(f"config: sites.{site}.{key} is not a site setting")
                SITE_KEYS[key](f"sites.{site}.{key}", value)
            shard = overrides.get("shard")
            if shard is not None and shard not in ({name for name, _ in shards} or {DEFAULT_SHARD}):
                raise ConfigError(f"config: sites.{site}.shard names no shard of redis_url, got {shard!r}")


def _require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config: {name} {message}")


def check_interval(name: str, value: Any) -> float:
    """An interval in seconds: a finite number greater than 0 and at most ``MAX_INTERVAL``."""
    problem = interval_problem(value)
    if problem:
        raise ConfigError(f"config: {name} {problem}, got {value!r}")
    return float(value)


def interval_problem(value: Any) -> str | None:
    """What ``value`` must be, when it is not an interval (``check_interval``); None when it is one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_INTERVAL:
        # NaN fails both comparisons, infinity the second.
        return f"must be a number of seconds greater than 0 and at most {MAX_INTERVAL:g}"
    return None


#: Pace multiplier of a response's elapsed time (Heritrix's default ``delayFactor``).
DEFAULT_FACTOR = 5.0
#: Fraction by which the pace eases down after each healthy, fast answer.
DEFAULT_EASE = 0.1


@dataclass(frozen=True)
class Auto:
    """An interval that follows the site: ``factor`` × the last response time, within [min, max] seconds.

    It doubles on 429/503/504 and timeouts, and eases down by ``ease`` (a fraction)
    per healthy answer faster than that. One value per site, in Redis, for the fleet.
    """

    min: float = 0.5
    max: float = 30.0
    factor: float = DEFAULT_FACTOR
    ease: float = DEFAULT_EASE

    def __post_init__(self) -> None:
        for name in ("min", "max", "factor", "ease"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"Auto {name} must be a finite number, got {value!r}")
        if not 0 < self.min <= self.max <= MAX_INTERVAL:
            raise ValueError(f"Auto needs 0 < min <= max <= {MAX_INTERVAL:g}, got min={self.min!r} max={self.max!r}")
        if self.factor <= 0:
            raise ValueError(f"Auto factor must be greater than 0, got {self.factor!r}")
        if not 0 <= self.ease < 1:
            raise ValueError(f"Auto ease must be at least 0 and below 1, got {self.ease!r}")

    def __str__(self) -> str:
        return f"auto {self.min:g}-{self.max:g}s"


def check_site_interval(name: str, value: Any) -> Any:
    """A site's interval in the config file: seconds (> 0), or a mapping of ``Auto``'s fields
    (``{min: 0.5, max: 30}``, ``factor`` and ``ease`` optional) for an adaptive one."""
    if not isinstance(value, Mapping):
        return check_interval(name, value)
    unknown = sorted(set(value) - {"min", "max", "factor", "ease"})
    if unknown:
        raise ConfigError(
            f"config: {name}.{unknown[0]} is not a field of an adaptive interval (min, max, factor, ease)"
        )
    try:
        return Auto(**value)
    except ValueError as exc:
        raise ConfigError(f"config: {name}: {exc}") from None


def check_concurrency(name: str, value: Any) -> int:
    """A concurrency cap: a whole number from 1 to ``MAX_CONCURRENCY``."""
    problem = concurrency_problem(value)
    if problem:
        raise ConfigError(f"config: {name} {problem}, got {value!r}")
    return int(value)


def concurrency_problem(value: Any) -> str | None:
    """What ``value`` must be, when it is not a concurrency cap (``check_concurrency``); None when it is one."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        return f"must be a whole number from 1 to {MAX_CONCURRENCY}"
    return None


def check_gate_by(name: str, value: Any) -> str:
    """What a site's gate spaces: "site" or "ip"."""
    if value not in ("site", "ip"):
        raise ConfigError(f"config: {name} must be 'site' or 'ip', got {value!r}")
    return str(value)


def check_gate_name(name: str, value: Any) -> str | None:
    """The name of a gate shared by several sites: letters, digits, ``.``, ``_``, ``-`` (or None)."""
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", value):
        raise ConfigError(f"config: {name} must be a name of letters, digits, '.', '_' or '-', got {value!r}")
    return value


def check_shard_name(name: str, value: Any) -> str:
    """The name of a Redis shard (``a=redis://…``): letters, digits, ``_`` or ``-``, 1 to 40 of them."""
    if not isinstance(value, str) or not _SHARD_NAME.fullmatch(value):
        raise ConfigError(f"config: {name} must be a shard name of letters, digits, '_' or '-', got {value!r}")
    return value


#: A shard's name in ``REDIS_URL``: ``NAME=URL``.
_SHARD_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
_NAMED_PIECE = re.compile(r"([A-Za-z0-9_-]{1,40})=(.*)", re.DOTALL)
#: The name of the one shard of a ``REDIS_URL`` that names none.
DEFAULT_SHARD = "default"


def split_shards(value: str | None) -> list[tuple[str, str]]:
    """The (name, URL) of each Redis a ``REDIS_URL`` value names; ConfigError for a malformed one.

    ``redis://h/0`` is one shard, ``default``; ``a=redis://h1/0,b=redis://h2/0`` two. A comma
    not followed by ``NAME=`` belongs to the URL before it (a Sentinel URL's host list).
    """
    if value is None:
        return []
    pieces = value.split(",")
    if not _NAMED_PIECE.fullmatch(pieces[0].strip()):
        if any(_NAMED_PIECE.fullmatch(piece.strip()) and "://" not in piece.split("=", 1)[0] for piece in pieces[1:]):
            raise ConfigError(
                "config: redis_url: name every shard (NAME=URL,NAME=URL), not only some "
                "(a comma in a password: percent-encode it, %2C)"
            )
        return [(DEFAULT_SHARD, value)]
    shards: list[tuple[str, str]] = []
    for piece in pieces:
        named = _NAMED_PIECE.fullmatch(piece.strip())
        if named:
            shards.append((named.group(1), named.group(2).strip()))
        else:
            shards[-1] = (shards[-1][0], f"{shards[-1][1]},{piece}")
    names = [name for name, _ in shards]
    for name, url in shards:
        if not url:
            raise ConfigError(f"config: redis_url: shard {name!r} has no URL")
        if names.count(name) > 1:
            raise ConfigError(f"config: redis_url: shard {name!r} is named twice")
    return shards


def redact_shards(value: str) -> str:
    """A ``REDIS_URL`` value as shown to people: each shard's URL without its secrets (``redact_url``)."""
    shards = split_shards(value)
    if len(shards) == 1 and shards[0][1] == value:
        return redact_url(value)
    return ",".join(f"{name}={redact_url(url)}" for name, url in shards)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"config: {name} must be true or false, got {value!r}")
    return value


def parse_proxies(value: Any, where: str) -> list[str]:
    """``value`` (a URL, a comma-separated string of them, or a list) as proxy URLs; ConfigError if one is bad.

    The error names ``where`` and the proxy without its credentials.
    """
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(item, str) for item in items):
        raise ConfigError(f"config: {where} must be a proxy URL or a list of them")
    proxies = [item.strip() for item in items if item.strip()]
    for proxy in proxies:
        try:
            parts = urlsplit(proxy)
            port = parts.port
        except ValueError:
            raise ConfigError(f"config: {where}: malformed proxy URL {redact_url(proxy)}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            raise ConfigError(
                f"config: {where}: a proxy is http(s)://[user:password@]host:port, got {redact_url(proxy)}"
            )
    return proxies


def check_proxy(name: str, value: Any) -> Any:
    """Proxy URL(s): one, a comma-separated string, or a list; the error hides credentials."""
    parse_proxies(value, name)
    return value


#: Fields of a site's live settings hash (``keys.live_settings``): ``crawler set``, ``pause``, ``resume`` write them.
LIVE_FIELDS = ("interval", "concurrency", "paused")


def check_live(live: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A site's live settings, as read from Redis (text), checked as ``crawler set`` checks them.

    Returns the values that hold (``interval`` a float, ``concurrency`` an int, ``paused``
    a bool) and, for each field whose value does not (``nan``, ``ten``, ``-1``: anyone can
    HSET the hash), why. Fields not in ``LIVE_FIELDS`` are left out of both.
    """
    good: dict[str, Any] = {}
    bad: dict[str, str] = {}
    for name in LIVE_FIELDS:
        if name not in live:
            continue
        raw = live[name]
        try:
            value: Any = {"interval": float, "concurrency": int}.get(name, str)(raw.strip())
        except ValueError:
            value = raw
        if name == "interval":
            problem = interval_problem(value)
        elif name == "concurrency":
            problem = concurrency_problem(value)
        else:
            problem = None if value in ("0", "1") else "must be 1 (paused) or 0"
            value = value == "1"
        if problem:  # named with the text written ('nan', '1e999'), not what it parsed to
            bad[name] = f"{problem}, got {raw!r}"
        else:
            good[name] = value
    return good, bad


#: Site settings a config file may override, with their checks.
SITE_KEYS = {
    "interval": check_site_interval,
    "concurrency": check_concurrency,
    "obey_robots": check_bool,
    "gate_by": check_gate_by,
    "gate": check_gate_name,
    "proxy": check_proxy,
    "shard": check_shard_name,
}

_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
#: The type each setting's value must have (``redis_url`` defaults to None but is a str).
_KINDS: dict[str, type] = {
    name: str if f.default is None else type(f.default) for name, f in _FIELDS.items() if name != "sites"
}


def _coerce(name: str, value: Any, source: str) -> Any:
    """``value`` converted to the type of setting ``name``; ConfigError naming it if it can't be."""
    if name == "sites":
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: sites must be a mapping of site name to settings")
        return dict(value)
    kind: type = _KINDS[name]
    if kind is bool:
        return _flag(name, value, source)
    try:
        if isinstance(value, bool) and kind is not str:
            raise TypeError
        if isinstance(value, str) and kind in (int, float):
            value = kind(value.strip())
        if kind is int and not isinstance(value, int):
            raise TypeError
        if kind is float and not isinstance(value, (int, float)):
            raise TypeError
        if kind is str and not isinstance(value, str):
            raise TypeError
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name} must be {kind.__name__}, got {value!r}") from None


#: Spellings of true and false accepted for on/off settings (env variables are text).
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _flag(name: str, value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, str | int) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{source}: {name} must be true or false, got {value!r}")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The settings in a YAML config file; ConfigError for a missing or malformed one."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    import yaml  # only a command given a config file pays for it (some 15 ms)

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of settings")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting {unknown[0]!r}")
    return {name: _coerce(name, value, f"config file {path}") for name, value in data.items()}


def read_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Settings given by ``REDIS_URL``, ``DATABASE_URL`` and ``CRAWLER_<KEY>`` variables."""
    environ = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for name in _FIELDS:
        if name == "sites":
            continue
        variable = name.upper() if name in ("redis_url", "database_url") else f"CRAWLER_{name.upper()}"
        if environ.get(variable):
            found[name] = _coerce(name, environ[variable], f"environment {variable}")
    return found


def load_settings(config_file: str | Path | None = None, **flags: Any) -> Settings:
    """Settings from defaults < config file < environment < ``flags`` (None flags ignored)."""
    values: dict[str, Any] = {}
    if config_file is not None:
        values.update(read_config_file(config_file))
    values.update(read_environment())
    values.update({k: _coerce(k, v, f"option {k}") for k, v in flags.items() if v is not None})
    return Settings(**values)


#: A URL's scheme and ``//`` (``redis://``, ``postgresql+psycopg://``).
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*://", re.IGNORECASE)
#: An ``@`` followed by what can be a host list (names, IPs, ``[v6]``, ports, sentinel's commas) and the end
#: of the authority: the userinfo ends at the last such ``@``, whatever its password holds (``/ ? # @``).
_HOST_AFTER_AT = re.compile(r"@(?=[a-z0-9._~%!$&'()*+,;=:\[\]-]*(?:[/?#]|$))", re.IGNORECASE)
#: Query parameters that carry secrets in Redis and database URLs (``?password=``, libpq's ``sslpassword``, …).
_SECRET_PARAM = re.compile(
    r"([?&;](?:[a-z_]*pass(?:word|wd)?|pwd|secret|[a-z_]*token|[a-z_]*key|auth)=)([^&;#]*)", re.IGNORECASE
)


def _split_userinfo(url: str) -> tuple[str, str | None, str]:
    """``url`` as (up to ``scheme://``, userinfo or None, from the host on), parsed or not.

    The userinfo is everything between ``scheme://`` and the last ``@`` before the host, so
    a password holding ``/``, ``?``, ``#`` or ``@`` is all of it; an ``@`` in a path or query
    may make it longer (more is hidden, never less). A URL whose authority is empty
    (``sqlite:///a@b.db``) has none; text without ``scheme://`` has everything up to its
    last ``@`` as one.
    """
    scheme = _SCHEME.search(url)
    start = scheme.end() if scheme else 0
    if url.startswith("/", start):
        return url, None, ""
    ats = [m.start() for m in _HOST_AFTER_AT.finditer(url, start)] or ([] if scheme else [url.rfind("@")])
    if not ats or ats[-1] < 0:
        return url, None, ""
    return url[:start], url[start : ats[-1]], url[ats[-1] :]


def redact_url(url: str) -> str:
    """``url`` with its user and password, and secret query parameters, replaced by ``***``.

    Works on text that does not parse as a URL too (``_split_userinfo``).
    """
    head, userinfo, rest = _split_userinfo(url)
    redacted = url if userinfo is None else f"{head}***{rest}"
    return _SECRET_PARAM.sub(lambda m: m.group(1) + "***", redacted)


def url_secrets(url: str | None) -> list[str]:
    """The secret values in ``url`` (password of its user part, secret query parameters), percent-decoded too."""
    if not url:
        return []
    from urllib.parse import unquote

    found = []
    _, userinfo, rest = _split_userinfo(url)
    if userinfo and ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    found += [m.group(2) for m in _SECRET_PARAM.finditer(rest if userinfo is not None else url)]
    found += [unquote(value) for value in found]
    return sorted({value for value in found if len(value) >= 3}, key=len, reverse=True)


def url_error(url: str, exc: BaseException) -> str:
    """Why ``url`` does not parse, in one line holding none of its secrets.

    A parser that cut the URL short at a ``/``, ``?`` or ``#`` of the password quotes a
    piece of it (redis-py: "Port could not be cast to integer value as 's3'"): then the
    reason is that, not the parser's words.
    """
    _, userinfo, _ = _split_userinfo(url)
    if userinfo and any(c in userinfo for c in "/?#@"):
        return "percent-encode '/', '?', '#' and '@' in its user and password (%2F, %3F, %23, %40)"
    lines = str(exc).strip().splitlines()
    return scrub(lines[0] if lines else type(exc).__name__, url_secrets(url))


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***`` (error messages, log lines)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def secrets_of(settings: Settings | None = None) -> list[str]:
    """Every secret in the configured Redis and database URLs (settings and environment)."""
    urls = [os.environ.get("REDIS_URL"), os.environ.get("DATABASE_URL")]
    if settings is not None:
        urls += [settings.redis_url, settings.database_url]
    found: set[str] = set()
    for value in urls:
        if value:
            found.update(secret for _, url in _shards_or_whole(value) for secret in url_secrets(url))
    return sorted(found, key=len, reverse=True)


def _shards_or_whole(value: str) -> list[tuple[str, str]]:
    """``split_shards``, or the whole value as one URL when it does not split (its secrets still hidden)."""
    try:
        return split_shards(value)
    except ConfigError:
        return [(DEFAULT_SHARD, value)]
