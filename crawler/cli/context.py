"""What every command shares: the ``Context``, the group's error handling, common helpers.

The ``Context`` holds the settings, the spiders and Redis (started lazily); ``CrawlerGroup``
turns expected errors into one line; helpers used by more than one command group live here.
"""

from __future__ import annotations

import gc
import io
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import IO, Any

import click
import redis
from redis import Redis

from ..coord.connection import LOCALHOST_URL, EmbeddedRedis, RedisChoice, connect, resolve_redis
from ..coord.shards import ShardSet, shards_of
from ..errors import ConfigError, CrawlerError
from ..settings import Settings, scrub, secrets_of
from ..spiders.loading import SpiderSet, load_spiders
from ..store.database import Store
from ..store.export import BINARY_FORMATS, SURROGATES, ItemNotWritten, keyed_items, write_items
from ..work.runtime import BUNDLED_SPIDERS, Runtime


@dataclass
class Context:
    """What every command shares: settings, the spiders, and (lazily) Redis."""

    settings: Settings
    embedded: EmbeddedRedis | None = None
    started_embedded: bool = False
    #: Stop an embedded Redis this command started when it ends (set by demo).
    stop_embedded: bool = False
    #: Set by commands that only read: they never start a Redis server (status, metrics).
    read_only: bool = False
    _redis_url: str | None = field(default=None, repr=False)
    _runtimes: dict[str, Runtime] = field(default_factory=dict, repr=False)

    @cached_property
    def spider_set(self) -> SpiderSet:
        with kept_for_life():  # the spiders: every command keeps them to its end
            found = load_spiders(self.settings.sites_dir, extra=BUNDLED_SPIDERS)
        ctx = click.get_current_context(silent=True)
        params = ctx.params if ctx is not None else {}
        named = {params.get("site"), *(params.get("targets") or ())} - {None}  # their failure: the command's error
        for error in found.errors:
            if not named & {error.module, error.site}:
                click.echo(f"warning: {error}", err=True)
        return found

    @cached_property
    def redis_choice(self) -> RedisChoice:
        """Which Redis this command uses, and why (see ``connection.resolve_redis``)."""
        return resolve_redis(self.settings.redis_url, self.settings.state_dir)

    @property
    def redis_url(self) -> str:
        if self._redis_url is None:
            choice = self.redis_choice
            if choice.embedded is not None and not choice.embedded.running():
                if self.read_only:
                    raise ConfigError(no_redis_to_read(choice.embedded))
                self.started_embedded = choice.embedded.start()
                self.embedded = choice.embedded
                if not self.stop_embedded:  # demo stops it when done: nothing to tell
                    click.echo(
                        f"started the embedded Redis server in {choice.embedded.state_dir} (it keeps its "
                        "data there; `crawler redis stop` stops it)",
                        err=True,
                    )
            elif choice.how == "localhost":
                click.echo(f"note: Redis {choice.describe()}", err=True)
            self._redis_url = choice.url
        return self._redis_url

    @cached_property
    def shards(self) -> ShardSet:
        """The crawl's shards (one unless ``REDIS_URL`` names several), each connected when first used."""
        return ShardSet(shards_of(self.redis_url), self.settings, connect)

    @property
    def redis(self) -> Redis:
        """The client of the first shard (the only one, unless ``REDIS_URL`` names several)."""
        return self.shards.client(self.shards.names[0])

    def redis_for(self, site: str) -> Redis:
        """The client of the shard holding ``site``."""
        return self.shards.client_for(site)

    @property
    def runtime(self) -> Runtime:
        """The runtime of the first shard (``runtime_of``)."""
        return self.runtime_of(self.shards.names[0])

    def runtime_of(self, shard: str) -> Runtime:
        """A runtime on shard ``shard``'s Redis, made once."""
        if shard not in self._runtimes:
            self._runtimes[shard] = Runtime(self.shards.client(shard), self.settings, self.spider_set)
        return self._runtimes[shard]

    def runtime_for(self, site: str) -> Runtime:
        """The runtime on the shard holding ``site``."""
        return self.runtime_of(self.shards.where(site))

    def site(self, name: str) -> str:
        """``name`` if it is a known site; ConfigError otherwise."""
        self.spider_set.get(name)
        return name

    def close(self) -> None:
        for runtime in self._runtimes.values():
            runtime.close()
        if "shards" in self.__dict__:
            self.shards.close()
        if self.stop_embedded and self.started_embedded and self.embedded is not None:
            self.embedded.stop()


@contextmanager
def kept_for_life() -> Iterator[None]:
    """Objects made inside are kept to the end of the process: the cyclic garbage collector is paused while
    they are made, then they and every object before them are left out of its later passes (``gc.freeze``).

    For the spiders a command loads: the collector's full passes would walk every class again and
    again. Garbage with cycles made before or inside is never collected: a command's start-up, once.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.freeze()


class CrawlerGroup(click.Group):
    """Turns expected errors into one line on stderr and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CrawlerError as exc:
            raise click.ClickException(_scrubbed(ctx, str(exc))) from None
        except redis.RedisError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise click.ClickException(_scrubbed(ctx, f"Redis error: {reason}")) from None
        except OSError as exc:  # a file a command reads or writes: not found, no permission, disk full
            if exc.filename is None:
                raise
            raise click.ClickException(_scrubbed(ctx, f"{exc.filename}: {exc.strerror or exc}")) from None


def _scrubbed(ctx: click.Context, message: str) -> str:
    """``message`` without any secret of the configured URLs (a library's error may quote a URL whole)."""
    settings = ctx.obj.settings if isinstance(ctx.obj, Context) else None
    return scrub(message, secrets_of(settings))


pass_context = click.make_pass_decorator(Context)


def _export(
    obj: Context,
    site: str,
    output: str | None,
    fmt: str,
    history: bool = False,
    raw_csv: bool = False,
    fields: list[str] | None = None,
) -> int:
    """Write ``site``'s items to ``output`` (None or '-': stdout) in ``fmt``; the number written.

    ConfigError naming the site and the item's key for an item the format cannot hold;
    a regular file is then left as it was (``_open_output``).
    """
    store = Store(obj.settings.database_url)
    try:
        with _open_output(output, binary=fmt in BINARY_FORMATS) as out:
            return write_items(lambda: keyed_items(store, site, history), out, fmt, raw_csv=raw_csv, fields=fields)
    except ItemNotWritten as exc:
        raise ConfigError(f"{site}: {exc}") from None
    finally:
        store.close()


#: Paths of a process's open files (``/dev/stdout``, ``/proc/self/fd/1``): written where the shell opened them.
OPEN_FILE_PATHS = re.compile(r"/dev/(stdout|stderr|fd/\d+)|/proc/(self|\d+)/fd/\d+")


def check_output(path: str | None) -> None:
    """ConfigError naming ``path`` now if an export cannot be written there (a crawl's ``-o``: before it crawls).

    Nothing is opened: opening a named pipe and closing it would end its reader.
    """
    if path is None or path == "-":
        return
    if _in_place(path):
        if os.path.isdir(path):
            raise ConfigError(f"cannot write {path!r}: Is a directory")
        if not os.access(path, os.W_OK):
            raise ConfigError(f"cannot write {path!r}: Permission denied")
        return
    target = os.path.realpath(path)
    if os.path.exists(target) and not os.access(target, os.W_OK):
        raise ConfigError(f"cannot write {path!r}: Permission denied")
    fd, part = _part_file(path, target)
    os.close(fd)
    os.unlink(part)


def _in_place(path: str) -> bool:
    """Whether ``path`` is written as it is: a pipe, a device, a folder, ``/dev/stdout``; not a regular file."""
    if OPEN_FILE_PATHS.fullmatch(os.path.abspath(path)):
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # none yet (or unreachable: the part file says why)
        return False


def _part_file(path: str, target: str) -> tuple[int, str]:
    """A new file beside ``target`` (mode as umask allows), open to write; ConfigError naming ``path``."""
    part = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{secrets.token_hex(4)}.part")
    try:
        return os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), part
    except OSError as exc:
        raise ConfigError(f"cannot write {path!r}: {exc.strerror or exc}") from None


@contextmanager
def _open_output(path: str | None, binary: bool = False) -> Iterator[IO[Any]]:
    """``path`` open to write UTF-8 text, or bytes if ``binary`` (stdout for None or '-', left open).

    A regular file (or a new one) is written beside it and renamed over it once complete:
    an export that fails leaves the file as it was. A pipe, a device or ``/dev/stdout`` is
    opened once, to append, and written as it is. Text is UTF-8 whatever the locale, with
    lone surrogates as U+FFFD (``export.SURROGATES``). ConfigError naming ``path`` when it
    cannot be written.
    """
    try:
        if path is None or path == "-":
            with _stdout(binary) as out:
                yield out
        elif _in_place(path):
            with _opened(os.open(path, os.O_WRONLY | os.O_APPEND), binary) as out:
                yield out
        else:
            target = os.path.realpath(path)
            fd, part = _part_file(path, target)
            try:
                with _opened(fd, binary) as out:
                    yield out
                if os.path.exists(target):
                    shutil.copymode(target, part)
                os.replace(part, target)
            finally:
                if os.path.exists(part):
                    os.unlink(part)
    except OSError as exc:  # the disk full, a pipe's reader gone
        where = "stdout" if path is None or path == "-" else repr(path)
        raise ConfigError(f"cannot write {where}: {exc.strerror or exc}") from None


def _opened(fd: int, binary: bool) -> IO[Any]:
    return open(fd, "wb") if binary else open(fd, "w", encoding="utf-8", errors=SURROGATES, newline="")


@contextmanager
def _stdout(binary: bool) -> Iterator[IO[Any]]:
    """Standard output's bytes, or UTF-8 text over them (``SURROGATES``), flushed but left open."""
    sys.stdout.flush()
    if binary or not hasattr(sys.stdout, "buffer"):
        yield sys.stdout.buffer if binary else sys.stdout
        return
    text = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors=SURROGATES, newline="")
    try:
        yield text
        text.flush()
    finally:
        text.detach()


def replace(settings: Settings, **changes: Any) -> Settings:
    import dataclasses

    return dataclasses.replace(settings, **changes)


def no_redis_to_read(server: EmbeddedRedis) -> str:
    """The error of a read-only command that finds no Redis (it never starts one)."""
    if server.data_file.exists():
        return (
            f"no Redis running: the embedded server in {server.state_dir} is stopped, its data kept; "
            "`crawler redis start` starts it (or set REDIS_URL)"
        )
    return (
        f"no Redis to read: none configured (REDIS_URL), none answering on {LOCALHOST_URL}, and no embedded "
        f"server in {server.state_dir}; `crawler crawl` or `crawler seed` starts one"
    )
