"""Start worker processes (each with one or more worker threads) and wait for them.

Each worker process builds its own Redis connection, HTTP pool and database engine,
sharing nothing with the parent but plain settings. A launcher running one thread (the
CLI) forks them, so they start with the modules it has imported; one running other
threads (a test, a benchmark with a server thread) spawns them instead, since a fork
copies any lock another thread holds at that moment, held for good. Spawned processes do
not import the parent's main module (``_main_module_left_out``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from ..coord.connection import connect
from ..coord.counters import FlushPace
from ..coord.shards import shards_of
from ..settings import Settings, scrub, secrets_of, url_secrets
from ..spiders.loading import SpiderSet
from . import idle
from .download_worker import DownloadWorker
from .events import JSONFormatter
from .parse_worker import ParseWorker
from .runtime import Runtime

log = logging.getLogger("crawler.workers")

KINDS = ("download", "parse")


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process runs."""

    kind: str  # download | parse
    sites: tuple[str, ...]
    #: Parse: worker threads. Download: the most the process grows to (None: MOST_DOWNLOAD_THREADS).
    threads: int | None = None
    burst: bool = False
    log_level: str = "WARNING"
    #: "text", or "json" for one JSON object per log line (see ``events``).
    log_format: str = "text"
    #: The Redis shards served, by name (``coord.shards``); empty: every one ``REDIS_URL`` names.
    shards: tuple[str, ...] = ()


class ScrubSecrets(logging.Filter):
    """Replaces the secrets of the configured URLs in every log line (a library's error may quote one)."""

    def __init__(self, secrets: list[str]):
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            record.msg, record.args = scrub(record.getMessage(), self.secrets), None
            if record.exc_info:
                record.exc_text = scrub(logging.Formatter().formatException(record.exc_info), self.secrets)
                record.exc_info = None
        return True


def configure_logging(level: str, log_format: str = "text", secrets: list[str] | None = None) -> None:
    """Log at ``level`` to stderr, as text lines or one JSON object per line, ``secrets`` scrubbed."""
    handler = logging.StreamHandler()
    handler.addFilter(ScrubSecrets(secrets or []))
    if log_format == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(processName)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("rq").setLevel(level)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def run_worker_process(
    spec: WorkerSpec,
    settings: Settings,
    redis_url: str,
    launcher_pid: int | None = None,
    told_to_stop: Any = None,
    spiders: SpiderSet | None = None,
) -> None:
    """Body of one worker process: its workers (``WorkerThreads``) until stopped, drained, or orphaned.

    ``launcher_pid``: the process that started this one; when it is gone, the workers stop.
    ``told_to_stop``: a ``multiprocessing.Event`` the launcher sets to stop them after their jobs.
    ``spiders``: the launcher's, when this process was forked from it (None: loaded here).
    """
    secrets = [secret for shard in shards_of(redis_url) for secret in url_secrets(shard.url)]
    configure_logging(spec.log_level, spec.log_format, secrets_of(settings) + secrets)
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
        threading.Thread(target=_give_back_free_memory, args=(libc,), name="malloc-trim", daemon=True).start()
    most = spec.threads or (MOST_DOWNLOAD_THREADS if spec.kind == "download" else 1)
    served = [shard for shard in shards_of(redis_url) if not spec.shards or shard.name in spec.shards]
    runtimes: list[Runtime] = []
    stop = threading.Event()
    if launcher_pid is not None:
        threading.Thread(
            target=_stop_when_orphaned, args=(launcher_pid, stop, told_to_stop), name="orphan-watch", daemon=True
        ).start()
    pace = FlushPace()  # every shard's counts written as often as one Redis's
    try:
        for shard in served:
            spiders = runtimes[0].spider_set if runtimes else spiders  # loaded once, whatever the shards
            runtimes.append(Runtime(worker_connection(shard.url, most), settings, spiders, pace))
        if len(runtimes) == 1:
            WorkerThreads(spec, runtimes[0].connection, runtimes[0], stop, most).run()
        else:
            ShardThreads(spec, runtimes, stop, most).run()
    finally:
        for rt in runtimes:
            rt.close()


def run_here(
    spec: WorkerSpec, settings: Settings, redis_url: str, processes: int = 1, spiders: SpiderSet | None = None
) -> int:
    """Run ``processes`` worker processes of ``spec``, this one among them; the worst exit code.

    ``spiders``: the ones this process loaded, which every worker process uses (``start_workers``).

    A launcher that only waited for its children would hold every module it imported for
    nothing: the command is the first worker process, and starts the others
    (``start_workers``) before any thread of its own. Signals reach it as they would a child
    (SIGTERM stops it after its jobs, a second one at once); when it ends, for whatever
    reason, it tells the others to stop after their jobs (``told_to_stop``, not a signal:
    one that already got Ctrl-C from the terminal must not take ours for a second one) and
    waits for them, STOP_WAIT seconds at most each. A crash is logged and exits 1, as a
    child's would.
    """
    told_to_stop = multiprocessing.get_context(start_method()).Event() if processes > 1 else None
    others = (
        start_workers([spec] * (processes - 1), settings, redis_url, told_to_stop, first=1, spiders=spiders)
        if processes > 1
        else []
    )
    multiprocessing.current_process().name = f"crawler-{spec.kind}-0"  # its log lines read as a child's
    code = 0
    try:
        run_worker_process(spec, settings, redis_url, spiders=spiders)
    except Exception:
        log.exception("the %s worker crashed", spec.kind)
        code = 1
    finally:
        if told_to_stop is not None:
            told_to_stop.set()
        join_or_kill(others)
    return max([code, *(abs(p.exitcode or 0) for p in others)])


def default_processes() -> int:
    """Download worker processes when not told: one per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: glibc's ``M_ARENA_MAX`` (``mallopt``) and the arenas a worker process keeps.
_M_ARENA_MAX = -8
#: Every thread that allocates gets a malloc arena of its own up to glibc's default (8 x
#: cores), each holding freed memory apart. Threads share the GIL anyway, so they gain
#: nothing from separate arenas.
MALLOC_ARENAS = 2
#: Seconds between two ``malloc_trim`` calls of a busy worker process (``_give_back_free_memory``).
TRIM_EVERY = 1.0
#: CPU seconds a process must have spent since its last trim for the next one to run: a trim
#: walks the whole heap, and an idle process has freed nothing.
TRIM_AFTER_CPU = 0.05


def _glibc() -> Any:
    """glibc's C library (``mallopt``, ``malloc_trim``), or None elsewhere (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 (both must exist)
    except (OSError, AttributeError):
        return None
    return libc


def _give_back_free_memory(libc: Any) -> None:
    """Return the pages malloc holds free to the system, every TRIM_EVERY seconds while busy, for good.

    glibc gives back only the free top of a heap; the pages freed in between stay counted in
    the process's memory until ``malloc_trim`` releases them. A process that spent under
    TRIM_AFTER_CPU since the last trim skips it (idle stays free).
    """
    trimmed_at = time.process_time()
    while True:
        time.sleep(TRIM_EVERY)
        if time.process_time() - trimmed_at >= TRIM_AFTER_CPU:
            libc.malloc_trim(0)
            trimmed_at = time.process_time()


#: Most download workers a process grows to unless told (``--threads``): a thread each, waiting on
#: its socket (a request in flight) or resting until its slow site's next turn (a paced batch: a
#: thread a site). The process's CPU, not its count of threads, is what limits it (docs/DEPLOYMENT.md).
MOST_DOWNLOAD_THREADS = 1024


class WorkerThreads:
    """A worker process's workers, one thread each, the first in the calling (main) thread.

    Parse: ``most`` workers from the start. Download: one, then one more each time a look
    finds work and no thread is left free to look for the next (``idle.IdleRoom.grow``), up
    to ``most``; a thread so added retires after ``idle.RETIRE_AFTER`` seconds unwanted. So
    a download process keeps as many requests in flight as its sites' gates and latencies
    allow, whatever they are, with no count to compute.
    """

    def __init__(self, spec: WorkerSpec, connection: Redis, rt: Runtime, stop: threading.Event, most: int):
        self.spec = spec
        self.connection = connection
        self.rt = rt
        self.stop = stop
        self.most = most
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started = 0

    def _make(self) -> DownloadWorker | ParseWorker:
        if self.spec.kind == "download":
            return DownloadWorker(self.connection, self.spec.sites, stop_event=self.stop, rt=self.rt)
        return ParseWorker(self.connection, self.spec.sites, stop_event=self.stop, rt=self.rt)

    def run(self) -> None:
        """Run the workers until the first (this thread's) ends, then stop the others and wait for them."""
        first = self._make()
        if isinstance(first, DownloadWorker):
            room = idle.shared(self.rt, DownloadWorker, self.spec.sites).room
            room.most = self.most
            room.grow = self.grow
        else:
            for _ in range(self.most - 1):
                self.grow()
        try:
            first.work(burst=self.spec.burst)
        finally:
            self.stop.set()
            for thread in self.threads():
                thread.join()

    def grow(self) -> bool:
        """Start one more worker in a thread of its own; False once the process is stopping.

        The worker is made in the new thread (``_grown``), not in the caller's: a download
        process grows from the thread that has just found a job, which goes on to run it.
        """
        if self.stop.is_set():
            return False
        with self._lock:
            self._started += 1
            thread = threading.Thread(target=self._grown, name=f"{self.spec.kind}-{self._started}", daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return True

    def _grown(self) -> None:
        """A grown thread: makes its worker and runs it; a worker that cannot be made is logged, and
        the room told (it counted the thread as starting)."""
        try:
            worker = self._make()
        except Exception:
            log.exception("could not start one more worker thread")
            if self.spec.kind == "download":
                idle.shared(self.rt, DownloadWorker, self.spec.sites).room.not_started()
            return
        if isinstance(worker, DownloadWorker):
            worker.may_retire = True
        worker.work(burst=self.spec.burst)

    def threads(self) -> list[threading.Thread]:
        """The threads started besides the first (those that ended included, until the next ``grow``)."""
        with self._lock:
            return list(self._threads)


class ShardThreads:
    """A worker process serving several shards: each shard's workers (``WorkerThreads``) in a thread of
    their own, sharing nothing but the process; the main thread takes the signals.

    Each shard's workers stop on their own event, set once ``stop`` is (the orphan watch) or at
    the first SIGTERM or SIGINT; a second one exits at once (a job cut short is handed back by
    the reaper). In burst mode a shard's workers that found it drained start again after
    REST_BETWEEN_BURSTS (a site may move to it: ``crawler move``); the process ends once every
    shard's last run ended drained and all those runs fall within MOVE_LEAST seconds
    (``_all_drained``): a move is noted on both its shards for longer than that
    (``keys.moving``), so runs that close together cannot all miss a site in transit.
    """

    def __init__(self, spec: WorkerSpec, runtimes: Sequence[Runtime], stop: threading.Event, most: int):
        self.spec = spec
        self.stop = stop
        self.groups = [_ShardGroup(rt) for rt in runtimes]
        self.most = most
        self._signals = 0

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._serve, args=(group,), name=f"shard-{i}", daemon=True)
            for i, group in enumerate(self.groups)
        ]
        previous = self._take_signals()
        try:
            for thread in threads:
                thread.start()
            while any(thread.is_alive() for thread in threads):
                if self.stop.wait(0.1) or (self.spec.burst and self._all_drained()):
                    self._stop_all()
                for thread in threads:
                    thread.join(0.01)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _all_drained(self) -> bool:
        """Whether every shard's latest burst run (each ends on a count that found its shard drained)
        started and ended within MOVE_LEAST seconds of the others'."""
        runs = [group.last_run for group in self.groups if group.last_run is not None]
        if len(runs) < len(self.groups):
            return False
        return max(end for _, end in runs) - min(start for start, _ in runs) < MOVE_LEAST

    def _serve(self, group: _ShardGroup) -> None:
        while not group.stop.is_set():
            group.current = threading.Event()  # set by ``_stop_all`` too: this run's workers stop on it
            if group.stop.is_set():
                return
            started = time.monotonic()
            try:
                WorkerThreads(self.spec, group.rt.connection, group.rt, group.current, self.most).run()
            except Exception:
                log.exception("the %s workers of a shard crashed: stopping the process's others", self.spec.kind)
                self.stop.set()
                return
            if not self.spec.burst:
                return
            group.last_run = (started, time.monotonic())
            group.stop.wait(REST_BETWEEN_BURSTS)

    def _take_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {signum: signal.signal(signum, self._signalled) for signum in (signal.SIGTERM, signal.SIGINT)}

    def _signalled(self, signum: Any, frame: Any) -> None:
        if self._signals:
            log.warning("stopping now (a job cut short is handed back by the reaper)")
            raise SystemExit(1)
        self._signals += 1
        log.warning("stopping after the current jobs")
        self.stop.set()

    def _stop_all(self) -> None:
        for group in self.groups:
            group.stop.set()
            group.current.set()


#: Seconds a shard's burst workers that found it drained wait before they look again (``ShardThreads``).
REST_BETWEEN_BURSTS = 0.5
#: Seconds within which the last burst runs of every shard must fall for a process of several to end:
#: less than a move is noted for (at least ``ops.move.SETTLE``, 5 s).
MOVE_LEAST = 3.0


@dataclass
class _ShardGroup:
    """One shard's workers in a process of several: their runtime, their stop, their burst runs ended drained."""

    rt: Runtime
    stop: threading.Event = field(default_factory=threading.Event)
    #: The stop of the run under way (each burst run's workers end by setting theirs).
    current: threading.Event = field(default_factory=threading.Event)
    #: When its last burst run started and ended (on a count that found the shard drained).
    last_run: tuple[float, float] | None = None


#: Redis connections a worker thread may hold at once: its own calls (RQ's command channel and
#: the job leases are the process's: ``listener``, ``leases.LeaseKeeper``).
CONNECTIONS_PER_THREAD = 1
#: Connections of a worker process's other users: the watchdog, counters, outbox, robots, sitemaps,
#: the subscription, the lease keeper.
CONNECTIONS_FIXED = 20


def pool_size(threads: int) -> int:
    """The Redis pool of a worker process of ``threads`` workers: enough for all its users at once (and
    ``connection.connect``'s pool waits, rather than fails, should more be asked for)."""
    return CONNECTIONS_PER_THREAD * threads + CONNECTIONS_FIXED


def worker_connection(redis_url: str, threads: int) -> Redis:
    """The Redis client of a worker process of ``threads`` workers, its pool sized to them (``pool_size``)."""
    return connect(redis_url, max_connections=pool_size(threads))


#: Seconds between checks that a worker process's launcher is still alive.
ORPHAN_CHECK_EVERY = 1.0


def _stop_when_orphaned(launcher_pid: int, stop: threading.Event, told_to_stop: Any = None) -> None:
    """Stop this process's workers after their current job once the launcher is gone, or once
    it sets ``told_to_stop`` (its own workers ended: ``run_here``).

    A launcher killed outright (SIGKILL, OOM) cannot stop its workers; without this they
    would run on, unsupervised, until someone finds them. Their jobs are not lost either
    way: a job cut short is handed back by the reaper.
    """
    while True:
        if told_to_stop is not None and told_to_stop.is_set():
            stop.set()
            return
        if os.getppid() != launcher_pid:  # re-parented: the launcher died (maybe before we started)
            logging.getLogger("crawler.launcher").warning(
                "launcher (pid %d) is gone: stopping after the current job", launcher_pid
            )
            stop.set()
            return
        if stop.wait(ORPHAN_CHECK_EVERY):
            return


def start_method() -> str:
    """``fork`` when this process runs a single thread and can fork, else ``spawn`` (see the module docstring)."""
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def start_workers(
    specs: Sequence[WorkerSpec],
    settings: Settings,
    redis_url: str,
    told_to_stop: Any = None,
    first: int = 0,
    spiders: SpiderSet | None = None,
) -> list[Any]:
    """Start one process per spec (forked or spawned: ``start_method``); returns the processes.

    ``told_to_stop``: an event of the same start method that stops them after their jobs once
    set (``run_here``). ``first``: the number in the first one's name (``crawler-download-1``).
    ``spiders``: this process's, handed to forked processes, which then neither compile the
    sites' modules again nor hold a second copy of their classes; spawned ones load their own.
    """
    if not specs:
        return []
    forked = start_method() == "fork"
    context = multiprocessing.get_context("fork") if forked else multiprocessing.get_context("spawn")
    if forked:
        # Every object imported so far moves to a generation no collection visits: a child's
        # collections would otherwise write to each one's header, and the page holding it,
        # shared with this process until then, would be copied into the child.
        gc.collect()
        gc.freeze()
    processes = []
    with _main_module_left_out():
        for i, spec in enumerate(specs):
            process = context.Process(
                target=run_worker_process,
                args=(spec, settings, redis_url, os.getpid(), told_to_stop, spiders if forked else None),
                name=f"crawler-{spec.kind}-{first + i}",
            )
            process.start()
            processes.append(process)
    return processes


@contextmanager
def _main_module_left_out() -> Iterator[None]:
    """Processes spawned meanwhile do not run this process's ``__main__`` again.

    ``spawn`` has every child import the parent's main module, for objects pickled from it;
    a worker's all live in ``crawler``, so that import (the CLI, or a user's script and its
    top-level code) would only cost time. A bare module stands in while they start.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


#: Seconds a launcher waits for each worker process it stopped, before it kills it.
STOP_WAIT = 30.0


def stop_workers(processes: Sequence[Any], timeout: float = STOP_WAIT) -> None:
    """Ask every process to stop after its current job (SIGTERM), then wait."""
    for process in processes:
        if process.is_alive() and process.pid:
            try:
                os.kill(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    join_or_kill(processes, timeout)


def join_or_kill(processes: Sequence[Any], timeout: float = STOP_WAIT) -> None:
    """Wait for each process ``timeout`` seconds at most, then kill it."""
    for process in processes:
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()


def wait_for(processes: Sequence[Any]) -> int:
    """Wait for every process; Ctrl-C or SIGTERM stops them gracefully. Returns the worst exit code."""
    previous = signal.signal(signal.SIGTERM, lambda *_: stop_workers(processes))
    try:
        for process in processes:
            process.join()
    except KeyboardInterrupt:
        stop_workers(processes)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return max((abs(p.exitcode or 0) for p in processes), default=0)
