"""Commands not yet given a group of their own."""

from __future__ import annotations

import click

from ..errors import ConfigError
from ..spiders.scaffold import check_name, write_spider
from .context import Context, pass_context


@click.command()
@click.argument("name")
@click.argument("url")
@pass_context
def new(obj: Context, name: str, url: str) -> None:
    """Write sites/NAME.py: a spider for the site at URL, ready to run and to edit (never overwrites)."""
    check_name(name)
    if name in obj.spider_set.spiders or name in obj.spider_set.by_name:
        raise ConfigError(f"a spider named {name!r} exists already")
    path = write_spider(obj.settings.sites_dir, name, url)
    click.echo(f"wrote {path}: edit it, then `crawler crawl {name}`")


#: The commands this module adds to ``crawler`` (``app`` registers them).
COMMANDS = [new]
