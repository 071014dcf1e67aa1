"""``crawler sites``, ``status``: the spiders a project has and where each site's crawl stands, read only.

The every-site commands, answered within a second at 10,000 sites (issue 46): this module
imports only what they use, and the database (``status``'s observed rates) and rich (the
tables) where they are used, so that neither pays for the work layer, HTTP or the store's
export at start-up.
"""

from __future__ import annotations

import click
from redis import Redis

from ..coord.policy import resolve_policy
from ..errors import ConfigError
from ..ops.status import (
    ParseBacklog,
    SiteStatus,
    known_sites,
    parse_backlog,
    read_politeness,
    site_status,
    status_json,
    workers_by_host,
)
from ..settings import split_shards
from .context import Context, pass_context


@click.command()
@pass_context
def sites(obj: Context) -> None:
    """List the spiders found, with their politeness settings."""
    from rich.console import Console
    from rich.text import Text

    from ..ops.tables import print_table

    rows = []
    spiders = sorted(obj.spider_set.spiders.items())
    # Where each site's keys are: only with several shards (one needs no Redis at all).
    located = obj.shards.locate(name for name, _ in spiders) if _several_shards(obj) else {}
    for name, spider in spiders:
        policy = resolve_policy(spider, obj.settings, {})
        rows.append(  # Text: a value is never read as markup
            [
                Text(name),
                Text(policy.interval_text),
                Text(policy.sources["interval"]),
                "yes" if policy.obey_robots else "no",
                Text(", ".join(spider().domains()) or "-"),
                str(len(spider.start_urls)),
                *([Text(located[name])] if located else []),
            ]
        )
    header = ("site", "interval (s)", "from", "robots", "allowed domains", "start URLs")
    print_table(Console(), header + (("shard",) if located else ()), rows)


def _several_shards(obj: Context) -> bool:
    """Whether ``REDIS_URL`` names several shards (read from the settings: no Redis is needed to tell)."""
    return len(split_shards(obj.settings.redis_url)) > 1


@click.command()
@click.argument("site", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def status(obj: Context, site: str | None, as_json: bool) -> None:
    """Per site: queued, in flight, done, failed."""
    obj.read_only = True
    up = _answering(obj)
    if site:
        names = [obj.site(site)]
    else:
        seeded = {name for _, client in up for name in known_sites(client)}
        names = sorted(seeded | set(obj.spider_set.spiders))
    statuses, hosts, parsing, suspended = _status_of(obj, up, names)
    rates = _observed_rates(obj, names)
    for s in statuses:
        s.rate = rates.get(s.site)
    if as_json:
        click.echo(status_json(statuses, parsing, hosts, suspended))
        return
    from rich.console import Console

    from ..ops.screens import print_status

    print_status(Console(), statuses, parsing, hosts, suspended)


def _answering(obj: Context) -> list[tuple[str, Redis]]:
    """The shards that answer; a warning line for each that does not (one Redis: its error, as before)."""
    if not obj.shards.several:
        return obj.shards.clients()
    up, down = obj.shards.answering()
    for name, why in down.items():
        click.echo(f"warning: shard {obj.shards.shard(name).describe()} is down ({why}): its sites left out", err=True)
    if not up:
        raise ConfigError("no shard answers")
    return up


def _status_of(
    obj: Context, up: list[tuple[str, Redis]], names: list[str]
) -> tuple[list[SiteStatus], dict[str, dict[str, int]], ParseBacklog, bool]:
    """The sites' statuses, in the order of ``names``, the workers per host, the parse backlog and whether RQ's
    workers are suspended, over the shards ``up`` (a few round trips a shard). With several shards a
    host's workers are counted per shard, ``HOST (SHARD)``."""
    from rq.suspension import is_suspended

    found: dict[str, SiteStatus] = {}
    hosts: dict[str, dict[str, int]] = {}
    parsing = ParseBacklog(0, 0)
    suspended = False
    named = obj.spider_set.named()
    located = obj.shards.by_shard(names, among=[name for name, _ in up])
    for shard, client in up:  # every shard: its workers and pages count, with sites there or not
        statuses = site_status(client, located.get(shard, []))
        spiders = {s.site: obj.spider_set.get(s.site) for s in statuses if s.site in named}
        politeness = read_politeness(client, spiders, obj.settings)  # a few round trips a chunk of sites
        for s in statuses:
            if s.site in politeness:
                policy, now = politeness[s.site]
                s.paused, s.interval_source = policy.paused, policy.sources.get("interval")
                s.interval, s.interval_why = now.interval, now.why
                s.closed_for, s.closed_why = now.closed_for, now.closed_why
            found[s.site] = s
        for host, states in workers_by_host(client).items():
            hosts[f"{host} ({shard})" if obj.shards.several else host] = states
        backlog = parse_backlog(client)
        parsing = ParseBacklog(parsing.queued + backlog.queued, parsing.in_flight + backlog.in_flight)
        suspended = suspended or bool(is_suspended(client))  # `rq suspend`: no worker takes a job
    return [found[name] for name in names if name in found], hosts, parsing, suspended


def _observed_rates(obj: Context, sites_: list[str]) -> dict[str, float]:
    """Downloads per second over the last minute by site, from the fetches table ({} if unreachable)."""
    from ..ops.stats import recent_rates  # SQLAlchemy: imported here, not by ``crawler sites``
    from ..store.database import Store

    try:
        store = Store(obj.settings.database_url)
    except ConfigError as exc:
        click.echo(f"warning: no observed rates: {exc}", err=True)
        return {}
    try:
        return recent_rates(store, sites_)
    finally:
        store.close()


COMMANDS = [sites, status]
