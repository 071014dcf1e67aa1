"""Real pages: parse and enqueue time against page size and link count.

What is measured, per page: **parse** = ``Page`` built from the body, the DOM parsed,
and a documentation spider's callback run to the end (the ``<h1>`` text as an item, then
``page.follow_all("a[href]")``: every link of the page as a ``Request``); **enqueue** =
those requests through ``Frontier.add`` on the benchmark's Redis (canonicalize, allowed
domain check, seen-set dedup, push to the compact frontier), as the parse job does. Each
repetition uses a fresh site, so every URL is new to its seen set; the median of the
repetitions is reported, with µs per link so that linearity shows as a flat column.

Pages: generated documentation pages (``generate_page``: nav bar, table of contents of
fragments, sections of prose with relative, root-relative and absolute links, API tables,
code blocks, external and ``mailto:`` links, a footer; some with a ``<base href>``), from
100 KB / 1,000 links to 10 MB / 100,000 links, and any real HTML file given with
``python -m bench parse --page FILE.html [--url URL]`` (the URL it was served from; its
host is the allowed domain; default ``https://docs.example/FILE.html``).
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crawler.coord.frontier import Frontier
from crawler.spiders.spider import Page, Request, Spider

from .common import BenchRedis, BenchResult, Check

#: Host of the generated pages, and the allowed domain of their site.
HOST = "docs.example"
#: URL the generated pages are parsed as.
PAGE_URL = f"https://{HOST}/docs/3.12/library/module.html"
#: Base of the pages generated with a ``<base href>`` (relative: resolved against PAGE_URL).
BASE_HREF = "/docs/3.12/"
#: Generated pages: (bytes, links, with a <base href>).
GENERATED: list[tuple[int, int, bool]] = [
    (100_000, 1_000, False),
    (500_000, 5_000, True),
    (2_500_000, 15_000, False),
    (2_500_000, 15_000, True),
    (5_000_000, 50_000, True),
    (10_000_000, 100_000, False),
]
#: Quick mode stops at the target page.
QUICK_GENERATED = GENERATED[:4]
REPEATS = 3
QUICK_REPEATS = 1
#: The target: a page of this size and link count parsed and enqueued in under TARGET_S.
TARGET_PAGE = (2_500_000, 15_000)
TARGET_S = 0.5

NAV = [
    "index.html",
    "tutorial/index.html",
    "library/index.html",
    "reference/index.html",
    "howto/index.html",
    "faq/index.html",
    "glossary.html",
    "search.html",
    "genindex.html",
    "py-modindex.html",
    "https://www.python.org/",
    "https://github.com/python/cpython",
    "../../download.html",
    "bugs.html",
]
WORDS = (
    "the value of a mapping returns iterator object when called with keyword argument raises error "
    "module class function attribute default none string bytes list tuple set frozen instance"
).split()


class DocsSpider(Spider):
    """What a documentation crawl does with a page: its title, and every link."""

    name = "bench_parse"

    def parse(self, page: Page) -> Any:
        yield {"title": page.text("h1"), "url": page.url}
        yield from page.follow_all("a[href]", callback=self.parse)


def _href(rng: random.Random, i: int, links: int) -> str:
    """One link of a generated page: the mix real documentation pages have."""
    kind = rng.random()
    n = rng.randrange(max(1, links // 2))  # about half the links are to a page seen before on the page
    if kind < 0.10:
        return f"#sec-{i % 500}"
    if kind < 0.35:
        return f"../library/mod{n}.html#mod{n}.func{i % 7}"
    if kind < 0.55:
        return f"api/class{n}.html"
    if kind < 0.70:
        return f"/docs/3.12/reference/ref{n}.html"
    if kind < 0.82:
        return f"https://{HOST}/docs/3.12/whatsnew/{n}.html?highlight=x{n % 13}&lang=en"
    if kind < 0.90:
        return f"https://github.com/python/cpython/blob/main/Lib/mod{n}.py#L{i}"
    if kind < 0.92:
        return f"mailto:docs{n % 5}@python.example"
    if kind < 0.96:
        return f"  ./howto/guide{n}.html  "
    return NAV[n % len(NAV)]


def _code_block(rng: random.Random, size: int) -> str:
    """A highlighted code block of about ``size`` characters (no links: bulk bytes, as on real pages)."""
    parts = ['<div class="highlight"><pre><code>']
    length = len(parts[0])
    while True:
        line = (
            f'<span class="k">def</span> <span class="nf">{rng.choice(WORDS)}_{rng.randrange(999)}</span>'
            f'(<span class="n">{rng.choice(WORDS)}</span>=<span class="mi">{rng.randrange(99)}</span>):\n'
            f'    <span class="k">return</span> {rng.choice(WORDS)} &lt; {rng.randrange(9999)}\n'
        )
        if length + len(line) > size:
            break
        parts.append(line)
        length += len(line)
    parts.append("</code></pre></div>\n")
    return "".join(parts)


def generate_page(size: int, links: int, base: bool = False, seed: int = 0) -> bytes:
    """A documentation page of about ``size`` bytes with exactly ``links`` ``<a href>`` links.

    Deterministic for a given seed. Structure: a head (with ``<base href>`` when
    ``base``), a nav bar and a footer of the same links, a table of contents of
    fragments, then sections of prose links, a table of API links and a code block.
    """
    rng = random.Random(seed)
    nav = "".join(f'<li><a class="reference" href="{h}">{h}</a></li>' for h in NAV)
    head = (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>module — docs</title>'
        f"{f'<base href={BASE_HREF!r}>' if base else ''}"
        f'<link rel="stylesheet" href="_static/pydoctheme.css"></head>\n<body>'
        f'<nav class="related"><ul>{nav}</ul></nav>\n<div class="body"><h1>module — the generated page</h1>\n'
    )
    foot = f"</div>\n<footer><ul>{nav}</ul></footer></body></html>\n"
    remaining = links - 2 * len(NAV)
    toc_links = min(remaining, max(0, links // 20))
    toc = (
        '<div class="toc"><ul>'
        + "".join(f'<li><a class="reference internal" href="#sec-{i}">{i}. Section</a></li>' for i in range(toc_links))
        + "</ul></div>\n"
    )
    remaining -= toc_links
    sections: list[str] = []
    i = 0
    while remaining > 0:
        take = min(remaining, 17)  # a section: its headerlink, up to 4 prose links, up to 12 table rows
        prose_n = min(take - 1, 4)
        table_n = take - 1 - prose_n
        prose = " ".join(
            f'<a href="{_href(rng, i + k, links)}">{rng.choice(WORDS)}</a> {rng.choice(WORDS)}' for k in range(prose_n)
        )
        rows = "".join(
            f'<tr><td><a href="{_href(rng, i + prose_n + k, links)}"><code>{rng.choice(WORDS)}()'
            f"</code></a></td><td>{rng.choice(WORDS)}.</td></tr>"
            for k in range(table_n)
        )
        n = len(sections)
        sections.append(
            f'<section id="sec-{n}"><h2>{n}. {rng.choice(WORDS)}'
            f'<a class="headerlink" href="#sec-{n}">¶</a></h2>\n<p>{prose}</p>\n'
            f'<table class="docutils"><tbody>{rows}</tbody></table>\n'
        )
        i += take
        remaining -= take
    fixed = sum(len(s.encode()) for s in sections) + len(head) + len(foot) + len(toc)
    filler = max(0, size - fixed) // max(1, len(sections))
    body = "".join(s + (_code_block(rng, filler) if filler else "") + "</section>\n" for s in sections)
    return (head + toc + body + foot).encode()


@dataclass
class Timing:
    """One page's figures: medians over the repetitions."""

    label: str
    size: int
    links: int
    requests: int
    enqueued: int
    duplicates: int
    refused: int
    parse_s: float
    enqueue_s: float

    @property
    def total_s(self) -> float:
        return self.parse_s + self.enqueue_s

    def row(self) -> list[Any]:
        per_link = 1e6 * self.total_s / max(1, self.links)
        return [
            self.label,
            f"{self.size / 1e6:.2f} MB",
            self.links,
            self.requests,
            self.enqueued,
            self.duplicates,
            self.refused,
            self.parse_s,
            self.enqueue_s,
            self.total_s,
            per_link,
        ]


def time_page(redis: BenchRedis, label: str, body: bytes, url: str, repeats: int) -> Timing:
    """Parse ``body`` as ``url`` and enqueue its links ``repeats`` times; the medians."""
    domains = [urlsplit(url).hostname or HOST]
    spider = DocsSpider()
    parse_times, enqueue_times = [], []
    for n in range(repeats):
        started = time.perf_counter()
        page = Page(url, body, headers={"content-type": "text/html"})
        requests = [r for r in spider.parse(page) if isinstance(r, Request)]
        parsed = time.perf_counter()
        frontier = Frontier(
            redis.connection, f"parse_{redis.tag}_{next(_runs)}", domains, failure_ttl=60, job_timeout=60
        )
        added = frontier.add(requests, depth=1)
        enqueued = time.perf_counter()
        parse_times.append(parsed - started)
        enqueue_times.append(enqueued - parsed)
        links = len(page.css("a[href]"))
        redis.reset()
    return Timing(
        label,
        len(body),
        links,
        len(requests),
        len(added.enqueued),
        added.duplicates,
        len(added.refused or []),
        statistics.median(parse_times),
        statistics.median(enqueue_times),
    )


_runs = itertools.count()

HEADER = [
    "page",
    "size",
    "a[href]",
    "requests",
    "enqueued",
    "duplicates",
    "refused",
    "parse s",
    "enqueue s",
    "total s",
    "µs per link",
]


def run(redis: BenchRedis, quick: bool = False, pages: Sequence[str] = (), urls: Sequence[str] = ()) -> BenchResult:
    """Time the generated pages, then each real page in ``pages`` (parsed as the URL at the same index)."""
    generated = QUICK_GENERATED if quick else GENERATED
    repeats = QUICK_REPEATS if quick else REPEATS
    result = BenchResult(
        "parse",
        {
            "repeats (median)": repeats,
            "callback": "h1 text + follow_all('a[href]')",
            "generated page url": PAGE_URL,
            "base href": BASE_HREF,
        },
    )
    started = time.monotonic()
    rows, timings = [], []
    for size, links, base in generated:
        label = f"generated{' +base' if base else ''}"
        timing = time_page(redis, label, generate_page(size, links, base), PAGE_URL, repeats)
        timings.append((size, links, timing))
        rows.append(timing.row())
        print(
            f"  parse {label} {size / 1e6:.1f} MB / {links} links: {timing.parse_s:.3f} + {timing.enqueue_s:.3f} s",
            flush=True,
        )
    result.table("generated documentation pages (parse = Page + DOM + callback; enqueue = Frontier.add)", HEADER, rows)
    real_rows = []
    for index, file in enumerate(pages):
        path = Path(file)
        url = urls[index] if index < len(urls) else f"https://{HOST}/{path.name}"
        timing = time_page(redis, path.name, path.read_bytes(), url, repeats)
        real_rows.append(timing.row())
        result.notes.append(f"{path.name}: {path} parsed as {url}")
        print(f"  parse {path}: {timing.parse_s:.3f} + {timing.enqueue_s:.3f} s", flush=True)
    if real_rows:
        result.table("real HTML files", HEADER, real_rows)
    for size, links, timing in timings:
        if (size, links) == TARGET_PAGE:
            result.checks.append(
                Check(
                    f"{size / 1e6:g} MB page, {links:,} links{timing.label[9:]}: parse + enqueue",
                    f"{timing.total_s:.3f} s",
                    f"< {TARGET_S} s",
                    timing.total_s < TARGET_S,
                )
            )
    first, last = timings[0][2], timings[-1][2]
    ratio = (last.total_s / last.links) / (first.total_s / first.links)
    result.checks.append(
        Check(f"time per link, {last.links:,} vs {first.links:,} links", f"{ratio:.2f}x", "about 1 (linear)", ratio < 2)
    )
    result.seconds = time.monotonic() - started
    return result
