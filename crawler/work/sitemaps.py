"""Sitemaps: URLs from ``<urlset>`` and ``<sitemapindex>`` documents, streamed into the frontier.

A sitemap is downloaded like any page, with the reserved callback ``SITEMAP_CALLBACK``; its
parse job reads it here. Nothing is held whole: the download keeps the body zlib-compressed
(``SitemapSink``), the parse inflates it a step at a time into lxml's pull parser
(``entries``), and the URLs go to the frontier a batch at a time (``SitemapReader``), at
most ``MAX_ENTRIES``. Parsed defused: no entity resolved, no DTD, no network, at most
``SITEMAP_MAX_BYTES`` decoded. A URL is taken once per document; a ``<lastmod>`` newer than
the one recorded (``crawler:lastmod:{SITE}``) queues it past the seen set. Indexes are
followed up to ``MAX_SITEMAP_DEPTH`` levels. See docs/ARCHITECTURE.md ("Sitemaps").
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Generator, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

from protego import Protego
from redis import Redis

from ..coord import keys, lua
from ..coord.frontier import Frontier
from ..coord.task import fingerprint
from ..errors import BadResponse, BodyTooLarge, RefusedURL
from ..http.content import DECODE_STEP, ContentDecoder, DecodeError
from ..spiders.spider import SITEMAP_CALLBACK, Request, SitemapRules, Spider

#: Largest sitemap read, decoded (gunzipped) bytes: the sitemaps protocol's limit.
SITEMAP_MAX_BYTES = 50 * 1024 * 1024
#: Sitemap indexes followed into sitemap indexes at most this deep (a loop ends there).
MAX_SITEMAP_DEPTH = 5
#: URLs handed to the frontier (and lastmods compared) at a time.
BATCH = 1000
#: Entries read from one sitemap at most (the protocol's limit); the rest are ignored.
MAX_ENTRIES = 50_000

_GZIP_MAGIC = b"\x1f\x8b"


class SitemapSink:
    """Where a sitemap's body goes as it downloads: a zlib stream, so only its compressed form is held."""

    def __init__(self) -> None:
        self._compressor = zlib.compressobj(6)
        self._parts: list[bytes] = []
        #: Bytes received (decoded from any content-coding).
        self.size = 0

    def feed(self, piece: bytes) -> None:
        self.size += len(piece)
        self._parts.append(self._compressor.compress(piece))

    def finish(self) -> bytes:
        """The whole body, zlib-compressed (as bodies wait in Redis for their parse job)."""
        self._parts.append(self._compressor.flush())
        return b"".join(self._parts)


def inflated(stored: bytes, cap: int = SITEMAP_MAX_BYTES) -> Iterator[bytes]:
    """A stored (zlib) body, inflated a step at a time and gunzipped if it is gzip data.

    Raises BodyTooLarge as soon as the document passes ``cap`` bytes, DecodeError for a
    corrupt stream.
    """
    inflater = zlib.decompressobj()
    gunzip: ContentDecoder | None = None
    size, first = 0, True
    data = stored
    while data or not inflater.eof:
        try:
            piece = inflater.decompress(data, DECODE_STEP)
        except zlib.error as exc:
            raise DecodeError(f"stored body: {exc}") from exc
        data = inflater.unconsumed_tail
        if not piece and not data:
            break
        if first and piece:
            first = False
            if piece.startswith(_GZIP_MAGIC):  # a .xml.gz file, served as it is (not a content-coding)
                gunzip = ContentDecoder("gzip")
        for out in gunzip.feed(piece) if gunzip is not None else (piece,):
            size += len(out)
            if size > cap:
                raise BodyTooLarge(f"sitemap larger than {cap} bytes (decoded)")
            yield out


@dataclass(frozen=True)
class Entry:
    """One ``<url>`` (``kind`` "url") or ``<sitemap>`` (``kind`` "sitemap") of a sitemap."""

    kind: str
    loc: str
    lastmod: int | None = None


def entries(pieces: Iterable[bytes]) -> Generator[Entry, None, None]:
    """The entries of a sitemap document fed in ``pieces``, as they are parsed.

    Every element is dropped from the tree once its end is read, whatever its name, so
    memory holds the elements still open (at most 256 deep: libxml2's limit) and one
    piece's events, not the document (entity references, which raise no event, are
    bounded by libxml2's amplification limit). Raises BadResponse for a document that is not
    well-formed XML (an entity bomb included), after the entries parsed before the
    fault. An entry whose ``<loc>`` holds anything but text (an unresolved entity) is
    dropped.
    """
    from lxml import etree  # type: ignore[import-untyped]  # lxml ships no types; imported here: ~6 MiB a process

    parser = etree.XMLPullParser(
        events=("end",),
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
    )
    reading = _Reading()
    try:
        for piece in pieces:
            parser.feed(piece)
            yield from reading.read(parser)
        parser.close()
    except etree.XMLSyntaxError as exc:
        yield from reading.read(parser)  # the entries parsed before the error in this piece
        raise BadResponse(f"not well-formed XML: {exc}") from None
    yield from reading.read(parser)


_ENTRY_KINDS = ("url", "sitemap")


class _Reading:
    """The state of one document's parse: the entry being read."""

    def __init__(self) -> None:
        self.loc: str | None = None
        self.lastmod: int | None = None
        self.bad = False  # a <loc> of the entry held markup or an entity reference

    def read(self, parser: Any) -> Iterator[Entry]:
        """The entries whose end the parser has read; every element ended is dropped."""
        for _, element in parser.read_events():
            entry = self._ended(element)
            _drop(element)
            if entry is not None:
                yield entry

    def _ended(self, element: Any) -> Entry | None:
        name = _local(element.tag)
        if name in _ENTRY_KINDS:
            entry = Entry(name, self.loc, self.lastmod) if self.loc and not self.bad else None
            self.loc, self.lastmod, self.bad = None, None, False
            return entry
        parent = element.getparent()
        if parent is None or _local(parent.tag) not in _ENTRY_KINDS:
            return None  # an <image:loc> of an <image:image>, an unknown element
        if name == "loc":
            if len(element):  # an entity reference (not resolved) or markup: not a plain URL
                self.bad = True
            else:
                self.loc = (element.text or "").strip()
        elif name == "lastmod":
            self.lastmod = parse_lastmod(element.text)
        return None


def _drop(element: Any) -> None:
    """Empty an element whose end was read and remove what precedes it in its parent.

    What follows it may not be read yet, so it stays (emptied, it is a few bytes).
    """
    element.clear(keep_tail=True)
    parent = element.getparent()
    if parent is not None:
        while element.getprevious() is not None:
            del parent[0]


def _local(tag: Any) -> str:
    """An element's name without its namespace (``{http://www.sitemaps.org/...}url`` → ``url``)."""
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


def parse_lastmod(text: str | None) -> int | None:
    """A W3C datetime (``2024-05-01``, ``2024-05-01T10:00:00+02:00``, ``…Z``) as epoch seconds; None if unreadable.

    A date or time without a zone is taken as UTC.
    """
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


def robots_sitemaps(text: str, base: str) -> list[str]:
    """The ``Sitemap:`` URLs of a robots.txt, made absolute against its URL."""
    return [urljoin(base, url) for url in Protego.parse(text).sitemaps]


@dataclass
class SitemapReport:
    """What one sitemap gave: URLs read, and what became of them."""

    urls: int = 0
    queued: int = 0
    duplicates: int = 0
    updated: int = 0
    refused: int = 0
    unmatched: int = 0
    sitemaps: int = 0
    #: Entries read (at most ``MAX_ENTRIES``), and whether the document had more.
    entries: int = 0
    capped: bool = False
    #: Entries whose URL the document listed before (each URL is taken once per document).
    repeated: int = 0
    first_refusals: list[str] = field(default_factory=list)

    def summary(self) -> str:
        refusals = f" ({'; '.join(self.first_refusals)})" if self.first_refusals else ""
        repeated = f"; {self.repeated} listed again, taken once" if self.repeated else ""
        capped = f"; capped at {MAX_ENTRIES} entries, the rest ignored" if self.capped else ""
        return (
            f"sitemap: {self.urls} URLs, {self.queued} queued ({self.updated} for a newer lastmod), "
            f"{self.duplicates} already seen, {self.unmatched} matching no rule, {self.refused} refused"
            f"{refusals}; {self.sitemaps} sitemaps to follow{repeated}{capped}"
        )


class SitemapReader:
    """Turns a downloaded sitemap (or robots.txt) of one site into queued requests.

    One reader per document. Its entries are taken once per URL: within a batch with
    the URL's latest ``<lastmod>``; a dated URL queued from an earlier batch of the same
    document is not queued again (``keys.sitemap_taken`` holds their fingerprints while
    the document is read, in Redis: the worker holds a batch).
    """

    def __init__(self, connection: Redis, frontier: Frontier, spider: Spider, depth: int):
        self.connection = connection
        self.frontier = frontier
        self.spider = spider
        self.depth = depth
        self.rules = SitemapRules(spider)
        self.report = SitemapReport()
        self._newer = lua.script(connection, "newer_lastmod")
        #: The set of the fingerprints of the dated URLs this read queued (the seen set has the others).
        self._taken = keys.sitemap_taken(frontier.site, os.urandom(8).hex())

    def read(self, url: str, stored: bytes) -> SitemapReport:
        """Queue what the sitemap (or robots.txt) at ``url``, stored zlib-compressed, lists.

        At most ``MAX_ENTRIES`` entries are read; past them the report says the sitemap was capped.
        """
        if urlsplit(url).path == "/robots.txt":
            text = b"".join(inflated(stored, 512 * 1024)).decode("utf-8", errors="replace")
            listed: Generator[Entry, None, None] = (Entry("sitemap", loc) for loc in robots_sitemaps(text, url))
        else:
            listed = entries(inflated(stored))
        batch: list[Entry] = []
        try:
            with closing(listed):
                for entry in listed:
                    if self.report.entries == MAX_ENTRIES:
                        self.report.capped = True
                        break
                    self.report.entries += 1
                    batch.append(entry)
                    if len(batch) >= BATCH:
                        self._add(batch)
                        batch = []
        finally:  # what was read before a malformed part is queued all the same
            try:
                self._add(batch)
            finally:
                self.connection.delete(self._taken)
        return self.report

    def _add(self, batch: list[Entry]) -> None:
        """Queue a batch of entries: pages by the rules, child sitemaps by ``sitemap_follow``, lastmods compared.

        A page or child sitemap skips the seen set only when its lastmod moved past the one
        recorded (verdict "u"); a new one, or one without lastmod, is queued if it is new
        to the seen set, like any URL.
        """
        if not batch:
            return
        candidates = self._candidates(batch)
        verdicts = self._lastmod_verdicts([(url, entry.lastmod) for entry, url, _ in candidates])
        requests = []
        for (entry, url, callback), verdict in zip(candidates, verdicts, strict=True):
            if verdict == "t":  # queued from this document already: its later lastmod is recorded, no more
                self.report.repeated += 1
                continue
            if entry.kind == "sitemap" and self.depth >= MAX_SITEMAP_DEPTH:
                self._refused(f"{url}: sitemaps nested deeper than {MAX_SITEMAP_DEPTH}")
                continue
            self.report.updated += entry.kind == "url" and verdict == "u"
            requests.append(Request(url, callback=callback, dont_filter=verdict == "u"))
        result = self.frontier.add(requests, depth=self.depth + 1, checked=True)  # canonical: checked above
        sitemaps = {r.url for r in requests if r.callback == SITEMAP_CALLBACK}
        self.report.sitemaps += sum(1 for url in result.enqueued if url in sitemaps)
        self.report.queued += sum(1 for url in result.enqueued if url not in sitemaps)
        self.report.duplicates += result.duplicates
        for _, reason in result.refused or []:
            self._refused(reason)

    def _candidates(self, batch: list[Entry]) -> list[tuple[Entry, str, str]]:
        """The batch's entries to queue, each once, with its canonical URL and callback.

        An entry listed again in the batch counts once, with the latest lastmod of its listings.
        """
        taken: dict[str, tuple[Entry, str, str]] = {}  # canonical URL -> (entry, URL, callback)
        for entry in batch:
            self.report.urls += entry.kind == "url"
            callback = self.rules.callback(entry.loc) if entry.kind == "url" else SITEMAP_CALLBACK
            if callback is None or (entry.kind == "sitemap" and not self.rules.follows(entry.loc)):
                self.report.unmatched += 1
                continue
            try:
                url = self.frontier.check(entry.loc)
            except RefusedURL as exc:
                self._refused(str(exc))
                continue
            first = taken.get(url)
            if first is None:
                taken[url] = (entry, url, callback)
                continue
            self.report.repeated += 1
            if entry.lastmod is not None and (first[0].lastmod is None or entry.lastmod > first[0].lastmod):
                taken[url] = (replace(first[0], lastmod=entry.lastmod), url, first[2])
        return list(taken.values())

    def _lastmod_verdicts(self, pairs: list[tuple[str, int | None]]) -> list[str]:
        """Per (URL, lastmod): "n", "u", "s" or "t" (see NEWER_LASTMOD); "-" for a URL without lastmod."""
        dated = [(index, url, lastmod) for index, (url, lastmod) in enumerate(pairs) if lastmod is not None]
        verdicts = ["-"] * len(pairs)
        if dated:
            blob = b"".join(fingerprint(url) for _, url, _ in dated)
            reply = self._newer(
                keys=[keys.lastmod(self.frontier.site), self._taken], args=[blob, *(m for _, _, m in dated)]
            )
            for (index, _, _), verdict in zip(
                dated, reply.decode() if isinstance(reply, bytes) else reply, strict=True
            ):
                verdicts[index] = verdict
        return verdicts

    def _refused(self, reason: str) -> None:
        self.report.refused += 1
        if len(self.report.first_refusals) < 3:
            self.report.first_refusals.append(reason[:200])
