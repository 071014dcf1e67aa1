"""What every command shares: the ``Context``, the group's error handling, common helpers.

The ``Context`` holds the settings, the spiders and Redis (started lazily); ``CrawlerGroup``
turns expected errors into one line; helpers used by more than one command group live here.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import click
import redis
from redis import Redis

from ..coord.connection import LOCALHOST_URL, EmbeddedRedis, RedisChoice, connect, resolve_redis
from ..coord.shards import ShardSet, shards_of
from ..demo import BUNDLED_SPIDERS
from ..errors import ConfigError, CrawlerError
from ..settings import Settings, scrub, secrets_of
from ..spiders.loading import SpiderSet, load_spiders

if TYPE_CHECKING:
    from ..work.runtime import Runtime


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
            from ..work.runtime import Runtime  # the work layer: not imported by the commands that need none

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
