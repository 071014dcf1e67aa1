"""Seeding from a file or a pipe: millions of URLs, streamed, in chunks Redis answers quickly.

``seed_lines`` reads one URL a line (blank lines and ``#`` comments skipped), never
holds more than one chunk in memory, and hands each chunk to ``Frontier.add``: one
``ADD_SEEN`` script call for the chunk's fingerprints, then ``RPUSH`` of the new ones in
pieces of at most ``frontier.PUSH_CHUNK`` entries, so no Redis command handles more than a
chunk and other clients are served between two. A bad line is counted (the first few kept
with their reason) and does not stop the seed; an over-long line is skipped, never held
whole. A seed that finds no good URL at all is an error (``NoGoodURL``).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis import Redis

from ..errors import ConfigError
from ..spiders.spider import Request, Spider
from .bulk import transact_many
from .frontier import SEED_PRIORITY, AddResult, Candidate, Frontier
from .scheduler import JOBS_AHEAD
from .together import enqueue_together, refill_together

#: URLs handed to the frontier at a time: one ADD_SEEN call and one RPUSH each, so that a chunk
#: holds Redis for about a millisecond (docs/BENCHMARKS.md, "Seeding a million URLs").
SEED_CHUNK = 500
#: Sites ``seed --all`` seeds together (``seed_sites``: their policies, seen-set calls, pushes and first
#: jobs): a few round trips for them all, and their lines printed as each such chunk is done.
SEED_SITES = 500
#: Bad lines kept (line number, text, reason) to show; the rest are only counted.
BAD_EXAMPLES = 5
#: Bytes a line may hold beyond the longest URL, for what ``strip`` removes (indentation, CR LF, a byte order mark).
LINE_SLACK = 1024
#: Bytes read at a time while skipping the rest of an over-long line.
SKIP_READ = 1 << 16


class NoGoodURL(ConfigError):
    """A seed file held no URL that could be queued."""


@dataclass
class SeedReport:
    """What a seed did: URLs read, queued, already seen, and bad lines (the first few kept)."""

    urls: int = 0
    enqueued: int = 0
    duplicates: int = 0
    bad: int = 0
    #: (line number, line as read, reason), the first ``BAD_EXAMPLES`` bad lines.
    examples: list[tuple[int, str, str]] = field(default_factory=list)

    def add_bad(self, line: int, text: str, reason: str) -> None:
        self.bad += 1
        if len(self.examples) < BAD_EXAMPLES:
            self.examples.append((line, text[:200], reason))

    def summary(self, site: str) -> str:
        """One line: ``shop: 998 enqueued, 1 already seen, 1 bad line``."""
        bad = f", {self.bad:,} bad line{'s' if self.bad != 1 else ''}" if self.bad else ""
        return f"{site}: {self.enqueued:,} enqueued, {self.duplicates:,} already seen{bad}"

    def bad_lines(self) -> list[str]:
        """The kept bad lines, one message each, and how many more there were."""
        shown = [f"line {line}: {reason}" for line, _, reason in sorted(self.examples)]
        if self.bad > len(self.examples):
            shown.append(f"... and {self.bad - len(self.examples):,} more")
        return shown


def bounded_lines(stream: Iterable[bytes], limit: int) -> Iterator[tuple[bytes, bool]]:
    """(line, whole) for each line of ``stream``; a line over ``limit`` bytes is cut: its first bytes, False.

    A file (anything with ``readline``) is read at most ``limit`` + 1 bytes a line and
    the rest of a longer line skipped in ``SKIP_READ`` pieces, so memory stays bounded
    whatever the line. Any other iterable of lines is taken as it comes (already in memory).
    """
    readline = getattr(stream, "readline", None)
    if readline is None:
        for line in stream:
            yield (line, True) if len(line) <= limit else (line[: limit + 1], False)
        return
    while line := readline(limit + 1):
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, True
            continue
        rest = line
        while rest and not rest.endswith(b"\n"):
            rest = readline(SKIP_READ)
        yield line, False


def url_lines(stream: Iterable[bytes], report: SeedReport, max_length: int) -> Iterator[tuple[int, str]]:
    """(line number, URL) of each line that holds one; blank lines and ``#`` comments skipped.

    A line that is not UTF-8, or longer than ``max_length`` bytes once stripped, is counted
    bad in ``report``; a line over ``max_length`` + ``LINE_SLACK`` is never read whole
    (``bounded_lines``).
    """
    for number, (raw, whole) in enumerate(bounded_lines(stream, max_length + LINE_SLACK), 1):
        line = raw.strip()
        if number == 1:
            line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark (files saved on Windows)
        if line.startswith(b"#") or (not line and whole):  # a comment, however long, or a blank line
            continue
        if len(line) > max_length or not whole:
            shown = line[:200].decode("utf-8", "replace")
            report.add_bad(number, shown, f"longer than {max_length:,} bytes{'' if whole else ' (not read whole)'}")
            continue
        try:
            yield number, line.decode("utf-8")
        except UnicodeDecodeError:
            report.add_bad(number, line.decode("utf-8", "replace"), "not UTF-8")


def seed_lines(
    frontier: Frontier,
    stream: Iterable[bytes],
    force: bool = False,
    priority: int = SEED_PRIORITY,
    chunk: int = SEED_CHUNK,
    progress: Callable[[SeedReport], None] | None = None,
    callback: str = "parse",
) -> SeedReport:
    """Queue the URLs of ``stream`` (lines of bytes) for ``frontier``'s site and ``callback``, ``chunk`` at a time.

    Each URL is canonicalized, kept to the site's domains and deduplicated against the
    seen set (``force`` queues URLs already seen, and still marks them seen). Memory
    stays bounded by one chunk whatever the stream's length, and by one
    ``max_url_length`` (+ ``LINE_SLACK``) a line whatever a line's length when ``stream``
    is a file (``bounded_lines``); ``progress(report)`` is
    called after each chunk. Raises NoGoodURL, after reading everything, if no line held
    a URL that could be queued or was already seen.
    """
    report = SeedReport()
    batch: list[tuple[int, str]] = []
    for numbered in url_lines(stream, report, frontier.max_url_length):
        batch.append(numbered)
        if len(batch) >= chunk:
            _add(frontier, batch, Request("-", callback, dont_filter=force, priority=priority), report)
            batch = []
            if progress is not None:
                progress(report)
    if batch:
        _add(frontier, batch, Request("-", callback, dont_filter=force, priority=priority), report)
    if report.enqueued == 0 and report.duplicates == 0:
        detail = "; ".join(report.bad_lines()[:3]) or "the input is empty"
        raise NoGoodURL(
            f"no URL to seed: {report.bad:,} bad line{'s' if report.bad != 1 else ''} ({detail})"
            if report.bad
            else f"no URL to seed: {detail}"
        )
    return report


def _add(frontier: Frontier, batch: list[tuple[int, str]], like: Request, report: SeedReport) -> None:
    """Add the batch's URLs as requests like ``like`` (its callback, priority, dont_filter); count what happened."""
    meta: dict[str, object] = {}  # one dict for the batch: the frontier encodes an entry shape once per meta
    result = frontier.add(
        [
            Request(url, like.callback, meta=meta, priority=like.priority, dont_filter=like.dont_filter)
            for _, url in batch
        ]
    )
    report.urls += len(batch)
    report.enqueued += len(result.enqueued)
    report.duplicates += result.duplicates
    if result.refused:
        lines: dict[str, int] = {}
        for number, url in batch:
            lines.setdefault(url, number)
        for url, reason in result.refused:
            report.add_bad(lines.get(url, 0), url, reason)


def seed_start(frontier: Frontier, spider: Spider, force: bool = False, priority: int = SEED_PRIORITY) -> AddResult:
    """Queue the spider's ``start_requests()`` (start URLs, then sitemaps) with their callbacks, at ``priority``.

    Every URL is checked first: RefusedURL for the first bad one, and nothing is queued.
    ConfigError when the spider has none.
    """
    (result,) = seed_candidates([(frontier, *start_candidates(frontier, spider, force, priority))])
    return result


#: What ``Frontier.vet`` made of a site's requests: those to queue if new (with their canonical URL), and
#: those refused, with why.
Vetted = tuple[list[Candidate], list[tuple[str, str]]]


def start_candidates(frontier: Frontier, spider: Spider, force: bool = False, priority: int = SEED_PRIORITY) -> Vetted:
    """What ``seed_start`` queues for ``spider`` (if new), vetted by ``frontier``; nothing is written.

    RefusedURL for the first URL ``frontier.check`` refuses; ConfigError when the spider has
    no start request.
    """
    requests = list(spider.start_requests())
    if not requests:
        raise ConfigError(f"site {spider.name!r} has no start_urls or sitemap_urls: give URLs to seed")
    for request in requests:
        frontier.check(request.url)
    return frontier.vet(
        [
            dataclasses.replace(request, priority=priority, dont_filter=force or request.dont_filter)
            for request in requests
        ]
    )


def seed_candidates(seeds: Sequence[tuple[Frontier, list[Candidate], list[tuple[str, str]]]]) -> list[AddResult]:
    """Queue each site's vetted requests (``start_candidates``) as ``Frontier.add`` queues them, all the
    sites' seen-set calls in one round trip and their pushes in a few (``enqueue_together``); what was
    done, a result a site. ``seed --all`` seeds SEED_SITES sites at a time so: one call a site was a
    round trip a site."""
    done = enqueue_together([(frontier, [(candidates, 0)]) for frontier, candidates, _ in seeds])
    results = [result for (result,) in done]
    for result, (_, _, refused) in zip(results, seeds, strict=True):
        result.refused = refused
    return results


@dataclass
class SitesSeeded:
    """What ``seed_sites`` did: (site, its result; None: it has no start URL or sitemap) of each site it came
    to, in order, and the error of the site that stopped it (None: it came to every site)."""

    results: list[tuple[str, AddResult | None]] = field(default_factory=list)
    failure: Exception | None = None


class SeedingSites(Protocol):
    """Where ``seed_sites`` finds a site's spider and frontier, and publishes its policy (``work.runtime.Runtime``)."""

    connection: Redis

    def spider(self, site: str) -> Spider: ...

    def frontier(self, site: str) -> Frontier: ...

    def publish(self, site: str, force: bool = False, pipe: Any = None) -> None: ...


def seed_sites(
    sites: Sequence[str], runtime: SeedingSites, force: bool = False, priority: int = SEED_PRIORITY
) -> SitesSeeded:
    """``seed_start`` of each site's spider (``runtime.spider(site)``), then its first jobs, as a site at a
    time would, together: the sites' policies published (``runtime.publish``, as each site's frontier
    is asked for, before its start requests are checked: written in one transaction before anything
    is queued), their seen-set calls and pushes in a few round trips for them all
    (``seed_candidates``), their first jobs' reads and moves in a few more (``refill_together``). The
    first site that cannot be seeded (RefusedURL, no start request at all:
    ``start_candidates``; any error of its spider's) stops it: those before it are seeded, none after
    it is looked at, and the error is ``failure``, for the caller to raise once it has shown the others.
    """
    done = SitesSeeded()
    seeds: list[tuple[Frontier, list[Candidate], list[tuple[str, str]]]] = []
    order: list[tuple[str, int | None]] = []  # each site, and the index of its seed (None: it has nothing to seed)
    with runtime.connection.pipeline(transaction=True) as policies:
        for site in sites:
            try:
                spider = runtime.spider(site)
                if not (spider.start_urls or spider.sitemap_urls):
                    order.append((site, None))
                    continue
                runtime.publish(site, pipe=policies)
                frontier = runtime.frontier(site)
                seeds.append((frontier, *start_candidates(frontier, spider, force=force, priority=priority)))
            except Exception as exc:  # raised by the caller once those before it are seeded, as a site at a time was
                done.failure = exc
                break
            order.append((site, len(seeds) - 1))
        transact_many(runtime.connection, [args for args, _ in policies.command_stack])
    results = seed_candidates(seeds)
    refill_together([frontier for frontier, _, _ in seeds], JOBS_AHEAD, also=(priority,))
    done.results = [(site, None if at is None else results[at]) for site, at in order]
    return done


@contextmanager
def open_lines(path: str) -> Iterator[Iterable[bytes]]:
    """The lines of ``path`` as bytes: ``-`` is standard input, a ``.gz`` file is gunzipped as read.

    ConfigError (one line) if the file cannot be opened.
    """
    if path == "-":
        yield sys.stdin.buffer
        return
    try:
        handle: io.BufferedIOBase = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        yield handle
    except (OSError, EOFError) as exc:  # a truncated or corrupt .gz shows only as it is read
        raise ConfigError(f"cannot read {path}: {exc}") from None
    finally:
        handle.close()
