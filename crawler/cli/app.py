"""The ``crawler`` command line. Commands are thin: they call library functions.

Every expected error (``CrawlerError``, unreachable services) is one line on stderr
and exit status 1; tracebacks are for bugs.
"""

from __future__ import annotations

import click

from ..errors import CrawlerError
from ..settings import load_settings, scrub, secrets_of
from . import control, crawl, dev, inspect, redis_servers, serve, shards
from .context import Context, CrawlerGroup
from .types import FINITE_FLOAT


@click.group(cls=CrawlerGroup)
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


for _module in (control, crawl, dev, inspect, redis_servers, serve, shards):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="crawler")
