"""``crawler seed``, ``worker``, ``crawl``, ``demo``: seeding and running the workers.

``crawl`` runs a whole crawl from one command, its progress on stderr.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import click

from ..coord import counters, keys
from ..coord.frontier import SEED_PRIORITY, Frontier
from ..coord.frontier import seed as seed_urls
from ..coord.scheduler import JOBS_AHEAD
from ..coord.seeding import SEED_SITES, SeedReport, open_lines, seed_lines, seed_sites, seed_start
from ..coord.spiderargs import parse_args, read_args, store_args
from ..coord.task import PRIORITY_RANGE
from ..errors import ConfigError
from ..ops.rekey import old_sites
from ..ops.reset import reset_site
from ..ops.status import SiteStatus, site_status, this_run
from ..settings import DEFAULT_DATABASE_URL, REDIS_EMBEDDED, redact_url
from ..store.database import Store
from ..store.export import FORMATS, format_for
from ..work.drain import crawl_drained
from ..work.launcher import (
    KINDS,
    MOST_DOWNLOAD_THREADS,
    WorkerSpec,
    default_processes,
    run_here,
    start_workers,
    stop_workers,
)
from ..work.runtime import Runtime
from .context import Context, pass_context, replace
from .control import report_reset
from .output import _export, check_output
from .serve import serve_metrics
from .watch import progress

if TYPE_CHECKING:
    pass


@click.command()
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
        for start in range(0, len(sites), SEED_SITES):  # a few round trips a chunk of sites, a line a site
            for shard, chunk in obj.shards.by_shard(sites[start : start + SEED_SITES]).items():
                _seed_chunk(obj.runtime_of(shard), chunk, force, priority)
        return
    (site,) = sites
    runtime = obj.runtime_for(site)
    _set_spider_args(obj, runtime, site, spider_args)
    spider = runtime.spider(site)
    if callback is not None:
        try:
            spider.callback(callback)
        except AttributeError as exc:
            raise ConfigError(str(exc)) from None
    if from_file is not None:
        if urls:
            raise ConfigError("give URLs or --from FILE, not both")
        _seed_from(runtime, site, from_file, force, priority, callback or "parse")
        _first_jobs(runtime, site)
        return
    if callback is not None and not urls:
        raise ConfigError("--callback applies to the URLs given (or --from FILE), not to start_urls")
    if urls:
        result = seed_urls(
            _seeding_frontier(runtime, site), urls, force=force, priority=priority, callback=callback or "parse"
        )
    else:  # the spider's own start requests, sitemaps included, each with its callback
        result = seed_start(_seeding_frontier(runtime, site), spider, force=force, priority=priority)
    _first_jobs(runtime, site)
    click.echo(f"{site}: {len(result.enqueued)} enqueued, {result.duplicates} already seen")


def _seed_chunk(runtime: Runtime, chunk: list[str], force: bool, priority: int) -> None:
    """Seed each site of ``chunk`` (all on ``runtime``'s shard) with its spider's start requests, a line a site."""
    runtime.sites.read_sites_due(chunk)  # their spider arguments and live settings, in one
    done = seed_sites(chunk, runtime, force, priority)
    for site, result in done.results:
        if result is None:
            click.echo(f"warning: {site}: no start_urls or sitemap_urls, nothing seeded", err=True)
        else:
            click.echo(f"{site}: {len(result.enqueued)} enqueued, {result.duplicates} already seen")
    if done.failure is not None:
        raise done.failure


def _seeding_frontier(runtime: Runtime, site: str) -> Frontier:
    """``site``'s frontier, for work to be added: the site's politeness is published first
    (``Runtime.publish``), so the scheduler hands its first jobs out by it."""
    runtime.publish(site)
    return runtime.frontier(site)


def _first_jobs(runtime: Runtime, site: str) -> None:
    """Make the site's first download jobs of what was seeded (``Frontier.refill``, as a worker would),
    so a worker's first look finds a job queued, not a dry queue to refill. Safe with workers
    running: a refill's move is made only if what it read is unchanged."""
    _seeding_frontier(runtime, site).refill(JOBS_AHEAD)


def _set_spider_args(obj: Context, runtime: Runtime, site: str, pairs: tuple[str, ...]) -> None:
    """Store ``-a`` pairs as ``site``'s spider arguments (none given: those stored are kept, and named)."""
    if pairs:
        store_args(runtime.connection, site, parse_args(pairs, obj.spider_set.get(site)))
        return
    kept = read_args(runtime.connection, site)
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
    found = [site for _, client in obj.shards.clients() for site in old_sites(client)]
    if found:
        named = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise ConfigError(
            f"Redis holds the crawl of {named} under the key names of an earlier version: "
            "stop every worker, then run `crawler migrate-keys`"
        )


def _seed_from(runtime: Runtime, site: str, path: str, force: bool, priority: int, callback: str) -> None:
    """``seed --from``: stream the file's URLs in; bad lines are warnings, none good is the error."""
    frontier = _seeding_frontier(runtime, site)
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


def _where(obj: Context, shards: tuple[str, ...] = ()) -> str:
    """The Redis a command's workers use, and why; with several shards, those served (credentials hidden)."""
    if not obj.shards.several:
        return obj.redis_choice.describe()
    return "shards " + ", ".join(obj.shards.shard(name).describe() for name in shards or obj.shards.names)


def _sites_option(value: str | None, obj: Context) -> tuple[str, ...]:
    if not value:  # the bundled demo too: its queue is empty unless `crawler demo` or `seed demo` filled it
        return tuple(sorted(obj.spider_set.named()))
    return tuple(obj.site(name.strip()) for name in value.split(",") if name.strip())


@click.command()
@click.argument("kind", type=click.Choice(KINDS))
@click.option("--sites", "site_list", help="Comma-separated sites to serve [all].")
@click.option(
    "-n", "--processes", type=click.IntRange(1, 256), help="Worker processes [download: one per core; parse: 1]."
)
@click.option(
    "--threads",
    type=click.IntRange(1, 4096),
    help="Download: most worker threads a process (requests in flight, slow sites' batches) "
    "[as the sites need, up to 1024]. Parse: threads [1].",
)
@click.option("--burst", is_flag=True, help="Exit when the crawl is drained.")
@click.option("--shards", "shard_list", metavar="NAMES", help="Comma-separated Redis shards to serve [all].")
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
    processes: int | None,
    threads: int | None,
    burst: bool,
    verbose: bool,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    shard_list: str | None = None,
) -> None:
    """Run N download or parse worker processes."""
    served = _sites_option(site_list, obj)
    shards = tuple(obj.shards.shard(name.strip()).name for name in (shard_list or "").split(",") if name.strip())
    Store(obj.settings.database_url).close()  # fail now, in one line, if the database is unreachable
    _refuse_old_keys(obj)
    level = "INFO" if verbose or log_format == "json" else "WARNING"
    spec = WorkerSpec(kind, served, threads, burst, level, log_format=log_format, shards=shards)
    server = serve_metrics(obj, metrics_host, metrics_port) if metrics_port is not None else None
    processes = processes or (default_processes() if kind == "download" else 1)
    each = f"up to {threads or MOST_DOWNLOAD_THREADS} in flight" if kind == "download" else f"{threads or 1} thread(s)"
    click.echo(f"{processes} {kind} worker process(es), {each} each, on {_where(obj, shards)}", err=True)
    try:
        code = run_here(spec, obj.settings, obj.redis_url, processes, spiders=obj.spider_set)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    sys.exit(code)


@click.command()
@click.argument("site")
@click.argument("urls", nargs=-1)
@click.option("-n", "--processes", type=click.IntRange(1, 256), help="Download worker processes [one per core].")
@click.option(
    "--threads",
    type=click.IntRange(1, 4096),
    help="Most worker threads a download process (requests in flight, slow sites' batches) "
    "[as the site needs, up to 1024].",
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
    processes: int | None,
    threads: int | None,
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
    check_output(output)  # now, not after an hour of crawling
    _refuse_old_keys(obj)
    if fresh:
        report_reset(site, reset_site(obj.redis_for(site), site))
    ctx = click.get_current_context()
    ctx.invoke(
        seed,
        targets=(site, *urls),
        force=False,
        priority=SEED_PRIORITY,
        from_file=from_file,
        spider_args=spider_args,
    )
    click.echo(f"Redis: {_where(obj)}", err=True)
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


def run_crawl(
    obj: Context,
    sites_: list[str],
    processes: int | None,
    threads: int | None,
    parsers: int,
    out: TextIO | None = None,
) -> list[SiteStatus]:
    """Run burst workers for ``sites_`` with a progress display; returns what this run did, per site.

    The counters in Redis add up over every run since the site was seeded (or reset);
    the summary and the result count only this run's downloads, parses and items.
    """
    Store(obj.settings.database_url).close()
    (shard, connection), *others = [(name, obj.shards.client(name)) for name in obj.shards.by_shard(sites_)]
    if others:
        raise ConfigError(f"the sites of one crawl must be on one shard; {', '.join(sites_)} are on several")
    one = (shard,) if obj.shards.several else ()
    specs = [WorkerSpec("download", tuple(sites_), threads, True, shards=one)] * (processes or default_processes())
    specs += [WorkerSpec("parse", tuple(sites_), 1, True, shards=one)] * parsers
    before = {status.site: status for status in site_status(connection, sites_)}
    started = time.monotonic()
    workers = start_workers(specs, obj.settings, obj.redis_url, spiders=obj.spider_set)
    try:
        with progress(connection, sites_, obj.settings.database_url) as refresh:
            while any(p.is_alive() for p in workers):
                refresh()
                time.sleep(0.25)
            refresh()
    except KeyboardInterrupt:
        stop_workers(workers)
        raise click.ClickException("interrupted: work left in the queues resumes with `crawler worker`") from None
    elapsed = time.monotonic() - started
    final = [this_run(status, before.get(status.site)) for status in site_status(connection, sites_)]
    for status in final:
        click.echo(
            f"{status.site}: {status.fetched} fetched, {status.parsed} parsed, {status.items} items, "
            f"{status.failed} failed, {status.refused} refused in {elapsed:.1f}s"
            f" ({status.fetched / elapsed if elapsed else 0:.1f} pages/s)"
            + (f"; {status.cache_hits} from the development cache" if status.cache_hits else ""),
            file=out,
        )
    if not crawl_drained(connection, sites_):
        raise click.ClickException("workers stopped before the crawl was drained (see the log above)")
    return final


@click.command()
@click.option("--products", default=300, show_default=True, type=click.IntRange(1, 100000))
@click.option("-n", "--processes", default=2, show_default=True, type=click.IntRange(1, 64))
@pass_context
def demo(obj: Context, products: int, processes: int) -> None:
    """Serve a bundled demo shop on loopback and crawl it end to end."""
    from ..demo import ShopSite

    if obj.settings.redis_url is None:  # the demo keeps to itself: a private Redis
        obj.settings = replace(obj.settings, redis_url=REDIS_EMBEDDED)
    # Quick retries, so the shop's failing pages do not hold the demo for long.
    obj.settings = replace(obj.settings, backoff=min(obj.settings.backoff, 0.5))
    if obj.settings.database_url == DEFAULT_DATABASE_URL:
        Path(obj.settings.state_dir).mkdir(parents=True, exist_ok=True)
        db = Path(obj.settings.state_dir) / "demo.db"
        db.unlink(missing_ok=True)
        obj.settings = replace(obj.settings, database_url=f"sqlite:///{db}")
    obj.stop_embedded = True
    with ShopSite(products=products, slow_every=50, slow_seconds=0.5) as shop:
        click.echo(
            f"demo shop with {products} products at {shop.url}; Redis {redact_url(obj.redis_url)}; "
            f"database {redact_url(obj.settings.database_url)}",
            err=True,
        )
        runtime = obj.runtime_for("demo")
        with runtime.connection.pipeline(transaction=True) as pipe:
            pipe.delete(keys.seen("demo"))
            counters.forget(pipe, "demo")
            pipe.execute()
        seed_urls(_seeding_frontier(runtime, "demo"), [shop.url + "/"], force=True)
        run_crawl(obj, ["demo"], processes, None, 1)
        store = Store(obj.settings.database_url)
        got = {item["sku"]: item for item in store.items("demo")}
        expected = shop.expected_items()
        gap = shop.min_gap()
        store.close()
    wrong = sum(1 for sku, item in expected.items() if got.get(sku) != item)
    click.echo(
        f"items: {len(got)} stored, {len(expected)} expected, {wrong} missing or wrong; "
        f"requests: {len(shop.requests)}, closest two {gap * 1000 if gap else 0:.1f} ms apart "
        f"(interval {runtime.policy('demo').interval * 1000:g} ms)"
    )
    click.echo(f"export them with: crawler --database-url {obj.settings.database_url} export demo")
    if wrong:
        raise ConfigError(f"demo crawl is incomplete: {wrong} items missing or wrong")


#: The commands this module adds to ``crawler`` (``app`` registers them).
COMMANDS = [seed, worker, crawl, demo]
