"""Frontier packs: entries of one push kept compressed together, refilled in order, counted exactly."""

from __future__ import annotations

import zlib

import pytest
from redis import Redis

from crawler.coord import keys, packs, quarantine
from crawler.coord.frontier import Frontier
from crawler.coord.scheduler import frontier_sizes
from crawler.coord.task import DownloadTask
from crawler.spiders.spider import Request

SITE = "packed"


def frontier(connection: Redis, batch: int = 1) -> Frontier:
    return Frontier(connection, SITE, ["shop.example"], 60, 60, batch=batch)


def entries(count: int) -> list[str]:
    return [DownloadTask(SITE, f"https://shop.example/p/{i}").to_entry() for i in range(count)]


@pytest.mark.unit
def test_a_push_of_a_few_entries_is_left_as_it_is_and_of_many_is_packed_in_runs() -> None:
    few = entries(packs.PACK_LEAST - 1)
    assert packs.pack(few) == (few, 0)
    many = entries(2 * packs.PACK_MOST + 1)
    elements, extra = packs.pack(many)
    assert len(elements) == 3 and elements[2] == many[-1]  # a run of one is left as it is
    assert extra == 2 * (packs.PACK_MOST - 1)
    unpacked = [entry.decode() for element in elements for entry in packs.unpack(element)]  # type: ignore[arg-type]
    assert unpacked == many


@pytest.mark.unit
def test_taking_part_of_a_pack_leaves_the_rest_packed_in_its_place() -> None:
    elements, _ = packs.pack(entries(20))
    head = [e if isinstance(e, bytes) else e.encode() for e in elements]
    taken = packs.take(head, 7)
    assert [e.decode() for e in taken.entries] == entries(7)
    assert (taken.whole, taken.extra) == (0, -19 + 12)
    assert taken.rest is not None and [e.decode() for e in packs.unpack(taken.rest)] == entries(20)[7:]
    last = packs.take([taken.rest], 1000)
    assert (len(last.entries), last.whole, last.rest, last.extra) == (13, 1, None, -12)


@pytest.mark.unit
def test_a_pack_that_does_not_decompress_or_inflates_past_the_cap_is_refused() -> None:
    with pytest.raises(ValueError):
        packs.unpack(packs.PACK_MARK + b"not zlib")
    bomb = packs.PACK_MARK + zlib.compress(b"[" * (packs.UNPACKED_MOST + 1))
    with pytest.raises(ValueError):
        packs.unpack(bomb)
    taken = packs.take([packs.PACK_MARK + b"junk", entries(1)[0].encode()], 5)
    assert [bad for bad, _ in taken.refused] == [packs.PACK_MARK + b"junk"]
    assert len(taken.entries) == 1 and taken.whole == 2


def test_a_packed_frontier_is_refilled_in_order_counted_exactly_and_keeps_what_its_tasks_carry(
    redis_conn: Redis,
) -> None:
    """Priorities, request bodies, refresh times and callbacks kept; the order as pushed; the count
    (``frontier_sizes``) exact at every step, down to no list, no level and no extra count left."""
    front = frontier(redis_conn, batch=3)
    posts = [
        Request(f"https://shop.example/api/{i}", method="POST", body=b'{"page": %d}' % i, callback="parse_api")
        for i in range(40)
    ]
    front.add([Request(f"https://shop.example/p/{i}") for i in range(300)] + posts)
    front.add([Request(f"https://shop.example/top/{i}", priority=5) for i in range(30)])
    assert redis_conn.llen(keys.frontier(SITE)) < 10  # 340 entries in a few elements
    assert frontier_sizes(redis_conn, [SITE]) == [370]
    urls: list[str] = []
    while True:
        made = front.refill(4)
        if not made:
            break
        assert frontier_sizes(redis_conn, [SITE])[0] == 370 - len(urls) - sum(
            len(job.args) for job in front.queue.get_jobs()
        )
        for job in front.queue.get_jobs():
            urls += [task["url"] for task in job.args]
            front.queue.remove(job)
        redis_conn.delete(keys.queued(SITE))
    assert urls == (
        [f"https://shop.example/top/{i}" for i in range(30)]
        + [f"https://shop.example/p/{i}" for i in range(300)]
        + [f"https://shop.example/api/{i}" for i in range(40)]
    )
    assert frontier_sizes(redis_conn, [SITE]) == [0]
    assert not redis_conn.exists(keys.frontier(SITE), keys.frontier(SITE, 5), keys.levels(SITE))
    assert not redis_conn.hgetall(keys.frontier_extra(SITE)) or set(redis_conn.hvals(keys.frontier_extra(SITE))) == {
        b"0"
    }


def test_a_packed_post_comes_out_of_the_frontier_as_it_went_in(redis_conn: Redis) -> None:
    front = frontier(redis_conn)
    front.add(
        [Request(f"https://shop.example/api/{i}", method="POST", body=b"q=%d" % i, priority=2) for i in range(10)]
    )
    tasks = front.waiting()
    assert [(t.method, t.body, t.priority) for t in tasks] == [("POST", b"q=%d" % i, 2) for i in range(10)]


def test_a_pack_written_by_hand_that_does_not_decompress_is_quarantined_and_the_rest_refilled(
    redis_conn: Redis,
) -> None:
    front = frontier(redis_conn)
    front.add([Request(f"https://shop.example/p/{i}") for i in range(3)])
    redis_conn.lpush(keys.frontier(SITE), packs.PACK_MARK + b"not a pack")
    assert front.refill(8) == 3
    assert not redis_conn.exists(keys.frontier(SITE))
    assert any(b"not a pack" in str(entry).encode() for entry in quarantine.entries(redis_conn))
