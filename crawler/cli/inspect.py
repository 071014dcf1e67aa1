"""``crawler failed``, ``stats``, ``export``: what a crawl did and holds, read only."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
import redis

from ..coord import keys, quarantine
from ..errors import ConfigError, CrawlerError
from ..ops.failures import FailedPage, failed_pages
from ..store.database import Store
from ..store.export import FORMATS, format_for
from .context import Context, pass_context
from .output import _export


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
COMMANDS = [export, failed, stats]
