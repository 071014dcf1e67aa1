"""Sitemaps: a 50 MB gzipped sitemap of 50,000 URLs, downloaded and read without being held whole.

What is measured, in a fresh process (so its peak RSS is the sitemap's doing): a loopback
server serves ``/sitemap.xml.gz``, a gzipped ``<urlset>`` of ``URLS`` URLs of about 960
characters each (just under the protocol's limits: 50,000 URLs, 50 MB), generated a line
at a time, of words that repeat as real slugs do; the crawler's download job fetches it
(through the gate, streamed into a zlib compressor) and its parse job reads it (inflated
a step at a time, gunzipped, lxml pull parser) into the frontier. Figures: the
document's size, each job's wall time, URLs queued, the process's RSS before and its
peak (``ru_maxrss``) after.
"""

from __future__ import annotations

import gzip
import io
import multiprocessing
import resource
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .common import BenchRedis, BenchResult, Check

URLS = 50_000
QUICK_URLS = 10_000
URL_LENGTH = 960


def _document(count: int) -> tuple[bytes, int]:
    """The gzipped sitemap and its size unzipped, written a line at a time (never held whole unzipped)."""
    out = io.BytesIO()
    size = 0
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6) as zipped:
        for line in _lines(count):
            zipped.write(line)
            size += len(line)
    return out.getvalue(), size


#: Words product URLs are made of (real slugs repeat words: a sitemap gzips about tenfold).
WORDS = (
    "red",
    "blue",
    "linen",
    "cotton",
    "shirt",
    "dress",
    "slim",
    "fit",
    "women",
    "men",
    "summer",
    "winter",
    "classic",
    "organic",
    "striped",
    "long",
    "sleeve",
    "collar",
    "pack",
    "size",
    "large",
    "small",
)


def _lines(count: int) -> Any:
    yield b'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
    for n in range(count):
        slug = "-".join(WORDS[(n * 7 + i * 3 + i * i) % len(WORDS)] for i in range(URL_LENGTH // 5))
        url = f"http://127.0.0.1/catalogue/{n}/{slug}"[:URL_LENGTH]
        yield f"<url><loc>{url}</loc><lastmod>2024-05-01</lastmod></url>\n".encode()
    yield b"</urlset>\n"


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _measure(redis_url: str, count: int, workdir: str, out: Any) -> None:
    """In a child process: serve the sitemap, run its download and parse jobs, send the figures."""
    from crawler.coord import keys
    from crawler.coord.connection import connect
    from crawler.coord.frontier import DownloadTask
    from crawler.coord.vetting import page_entry
    from crawler.settings import Settings
    from crawler.spiders.loading import SpiderSet
    from crawler.spiders.spider import Spider
    from crawler.work import jobs, parse_job
    from crawler.work.runtime import Runtime
    from crawler.work.sitemaps import SITEMAP_CALLBACK

    body, size = _document(count)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    spider = type(
        "Big", (Spider,), {"name": "bigmap", "allowed_domains": ["127.0.0.1"], "obey_robots": False, "interval": 0.01}
    )
    settings = Settings(
        redis_url=redis_url,
        database_url=f"sqlite:///{workdir}/crawl.db",
        sites_dir=workdir,
        state_dir=f"{workdir}/state",
    )
    connection = connect(redis_url)
    rt = Runtime(connection, settings, SpiderSet({"bigmap": spider}, []))
    rt.store  # noqa: B018  # the schema, before the figures
    url = f"http://127.0.0.1:{server.server_address[1]}/sitemap.xml.gz"
    before = _rss_kib()
    started = time.monotonic()
    jobs.download(DownloadTask("bigmap", url, SITEMAP_CALLBACK).to_json(), rt=rt)
    downloaded = time.monotonic() - started
    ((_, fields),) = connection.xrange(keys.pages())  # the one page entry, as a parse worker reads it
    task, compressed = page_entry(fields)
    started = time.monotonic()
    parse_job.parse(task, compressed, rt=rt)
    parsed = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queued = connection.llen(keys.frontier("bigmap"))
    note = [r["error"] for r in rt.store.fetch_rows("bigmap") if r["kind"] == "parse"]
    rt.close()
    server.shutdown()
    out.send(
        {
            "gz": len(body),
            "xml": size,
            "download_s": downloaded,
            "parse_s": parsed,
            "queued": queued,
            "rss_before_mib": before / 1024,
            "rss_peak_mib": peak / 1024,
            "note": note[0] if note else "-",
        }
    )


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    count = QUICK_URLS if quick else URLS
    result = BenchResult("sitemaps", {"urls": count, "url_length": URL_LENGTH, "served as": "application/x-gzip"})
    started = time.monotonic()
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    with tempfile.TemporaryDirectory(prefix="bench-sitemaps-") as tmp:
        child = context.Process(target=_measure, args=(redis.url, count, tmp, send))
        child.start()
        figures = receive.recv()
        child.join()
    growth = figures["rss_peak_mib"] - figures["rss_before_mib"]
    result.table(
        "one sitemap, download job then parse job, in a fresh process",
        [
            "sitemap MB (unzipped)",
            "gzipped MB",
            "download s",
            "parse s",
            "URLs queued",
            "RSS before MiB",
            "peak RSS MiB",
            "peak - before MiB",
        ],
        [
            [
                figures["xml"] / 1e6,
                figures["gz"] / 1e6,
                figures["download_s"],
                figures["parse_s"],
                figures["queued"],
                figures["rss_before_mib"],
                figures["rss_peak_mib"],
                growth,
            ]
        ],
    )
    result.notes.append(f"parse record: {figures['note']}")
    result.checks.append(Check("URLs queued", f"{figures['queued']:,}", f"{count:,}", figures["queued"] == count))
    result.checks.append(
        Check(
            "peak RSS growth / sitemap size",
            f"{growth:.1f} MiB for {figures['xml'] / 1e6:.0f} MB",
            "well under the sitemap",
            growth * 1024 * 1024 < figures["xml"] / 2,
        )
    )
    result.seconds = time.monotonic() - started
    return result
