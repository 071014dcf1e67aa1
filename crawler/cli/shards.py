"""``crawler shards``, ``move``: the Redis shards of a crawl, which holds each site, and moving a site."""

from __future__ import annotations

import click
import redis
from redis import Redis

from ..coord import keys
from ..coord.shards import rendezvous
from ..errors import ConfigError
from ..ops.move import describe, move_site
from .context import Context, pass_context


@click.command()
@click.argument("sites", nargs=-1)
@pass_context
def shards(obj: Context, sites: tuple[str, ...]) -> None:
    """List the Redis shards (name, URL, role, sites held, memory); with SITES, where each is and why."""
    obj.read_only = True
    if sites:
        located = obj.shards.locate(obj.site(site) for site in sites)
        for site, where in located.items():
            click.echo(f"{site}\t{where}\t{_why(obj, site, where)}")
        return
    for shard in obj.shards.shards:
        try:
            client = obj.shards.client(shard.name)
            click.echo(f"{shard.name}\t{_describe(client)}\t{shard.describe()}")
        except (ConfigError, redis.RedisError) as exc:
            click.echo(f"{shard.name}\tdown: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def _describe(client: Redis) -> str:
    """A shard's role, the sites it holds and its memory, in one round trip."""
    with client.pipeline(transaction=False) as pipe:
        pipe.info("replication")
        pipe.scard(keys.sites())
        pipe.info("memory")
        replication, held, memory = pipe.execute()
    return f"{replication.get('role', '?')}\t{held} sites\t{memory.get('used_memory_human', '?')}"


def _why(obj: Context, site: str, shard: str) -> str:
    """Why ``site`` is on ``shard``: its keys are there, or not yet seeded and named there or hashed there."""
    if not obj.shards.several:
        return "the only shard"
    if obj.shards.client(shard).sismember(keys.sites(), site):
        held = "seeded there"
    else:
        held = "not seeded yet"
    if obj.settings.sites.get(site, {}).get("shard") == shard:
        return f"{held}; the config file names it"
    if rendezvous(site, obj.shards.names) == shard:
        return f"{held}; hashed there"
    return f"{held}; moved there (`crawler move`)"


@click.command()
@click.argument("site")
@click.option("--to", "target", required=True, metavar="SHARD", help="The shard to move SITE to.")
@pass_context
def move(obj: Context, site: str, target: str) -> None:
    """Move SITE's crawl to another shard, live: queues, seen set, schedule, retries, cookies, settings, counters.

    The site is paused while its downloads in flight finish and its pages are parsed, then
    copied and resumed on SHARD; workers of every shard follow it without a restart.
    """
    obj.site(site)
    target = obj.shards.shard(target).name
    source = obj.shards.where(site)
    if source == target:
        raise ConfigError(f"{site} is on shard {target} already")
    policy = obj.runtime_of(source).policy(site)
    if policy.gate_by != "site" or policy.gate:
        raise ConfigError(
            f"{site} shares a gate with other sites (gate_by or gate): move them together by naming one "
            "shard for all in the config file (sites.SITE.shard), not with crawler move"
        )
    click.echo(f"{site}: pausing on shard {source}, waiting for its downloads and pages in flight ...", err=True)
    runtimes = {id(obj.shards.client(name)): obj.runtime_of(name) for name in (source, target)}
    moved = move_site(
        obj.shards.client(source),
        obj.shards.client(target),
        site,
        lambda connection: runtimes[id(connection)].publish(site, force=True),
    )
    click.echo(describe(moved, site, source, target))


#: The commands this module adds to ``crawler`` (``app`` registers them).
COMMANDS = [shards, move]
