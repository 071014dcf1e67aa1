"""Memory: Redis bytes per queued URL and per seen URL, against a plain RQ job; worker RSS.

What is measured, on a Redis with nothing else in it (``used_memory`` from ``INFO
memory``, before and after, divided by the count):

- **queued URL**: N download tasks for ~86-character URLs appended to one site's compact
  frontier with ``Frontier.push`` (pipelined batches), as the parse step queues them;
- **seen URL**: N fingerprints (``crawler.coord.task.fingerprint``) added to the site's
  seen set (SADD in pipelined batches), as dedup keeps them;
- **seen URL as the crawler adds it**: the same N URLs through ``seen.mark_seen_together``
  (the ``ADD_SEEN`` script);
- **seen URL that expires** (``Spider.revisit_after``, a week): the same N URLs through
  ``seen.mark_seen_together`` into the time-bucketed seen sets (``ADD_SEEN_FOR_A_WHILE``);
  and, for contrast, a sorted set of fingerprint → time (``ZADD``), the other way to
  let seen URLs expire;
- **plain RQ job**, for contrast: the same download task queued as an RQ job with the
  JSON serializer, ``description=url`` and the crawler's job options
  (``Queue.prepare_data`` + ``enqueue_many``), as every queued URL used to cost;
- **worker RSS**: a download worker process and a parse worker process (one worker
  thread each, ``crawler.work.launcher.start_workers``) crawl a demo shop of a few hundred
  products; their RSS (and USS) is sampled every ``RSS_EVERY`` seconds with psutil, and
  the last sample before they exit (burst, crawl drained) and the peak are reported.

Target: at most 200 bytes of Redis per queued URL at 1,000,000 queued URLs.

``python -m bench.memory seen N...`` measures the seen set alone (``seen_dedup``), at each N
URLs of one site: bytes a URL (``used_memory`` delta and the sum of ``MEMORY USAGE`` of the
site's seen keys), the sub-sets' encodings, and the time a link of the dedup check, new links
and links seen before, in calls of SEEN_CHUNK; on the embedded Redis, or ``BENCH_REDIS_URL``.
It measures the code it runs with, so the same file run against an older checkout
(``PYTHONPATH``) gives the figures before. ``python -m bench.memory seen-ab OLD.lua N...``
times ADD_SEEN against an older one (``git show 4e3c1d6:crawler/coord/lua/add_seen.lua``,
the set of 8-byte fingerprints) side by side on one server, calls alternated (``seen_ab``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rq import Queue
from rq.serializers import JSONSerializer

from crawler.coord import keys
from crawler.coord.frontier import DownloadTask, Frontier, seed
from crawler.coord.seen import SEEN_CHUNK, SeenKey, mark_seen_together
from crawler.coord.task import fingerprint
from crawler.coord.vetting import DOWNLOAD_FUNC
from crawler.demo import ShopSite
from crawler.settings import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_FAILURE_TTL
from crawler.work.launcher import WorkerSpec, start_workers
from crawler.work.runtime import Runtime

from .common import BenchRedis, BenchResult, Check, bench_redis, crawl_settings, machine_info, stored_items

#: URLs queued and seen.
URLS = 1_000_000
QUICK_URLS = 100_000
#: Plain RQ jobs queued for the contrast.
RQ_JOBS = 20_000
QUICK_RQ_JOBS = 5_000
#: Entries per pipelined batch.
BATCH = 10_000
RQ_BATCH = 1_000
#: Length of every URL.
URL_LENGTH = 86
#: Products in the shop crawled for the RSS figures, and the crawl's interval (s).
RSS_PRODUCTS = 400
QUICK_RSS_PRODUCTS = 100
RSS_INTERVAL = 0.005
#: Seconds between two RSS samples; longest the RSS crawl may take.
RSS_EVERY = 0.2
RSS_TIMEOUT = 150.0
#: Target bytes per queued URL.
TARGET = 200
#: The time buckets cost what the plain set does, within this factor: runs measured 0.1-0.2 B
#: a URL more (56.5-56.6 against 56.4), the sets' own overhead, not a second copy of a URL.
SAME_AS_PLAIN = 1.02
#: ``revisit_after`` of the expiring seen sets measured (a week: one bucket spans 1.75 days).
REVISIT_AFTER = 7 * 24 * 3600.0


def url_for(n: int) -> str:
    """A canonical product URL of exactly URL_LENGTH characters."""
    url = f"https://www.example-shop.com/catalogue/kitchen-and-dining/mug-{n:010d}/index.html"
    return url + "x" * (URL_LENGTH - len(url)) if len(url) < URL_LENGTH else url[:URL_LENGTH]


def used_memory(redis: BenchRedis) -> int:
    return int(redis.connection.info("memory")["used_memory"])


def queued_bytes(redis: BenchRedis, site: str, count: int) -> dict[str, Any]:
    """Bytes per URL in the compact frontier after ``Frontier.push`` of ``count`` tasks."""
    frontier = Frontier(redis.connection, site, ["example-shop.com"], DEFAULT_FAILURE_TTL, DEFAULT_DOWNLOAD_TIMEOUT)
    before = used_memory(redis)
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        frontier.push([DownloadTask(site, url_for(n)) for n in range(start, min(count, start + BATCH))])
    seconds = time.perf_counter() - started
    after = used_memory(redis)
    key = keys.frontier(site)
    entry = redis.connection.lindex(key, 0) or b""
    usage = redis.connection.memory_usage(key, samples=0)
    return {
        "count": count,
        "delta": after - before,
        "per_url": (after - before) / count,
        "key_usage_per_url": (usage or 0) / count,
        "entry_bytes": len(entry),
        "seconds": seconds,
    }


def seen_bytes(redis: BenchRedis, site: str, count: int) -> dict[str, Any]:
    """Bytes per URL in the seen set after SADD of ``count`` fingerprints."""
    key = keys.seen(site)
    before = used_memory(redis)
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        members = [fingerprint(url_for(n)) for n in range(start, min(count, start + BATCH))]
        redis.connection.sadd(key, *members)
    seconds = time.perf_counter() - started
    after = used_memory(redis)
    return {
        "count": count,
        "delta": after - before,
        "per_url": (after - before) / count,
        "key_usage_per_url": (redis.connection.memory_usage(key, samples=0) or 0) / count,
        "entry_bytes": len(fingerprint(url_for(0))),
        "seconds": seconds,
    }


def seen_marked_bytes(redis: BenchRedis, site: str, count: int, revisit_after: float | None) -> dict[str, Any]:
    """Bytes per URL in the seen set(s) after ``count`` new URLs through ``mark_seen_together``.

    The crawler's own path (a Lua script per SEEN_CHUNK URLs): the plain set (``ADD_SEEN``),
    or with ``revisit_after`` the time buckets (``ADD_SEEN_FOR_A_WHILE``).
    """
    frontier = Frontier(
        redis.connection,
        site,
        ["example-shop.com"],
        DEFAULT_FAILURE_TTL,
        DEFAULT_DOWNLOAD_TIMEOUT,
        revisit_after=revisit_after,
    )
    before = used_memory(redis)
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        mark_seen_together([(frontier.seen, [url_for(n) for n in range(start, min(count, start + BATCH))])])
    seconds = time.perf_counter() - started
    after = used_memory(redis)
    found = seen_keys(redis, site)
    usage = sum(redis.connection.memory_usage(key, samples=0) or 0 for key in found)
    return {
        "count": count,
        "delta": after - before,
        "per_url": (after - before) / count,
        "key_usage_per_url": usage / count,
        "entry_bytes": len(fingerprint(url_for(0))),
        "seconds": seconds,
        "keys": found,
    }


def seen_keys(redis: BenchRedis, site: str) -> list[bytes]:
    """Every key of ``site``'s seen URLs (the set or table, its sub-sets, time buckets)."""
    found = [keys.seen(site).encode()] if redis.connection.exists(keys.seen(site)) else []
    return found + list(redis.connection.scan_iter(match=keys.seen(site) + ":*", count=1000))


def redis_cpu(redis: BenchRedis) -> float:
    """The server's CPU seconds so far (``INFO cpu``)."""
    cpu = redis.connection.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def dedup_pass(redis: BenchRedis, frontier: Frontier, numbers: range) -> tuple[float, float, int]:
    """Wall and Redis CPU seconds to check (and add) URLs ``numbers``, SEEN_CHUNK a call; how many were new."""
    new, cpu, started = 0, redis_cpu(redis), time.perf_counter()
    for start in range(numbers.start, numbers.stop, SEEN_CHUNK):
        urls: list[SeenKey] = [url_for(n) for n in range(start, min(numbers.stop, start + SEEN_CHUNK))]
        new += sum(mark_seen_together([(frontier.seen, urls)])[0])
    return time.perf_counter() - started, redis_cpu(redis) - cpu, new


def seen_dedup(redis: BenchRedis, site: str, count: int, sample: int = 200_000) -> dict[str, Any]:
    """``count`` URLs of one site through the dedup check (``mark_seen_together``, as a parse step
    does, calls of SEEN_CHUNK): bytes a URL, encodings, and per link the time to add a new one
    (all ``count``) and to check one seen before (``sample`` of them, every k-th, again).

    Per link times include making the fingerprints in Python (the same before and after)."""
    frontier = Frontier(redis.connection, site, ["example-shop.com"], DEFAULT_FAILURE_TTL, DEFAULT_DOWNLOAD_TIMEOUT)
    before = used_memory(redis)
    add_wall, add_cpu, new = dedup_pass(redis, frontier, range(count))
    after = used_memory(redis)
    found = seen_keys(redis, site)
    usage, largest, encodings = 0, 0, dict[str, int]()
    with redis.connection.pipeline(transaction=False) as pipe:
        for key in found:
            pipe.memory_usage(key, samples=0)
            pipe.object("encoding", key)
            pipe.type(key)
        replies = pipe.execute()
    sets = []
    for key, size, encoding, kind in zip(found, replies[0::3], replies[1::3], replies[2::3], strict=True):
        usage += size or 0
        name = encoding.decode() if isinstance(encoding, bytes) else str(encoding)
        encodings[name] = encodings.get(name, 0) + 1
        if kind in (b"set", "set"):
            sets.append(key)
    for start in range(0, len(sets), 1000):
        with redis.connection.pipeline(transaction=False) as pipe:
            for key in sets[start : start + 1000]:
                pipe.scard(key)
            largest = max([largest, *pipe.execute()])
    step = max(1, count // sample)
    again = range(0, count, step)
    wall, cpu, fresh = 0.0, 0.0, 0
    for start in range(0, len(again), SEEN_CHUNK):  # every k-th URL, SEEN_CHUNK of them a call
        urls: list[SeenKey] = [url_for(n) for n in again[start : start + SEEN_CHUNK]]
        cpu0, t0 = redis_cpu(redis), time.perf_counter()
        fresh += sum(mark_seen_together([(frontier.seen, urls)])[0])
        wall, cpu = wall + time.perf_counter() - t0, cpu + redis_cpu(redis) - cpu0
    return {
        "count": count,
        "new": new,
        "delta": after - before,
        "per_url": (after - before) / count,
        "key_usage_per_url": usage / count,
        "keys": len(found),
        "encodings": encodings,
        "largest set": largest,
        "add us/link": add_wall / count * 1e6,
        "add Redis CPU us/link": add_cpu / count * 1e6,
        "seen again": len(again),
        "false new on re-check": fresh,
        "re-check us/link": wall / len(again) * 1e6,
        "re-check Redis CPU us/link": cpu / len(again) * 1e6,
    }


def seen_ab(redis: BenchRedis, count: int, old_source: str, reps: int = 21) -> dict[str, Any]:
    """Redis time a link of ADD_SEEN and of an older ADD_SEEN (``old_source``: one KEYS, the set of
    8-byte fingerprints, ARGV[1] the fingerprints concatenated), side by side on one server:
    ``count`` URLs of one site in each, then ``reps`` rounds of a call of SEEN_CHUNK links seen
    before (a random sample) and one of new links to each, alternated, so that a busy machine
    weighs on both alike. Per kind: min and median µs a link, by ``INFO commandstats`` (the
    scripts' own time); and the Python time a link of making each's arguments."""
    import random
    import statistics

    from crawler.coord import lua
    from crawler.coord.seen import SUBSET_LOAD, chunk_of
    from crawler.coord.task import fingerprint

    connection = redis.connection
    old, new = connection.register_script(old_source), lua.script(connection, "add_seen")
    old_keys = [f"{keys.seen(redis.tag + '_old')}"]
    new_keys = [keys.seen_table(redis.tag + "_new"), keys.seen(redis.tag + "_new")]
    shape: list[tuple[int, int] | None] = [None]

    def call_new(chunk: tuple[bytes, bytes, bytes]) -> bytes:
        reply = new(keys=new_keys, args=[chunk[0], chunk[1], SUBSET_LOAD, "", chunk[2]])
        flags, _, named = reply.partition(b":")
        level, split = named.split()
        shape[0] = (int(level), int(split))
        return flags

    def script_usec() -> int:
        return int(connection.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))

    for start in range(0, count, SEEN_CHUNK):
        fps = [fingerprint(url_for(n)) for n in range(start, min(count, start + SEEN_CHUNK))]
        old(keys=old_keys, args=[b"".join(fps)])
        call_new(chunk_of(fps, shape[0]))
    times: dict[str, list[float]] = {k: [] for k in ("old seen", "new seen", "old new", "new new", "py old", "py new")}
    fresh = count
    for _ in range(reps):
        for kind, fps in (
            ("seen", [fingerprint(url_for(n)) for n in random.sample(range(count), SEEN_CHUNK)]),
            ("new", [fingerprint(url_for(n)) for n in range(fresh, fresh + SEEN_CHUNK)]),
        ):
            started = time.perf_counter()
            raw = b"".join(fps)
            times["py old"].append(time.perf_counter() - started)
            started = time.perf_counter()
            chunk = chunk_of(fps, shape[0])
            times["py new"].append(time.perf_counter() - started)
            expected = (b"0" if kind == "seen" else b"1") * SEEN_CHUNK
            before = script_usec()
            assert as_bytes(old(keys=old_keys, args=[raw])) == expected
            middle = script_usec()
            assert call_new(chunk) == expected
            times[f"old {kind}"].append((middle - before) / 1e6)
            times[f"new {kind}"].append((script_usec() - middle) / 1e6)
        fresh += SEEN_CHUNK
    connection.delete(*old_keys, *seen_keys(redis, redis.tag + "_new"))
    per_link = {k: [t / SEEN_CHUNK * 1e6 for t in v] for k, v in times.items()}
    return {k: {"min": min(v), "median": statistics.median(v)} for k, v in per_link.items()} | {"count": count}


def main_seen(counts: list[int]) -> None:
    """``python -m bench.memory seen N...``: ``seen_dedup`` at each N, on a Redis of its own or BENCH_REDIS_URL."""
    with bench_redis() as redis:
        info = machine_info(redis.connection)
        print(f"redis {info.get('redis-server', '?')} | {info.get('cpu', '?')} | {sys.version.split()[0]}", flush=True)
        for count in counts:
            redis.reset()
            site = f"memseen_{redis.tag}_{count}"
            figures = seen_dedup(redis, site, count)
            print(json.dumps(figures), flush=True)
            redis.connection.delete(*seen_keys(redis, site))


def seen_zset_bytes(redis: BenchRedis, site: str, count: int) -> dict[str, Any]:
    """Bytes per URL in a sorted set of fingerprint -> when seen (ms), the alternative to buckets."""
    key = f"{keys.seen(site)}:zset"
    before = used_memory(redis)
    started = time.perf_counter()
    now_ms = time.time() * 1000
    for start in range(0, count, BATCH):
        batch = range(start, min(count, start + BATCH))
        redis.connection.zadd(key, {fingerprint(url_for(n)): now_ms + n for n in batch})
    seconds = time.perf_counter() - started
    after = used_memory(redis)
    return {
        "count": count,
        "delta": after - before,
        "per_url": (after - before) / count,
        "key_usage_per_url": (redis.connection.memory_usage(key, samples=0) or 0) / count,
        "entry_bytes": len(fingerprint(url_for(0))) + 8,
        "seconds": seconds,
        "key": key,
    }


def rq_job_bytes(redis: BenchRedis, site: str, count: int) -> dict[str, Any]:
    """Bytes per URL queued as a plain RQ job (JSON serializer, description = URL)."""
    queue = Queue(f"memrq_{site}", connection=redis.connection, serializer=JSONSerializer)
    before = used_memory(redis)
    started = time.perf_counter()
    ids: list[str] = []
    for start in range(0, count, RQ_BATCH):
        jobs = [
            Queue.prepare_data(
                DOWNLOAD_FUNC,
                args=(DownloadTask(site, url_for(n)).to_json(),),
                result_ttl=0,
                failure_ttl=DEFAULT_FAILURE_TTL,
                timeout=DEFAULT_DOWNLOAD_TIMEOUT,
                description=url_for(n),
            )
            for n in range(start, min(count, start + RQ_BATCH))
        ]
        with redis.connection.pipeline() as pipe:
            ids += [job.id for job in queue.enqueue_many(jobs, pipeline=pipe)]
            pipe.execute()
    seconds = time.perf_counter() - started
    after = used_memory(redis)
    job_key = f"rq:job:{ids[0]}"
    encoding = redis.connection.object("encoding", job_key)
    one = redis.connection.memory_usage(job_key, samples=0) or 0
    figures = {
        "count": count,
        "delta": after - before,
        "per_url": (after - before) / count,
        "key_usage_per_url": one,
        "entry_bytes": None,
        "seconds": seconds,
        "encoding": encoding.decode() if isinstance(encoding, bytes) else str(encoding),
    }
    with redis.connection.pipeline(transaction=False) as pipe:  # cleanup, also on a shared Redis
        for job_id in ids:
            pipe.delete(f"rq:job:{job_id}")
        pipe.delete(queue.key)
        pipe.srem("rq:queues", queue.key)
        pipe.execute()
    return figures


def worker_rss(redis: BenchRedis, products: int) -> dict[str, Any]:
    """RSS of one download and one parse worker process over a crawl of ``products`` products."""
    import psutil

    site = f"memrss_{redis.tag}"
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp, ShopSite(products=products, faults=False) as shop:
        settings = crawl_settings(Path(tmp), redis.url, [site], {site: RSS_INTERVAL})
        rt = Runtime(redis.connection, settings)
        seed(rt.frontier(site), [shop.url + "/"])
        rt.close()
        specs = [
            WorkerSpec("download", (site,), threads=1, burst=True),
            WorkerSpec("parse", (site,), threads=1, burst=True),
        ]
        procs = start_workers(specs, settings, redis.url)
        handles = [psutil.Process(p.pid) for p in procs]
        last: list[tuple[int, int] | None] = [None, None]
        peak = [0, 0]
        deadline = time.monotonic() + RSS_TIMEOUT
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            for i, handle in enumerate(handles):
                try:
                    info = handle.memory_full_info()
                except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    continue
                if procs[i].is_alive() and info.rss:  # a process tearing down reads as 0
                    last[i] = (info.rss, info.uss)
                    peak[i] = max(peak[i], info.rss)
            time.sleep(RSS_EVERY)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        pages = len(shop.requests)
        items = stored_items(settings.database_url, site)
    return {"pages": pages, "items": items, "last": last, "peak": peak}


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    urls = QUICK_URLS if quick else URLS
    rq_jobs = QUICK_RQ_JOBS if quick else RQ_JOBS
    products = QUICK_RSS_PRODUCTS if quick else RSS_PRODUCTS
    result = BenchResult(
        "memory",
        {
            "queued/seen URLs": urls,
            "URL length": URL_LENGTH,
            "example URL": url_for(1),
            "plain RQ jobs": rq_jobs,
            "batch": BATCH,
            "RSS crawl products": products,
            "RSS crawl interval_s": RSS_INTERVAL,
            "measure": "INFO memory used_memory delta / count (and MEMORY USAGE of the key)",
        },
    )
    started = time.monotonic()
    redis.reset()
    site = f"mem_{redis.tag}"
    queued = queued_bytes(redis, site, urls)
    print(f"  memory: {queued['per_url']:.1f} B per queued URL", flush=True)
    seen = seen_bytes(redis, site, urls)
    print(f"  memory: {seen['per_url']:.1f} B per seen URL", flush=True)
    redis.connection.delete(keys.frontier(site), keys.seen(site))
    marked = seen_marked_bytes(redis, site, urls, None)
    print(f"  memory: {marked['per_url']:.1f} B per seen URL, added as the crawler adds it", flush=True)
    redis.connection.delete(*marked["keys"])
    expiring = seen_marked_bytes(redis, site, urls, REVISIT_AFTER)
    print(f"  memory: {expiring['per_url']:.1f} B per seen URL that expires (buckets)", flush=True)
    redis.connection.delete(*expiring["keys"])
    zset = seen_zset_bytes(redis, site, urls)
    print(f"  memory: {zset['per_url']:.1f} B per seen URL in a sorted set (contrast)", flush=True)
    redis.connection.delete(zset["key"])
    redis.connection.zrem(keys.ready(), site)
    redis.connection.srem(keys.sites(), site)
    plain = rq_job_bytes(redis, site, rq_jobs)
    print(f"  memory: {plain['per_url']:.0f} B per plain RQ job", flush=True)
    result.table(
        "Redis memory per URL",
        ["what", "count", "used_memory delta", "bytes per URL", "MEMORY USAGE per URL", "entry bytes", "seconds"],
        [
            [
                "queued URL, compact frontier (Frontier.push)",
                queued["count"],
                queued["delta"],
                queued["per_url"],
                queued["key_usage_per_url"],
                queued["entry_bytes"],
                queued["seconds"],
            ],
            [
                "seen URL, dedup set (8-byte fingerprint)",
                seen["count"],
                seen["delta"],
                seen["per_url"],
                seen["key_usage_per_url"],
                seen["entry_bytes"],
                seen["seconds"],
            ],
            [
                "seen URL, dedup set, added by Frontier._mark_seen (ADD_SEEN)",
                marked["count"],
                marked["delta"],
                marked["per_url"],
                marked["key_usage_per_url"],
                marked["entry_bytes"],
                marked["seconds"],
            ],
            [
                "seen URL that expires, time buckets (revisit_after)",
                expiring["count"],
                expiring["delta"],
                expiring["per_url"],
                expiring["key_usage_per_url"],
                expiring["entry_bytes"],
                expiring["seconds"],
            ],
            [
                "seen URL in a sorted set fingerprint -> time (contrast)",
                zset["count"],
                zset["delta"],
                zset["per_url"],
                zset["key_usage_per_url"],
                zset["entry_bytes"],
                zset["seconds"],
            ],
            [
                f"plain RQ job, JSON, description=url ({plain['encoding']} hash)",
                plain["count"],
                plain["delta"],
                plain["per_url"],
                plain["key_usage_per_url"],
                None,
                plain["seconds"],
            ],
        ],
    )
    redis.reset()
    rss = worker_rss(redis, products)
    rows = []
    for i, kind in enumerate(("download (1 thread)", "parse (1 thread)")):
        last = rss["last"][i]
        rows.append(
            [
                kind,
                rss["pages"],
                last[0] / 2**20 if last else None,
                last[1] / 2**20 if last else None,
                rss["peak"][i] / 2**20,
            ]
        )
    result.table(
        f"worker RSS after crawling {products} products ({rss['pages']} requests, {rss['items']} items)",
        ["process", "requests", "RSS MiB (last sample)", "USS MiB (last sample)", "peak RSS MiB"],
        rows,
    )
    result.checks.append(
        Check(
            f"Redis bytes per queued URL at {urls:,}",
            f"{queued['per_url']:.1f}",
            f"<= {TARGET}",
            queued["per_url"] <= TARGET,
        )
    )
    result.checks.append(Check("Redis bytes per seen URL", f"{seen['per_url']:.1f}", "-", None))
    result.checks.append(
        Check(
            "Redis bytes per seen URL that expires (buckets)",
            f"{expiring['per_url']:.1f}",
            f"<= {seen['per_url'] * SAME_AS_PLAIN:.1f} (plain set + {SAME_AS_PLAIN - 1:.0%})",
            expiring["per_url"] <= seen["per_url"] * SAME_AS_PLAIN,
        )
    )
    result.checks.append(Check("plain RQ job per URL (contrast)", f"{plain['per_url']:.0f}", "-", None))
    result.checks.append(
        Check("download / parse worker RSS (MiB)", " / ".join(f"{r[2]:.0f}" if r[2] else "-" for r in rows), "-", None)
    )
    result.seconds = time.monotonic() - started
    return result


def main_seen_ab(old_script: str, counts: list[int]) -> None:
    """``python -m bench.memory seen-ab OLD_ADD_SEEN.lua N...``: ``seen_ab`` at each N."""
    source = Path(old_script).read_text()
    with bench_redis() as redis:
        info = machine_info(redis.connection)
        print(f"redis {info.get('redis-server', '?')} | {info.get('cpu', '?')} | {sys.version.split()[0]}", flush=True)
        for count in counts:
            redis.reset()
            print(json.dumps(seen_ab(redis, count, source)), flush=True)


def as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


if __name__ == "__main__":
    if sys.argv[1:2] == ["seen"] and len(sys.argv) >= 3:
        main_seen([int(n) for n in sys.argv[2:]])
    elif sys.argv[1:2] == ["seen-ab"] and len(sys.argv) >= 4:
        main_seen_ab(sys.argv[2], [int(n) for n in sys.argv[3:]])
    else:
        sys.exit("usage: python -m bench.memory seen N [N...] | seen-ab OLD_ADD_SEEN.lua N [N...]")
