"""Concurrency models: what one request to a slow site costs under threads, and under an event loop.

Invocation: ``python -m bench models [--quick]``.

The question (issue 21's open item): the download processes keep a thread for each site in
flight, and a profile (``perf``) of them at 200 slow sites puts about a sixth of their CPU in
the kernel's scheduler, threads handing the GIL and their locks to each other. Would an
event loop (one thread, a task per site) cost less a request, and with which HTTP client?
Not our crawler: the same small loop per site, written once per model, so only the model
differs:

1. take the site's gate: ``SET key token NX PX interval`` in a Lua script, which answers
   the gate's remaining milliseconds when closed (then sleep them and take it again);
2. ``GET`` the site's home page, keep-alive, and read its body;
3. one pipeline of three commands: a record (``HSET``), a counter (``HINCRBY``), the
   page handed on (``XADD``, capped).

Models (each in a fresh process of its own, one after the other, the same sites):

- ``threads``: a thread per site, ``httpx.Client`` and ``redis.Redis`` (what the download
  workers use now);
- ``threads-fetcher``: as ``threads``, each request sent by the download workers' own
  ``crawler.http.fetch.Fetcher`` (its deadline, address check, body cap and decoding, pools
  per origin), with an ``on_sent`` hook as the gate's;
- ``threads-transport``: as ``threads``, each request handed to an ``httpx.HTTPTransport`` of
  the site's as an ``httpx.Request``, its body read raw (``iter_raw``): how our ``Fetcher``
  sends, without ``httpx.Client`` (its cookies, redirects, auth and hooks);
- ``threads-httpcore``: as ``threads``, each request sent by a ``httpcore.ConnectionPool`` of
  the site's (what ``httpx.Client`` sends through), without httpx's layer above it;
- ``asyncio-httpx``: a task per site on one asyncio loop, ``httpx.AsyncClient`` and
  ``redis.asyncio``;
- ``asyncio-aiohttp``: the same with ``aiohttp`` for HTTP (skipped when not installed:
  a reference, not a dependency of ours);
- ``threads-aiohttp``: a thread per site as ``threads``, each handing its request to one
  asyncio loop thread running ``aiohttp`` (``run_coroutine_threadsafe``) and waiting for it:
  whether the HTTP client can change without the threads.

The sites are ``bench fleet``'s server (each site its own loopback address, latency drawn
once per site from 0.2-0.8 s plus up to 0.1 s a response), at 200 sites and ``interval`` 1 s.
Each model runs ``WARMUP`` s, then its process's CPU (user + system, ``RUSAGE_SELF``) and the
Redis server's (``INFO cpu``) are taken over ``WINDOW`` s and divided by the requests answered
in it. Figures: CPU ms a request (the model's process, and with Redis), the ratio to
``threads`` in the same run, and the share of the budget used (requests / (sites x window /
interval)). ``BENCH_MODELS_ROUNDS=N`` repeats the set, each round in another order; ``BENCH_MODELS=a,b``
runs only those models (and ``threads``).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import BenchRedis, BenchResult, Check
from .fleet import CONFIGS, FleetConfig, FleetServer, site_host

MODELS = (
    "threads",
    "threads-fetcher",
    "threads-transport",
    "threads-httpcore",
    "asyncio-httpx",
    "asyncio-aiohttp",
    "threads-aiohttp",
)
#: Environment: the models to run, comma-separated (default all; ``threads`` always runs, as the base).
MODELS_ENV = "BENCH_MODELS"
WARMUP = 5.0
WINDOW = 20.0
QUICK_WARMUP = 2.0
QUICK_WINDOW = 5.0
ROUNDS_ENV = "BENCH_MODELS_ROUNDS"
#: Longest body kept in the page handed on (the fleet's home pages are a few KiB).
STREAM_MAXLEN = 10_000

#: 0 once taken, else the milliseconds to wait (at least 1: a key about to expire answers PTTL 0 or -2).
GATE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
return math.max(redis.call('PTTL', KEYS[1]), 1)
"""


def _record(pipe: Any, site: str, url: str, status: int, body: bytes) -> None:
    pipe.hset(f"models:rec:{site}", mapping={"url": url, "status": status, "bytes": len(body), "at": time.time()})
    pipe.hincrby(f"models:count:{site}", "pages", 1)
    pipe.xadd("models:pages", {"site": site, "url": url, "body": body}, maxlen=STREAM_MAXLEN, approximate=True)


class Tally:
    """Requests answered, and the CPU of this process and of Redis at the window's edges."""

    def __init__(self) -> None:
        self.requests = 0
        self.lock = threading.Lock()
        self.window: dict[str, float] = {}

    def add(self) -> None:
        with self.lock:
            self.requests += 1

    def mark(self, name: str, redis_cpu: float) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with self.lock:
            self.window[name + "_requests"] = self.requests
        self.window[name + "_cpu"] = usage.ru_utime + usage.ru_stime
        self.window[name + "_redis_cpu"] = redis_cpu
        self.window[name + "_at"] = time.monotonic()


def _redis_cpu(info: dict[str, Any]) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


#: A thread model's ``get(url) -> (status, body)``, callable from any thread.
Getter = Callable[[str], tuple[int, bytes]]


def _getter(model: str, urls: list[str]) -> Getter:
    """How ``model`` (a ``threads*`` one) sends: each with a pool or client a site, as the download
    workers' pools are per origin (``crawler.http.pools``: httpcore's pool looks at each of its
    connections on every request)."""
    import httpx

    if model == "threads":
        clients = {url: httpx.Client(timeout=30) for url in urls}

        def get(url: str) -> tuple[int, bytes]:
            response = clients[url].get(url)
            return response.status_code, response.content

    elif model == "threads-fetcher":
        from crawler.http.fetch import Fetcher

        fetcher = Fetcher(timeout=30, max_body_bytes=10 * 1024 * 1024, user_agent="models")

        def get(url: str) -> tuple[int, bytes]:
            response = fetcher.get(url, on_sent=lambda: None)
            return response.status, response.body

    elif model == "threads-transport":
        transports = {url: httpx.HTTPTransport() for url in urls}
        headers = httpx.Headers({"user-agent": "models", "accept-encoding": "identity"})

        def get(url: str) -> tuple[int, bytes]:
            response = transports[url].handle_request(httpx.Request("GET", url, headers=headers))
            try:
                return response.status_code, b"".join(response.iter_raw())
            finally:
                response.close()

    elif model == "threads-httpcore":
        import httpcore

        pools = {url: httpcore.ConnectionPool() for url in urls}

        def get(url: str) -> tuple[int, bytes]:
            response = pools[url].request("GET", url)
            return response.status, response.content

    else:  # threads-aiohttp: one asyncio loop thread sends for every thread
        import aiohttp

        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="http-loop", daemon=True).start()

        async def make() -> Any:
            return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        session = asyncio.run_coroutine_threadsafe(make(), loop).result()

        async def fetch(url: str) -> tuple[int, bytes]:
            async with session.get(url) as response:
                return response.status, await response.read()

        def get(url: str) -> tuple[int, bytes]:
            return asyncio.run_coroutine_threadsafe(fetch(url), loop).result()

    return get


def run_threads(model: str, spec: dict[str, Any], tally: Tally) -> None:
    """A thread a site, each sending as ``model`` says (``_getter``), until the window ends."""
    import redis

    sites = spec["sites"]
    client = redis.Redis.from_url(spec["redis_url"], max_connections=len(sites) + 8)
    gate = client.register_script(GATE)
    get = _getter(model, [url for _, url in sites])
    interval_ms = int(spec["interval"] * 1000)
    stop = threading.Event()

    def loop(site: str, url: str) -> None:
        while not stop.is_set():
            wait = int(gate(keys=[f"models:gate:{site}"], args=[os.getpid(), interval_ms]))
            if wait:
                time.sleep(wait / 1000)
                continue
            status, body = get(url)
            pipe = client.pipeline(transaction=False)
            _record(pipe, site, url, status, body)
            pipe.execute()
            tally.add()

    threads = [threading.Thread(target=loop, args=(site, url), daemon=True) for site, url in sites]
    for thread in threads:
        thread.start()
    time.sleep(spec["warmup"])
    tally.mark("start", _redis_cpu(client.info("cpu")))
    time.sleep(spec["window"])
    tally.mark("end", _redis_cpu(client.info("cpu")))
    stop.set()
    for thread in threads:
        thread.join()


async def _run_asyncio(spec: dict[str, Any], tally: Tally, use_aiohttp: bool) -> None:
    """A task a site on this loop, sending by aiohttp or by ``httpx.AsyncClient``, until the window ends."""
    import redis.asyncio as aredis

    sites = spec["sites"]
    client = aredis.Redis.from_url(spec["redis_url"], max_connections=len(sites) + 8)
    gate = client.register_script(GATE)
    interval_ms = int(spec["interval"] * 1000)
    stop = asyncio.Event()
    if use_aiohttp:
        import aiohttp

        session: Any = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def get(url: str) -> tuple[int, bytes]:
            async with session.get(url) as response:
                return response.status, await response.read()

    else:
        import httpx

        session = {url: httpx.AsyncClient(timeout=30) for _, url in sites}  # a client per site, as in ``_getter``

        async def get(url: str) -> tuple[int, bytes]:
            response = await session[url].get(url)
            return response.status_code, response.content

    async def loop(site: str, url: str) -> None:
        while not stop.is_set():
            wait = int(await gate(keys=[f"models:gate:{site}"], args=[os.getpid(), interval_ms]))
            if wait:
                await asyncio.sleep(wait / 1000)
                continue
            status, body = await get(url)
            pipe = client.pipeline(transaction=False)
            _record(pipe, site, url, status, body)
            await pipe.execute()
            tally.add()

    tasks = [asyncio.create_task(loop(site, url)) for site, url in sites]

    async def redis_cpu() -> float:
        return _redis_cpu(await client.info("cpu"))

    await asyncio.sleep(spec["warmup"])
    tally.mark("start", await redis_cpu())
    await asyncio.sleep(spec["window"])
    tally.mark("end", await redis_cpu())
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    if use_aiohttp:
        await session.close()
    else:
        for each in session.values():
            await each.aclose()
    await client.aclose()


def model_main() -> None:
    """One model's process: argv[1] the model, argv[2] a JSON spec; prints its figures as JSON."""
    model, spec = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    tally = Tally()
    if model.startswith("threads"):
        run_threads(model, spec, tally)
    else:
        asyncio.run(_run_asyncio(spec, tally, use_aiohttp=model == "asyncio-aiohttp"))
    w = tally.window
    print(
        json.dumps(
            {
                "requests": w["end_requests"] - w["start_requests"],
                "cpu": w["end_cpu"] - w["start_cpu"],
                "redis_cpu": w["end_redis_cpu"] - w["start_redis_cpu"],
                "seconds": w["end_at"] - w["start_at"],
            }
        )
    )


def available(model: str) -> bool:
    """Whether this Python can run ``model`` (aiohttp is not a dependency of ours)."""
    if "aiohttp" not in model:
        return True
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return False
    return True


def run_model(model: str, spec_file: Path, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", "from bench.models import model_main; model_main()", model, str(spec_file)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if done.returncode != 0:
        raise RuntimeError(f"model {model} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _ms_with_redis(figures: dict[str, Any]) -> float:
    """CPU ms a request of a model's process and Redis together (``model_main``'s figures)."""
    return float(figures["cpu"] + figures["redis_cpu"]) / figures["requests"] * 1000


def run(redis: BenchRedis, quick: bool = False) -> BenchResult:
    config: FleetConfig = CONFIGS["200"]
    warmup, window = (QUICK_WARMUP, QUICK_WINDOW) if quick else (WARMUP, WINDOW)
    rounds = 1 if quick else int(os.environ.get(ROUNDS_ENV, "1"))
    chosen = os.environ.get(MODELS_ENV)
    wanted = {"threads", *chosen.split(",")} if chosen else set(MODELS)
    models = [model for model in MODELS if model in wanted and available(model)]
    result = BenchResult(
        "models",
        {
            "sites": config.sites,
            "interval s": config.interval,
            "budget req/s": config.budget,
            "warmup s": warmup,
            "window s": window,
            "rounds": rounds,
            "models": ", ".join(models),
        },
    )
    for model in MODELS:
        if model in wanted and model not in models:
            result.notes.append(f"{model} left out: not installed in this Python")
    rows = []
    by_round: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        workdir = Path(tmp)
        for round_ in range(rounds):
            order = models[round_ % len(models) :] + models[: round_ % len(models)]
            figures: dict[str, dict[str, Any]] = {}
            for model in order:
                redis.reset()
                server = FleetServer(config, workdir)
                try:
                    sites = [(site_host(i), server.url(i)) for i in range(config.sites)]
                    spec = {
                        "sites": sites,
                        "redis_url": redis.url,
                        "interval": config.interval,
                        "warmup": warmup,
                        "window": window,
                    }
                    spec_file = workdir / "spec.json"
                    spec_file.write_text(json.dumps(spec))
                    figures[model] = run_model(model, spec_file, timeout=warmup + window + 60)
                finally:
                    server.stop(model)
            by_round.append(figures)
            base_ms = _ms_with_redis(figures["threads"])
            for model in models:
                f = figures[model]
                ms, with_redis = f["cpu"] / f["requests"] * 1000, _ms_with_redis(f)
                used = f["requests"] / (config.budget * f["seconds"])
                rows.append([round_ + 1, model, f["requests"], ms, with_redis, with_redis / base_ms, used])
    result.table(
        "per model and round",
        ["round", "model", "requests", "CPU ms/request", "with Redis", "ratio to threads", "budget used"],
        rows,
    )
    first = by_round[0]
    cost = {m: _ms_with_redis(f) for m, f in first.items()}
    for model in models:
        if model != "threads":
            result.checks.append(
                Check(
                    f"CPU a request, {model} vs threads",
                    f"{cost[model]:.2f} vs {cost['threads']:.2f} ms ({cost[model] / cost['threads']:.2f}x)",
                    "informational",
                    None,
                )
            )
    return result
