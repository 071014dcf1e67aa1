"""The ``crawler`` command line. Commands are thin: they call library functions.

Every expected error (``CrawlerError``, unreachable services) is one line on stderr
and exit status 1; tracebacks are for bugs.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

import click
import redis
from redis import Redis

from . import keys
from .connection import EmbeddedRedis, connect, resolve_redis_url
from .errors import ConfigError, CrawlerError
from .export import FORMATS, with_history, write_items
from .failures import FailedPage, failed_pages, retry_pages
from .frontier import PRIORITY_RANGE, SEED_PRIORITY
from .frontier import seed as seed_urls
from .launcher import KINDS, WorkerSpec, start_workers, stop_workers, wait_for
from .policy import read_live, reset_live, resolve_policy, set_live
from .runtime import BUNDLED_SPIDERS, Runtime
from .settings import DEFAULT_DATABASE_URL, REDIS_EMBEDDED, Settings, load_settings, redact_url
from .spider import SpiderSet, load_spiders
from .status import RateMeter, SiteStatus, known_sites, parse_backlog, site_status, workers_by_host
from .store import Store
from .workers import crawl_drained


@dataclass
class Context:
    """What every command shares: settings, the spiders, and (lazily) Redis."""

    settings: Settings
    embedded: EmbeddedRedis | None = None
    started_embedded: bool = False
    #: Stop an embedded Redis this command started when it ends (set by crawl and demo).
    stop_embedded: bool = False
    _redis_url: str | None = field(default=None, repr=False)

    @cached_property
    def spider_set(self) -> SpiderSet:
        found = load_spiders(self.settings.sites_dir, extra=BUNDLED_SPIDERS)
        ctx = click.get_current_context(silent=True)
        named = ctx.params.get("site") if ctx is not None else None  # its failure is the command's error
        for error in found.errors:
            if error.module != named:
                click.echo(f"warning: {error}", err=True)
        return found

    @property
    def redis_url(self) -> str:
        if self._redis_url is None:
            url, embedded = resolve_redis_url(self.settings.redis_url, self.settings.state_dir)
            if embedded is not None:
                self.started_embedded = embedded.start()
                self.embedded = embedded
            self._redis_url = url
        return self._redis_url

    @cached_property
    def redis(self) -> Redis:
        return connect(self.redis_url)

    @cached_property
    def runtime(self) -> Runtime:
        return Runtime(self.redis, self.settings, self.spider_set)

    def site(self, name: str) -> str:
        """``name`` if it is a known site; ConfigError otherwise."""
        self.spider_set.get(name)
        return name

    def close(self) -> None:
        if "runtime" in self.__dict__:
            self.runtime.close()
        if self.stop_embedded and self.started_embedded and self.embedded is not None:
            self.embedded.stop()


class CrawlerGroup(click.Group):
    """Turns expected errors into one line on stderr and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CrawlerError as exc:
            raise click.ClickException(str(exc)) from None
        except redis.RedisError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise click.ClickException(f"Redis error: {reason}") from None


pass_context = click.make_pass_decorator(Context)


@click.group(cls=CrawlerGroup)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML config file.")
@click.option("--sites", "sites_dir", type=click.Path(file_okay=False), help="Directory of spider modules [./sites].")
@click.option("--redis-url", help="Redis URL ('embedded' for a private server) [env REDIS_URL].")
@click.option("--database-url", help="SQLAlchemy database URL [env DATABASE_URL, sqlite:///crawler.db].")
@click.option("--gate-margin", type=float, metavar="SECONDS",
              help="Added to every site's interval, for hosts at different distances [env CRAWLER_GATE_MARGIN, 0.01].")
@click.version_option(package_name="crawler")
@click.pass_context
def cli(ctx: click.Context, config_file: str | None, sites_dir: str | None,
        redis_url: str | None, database_url: str | None, gate_margin: float | None) -> None:
    """Crawl many sites politely, with workers on any number of machines."""
    try:
        settings = load_settings(config_file, sites_dir=sites_dir, redis_url=redis_url, database_url=database_url,
                                 gate_margin=gate_margin)
    except CrawlerError as exc:
        raise click.ClickException(str(exc)) from None
    context = Context(settings)
    ctx.obj = context
    ctx.call_on_close(context.close)


@cli.command()
@pass_context
def sites(obj: Context) -> None:
    """List the spiders found, with their politeness settings."""
    from rich.console import Console
    from rich.table import Table

    table = Table("site", "interval (s)", "from", "robots", "allowed domains", "start URLs")
    for name, spider in sorted(obj.spider_set.spiders.items()):
        policy = resolve_policy(spider, obj.settings, {})
        table.add_row(name, f"{policy.interval:g}", policy.sources["interval"], "yes" if policy.obey_robots else "no",
                      ", ".join(spider().domains()) or "-", str(len(spider.start_urls)))
    Console().print(table)


@cli.command()
@click.argument("site")
@click.argument("urls", nargs=-1)
@click.option("--force", is_flag=True, help="Enqueue even URLs already seen (fetch them again now).")
@click.option("--priority", default=SEED_PRIORITY, show_default=True, type=click.IntRange(*PRIORITY_RANGE),
              help="Higher is fetched sooner (links found: 0, refreshes: -10).")
@pass_context
def seed(obj: Context, site: str, urls: tuple[str, ...], force: bool, priority: int) -> None:
    """Enqueue start URLs for SITE (the spider's own when none are given)."""
    spider = obj.runtime.spider(obj.site(site))
    chosen = list(urls) or [r.url for r in spider.start_requests()]
    if not chosen:
        raise ConfigError(f"site {site!r} has no start_urls: give URLs to seed")
    result = seed_urls(obj.runtime.frontier(site), chosen, force=force, priority=priority)
    click.echo(f"{site}: {len(result.enqueued)} enqueued, {result.duplicates} already seen")


def _sites_option(value: str | None, obj: Context) -> tuple[str, ...]:
    if not value:
        return tuple(sorted(obj.spider_set.spiders))
    return tuple(obj.site(name.strip()) for name in value.split(",") if name.strip())


@cli.command()
@click.argument("kind", type=click.Choice(KINDS))
@click.option("--sites", "site_list", help="Comma-separated sites to serve [all].")
@click.option("-n", "--processes", default=1, show_default=True, type=click.IntRange(1, 256), help="Worker processes.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1, 64), help="Workers per process.")
@click.option("--burst", is_flag=True, help="Exit when the crawl is drained.")
@click.option("-v", "--verbose", is_flag=True, help="Log every job (one line each).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON object per log line, every job included (for log shippers).")
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Also serve the fleet's Prometheus metrics on this port (see `crawler metrics`).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics endpoint listens on.")
@pass_context
def worker(obj: Context, kind: str, site_list: str | None, processes: int, threads: int, burst: bool,
           verbose: bool, log_format: str, metrics_port: int | None, metrics_host: str) -> None:
    """Run N download or parse worker processes."""
    served = _sites_option(site_list, obj)
    Store(obj.settings.database_url).close()  # fail now, in one line, if the database is unreachable
    obj.redis.ping()
    level = "INFO" if verbose or log_format == "json" else "WARNING"
    spec = WorkerSpec(kind, served, threads, burst, level, log_format=log_format,
                      all_sites=not site_list)
    server = _serve_metrics(obj, metrics_host, metrics_port) if metrics_port is not None else None
    click.echo(f"{processes} {kind} worker process(es) x {threads} on {redact_url(obj.redis_url)}", err=True)
    try:
        code = wait_for(start_workers([spec] * processes, obj.settings, obj.redis_url))
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    sys.exit(code)


@cli.command()
@click.argument("site")
@click.argument("urls", nargs=-1)
@click.option("-n", "--processes", default=2, show_default=True, type=click.IntRange(1, 256),
              help="Download worker processes.")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Download workers per process.")
@click.option("--parsers", default=1, show_default=True, type=click.IntRange(1, 64), help="Parse worker processes.")
@pass_context
def crawl(obj: Context, site: str, urls: tuple[str, ...], processes: int, threads: int, parsers: int) -> None:
    """Seed SITE and run workers until the crawl is drained, showing progress."""
    obj.site(site)
    click.get_current_context().invoke(seed, site=site, urls=urls, force=False, priority=SEED_PRIORITY)
    run_crawl(obj, [site], processes, threads, parsers)
    obj.stop_embedded = True  # drained: nothing left in a private Redis worth keeping


def run_crawl(obj: Context, sites_: list[str], processes: int, threads: int, parsers: int,
              out: TextIO | None = None) -> list[SiteStatus]:
    """Run burst workers for ``sites_`` with a progress display; returns the final status."""
    Store(obj.settings.database_url).close()
    specs = [WorkerSpec("download", tuple(sites_), threads, True)] * processes
    specs += [WorkerSpec("parse", tuple(sites_), 1, True)] * parsers
    started = time.monotonic()
    workers = start_workers(specs, obj.settings, obj.redis_url)
    try:
        with _progress(obj.redis, sites_) as refresh:
            while any(p.is_alive() for p in workers):
                refresh()
                time.sleep(0.25)
            refresh()
    except KeyboardInterrupt:
        stop_workers(workers)
        raise click.ClickException("interrupted: work left in the queues resumes with `crawler worker`") from None
    final = site_status(obj.redis, sites_)
    elapsed = time.monotonic() - started
    for status in final:
        click.echo(
            f"{status.site}: {status.fetched} fetched, {status.parsed} parsed, {status.items} items, "
            f"{status.failed} failed, {status.refused} refused in {elapsed:.1f}s"
            f" ({status.fetched / elapsed if elapsed else 0:.1f} pages/s)",
            file=out,
        )
    if not crawl_drained(obj.redis, sites_):
        raise click.ClickException("workers stopped before the crawl was drained (see the log above)")
    return final


@contextmanager
def _progress(connection: Redis, sites_: list[str]) -> Iterator[Callable[[], None]]:
    """A live table on a terminal; a log line per site every 5 s otherwise (logs, CI, pipes)."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    meter = RateMeter()
    console = Console(stderr=True)

    def snapshot() -> list[tuple[SiteStatus, float, str]]:
        statuses = site_status(connection, sites_)
        meter.update(statuses)
        return [(s, meter.rates.get(s.site, 0.0), format_eta(s.eta(meter.rates.get(s.site)))) for s in statuses]

    def table() -> Table:
        grid = Table("site", "done", "queued", "in flight", "retrying", "failed", "parsed", "items", "pages/s", "ETA")
        for s, rate, eta in snapshot():
            grid.add_row(s.site, str(s.done), str(s.queued), str(s.in_flight), str(s.scheduled), str(s.failed),
                         str(s.parsed), str(s.items), f"{rate:.1f}", eta)
        return grid

    if console.is_terminal:
        with Live(table(), console=console, refresh_per_second=4) as live:
            yield lambda: live.update(table())
    else:
        last = [0.0]

        def log_line() -> None:
            if time.monotonic() - last[0] >= PROGRESS_LOG_EVERY:
                last[0] = time.monotonic()
                for s, rate, eta in snapshot():
                    console.print(f"{time.strftime('%H:%M:%S')} {s.site}: done {s.done}, queued {s.queued}, "
                                  f"in flight {s.in_flight}, retrying {s.scheduled}, failed {s.failed}, "
                                  f"items {s.items}, {rate:.1f} pages/s, ETA {eta}", highlight=False, soft_wrap=True)

        yield log_line


#: Seconds between progress lines when the output is not a terminal.
PROGRESS_LOG_EVERY = 5.0


def format_eta(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``12s``; ``-`` while unknown (no rate yet)."""
    if seconds is None:
        return "-"
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


@cli.command()
@click.argument("site", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def status(obj: Context, site: str | None, as_json: bool) -> None:
    """Per site: queued, in flight, done, failed."""
    names = [obj.site(site)] if site else sorted(set(known_sites(obj.redis)) | set(obj.spider_set.spiders))
    statuses = site_status(obj.redis, names)
    rates = _observed_rates(obj, names)
    for s in statuses:
        s.rate = rates.get(s.site)
        if s.site in obj.spider_set.spiders:
            policy = resolve_policy(obj.spider_set.spiders[s.site], obj.settings, read_live(obj.redis, s.site))
            s.interval, s.paused = policy.interval, policy.paused
            s.interval_source = policy.sources.get("interval")
    hosts = workers_by_host(obj.redis)
    parsing = parse_backlog(obj.redis)
    if as_json:
        click.echo(json.dumps({"sites": [s.as_dict() for s in statuses], "parse": asdict(parsing), "workers": hosts},
                              indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("site", "queued", "in flight", "retrying", "refreshes", "fetched", "parsed", "items", "failed",
                  "refused", "req/s (1 min)", "interval (s)", "from", "state")
    for s in statuses:
        table.add_row(s.site, str(s.queued), str(s.in_flight), str(s.scheduled), str(s.refreshes), str(s.fetched),
                      str(s.parsed), str(s.items), str(s.failed), str(s.refused),
                      "-" if s.rate is None else f"{s.rate:.2f}", f"{s.interval:g}" if s.interval else "-",
                      s.interval_source or "-", "paused" if s.paused else "running")
    console = Console()
    console.print(table)
    console.print(f"parse jobs (all sites): {parsing.queued} queued, {parsing.in_flight} in flight", highlight=False)
    for host, states in sorted(hosts.items()):
        console.print(f"workers on {host}: " + ", ".join(f"{n} {state}" for state, n in sorted(states.items())),
                      highlight=False)


def _observed_rates(obj: Context, sites_: list[str]) -> dict[str, float]:
    """Downloads per second over the last minute by site, from the fetches table ({} if unreachable)."""
    from .stats import recent_rates

    try:
        store = Store(obj.settings.database_url)
    except ConfigError as exc:
        click.echo(f"warning: no observed rates: {exc}", err=True)
        return {}
    try:
        return recent_rates(store, sites_)
    finally:
        store.close()


@cli.command("set")
@click.argument("site")
@click.option("--interval", type=float, help="Seconds between requests to SITE.")
@click.option("--concurrency", type=int, help="Most requests to SITE at once.")
@click.option("--reset", is_flag=True, help="Drop SITE's live interval and concurrency (config/spider apply).")
@pass_context
def set_(obj: Context, site: str, interval: float | None, concurrency: int | None, reset: bool) -> None:
    """Change SITE's politeness for every running worker, without a restart."""
    if reset and (interval is not None or concurrency is not None):
        raise ConfigError("--reset drops live values: give it alone")
    if reset:
        reset_live(obj.redis, obj.site(site))
    else:
        set_live(obj.redis, obj.site(site), interval=interval, concurrency=concurrency)
    obj.runtime.publish(site, force=True)
    click.echo(f"{site}: {'live settings dropped' if reset else 'updated'}")


def _pause(obj: Context, site: str | None, all_sites: bool, paused: bool) -> None:
    if not site and not all_sites:
        raise ConfigError("name a SITE or give --all")
    names = sorted(obj.spider_set.spiders) if all_sites else [obj.site(str(site))]
    for name in names:
        set_live(obj.redis, name, paused=paused)
        obj.runtime.publish(name, force=True)
    click.echo(f"{', '.join(names)}: {'paused' if paused else 'resumed'}")


@cli.command()
@click.argument("site", required=False)
@click.option("--all", "all_sites", is_flag=True, help="Every site.")
@pass_context
def pause(obj: Context, site: str | None, all_sites: bool) -> None:
    """Stop downloading from SITE (queued work is kept)."""
    _pause(obj, site, all_sites, True)


@cli.command()
@click.argument("site", required=False)
@click.option("--all", "all_sites", is_flag=True, help="Every site.")
@pass_context
def resume(obj: Context, site: str | None, all_sites: bool) -> None:
    """Resume downloading from SITE."""
    _pause(obj, site, all_sites, False)


@cli.command()
@click.argument("site")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="jsonl", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="File to write [stdout].")
@click.option("--history", is_flag=True,
              help="Add each item's _key, _url, _first_seen, _last_seen and _changed (UTC, ISO 8601).")
@pass_context
def export(obj: Context, site: str, fmt: str, output: str | None, history: bool) -> None:
    """Write SITE's items as JSON lines or CSV."""
    obj.site(site)
    store = Store(obj.settings.database_url)
    try:
        items = (with_history(row) for row in store.item_rows(site)) if history else store.items(site)
        if output is None:
            count = write_items(items, sys.stdout, fmt)
        else:
            with open(output, "w", newline="", encoding="utf-8") as out:
                count = write_items(items, out, fmt)
    finally:
        store.close()
    click.echo(f"{site}: {count} items exported" + (f" to {output}" if output else ""), err=True)


@cli.command()
@click.argument("site", required=False)
@click.option("--traceback", "show_error", is_flag=True, help="Show each page's full error text.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (full errors included).")
@click.option("--limit", type=click.IntRange(1), help="Show at most N pages.")
@pass_context
def failed(obj: Context, site: str | None, show_error: bool, as_json: bool, limit: int | None) -> None:
    """List failed pages (of SITE, or every site) with the reason."""
    name = obj.site(site) if site else None
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


def _print_failed(pages: list[FailedPage], show_error: bool) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Column, Table
    from rich.text import Text

    console = Console(highlight=False)
    # Light borders, and URLs and reasons folded, never cut short, to fit a narrow terminal.
    table = Table("site", Column("url", overflow="fold"), "kind", "status", "attempt", "finished (UTC)",
                  Column("reason", overflow="fold"), box=box.SIMPLE_HEAD)
    for page in pages:  # Text cells: a URL or an error may hold [brackets] rich would read as markup
        table.add_row(*(Text(value) for value in (
            page.site, page.url, page.kind, str(page.status or "-"), str(page.attempt),
            page.finished.strftime("%Y-%m-%d %H:%M:%S"), page.reason)))
    console.print(table)
    if show_error:
        for page in pages:
            console.print(Text(f"\n{page.site} {page.url} ({page.kind}):", style="bold"), soft_wrap=True)
            console.print(Text((page.error or page.reason).rstrip()), soft_wrap=True)  # copyable: no wrapping


@cli.command()
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
    pages = retry_pages(obj.runtime.store, obj.runtime.frontier(site), None if all_pages else urls)
    click.echo(f"{site}: {len(pages)} failed page{'' if len(pages) == 1 else 's'} requeued")


@cli.command()
@click.argument("site")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--plot", "plot_file", metavar="FILE",
              help="Write charts to FILE: .html, or .png (needs crawler[plot]). SITE may then be a,b or all.")
@pass_context
def stats(obj: Context, site: str, as_json: bool, plot_file: str | None) -> None:
    """SITE's downloads: latency percentiles, statuses, pages per minute, slowest pages.

    With --plot FILE: charts of requests and latency over time instead, for SITE, a comma
    list of sites, or all (every site with downloads recorded).
    """
    from .stats import site_stats

    if plot_file is not None:
        _plot_stats(obj, site, plot_file, as_json)
        return
    obj.site(site)
    store = Store(obj.settings.database_url)
    try:
        summary = site_stats(store, site)
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps(summary.as_dict(), indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    lat = summary.latency
    console.print(f"{site}: {summary.downloads} downloads; latency p50 {lat['p50'] * 1000:.0f} ms, "
                  f"p90 {lat['p90'] * 1000:.0f} ms, p99 {lat['p99'] * 1000:.0f} ms, max {lat['max'] * 1000:.0f} ms",
                  highlight=False)
    console.print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items())), highlight=False)
    console.print("statuses: " + ", ".join(f"{k} {v}" for k, v in summary.statuses.items()), highlight=False)
    minutes = Table("minute (UTC)", "downloads")
    for minute, count in summary.per_minute[-30:]:
        minutes.add_row(minute, str(count))
    console.print(minutes)
    slow = Table("slowest", "seconds", "status")
    for row in summary.slowest:
        slow.add_row(row["url"], f"{row['elapsed']:.3f}", str(row["status"]))
    console.print(slow)


def _plot_stats(obj: Context, spec: str, path: str, as_json: bool) -> None:
    """``stats --plot``: the report of the sites ``spec`` names, written to ``path``."""
    from .report import check_plot_path, site_reports, write_report
    from .stats import sites_with_downloads

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


def _serve_metrics(obj: Context, host: str, port: int) -> Any:
    """Serve the fleet's metrics from a daemon thread of this process; one line on stderr says where."""
    from .metrics import MetricsCollector, address, serve

    server = serve(MetricsCollector(obj.redis, obj.spider_set.spiders, obj.settings), host, port)
    click.echo(f"metrics at http://{address(host, server.server_port)}/metrics from Redis {redact_url(obj.redis_url)}",
               err=True)
    return server


@cli.command("metrics")
@click.option("--port", default=9108, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@pass_context
def metrics_(obj: Context, port: int, host: str) -> None:
    """Serve the fleet's Prometheus metrics, read from Redis on every scrape, until Ctrl-C."""
    obj.redis.ping()
    server = _serve_metrics(obj, host, port)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()


@cli.command()
@click.option("--products", default=300, show_default=True, type=click.IntRange(1, 100000))
@click.option("-n", "--processes", default=2, show_default=True, type=click.IntRange(1, 64))
@pass_context
def demo(obj: Context, products: int, processes: int) -> None:
    """Serve a bundled demo shop on loopback and crawl it end to end."""
    from .demo import ShopSite

    if obj.settings.redis_url is None:  # the demo keeps to itself: a private Redis
        obj.settings = _replace(obj.settings, redis_url=REDIS_EMBEDDED)
    # Quick retries, so the shop's failing pages do not hold the demo for long.
    obj.settings = _replace(obj.settings, backoff=min(obj.settings.backoff, 0.5))
    if obj.settings.database_url == DEFAULT_DATABASE_URL:
        Path(obj.settings.state_dir).mkdir(parents=True, exist_ok=True)
        db = Path(obj.settings.state_dir) / "demo.db"
        db.unlink(missing_ok=True)
        obj.settings = _replace(obj.settings, database_url=f"sqlite:///{db}")
    obj.stop_embedded = True
    with ShopSite(products=products, slow_every=50, slow_seconds=0.5) as shop:
        click.echo(f"demo shop with {products} products at {shop.url}; Redis {redact_url(obj.redis_url)}; "
                   f"database {redact_url(obj.settings.database_url)}", err=True)
        obj.redis.delete(keys.seen("demo"), keys.stats("demo"))
        seed_urls(obj.runtime.frontier("demo"), [shop.url + "/"], force=True)
        run_crawl(obj, ["demo"], processes, 2, 1)
        store = Store(obj.settings.database_url)
        got = {item["sku"]: item for item in store.items("demo")}
        expected = shop.expected_items()
        gap = shop.min_gap()
        store.close()
    wrong = sum(1 for sku, item in expected.items() if got.get(sku) != item)
    click.echo(f"items: {len(got)} stored, {len(expected)} expected, {wrong} missing or wrong; "
               f"requests: {len(shop.requests)}, closest two {gap * 1000 if gap else 0:.1f} ms apart "
               f"(interval {obj.runtime.policy('demo').interval * 1000:g} ms)")
    click.echo(f"export them with: crawler --database-url {obj.settings.database_url} export demo")
    if wrong:
        raise ConfigError(f"demo crawl is incomplete: {wrong} items missing or wrong")


def _replace(settings: Settings, **changes: Any) -> Settings:
    import dataclasses

    return dataclasses.replace(settings, **changes)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="crawler")
