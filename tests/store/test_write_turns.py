"""Turns at a SQLite database's writer (``crawler.store.write_turns``): threads and processes queue."""

from __future__ import annotations

import multiprocessing
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from crawler.store import write_turns
from crawler.store.database import FetchRecord, Store
from crawler.store.write_turns import WriteTurns

HOLD = 0.05


def _hold_turns(database: str, times: int, log: str) -> None:
    """Take the writer's turn ``times`` times, holding each HOLD seconds; append (start, end) to ``log``."""
    turns = WriteTurns(database, lambda: None)
    for _ in range(times):
        with turns.turn():
            start = time.monotonic()
            time.sleep(HOLD)
            end = time.monotonic()
        with open(log, "a") as out:
            out.write(f"{start} {end}\n")


def _overlaps(spans: list[tuple[float, float]]) -> int:
    spans = sorted(spans)
    return sum(1 for (_, end), (start, _) in zip(spans, spans[1:], strict=False) if start < end)


@pytest.mark.integration
def test_processes_take_the_writers_turn_one_at_a_time(tmp_path: Path) -> None:
    database, log = str(tmp_path / "crawl.db"), str(tmp_path / "spans")
    fork = multiprocessing.get_context("fork")
    # Made before the fork: each child must still queue against the others (a flock a fork shared would not).
    WriteTurns(database, lambda: None)
    workers = [fork.Process(target=_hold_turns, args=(database, 4, log)) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
        assert worker.exitcode == 0
    spans = [tuple(map(float, line.split())) for line in Path(log).read_text().splitlines()]
    assert len(spans) == 12
    assert _overlaps(spans) == 0  # type: ignore[arg-type]
    assert (tmp_path / "crawl.db-writer").exists()


def test_threads_of_a_process_take_the_writers_turn_one_at_a_time(tmp_path: Path) -> None:
    turns = WriteTurns(str(tmp_path / "crawl.db"), lambda: None)
    spans: list[tuple[float, float]] = []

    def hold() -> None:
        with turns.turn():
            start = time.monotonic()
            time.sleep(HOLD / 5)
            spans.append((start, time.monotonic()))

    threads = [threading.Thread(target=hold) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(spans) == 8
    assert _overlaps(spans) == 0


def test_a_checkpoint_follows_every_so_many_writes_outside_the_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(write_turns, "CHECKPOINT_EVERY", 3)
    free: list[bool] = []
    turns: WriteTurns

    def checkpoint() -> None:  # another thread may take the turn meanwhile: the checkpoint holds none
        taker = threading.Thread(target=lambda: turns.turn().__enter__())
        taker.start()
        taker.join(2)
        free.append(not taker.is_alive())

    turns = WriteTurns(None, checkpoint)  # an in-memory database: threads still queue, no file
    for _ in range(7):
        with turns.turn():
            pass
        if free:
            break
    assert free == [True]


def test_a_sqlite_store_checkpoints_its_log_itself_and_keeps_it_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(write_turns, "CHECKPOINT_EVERY", 20)
    store = Store(f"sqlite:///{tmp_path / 'crawl.db'}")
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("PRAGMA wal_autocheckpoint")).scalar() == 0  # not at a commit, in a turn
        checkpoints: list[int] = []
        checkpoint = store._checkpoint
        monkeypatch.setattr(store._turns, "_checkpoint", lambda: checkpoints.append(1) or checkpoint())
        now = datetime.now(UTC)
        wal = tmp_path / "crawl.db-wal"
        sizes = []
        for n in range(200):
            url = f"https://s.test/{n}/" + "x" * 2000
            store.record_fetches([FetchRecord(site="s", url=url, outcome="ok", started=now, finished=now)])
            sizes.append(wal.stat().st_size)
        assert len(checkpoints) == 10
        # Checkpointed, the log is written again from its start: its size stops growing.
        assert sizes[-1] == max(sizes[-60:]) and max(sizes) < sizes[20] * 3
    finally:
        store.close()


def test_a_holder_frozen_in_its_turn_holds_the_others_up_turn_wait_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(write_turns, "TURN_WAIT", 0.3)
    database = str(tmp_path / "crawl.db")
    frozen, other = WriteTurns(database, lambda: None), WriteTurns(database, lambda: None)  # two open files
    held, release = threading.Event(), threading.Event()

    def freeze() -> None:
        with frozen.turn():
            held.set()
            release.wait(10)

    holder = threading.Thread(target=freeze)
    holder.start()
    try:
        assert held.wait(5)
        started = time.monotonic()
        with other.turn():  # goes ahead without the turn: SQLite's own wait decides from here
            waited = time.monotonic() - started
    finally:
        release.set()
        holder.join()
    assert 0.3 <= waited < 2.0
    started = time.monotonic()
    with other.turn():  # the turn free again: taken at once
        assert time.monotonic() - started < 0.1
