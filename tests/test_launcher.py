"""Worker processes live and die with the launcher that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from redis import Redis


def worker_children(pid: int) -> list[int]:
    """Worker processes (multiprocessing spawn children) whose parent is ``pid``."""
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
        if parent == pid and b"spawn_main" in cmdline:
            children.append(int(entry.name))
    return children


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_workers_stop_when_their_launcher_is_killed(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "sites").mkdir()
    command = [
        sys.executable,
        "-c",
        "from crawler.cli import main; main()",
        "--redis-url",
        redis_url,
        "--database-url",
        sqlite_url,
        "--sites",
        str(tmp_path / "sites"),
        "worker",
        "download",
        "-n",
        "2",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    launcher = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=open(tmp_path / "err.log", "w"), text=True)
    try:
        deadline = time.monotonic() + 30
        while len(children := worker_children(launcher.pid)) < 2:
            assert launcher.poll() is None, launcher.stderr.read() if launcher.stderr else ""
            assert time.monotonic() < deadline, "the worker processes never started"
            time.sleep(0.1)
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
