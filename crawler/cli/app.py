"""The ``crawler`` command line. Commands are thin: they call library functions.

Every expected error (``CrawlerError``, unreachable services) is one line on stderr
and exit status 1; tracebacks are for bugs.

A command's module is imported when the command runs (``LazyGroup``, after click's
lazily loaded subcommands): ``crawler status`` imports what the status needs, not the
workers, HTTP and the store that ``crawler crawl`` runs (issue 46: the every-site
commands within a second at 10,000 sites). ``crawler --help`` imports them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import click

from ..errors import CrawlerError
from ..settings import load_settings, scrub, secrets_of
from .context import Context, CrawlerGroup
from .types import FINITE_FLOAT

#: Every command of ``crawler``, by name: the module of this package that makes it (its ``COMMANDS``).
COMMAND_MODULES: dict[str, str] = {
    "crawl": "crawl",
    "dashboard": "serve",
    "demo": "crawl",
    "export": "inspect",
    "failed": "inspect",
    "fetch": "dev",
    "metrics": "serve",
    "migrate-keys": "control",
    "move": "shards",
    "new": "dev",
    "parse": "dev",
    "pause": "control",
    "redis": "redis_servers",
    "reset": "control",
    "resume": "control",
    "retry": "control",
    "seed": "crawl",
    "set": "control",
    "shards": "shards",
    "shell": "dev",
    "sites": "overview",
    "stats": "inspect",
    "status": "overview",
    "worker": "crawl",
}


class LazyGroup(CrawlerGroup):
    """A group whose commands (``lazy``: name -> module of this package) are imported when first asked for."""

    def __init__(self, *args: Any, lazy: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            self._load(self.lazy[cmd_name])
        return super().get_command(ctx, cmd_name)

    def _load(self, module_name: str) -> None:
        """Add every command of ``module_name`` (its ``COMMANDS``) that this group lists."""
        module = importlib.import_module(f"{__package__}.{module_name}")
        for command in module.COMMANDS:
            if self.lazy.get(command.name or "") == module_name:
                self.add_command(command)


@click.group(cls=LazyGroup, lazy=COMMAND_MODULES)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML config file.")
@click.option("--sites", "sites_dir", type=click.Path(file_okay=False), help="Directory of spider modules [./sites].")
@click.option(
    "--redis-url",
    help="Redis URL ('embedded' for a private server; NAME=URL,NAME=URL for shards) [env REDIS_URL].",
)
@click.option("--database-url", help="SQLAlchemy database URL [env DATABASE_URL, sqlite:///crawler.db].")
@click.option(
    "--gate-margin",
    type=FINITE_FLOAT,
    metavar="SECONDS",
    help="Added to every site's interval, for hosts at different distances [env CRAWLER_GATE_MARGIN, 0.005].",
)
@click.option(
    "--http-cache",
    is_flag=True,
    default=None,
    help="Development cache: replay pages stored under the state directory [env CRAWLER_HTTP_CACHE].",
)
@click.version_option(package_name="crawler")
@click.pass_context
def cli(
    ctx: click.Context,
    config_file: str | None,
    sites_dir: str | None,
    redis_url: str | None,
    database_url: str | None,
    gate_margin: float | None,
    http_cache: bool | None,
) -> None:
    """Crawl many sites politely, with workers on any number of machines."""
    try:
        settings = load_settings(
            config_file,
            sites_dir=sites_dir,
            redis_url=redis_url,
            database_url=database_url,
            gate_margin=gate_margin,
            http_cache=http_cache,
        )
    except CrawlerError as exc:
        raise click.ClickException(scrub(str(exc), secrets_of())) from None
    context = Context(settings)
    ctx.obj = context
    ctx.call_on_close(context.close)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="crawler")
