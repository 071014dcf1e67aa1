"""Worker processes: forked by a single-threaded launcher, and they live and die with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from redis import Redis

from crawler.work.launcher import start_method


def test_a_launcher_running_other_threads_spawns_its_workers() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        assert start_method() == "spawn"  # a fork would copy locks the other thread may hold
    finally:
        stop.set()
        other.join()


@pytest.mark.integration
def test_a_single_threaded_launcher_forks_its_workers() -> None:
    code = "from crawler.work.launcher import start_method; print(start_method())"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "fork"


@pytest.mark.integration
def test_forked_workers_find_the_launchers_objects_frozen() -> None:
    """Objects imported before the fork are frozen (``gc.freeze``): a child's collections leave
    their pages shared with the launcher instead of writing to every one of them."""
    code = """
import gc, sys
from crawler.work import launcher

def child(*args):
    sys.exit(0 if gc.get_freeze_count() > 1000 else 3)

launcher.run_worker_process = child
processes = launcher.start_workers([launcher.WorkerSpec("parse", ())], None, "redis://unused")
print(launcher.wait_for(processes))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "0", done.stderr


def worker_children(pid: int) -> list[int]:
    """Worker processes whose parent is ``pid``: forked (the launcher's command line) or spawned."""
    try:
        launcher = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        launcher = b""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and (b"spawn_main" in cmdline or cmdline == launcher):
            children.append(int(entry.name))
    return children


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def worker_command(redis_url: str, sqlite_url: str, sites: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from crawler.cli.app import main; main()",
        "--redis-url",
        redis_url,
        "--database-url",
        sqlite_url,
        "--sites",
        str(sites),
        "worker",
        *args,
    ]


def test_a_single_worker_process_is_the_command_itself(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    """``-n 1`` (the parse workers' default) runs the workers in the command's own process: no
    launcher beside it holding the same modules; SIGTERM stops it, exit code 0."""
    (tmp_path / "sites").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    command = worker_command(redis_url, sqlite_url, tmp_path / "sites", "parse")
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=open(tmp_path / "err.log", "w"), text=True)
    try:
        log = tmp_path / "err.log"
        deadline = time.monotonic() + 30
        while "worker process(es)" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the command never started its worker"
            time.sleep(0.1)
        time.sleep(1.0)  # a launcher would have forked its child by now
        assert process.poll() is None, log.read_text()
        assert worker_children(process.pid) == []
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()
        # The worker that stopped is named by its process: the command's own (host:pid:tag).
        assert f":{process.pid}:" in log.read_text().split("stopping after the current page")[0].splitlines()[-1]
    finally:
        if process.poll() is None:
            process.kill()


def test_the_command_is_the_first_of_its_worker_processes_and_stops_the_others_with_it(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    """``-n 2``: one forked child beside the command; SIGTERM to the command alone (as ``kill PID``
    sends it) stops both after their jobs, exit code 0."""
    (tmp_path / "sites").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    command = worker_command(redis_url, sqlite_url, tmp_path / "sites", "download", "-n", "2")
    log = tmp_path / "err.log"
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=open(log, "w"), text=True)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not (children := worker_children(process.pid)):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the second worker process never started"
            time.sleep(0.1)
        time.sleep(1.0)
        assert len(worker_children(process.pid)) == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()
        assert not any(alive(pid) for pid in children), "the forked worker outlived the command"
    finally:
        if process.poll() is None:
            process.kill()
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_workers_stop_when_their_launcher_is_killed(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    """The CLI forks its workers (no other thread runs yet); killed outright, they stop on their own."""
    (tmp_path / "sites").mkdir()
    command = worker_command(redis_url, sqlite_url, tmp_path / "sites", "download", "-n", "3")
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    launcher = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=open(tmp_path / "err.log", "w"), text=True)
    try:
        deadline = time.monotonic() + 30
        while len(children := worker_children(launcher.pid)) < 2:  # -n 3: the command is the third
            assert launcher.poll() is None, launcher.stderr.read() if launcher.stderr else ""
            assert time.monotonic() < deadline, "the worker processes never started"
            time.sleep(0.1)
        forked = [c for c in children if b"spawn_main" not in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert forked == children, "the CLI spawned its workers: each paid the imports again"
        launcher.send_signal(signal.SIGKILL)  # no chance to stop its workers itself
        launcher.wait()
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in children):
            assert time.monotonic() < deadline, f"orphaned workers still running: {children}"
            time.sleep(0.1)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in worker_children(launcher.pid):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_process_s_redis_pool_serves_all_its_threads_at_once_and_waits_when_full(redis_url: str) -> None:
    """Every user of a 64-thread download process (each thread's calls, its lease keeper, RQ's
    command channel) holds a connection at the same moment: none fails (issue 21: redis-py's
    default pool of 100 raised ``MaxConnectionsError`` and the launcher exited 1); one more
    waits for a free connection instead of failing."""
    import redis as redis_module

    from crawler.work.launcher import CONNECTIONS_PER_THREAD, worker_connection

    threads = 64
    connection = worker_connection(redis_url, threads)
    users = CONNECTIONS_PER_THREAD * threads + 1  # one past what the threads use: it waits its turn
    errors: list[BaseException] = []
    barrier = threading.Barrier(users)

    def hold() -> None:
        try:
            barrier.wait(30)
            connection.blpop(["crawler:test:nothing"], timeout=1)  # holds a connection for a second
        except (redis_module.RedisError, threading.BrokenBarrierError) as exc:
            errors.append(exc)

    started = time.monotonic()
    holders = [threading.Thread(target=hold) for _ in range(users)]
    for holder in holders:
        holder.start()
    for holder in holders:
        holder.join(60)
    took = time.monotonic() - started
    connection.close()
    assert not errors, f"{len(errors)} of {users} users failed: {errors[0]!r}"
    assert took < 30


@pytest.mark.integration
def test_a_worker_process_gives_freed_memory_back_to_the_system() -> None:
    """Pages freed in the middle of malloc's heap (kept from the system by glibc until trimmed)
    go back with the trim a worker process runs every TRIM_EVERY seconds."""
    code = """
import threading, time
from crawler.work import launcher

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

libc = launcher._glibc()
assert libc is not None, "not glibc"
# Blocks of 100 KiB (from the heap, below glibc's mmap threshold), every other one kept:
# freeing the rest leaves holes glibc cannot give back from the heap's top.
blocks = [bytearray(100_000) for _ in range(3000)]
kept = blocks[::2]
del blocks
before = rss_mib()
launcher.TRIM_EVERY = 0.05
launcher.TRIM_AFTER_CPU = 0.0
threading.Thread(target=launcher._give_back_free_memory, args=(libc,), daemon=True).start()
time.sleep(0.5)
print(before - rss_mib())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) > 100, f"only {done.stdout.strip()} MiB given back"


def test_an_idle_worker_process_does_not_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trim walks the whole heap: one a second costs an idle process CPU it has freed nothing for."""
    from crawler.work import launcher

    class Libc:
        trims = 0

        def malloc_trim(self, pad: int) -> None:
            Libc.trims += 1

    monkeypatch.setattr(launcher, "TRIM_EVERY", 0.01)
    monkeypatch.setattr(launcher, "TRIM_AFTER_CPU", 10.0)  # CPU this test's process will not spend meanwhile
    threading.Thread(target=launcher._give_back_free_memory, args=(Libc(),), daemon=True).start()
    time.sleep(0.3)
    assert Libc.trims == 0


@pytest.mark.unit
def test_a_process_of_several_shards_ends_its_burst_only_when_every_shard_s_last_run_falls_close_together() -> None:
    from typing import Any, cast

    from crawler.work.launcher import MOVE_LEAST, ShardThreads, WorkerSpec

    runtimes = cast(Any, [object(), object(), object()])
    threads = ShardThreads(WorkerSpec("download", ("a",), burst=True), runtimes, threading.Event(), 1)
    first, second, third = threads.groups
    first.last_run, second.last_run = (10.0, 10.2), (10.4, 10.5)
    assert not threads._all_drained()  # the third shard has not ended a run yet: it is busy
    third.last_run = (1.0, 10.6)  # a long run, since the start: a site may have moved while it ran
    assert not threads._all_drained()
    third.last_run = (11.0, 11.1)
    assert threads._all_drained()
    first.last_run = (11.1 - MOVE_LEAST, 10.2)  # runs spread over more than a move is noted for
    assert not threads._all_drained()


COUNTED_SPIDER = """
import os
from crawler import Spider

with open({log!r}, "a") as log:  # one line each time this module is run
    log.write(f"{{os.getpid()}}\\n")

class Counted(Spider):
    name = "counted"
    start_urls = ["http://127.0.0.1:9/"]
"""


@pytest.mark.integration
def test_forked_workers_use_the_launchers_spiders_and_compile_no_site_module_again(
    redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    """``crawler worker download -n 3``: the sites' modules run once, in the launcher (10,000 sites'
    classes compiled once, held once in pages the processes share), not once more in each process."""
    sites, log = tmp_path / "sites", tmp_path / "imports.log"
    sites.mkdir()
    (sites / "counted.py").write_text(COUNTED_SPIDER.format(log=str(log)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLER_") and k != "REDIS_URL"}
    cli = [sys.executable, "-c", "from crawler.cli.app import main; main()"]
    command = [*cli, "--redis-url", redis_url, "--database-url", sqlite_url, "--sites", str(sites)]
    command += ["worker", "download", "-n", "3", "--burst"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 download worker process(es)" in done.stderr
    assert len(log.read_text().split()) == 1, log.read_text()
