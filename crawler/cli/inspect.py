"""``crawler status``, ``failed``, ``stats``, ``export``: what a crawl did and holds, read only."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
import redis
from redis import Redis

from ..coord import keys, quarantine
from ..errors import ConfigError, CrawlerError
from ..ops.failures import FailedPage, failed_pages
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
from ..store.database import Store
from ..store.export import FORMATS, format_for
from .context import Context, _export, pass_context


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
    from ..ops.stats import recent_rates

    try:
        store = Store(obj.settings.database_url)
    except ConfigError as exc:
        click.echo(f"warning: no observed rates: {exc}", err=True)
        return {}
    try:
        return recent_rates(store, sites_)
    finally:
        store.close()


@click.command()
@click.argument("site")
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="File to write; its suffix picks the format: .jsonl, .json, .csv, .parquet ['-': stdout, JSON lines].",
)
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="The format, whatever the suffix.")
@click.option(
    "--fields", metavar="A,B,C", help="Only these fields; CSV/Parquet: these columns, in this order (one pass)."
)
@click.option(
    "--history", is_flag=True, help="Add each item's _key, _url, _first_seen, _last_seen and _changed (UTC, ISO 8601)."
)
@click.option(
    "--raw-csv", is_flag=True, help="CSV: keep cells starting with = + - @ as they are (default: a leading ')."
)
@pass_context
def export(
    obj: Context, site: str, output: str | None, fmt: str | None, fields: str | None, history: bool, raw_csv: bool
) -> None:
    """Write SITE's items as JSON lines, a JSON array, CSV or Parquet, streamed in constant memory.

    CSV and Parquet columns are every field seen (a first pass over the items) unless
    --fields names them. CSV cells a spreadsheet would run as formulas (starting with
    = + - @, tab or CR) get a leading ' unless --raw-csv.
    """
    obj.site(site)
    chosen = format_for(output, fmt)
    count = _export(obj, site, output, chosen, history=history, raw_csv=raw_csv, fields=_fields_option(fields))
    click.echo(f"{site}: {count} items exported" + (f" to {output}" if output not in (None, "-") else ""), err=True)


def _fields_option(value: str | None) -> list[str] | None:
    if value is None:
        return None
    fields = list(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    if not fields:
        raise ConfigError("--fields: name at least one field")
    return fields


@click.command()
@click.argument("site", required=False)
@click.option("--traceback", "show_error", is_flag=True, help="Show each page's full error text.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (full errors included).")
@click.option("--limit", type=click.IntRange(1), help="Show at most N pages.")
@click.option("--quarantined", is_flag=True, help="List the jobs refused before running (unsafe or malformed).")
@pass_context
def failed(
    obj: Context, site: str | None, show_error: bool, as_json: bool, limit: int | None, quarantined: bool
) -> None:
    """List failed pages (of SITE, or every site) with the reason."""
    obj.read_only = True  # looks at Redis only for quarantined jobs: never starts a server
    name = obj.site(site) if site else None
    if quarantined:
        _print_quarantined(obj, name, as_json, limit)
        return
    store = Store(obj.settings.database_url)
    try:
        pages = failed_pages(store, name, limit)
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps([page.as_dict() for page in pages], indent=2))
    elif not pages:
        click.echo("no failed pages")
    else:
        _print_failed(pages, show_error)
    if limit is not None and len(pages) == limit:
        click.echo(f"showing the first {limit} failed pages; raise --limit for more", err=True)
    try:
        refused = sum(quarantine.count(client) for _, client in obj.shards.clients())
    except (ConfigError, redis.RedisError):  # the failed pages are in the database; Redis is optional here
        refused = 0
    if refused:
        click.echo(
            f"{refused} job{'' if refused == 1 else 's'} quarantined (refused before running): "
            "crawler failed --quarantined",
            err=True,
        )


def _print_quarantined(obj: Context, site: str | None, as_json: bool, limit: int | None) -> None:
    """The quarantined jobs and frontier entries (of SITE's queue and frontier when given), newest first."""
    found = [q for _, client in obj.shards.clients() for q in quarantine.entries(client)]
    found.sort(key=lambda q: q.when, reverse=True)  # newest first, whatever the shard
    if site is not None:
        found = [
            q
            for q in found
            if q.source in (keys.download_queue(site), keys.frontier(site))
            or q.source.startswith(keys.frontier(site) + ":")
        ]
    found = found[:limit] if limit else found
    if as_json:
        click.echo(json.dumps([q.as_dict() for q in found], indent=2, ensure_ascii=False))
        return
    if not found:
        click.echo("no quarantined jobs")
    for q in found:
        when = datetime.fromtimestamp(q.when, UTC).strftime("%Y-%m-%d %H:%M:%S")
        click.echo(f"{when}\t{q.source}\t{q.job_id or '-'}\t{q.reason}")


def _print_failed(pages: list[FailedPage], show_error: bool) -> None:
    from rich.console import Console

    from ..ops.screens import print_failed

    print_failed(Console(highlight=False), pages, show_error)


@click.command()
@click.argument("site")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--plot",
    "plot_file",
    metavar="FILE",
    help="Write charts to FILE: .html, or .png (needs crawler[plot]). SITE may then be a,b or all.",
)
@pass_context
def stats(obj: Context, site: str, as_json: bool, plot_file: str | None) -> None:
    """SITE's downloads: latency percentiles, statuses, pages per minute, slowest pages.

    With --plot FILE: charts of requests and latency over time instead, for SITE, a comma
    list of sites, or all (every site with downloads recorded).
    """
    from ..ops.stats import site_stats

    if plot_file is not None:
        _plot_stats(obj, site, plot_file, as_json)
        return
    obj.site(site)
    store = Store(obj.settings.database_url)
    try:
        summary = site_stats(store, site)
    finally:
        store.close()
    cache = _cache_counts(obj, site)
    parsed = _item_counts(obj, site)
    if as_json:
        click.echo(json.dumps({**summary.as_dict(), "cache": cache, "items": parsed}, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    if cache["hits"] or cache["misses"]:
        console.print(
            f"development cache: {cache['hits']} hits (no request sent; in the counts below), {cache['misses']} misses",
            highlight=False,
            markup=False,
        )
    lat = summary.latency
    console.print(
        f"{site}: {summary.downloads} downloads; latency p50 {lat['p50'] * 1000:.0f} ms, "
        f"p90 {lat['p90'] * 1000:.0f} ms, p99 {lat['p99'] * 1000:.0f} ms, max {lat['max'] * 1000:.0f} ms",
        highlight=False,
        markup=False,
    )
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items()))
    console.print("outcomes: " + outcomes, highlight=False, markup=False)
    console.print(
        "statuses: " + ", ".join(f"{k} {v}" for k, v in summary.statuses.items()), highlight=False, markup=False
    )
    console.print(
        f"items: {parsed['stored']} stored, {parsed['dropped']} dropped (DropItem in process_item or a pipeline)",
        highlight=False,
        markup=False,
    )
    minutes = Table("minute (UTC)", "downloads")
    for minute, count in summary.per_minute[-30:]:
        minutes.add_row(Text(minute), str(count))
    console.print(minutes)
    slow = Table("slowest", "seconds", "status")
    for row in summary.slowest:
        slow.add_row(Text(row["url"]), f"{row['elapsed']:.3f}", Text(str(row["status"])))  # a URL is no markup
    console.print(slow)


def _cache_counts(obj: Context, site: str) -> dict[str, int]:
    """The site's development-cache hits and misses from Redis (zeros when no Redis is running)."""
    obj.read_only = True
    try:
        raw = obj.redis_for(site).hmget(keys.stats(site), "cache_hits", "cache_misses")
    except CrawlerError:
        return {"hits": 0, "misses": 0}
    return {"hits": int(raw[0] or 0), "misses": int(raw[1] or 0)}


def _item_counts(obj: Context, site: str) -> dict[str, int]:
    """The site's items stored (each time a page yields one) and dropped, from Redis (zeros when none is running)."""
    obj.read_only = True
    try:
        raw = obj.redis_for(site).hmget(keys.stats(site), "items", "dropped")
    except CrawlerError:
        return {"stored": 0, "dropped": 0}
    return {"stored": int(raw[0] or 0), "dropped": int(raw[1] or 0)}


def _plot_stats(obj: Context, spec: str, path: str, as_json: bool) -> None:
    """``stats --plot``: the report of the sites ``spec`` names, written to ``path``."""
    from ..ops.charts import check_plot_path, site_reports, write_report
    from ..ops.stats import sites_with_downloads

    if as_json:
        raise ConfigError("give --json or --plot, not both")
    check_plot_path(path)
    every_site = spec == "all" and "all" not in obj.spider_set.spiders
    names = [] if every_site else list(dict.fromkeys(obj.site(n.strip()) for n in spec.split(",") if n.strip()))
    if not every_site and not names:
        raise ConfigError("name a site, a comma list of sites, or all")
    store = Store(obj.settings.database_url)
    try:
        if every_site:
            names = sites_with_downloads(store)
            if not names:
                raise ConfigError("no downloads recorded for any site: nothing to plot")
        reports = site_reports(store, names)
    finally:
        store.close()
    write_report(path, reports)
    click.echo(f"wrote {path}: {', '.join(names)}")


#: The commands this module adds to ``crawler`` (``app`` registers them).
COMMANDS = [status, export, failed, stats]
