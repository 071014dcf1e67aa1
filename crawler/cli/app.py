"""The ``crawler`` command line. Commands are thin: they call library functions.

Every expected error (``CrawlerError``, unreachable services) is one line on stderr
and exit status 1; tracebacks are for bugs.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import IO, Any, TextIO

import click
import redis
from redis import Redis

from ..coord import counters, keys, quarantine
from ..coord.connection import LOCALHOST_URL, EmbeddedRedis, RedisChoice, connect, resolve_redis
from ..coord.frontier import SEED_PRIORITY
from ..coord.frontier import seed as seed_urls
from ..coord.policy import read_live, reset_live, resolve_policy, set_live
from ..coord.seeding import SeedReport, open_lines, seed_lines, seed_start
from ..coord.spiderargs import parse_args, read_args, store_args
from ..coord.task import PRIORITY_RANGE
from ..errors import ConfigError, CrawlerError
from ..ops.failures import FailedPage, failed_pages, retry_pages
from ..ops.rekey import migrate_keys, old_sites, running_workers
from ..ops.reset import ResetResult, reset_site
from ..ops.screens import state
from ..ops.status import SiteStatus, known_sites, parse_backlog, politeness, site_status, this_run, workers_by_host
from ..settings import DEFAULT_DATABASE_URL, REDIS_EMBEDDED, Settings, load_settings, redact_url, scrub, secrets_of
from ..spiders.scaffold import check_name, write_spider
from ..spiders.spider import SpiderSet, load_spiders
from ..store.database import Store
from ..store.export import BINARY_FORMATS, FORMATS, format_for, with_history, write_items
from ..work.download_worker import crawl_drained
from ..work.launcher import KINDS, WorkerSpec, start_workers, stop_workers, wait_for
from ..work.runtime import BUNDLED_SPIDERS, Runtime
from .types import FINITE_FLOAT


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

    @cached_property
    def spider_set(self) -> SpiderSet:
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


@click.group(cls=CrawlerGroup)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML config file.")
@click.option("--sites", "sites_dir", type=click.Path(file_okay=False), help="Directory of spider modules [./sites].")
@click.option("--redis-url", help="Redis URL ('embedded' for a private server) [env REDIS_URL].")
@click.option("--database-url", help="SQLAlchemy database URL [env DATABASE_URL, sqlite:///crawler.db].")
@click.option(
    "--gate-margin",
    type=FINITE_FLOAT,
    metavar="SECONDS",
    help="Added to every site's interval, for hosts at different distances [env CRAWLER_GATE_MARGIN, 0.01].",
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


@cli.command()
@pass_context
def sites(obj: Context) -> None:
    """List the spiders found, with their politeness settings."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table("site", "interval (s)", "from", "robots", "allowed domains", "start URLs")
    for name, spider in sorted(obj.spider_set.spiders.items()):
        policy = resolve_policy(spider, obj.settings, {})
        table.add_row(  # Text: a value is never read as markup
            Text(name),
            Text(policy.interval_text),
            Text(policy.sources["interval"]),
            "yes" if policy.obey_robots else "no",
            Text(", ".join(spider().domains()) or "-"),
            str(len(spider.start_urls)),
        )
    Console().print(table)


@cli.command()
@click.argument("targets", nargs=-1, metavar="SITE... [URL...]")
@click.option("--all", "all_sites", is_flag=True, help="Every spider's start requests, in this one process.")
@click.option(
    "--from",
    "from_file",
    metavar="FILE",
    help="Read URLs from FILE, one a line ('-': stdin; .gz files are gunzipped), streamed in chunks.",
)
@click.option("--force", is_flag=True, help="Enqueue even URLs already seen (fetch them again now).")
@click.option(
    "--priority",
    default=SEED_PRIORITY,
    show_default=True,
    type=click.IntRange(*PRIORITY_RANGE),
    help="Higher is fetched sooner (links found: 0, refreshes: -10).",
)
@click.option("--callback", default=None, metavar="NAME", help="Spider method to parse the seeded pages [parse].")
@click.option(
    "-a",
    "spider_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a spider attribute (a string) for the crawl, in every worker (repeatable; replaces those set before).",
)
@pass_context
def seed(
    obj: Context,
    targets: tuple[str, ...],
    force: bool,
    priority: int,
    all_sites: bool = False,
    from_file: str | None = None,
    callback: str | None = None,
    spider_args: tuple[str, ...] = (),
) -> None:
    """Enqueue start URLs: SITE's (the spider's own when none are given), or several sites' own.

    After the first site, an argument that names no spider is a URL; URLs, ``--from``
    and ``--callback`` apply to one site. ``--all`` (or several sites) seeds each spider's
    start requests in this one process, a line per site.
    """
    sites, urls = _split_seed_targets(obj, targets, all_sites)
    _refuse_old_keys(obj)
    if len(sites) > 1:
        if urls or from_file is not None or callback is not None or spider_args:
            raise ConfigError("URLs, --from, --callback and -a apply to one site: name one")
        for site in sites:
            spider = obj.runtime.spider(site)
            if not (spider.start_urls or spider.sitemap_urls):
                click.echo(f"warning: {site}: no start_urls or sitemap_urls, nothing seeded", err=True)
                continue
            result = seed_start(obj.runtime.frontier(site), spider, force=force, priority=priority)
            click.echo(f"{site}: {len(result.enqueued)} enqueued, {result.duplicates} already seen")
        return
    (site,) = sites
    _set_spider_args(obj, site, spider_args)
    spider = obj.runtime.spider(site)
    if callback is not None:
        try:
            spider.callback(callback)
        except AttributeError as exc:
            raise ConfigError(str(exc)) from None
    if from_file is not None:
        if urls:
            raise ConfigError("give URLs or --from FILE, not both")
        _seed_from(obj, site, from_file, force, priority, callback or "parse")
        return
    if callback is not None and not urls:
        raise ConfigError("--callback applies to the URLs given (or --from FILE), not to start_urls")
    if urls:
        result = seed_urls(
            obj.runtime.frontier(site), urls, force=force, priority=priority, callback=callback or "parse"
        )
    else:  # the spider's own start requests, sitemaps included, each with its callback
        result = seed_start(obj.runtime.frontier(site), spider, force=force, priority=priority)
    click.echo(f"{site}: {len(result.enqueued)} enqueued, {result.duplicates} already seen")


def _set_spider_args(obj: Context, site: str, pairs: tuple[str, ...]) -> None:
    """Store ``-a`` pairs as ``site``'s spider arguments (none given: those stored are kept, and named)."""
    if pairs:
        store_args(obj.redis, site, parse_args(pairs, obj.spider_set.get(site)))
        return
    kept = read_args(obj.redis, site)
    if kept:
        shown = " ".join(f"{name}={value[:40]}" for name, value in sorted(kept.items()))
        click.echo(f"{site}: spider arguments kept from before: {shown} (`crawler reset` clears them)", err=True)


def _split_seed_targets(obj: Context, targets: tuple[str, ...], all_sites: bool) -> tuple[list[str], list[str]]:
    """``seed``'s arguments as (sites, URLs).

    The first argument names a site (unknown: ConfigError); each later one is a site when
    a spider has that name, else a URL (checked when seeded). ``--all``: every spider.
    """
    if all_sites:
        if targets:
            raise ConfigError("give site names or --all, not both")
        sites = sorted(obj.spider_set.spiders)
        if not sites:
            raise ConfigError("no spiders found to seed")
        return sites, []
    if not targets:
        raise click.UsageError("name a site (or give --all)")
    first, *rest = targets
    sites = [obj.site(first), *(target for target in rest if target in obj.spider_set.spiders)]
    urls = [target for target in rest if target not in obj.spider_set.spiders]
    return list(dict.fromkeys(sites)), urls


def _refuse_old_keys(obj: Context) -> None:
    """ConfigError while Redis holds a crawl under the key names of an earlier version (see ``rekey``)."""
    found = old_sites(obj.redis)
    if found:
        named = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise ConfigError(
            f"Redis holds the crawl of {named} under the key names of an earlier version: "
            "stop every worker, then run `crawler migrate-keys`"
        )


def _seed_from(obj: Context, site: str, path: str, force: bool, priority: int, callback: str) -> None:
    """``seed --from``: stream the file's URLs in; bad lines are warnings, none good is the error."""
    frontier = obj.runtime.frontier(site)
    shown = [time.monotonic()]

    def progress(report: SeedReport) -> None:  # on a terminal only: a pipe gets the summary alone
        if time.monotonic() - shown[0] >= 1.0:
            shown[0] = time.monotonic()
            click.echo(f"\r{report.summary(site)} ...", err=True, nl=False)

    with open_lines(path) as lines:
        report = seed_lines(
            frontier,
            lines,
            force=force,
            priority=priority,
            callback=callback,
            progress=progress if sys.stderr.isatty() else None,
        )
    if sys.stderr.isatty():
        click.echo("\r\033[K", err=True, nl=False)
    for line in report.bad_lines():
        click.echo(f"warning: {line}", err=True)
    click.echo(report.summary(site))


def _sites_option(value: str | None, obj: Context) -> tuple[str, ...]:
    if not value:  # the bundled demo too: its queue is empty unless `crawler demo` or `seed demo` filled it
        return tuple(sorted(obj.spider_set.named()))
    return tuple(obj.site(name.strip()) for name in value.split(",") if name.strip())


@cli.command()
@click.argument("kind", type=click.Choice(KINDS))
@click.option("--sites", "site_list", help="Comma-separated sites to serve [all].")
@click.option("-n", "--processes", default=1, show_default=True, type=click.IntRange(1, 256), help="Worker processes.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1, 64), help="Workers per process.")
@click.option("--burst", is_flag=True, help="Exit when the crawl is drained.")
@click.option("-v", "--verbose", is_flag=True, help="Log every job (one line each).")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per log line, every job included (for log shippers).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Also serve the fleet's Prometheus metrics on this port (see `crawler metrics`).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics endpoint listens on.")
@pass_context
def worker(
    obj: Context,
    kind: str,
    site_list: str | None,
    processes: int,
    threads: int,
    burst: bool,
    verbose: bool,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run N download or parse worker processes."""
    served = _sites_option(site_list, obj)
    Store(obj.settings.database_url).close()  # fail now, in one line, if the database is unreachable
    _refuse_old_keys(obj)
    level = "INFO" if verbose or log_format == "json" else "WARNING"
    spec = WorkerSpec(kind, served, threads, burst, level, log_format=log_format)
    server = _serve_metrics(obj, metrics_host, metrics_port) if metrics_port is not None else None
    click.echo(f"{processes} {kind} worker process(es) x {threads} on {obj.redis_choice.describe()}", err=True)
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
@click.option(
    "-n", "--processes", default=2, show_default=True, type=click.IntRange(1, 256), help="Download worker processes."
)
@click.option(
    "--threads", default=2, show_default=True, type=click.IntRange(1, 64), help="Download workers per process."
)
@click.option("--parsers", default=1, show_default=True, type=click.IntRange(1, 64), help="Parse worker processes.")
@click.option("--fresh", is_flag=True, help="Forget SITE's queued and seen URLs and counters first (crawler reset).")
@click.option("--from", "from_file", metavar="FILE", help="Seed the URLs of FILE ('-': stdin), as seed --from does.")
@click.option(
    "-a",
    "spider_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a spider attribute (a string) for the crawl, in every worker (repeatable; replaces those set before).",
)
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="When the crawl is drained, export SITE's items to FILE (format from the suffix, as export does).",
)
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="-o's format, whatever the suffix.")
@pass_context
def crawl(
    obj: Context,
    site: str,
    urls: tuple[str, ...],
    processes: int,
    threads: int,
    parsers: int,
    fresh: bool,
    from_file: str | None = None,
    spider_args: tuple[str, ...] = (),
    output: str | None = None,
    fmt: str | None = None,
) -> None:
    """Seed SITE and run workers until the crawl is drained, showing progress; -o: then export the items."""
    obj.site(site)
    if fmt is not None and output is None:
        raise ConfigError("--format is the format of -o FILE: give -o too")
    chosen = format_for(output, fmt) if output is not None else None
    _check_writable(output)  # now, not after an hour of crawling
    _refuse_old_keys(obj)
    if fresh:
        _report_reset(site, reset_site(obj.redis, site))
    ctx = click.get_current_context()
    ctx.invoke(
        seed,
        targets=(site, *urls),
        force=False,
        priority=SEED_PRIORITY,
        from_file=from_file,
        spider_args=spider_args,
    )
    click.echo(f"Redis: {obj.redis_choice.describe()}", err=True)
    (run,) = run_crawl(obj, [site], processes, threads, parsers, out=sys.stderr if output == "-" else None)
    if not run.done and not run.parsed:
        click.echo(
            f"{site}: nothing new to crawl: every URL seeded was seen before (`crawler crawl --fresh` starts over)",
            err=True,
        )
    if chosen is not None:
        count = _export(obj, site, output, chosen)
        click.echo(f"{site}: {count} items exported" + (f" to {output}" if output != "-" else ""), err=True)
    if obj.redis_choice.embedded is not None:
        click.echo(
            "the embedded Redis server keeps running with the crawl's state (`crawler status` reads it; "
            "`crawler redis stop` stops it)",
            err=True,
        )


def _report_reset(site: str, result: ResetResult) -> None:
    click.echo(
        f"{site}: forgot {result.queued} queued and {result.seen} seen URLs and the counters "
        "(items and fetch records kept)",
        err=True,
    )
    if result.in_flight:
        click.echo(f"warning: {site}: {result.in_flight} downloads in flight will finish and may queue links", err=True)


@cli.command()
@click.argument("site")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_context
def reset(obj: Context, site: str, yes: bool) -> None:
    """Forget SITE's queued URLs, seen set and counters, to crawl it again from the start."""
    obj.site(site)
    if not yes:
        seen = obj.redis.scard(keys.seen(site))
        try:
            click.confirm(
                f"Forget {site}'s queued URLs, its {seen} seen URLs and its counters? "
                "Items and fetch records are kept.",
                abort=True,
                err=True,
            )
        except click.Abort:
            raise ConfigError(f"{site} not reset (give --yes to skip the question)") from None
    _report_reset(site, reset_site(obj.redis, site))


@cli.command()
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


@cli.command("migrate-keys")
@click.option("--force", is_flag=True, help="Migrate even though workers seem to be running.")
@pass_context
def migrate_keys_(obj: Context, force: bool) -> None:
    """Move a crawl kept by an earlier version to today's key names (stop every worker first)."""
    busy = running_workers(obj.redis)
    if busy and not force:
        raise ConfigError(f"{busy} workers are running on this Redis: stop every worker first (or give --force)")
    click.echo(migrate_keys(obj.redis).summary())


def run_crawl(
    obj: Context, sites_: list[str], processes: int, threads: int, parsers: int, out: TextIO | None = None
) -> list[SiteStatus]:
    """Run burst workers for ``sites_`` with a progress display; returns what this run did, per site.

    The counters in Redis add up over every run since the site was seeded (or reset);
    the summary and the result count only this run's downloads, parses and items.
    """
    Store(obj.settings.database_url).close()
    specs = [WorkerSpec("download", tuple(sites_), threads, True)] * processes
    specs += [WorkerSpec("parse", tuple(sites_), 1, True)] * parsers
    before = {status.site: status for status in site_status(obj.redis, sites_)}
    started = time.monotonic()
    workers = start_workers(specs, obj.settings, obj.redis_url)
    try:
        with _progress(obj.redis, sites_, obj.settings.database_url) as refresh:
            while any(p.is_alive() for p in workers):
                refresh()
                time.sleep(0.25)
            refresh()
    except KeyboardInterrupt:
        stop_workers(workers)
        raise click.ClickException("interrupted: work left in the queues resumes with `crawler worker`") from None
    elapsed = time.monotonic() - started
    final = [this_run(status, before.get(status.site)) for status in site_status(obj.redis, sites_)]
    for status in final:
        click.echo(
            f"{status.site}: {status.fetched} fetched, {status.parsed} parsed, {status.items} items, "
            f"{status.failed} failed, {status.refused} refused in {elapsed:.1f}s"
            f" ({status.fetched / elapsed if elapsed else 0:.1f} pages/s)"
            + (f"; {status.cache_hits} from the development cache" if status.cache_hits else ""),
            file=out,
        )
    if not crawl_drained(obj.redis, sites_):
        raise click.ClickException("workers stopped before the crawl was drained (see the log above)")
    return final


@contextmanager
def _progress(connection: Redis, sites_: list[str], database_url: str | None = None) -> Iterator[Callable[[], None]]:
    """A live table on a terminal; a log line per site every 5 s otherwise (logs, CI, pipes).

    Both stages count: the parse backlog, downloads and parses per second, and an ETA
    over what is left to download and to parse. With ``database_url``, the first
    callback error of each kind is printed once, as it is recorded.
    """
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    from ..ops.progress import ErrorWatch, Progress, Snapshot

    progress = Progress()
    console = Console(stderr=True)
    errors = ErrorWatch(database_url, sites_) if database_url else None
    last_poll = [0.0]

    def snapshot() -> list[Snapshot]:
        return progress.update(site_status(connection, sites_), parse_backlog(connection))

    def report_errors(print_line: Callable[[str], None]) -> None:
        if errors is not None and time.monotonic() - last_poll[0] >= ERRORS_POLL_EVERY:
            last_poll[0] = time.monotonic()
            for line in errors.poll():
                print_line(line)

    def table() -> Table:
        grid = Table(
            "site",
            "done",
            "queued",
            "in flight",
            "retrying",
            "failed",
            "to parse",
            "parsed",
            "items",
            "pages/s",
            "parsed/s",
            "ETA",
        )
        for p in snapshot():
            s = p.status
            grid.add_row(
                Text(s.site),
                str(s.done),
                str(s.queued),
                str(s.in_flight),
                str(s.scheduled),
                str(s.failed),
                str(p.to_parse),
                str(s.parsed),
                str(s.items),
                f"{p.download_rate:.1f}",
                f"{p.parse_rate:.1f}",
                format_eta(p.eta),
            )
        return grid

    def plain(line: str) -> None:
        console.print(line, highlight=False, soft_wrap=True, markup=False)

    if console.is_terminal:
        with Live(table(), console=console, refresh_per_second=4) as live:

            def refresh() -> None:
                report_errors(lambda line: live.console.print(line, highlight=False, soft_wrap=True, markup=False))
                live.update(table())

            yield refresh
    else:
        last = [0.0]

        def log_line() -> None:
            report_errors(plain)
            if time.monotonic() - last[0] >= PROGRESS_LOG_EVERY:
                last[0] = time.monotonic()
                for p in snapshot():
                    s = p.status
                    plain(
                        f"{time.strftime('%H:%M:%S')} {s.site}: done {s.done}, queued {s.queued}, "
                        f"in flight {s.in_flight}, retrying {s.scheduled}, failed {s.failed}, "
                        f"to parse {p.to_parse}, parsed {s.parsed}, items {s.items}, "
                        f"{p.download_rate:.1f} pages/s, {p.parse_rate:.1f} parsed/s, ETA {format_eta(p.eta)}"
                    )

        yield log_line
    if errors is not None:
        for line in [*errors.poll(), *errors.closing_lines()]:
            plain(line)


#: Seconds between two looks for new callback errors during ``crawl``.
ERRORS_POLL_EVERY = 1.0

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
    obj.read_only = True
    names = [obj.site(site)] if site else sorted(set(known_sites(obj.redis)) | set(obj.spider_set.spiders))
    statuses = site_status(obj.redis, names)
    rates = _observed_rates(obj, names)
    for s in statuses:
        s.rate = rates.get(s.site)
        if s.site in obj.spider_set.named():
            policy = resolve_policy(obj.spider_set.get(s.site), obj.settings, read_live(obj.redis, s.site))
            s.paused, s.interval_source = policy.paused, policy.sources.get("interval")
            now = politeness(obj.redis, s.site, policy)
            s.interval, s.interval_why = now.interval, now.why
            s.closed_for, s.closed_why = now.closed_for, now.closed_why
    hosts = workers_by_host(obj.redis)
    parsing = parse_backlog(obj.redis)
    from rq.suspension import is_suspended

    suspended = bool(is_suspended(obj.redis))  # `rq suspend`: no worker takes a job, whatever a site's state
    if as_json:
        sites_ = [{**s.as_dict(), "state": state(s, suspended)} for s in statuses]
        click.echo(
            json.dumps({"sites": sites_, "parse": asdict(parsing), "workers": hosts, "suspended": suspended}, indent=2)
        )
        return
    from rich.console import Console

    from ..ops.screens import print_status

    print_status(Console(), statuses, parsing, hosts, suspended)


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


@cli.command("set")
@click.argument("site")
@click.option("--interval", type=FINITE_FLOAT, help="Seconds between requests to SITE.")
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


def _export(
    obj: Context,
    site: str,
    output: str | None,
    fmt: str,
    history: bool = False,
    raw_csv: bool = False,
    fields: list[str] | None = None,
) -> int:
    """Write ``site``'s items to ``output`` (None or '-': stdout) in ``fmt``; the number written."""
    store = Store(obj.settings.database_url)
    try:

        def source() -> Iterable[dict[str, Any]]:  # a streaming query each time it is called
            return (with_history(row) for row in store.stream_item_rows(site)) if history else store.items(site)

        with _open_output(output, binary=fmt in BINARY_FORMATS) as out:
            return write_items(source, out, fmt, raw_csv=raw_csv, fields=fields)
    finally:
        store.close()


@cli.command()
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
        refused = quarantine.count(obj.redis)
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
    found = quarantine.entries(obj.redis)
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
        raw = obj.redis.hmget(keys.stats(site), "cache_hits", "cache_misses")
    except CrawlerError:
        return {"hits": 0, "misses": 0}
    return {"hits": int(raw[0] or 0), "misses": int(raw[1] or 0)}


def _item_counts(obj: Context, site: str) -> dict[str, int]:
    """The site's items stored (each time a page yields one) and dropped, from Redis (zeros when none is running)."""
    obj.read_only = True
    try:
        raw = obj.redis.hmget(keys.stats(site), "items", "dropped")
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


def _serve_metrics(obj: Context, host: str, port: int) -> Any:
    """Serve the fleet's metrics from a daemon thread of this process; one line on stderr says where."""
    from ..ops.metrics import MetricsCollector, address, serve

    server = serve(MetricsCollector(obj.redis, obj.spider_set.named(), obj.settings), host, port)
    click.echo(
        f"metrics at http://{address(host, server.server_port)}/metrics from Redis {redact_url(obj.redis_url)}",
        err=True,
    )
    return server


@cli.command("dashboard")
@click.option("--port", default=9181, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--username", envvar="CRAWLER_DASHBOARD_USERNAME", help="Ask for HTTP basic credentials, this user.")
@click.option("--password", envvar="CRAWLER_DASHBOARD_PASSWORD", help="The password of --username.")
@click.option("--allow-host", "allowed_hosts", multiple=True, help="A host name the dashboard answers to (repeatable).")
@pass_context
def dashboard_(
    obj: Context, port: int, host: str, username: str | None, password: str | None, allowed_hosts: tuple[str, ...]
) -> None:
    """Serve rq-dashboard (RQ's queues, jobs and workers) for this Redis, read-only, until Ctrl-C.

    It answers to IP addresses, localhost and --allow-host names only, refuses cross-site
    requests, and off loopback needs --username and --password.
    Needs the dashboard extra: pip install 'crawler[dashboard]'.
    """
    from ..ops.dashboard import make_app

    if not _loopback(host) and not (username and password):
        raise ConfigError(f"crawler dashboard on {host} (not loopback) needs --username and --password")
    obj.read_only = True
    obj.redis.ping()
    app = make_app(obj.redis_url, username=username, password=password, allowed_hosts=allowed_hosts)
    click.echo(f"dashboard at http://{host}:{port}/ for Redis {redact_url(obj.redis_url)}", err=True)
    app.run(host=host, port=port)


def _loopback(host: str) -> bool:
    """Whether ``host`` (an address to listen on) is a loopback address or ``localhost``."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


@cli.command("metrics")
@click.option(
    "--port",
    default=9108,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to listen on (0: any free port).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@pass_context
def metrics_(obj: Context, port: int, host: str) -> None:
    """Serve the fleet's Prometheus metrics, read from Redis on every scrape, until Ctrl-C."""
    obj.read_only = True
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
    from ..demo import ShopSite

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
        click.echo(
            f"demo shop with {products} products at {shop.url}; Redis {redact_url(obj.redis_url)}; "
            f"database {redact_url(obj.settings.database_url)}",
            err=True,
        )
        with obj.redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.seen("demo"))
            counters.forget(pipe, "demo")
            pipe.execute()
        seed_urls(obj.runtime.frontier("demo"), [shop.url + "/"], force=True)
        run_crawl(obj, ["demo"], processes, 2, 1)
        store = Store(obj.settings.database_url)
        got = {item["sku"]: item for item in store.items("demo")}
        expected = shop.expected_items()
        gap = shop.min_gap()
        store.close()
    wrong = sum(1 for sku, item in expected.items() if got.get(sku) != item)
    click.echo(
        f"items: {len(got)} stored, {len(expected)} expected, {wrong} missing or wrong; "
        f"requests: {len(shop.requests)}, closest two {gap * 1000 if gap else 0:.1f} ms apart "
        f"(interval {obj.runtime.policy('demo').interval * 1000:g} ms)"
    )
    click.echo(f"export them with: crawler --database-url {obj.settings.database_url} export demo")
    if wrong:
        raise ConfigError(f"demo crawl is incomplete: {wrong} items missing or wrong")


@contextmanager
def _open_output(path: str | None, binary: bool = False) -> Iterator[IO[Any]]:
    """``path`` open to write text, or bytes if ``binary`` (stdout for None or '-', left open).

    ConfigError naming it when it cannot be.
    """
    if path is None or path == "-":
        yield sys.stdout.buffer if binary else sys.stdout
        return
    try:
        out = open(path, "wb") if binary else open(path, "w", newline="", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {path!r}: {exc.strerror or exc}") from None
    with out:
        yield out


def _check_writable(path: str | None) -> None:
    """ConfigError naming ``path`` now if it cannot be written (a crawl's ``-o``: before the crawl, not after)."""
    if path is None or path == "-":
        return
    existed = Path(path).exists()
    try:
        open(path, "ab").close()
    except OSError as exc:
        raise ConfigError(f"cannot write {path!r}: {exc.strerror or exc}") from None
    if not existed:
        Path(path).unlink()


def _replace(settings: Settings, **changes: Any) -> Settings:
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


# The spider author's commands (fetch, parse, shell) and `crawler redis` live in modules of their own.
from . import dev, redis_servers  # noqa: E402,F401


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="crawler")
