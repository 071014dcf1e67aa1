"""``crawler set``, ``pause``, ``resume``, ``reset``, ``retry``, ``migrate-keys``: steering sites that are crawled."""

from __future__ import annotations

import click

from ..coord.policy import reset_live, set_live
from ..coord.seen import stored
from ..errors import ConfigError
from ..ops.failures import retry_pages
from ..ops.rekey import migrate_keys, running_workers
from ..ops.reset import ResetResult, reset_site
from .context import Context, pass_context
from .types import FINITE_FLOAT


def report_reset(site: str, result: ResetResult) -> None:
    click.echo(
        f"{site}: forgot {result.queued} queued and {result.seen} seen URLs and the counters "
        "(items and fetch records kept)",
        err=True,
    )
    if result.in_flight:
        click.echo(f"warning: {site}: {result.in_flight} downloads in flight will finish and may queue links", err=True)


@click.command()
@click.argument("site")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_context
def reset(obj: Context, site: str, yes: bool) -> None:
    """Forget SITE's queued URLs, seen set and counters, to crawl it again from the start."""
    obj.site(site)
    if not yes:
        _, seen = stored(obj.redis_for(site), site)
        try:
            click.confirm(
                f"Forget {site}'s queued URLs, its {seen} seen URLs and its counters? "
                "Items and fetch records are kept.",
                abort=True,
                err=True,
            )
        except click.Abort:
            raise ConfigError(f"{site} not reset (give --yes to skip the question)") from None
    report_reset(site, reset_site(obj.redis_for(site), site))


@click.command("migrate-keys")
@click.option("--force", is_flag=True, help="Migrate even though workers seem to be running.")
@pass_context
def migrate_keys_(obj: Context, force: bool) -> None:
    """Move a crawl kept by an earlier version to today's key names (stop every worker first)."""
    clients = obj.shards.clients()
    busy = sum(running_workers(client) for _, client in clients)
    if busy and not force:
        raise ConfigError(f"{busy} workers are running on this Redis: stop every worker first (or give --force)")
    for name, client in clients:
        summary = migrate_keys(client).summary()
        click.echo(f"{name}: {summary}" if obj.shards.several else summary)


@click.command("set")
@click.argument("site")
@click.option("--interval", type=FINITE_FLOAT, help="Seconds between requests to SITE.")
@click.option("--concurrency", type=int, help="Most requests to SITE at once.")
@click.option("--reset", is_flag=True, help="Drop SITE's live interval and concurrency (config/spider apply).")
@pass_context
def set_(obj: Context, site: str, interval: float | None, concurrency: int | None, reset: bool) -> None:
    """Change SITE's politeness for every running worker, without a restart."""
    if reset and (interval is not None or concurrency is not None):
        raise ConfigError("--reset drops live values: give it alone")
    runtime = obj.runtime_for(obj.site(site))
    if reset:
        reset_live(runtime.connection, site)
    else:
        set_live(runtime.connection, site, interval=interval, concurrency=concurrency)
    runtime.publish(site, force=True)
    click.echo(f"{site}: {'live settings dropped' if reset else 'updated'}")


def _pause(obj: Context, site: str | None, all_sites: bool, paused: bool) -> None:
    if not site and not all_sites:
        raise ConfigError("name a SITE or give --all")
    names = sorted(obj.spider_set.spiders) if all_sites else [obj.site(str(site))]
    for name, shard in obj.shards.locate(names).items():
        runtime = obj.runtime_of(shard)
        set_live(runtime.connection, name, paused=paused)
        runtime.publish(name, force=True)
    click.echo(f"{', '.join(names)}: {'paused' if paused else 'resumed'}")


@click.command()
@click.argument("site", required=False)
@click.option("--all", "all_sites", is_flag=True, help="Every site.")
@pass_context
def pause(obj: Context, site: str | None, all_sites: bool) -> None:
    """Stop downloading from SITE (queued work is kept)."""
    _pause(obj, site, all_sites, True)


@click.command()
@click.argument("site", required=False)
@click.option("--all", "all_sites", is_flag=True, help="Every site.")
@pass_context
def resume(obj: Context, site: str | None, all_sites: bool) -> None:
    """Resume downloading from SITE."""
    _pause(obj, site, all_sites, False)


@click.command()
@click.argument("site")
@click.argument("urls", nargs=-1)
@click.option("--all", "all_pages", is_flag=True, help="Every failed page of SITE.")
@pass_context
def retry(obj: Context, site: str, urls: tuple[str, ...], all_pages: bool) -> None:
    """Requeue failed pages of SITE: the URLs given, or --all."""
    obj.site(site)
    if not urls and not all_pages:
        raise ConfigError("name the failed URLs to retry, or give --all")
    if urls and all_pages:
        raise ConfigError("give failed URLs or --all, not both")
    runtime = obj.runtime_for(site)
    runtime.publish(site)  # before its work: the politeness the scheduler hands it out by
    pages = retry_pages(runtime.store, runtime.frontier(site), None if all_pages else urls)
    click.echo(f"{site}: {len(pages)} failed page{'' if len(pages) == 1 else 's'} requeued")


#: The commands this module adds to ``crawler`` (``app`` registers them).
COMMANDS = [reset, migrate_keys_, set_, pause, resume, retry]
