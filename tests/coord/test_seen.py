"""The seen set as seen tables (``coord.seen``, ``lua/_seen_table.lua``): 64-bit fingerprints as
integers in sub-sets Redis keeps as intsets, exact, their number growing with the site."""

from __future__ import annotations

import re
import time

import pytest
from redis import Redis

import crawler.coord.seen
from crawler.coord import keys, lua, redisclock
from crawler.coord.frontier import Frontier
from crawler.coord.seen import (
    SEEN_BUCKETS,
    chunk_of,
    contains,
    fingerprints_of,
    mark_seen_together,
    member,
    migrate,
    stored,
)
from crawler.coord.task import fingerprint
from crawler.ops.reset import reset_site

SITE = "shop"
#: Fingerprints at the edges of signed 64 bits and of the nine decimal digits a sub-set is chosen by.
EDGE_VALUES = (0, 1, -1, 5, -5, 10**9 - 1, -(10**9) + 1, 10**9, -(10**9), 2**63 - 1, -(2**63), 2**53 + 1, -(2**53) - 1)
EDGES = [value.to_bytes(8, "big", signed=True) for value in EDGE_VALUES]


def frontier(connection: Redis, site: str = SITE, revisit_after: float | None = None) -> Frontier:
    return Frontier(connection, site, ["example.com"], 60, 60, revisit_after=revisit_after)


def mark(front: Frontier, urls: list[str]) -> list[bool]:
    """Whether each URL was new, as a parse step asks (calls of SEEN_CHUNK)."""
    return mark_seen_together([(front.seen, list(urls))])[0]


def add_fingerprints(connection: Redis, fingerprints: list[bytes], site: str = SITE) -> str:
    """ADD_SEEN of raw fingerprints; its reply ("1" new, "0" seen, per fingerprint)."""
    packed, raw, _ = chunk_of(fingerprints)
    reply = lua.script(connection, "add_seen")(
        keys=[keys.seen_table(site), keys.seen(site)], args=[packed, raw, crawler.coord.seen.SUBSET_LOAD, "", ""]
    )
    return (reply.decode() if isinstance(reply, bytes) else str(reply)).partition(":")[0]


def subsets(connection: Redis, table: str) -> list[bytes]:
    named = re.compile(re.escape(table.encode()) + rb":\d+")
    return [key for key in connection.scan_iter(match=table + ":*", count=1000) if named.fullmatch(key)]


def check_table(connection: Redis, table: str) -> dict[str, int]:
    """The table's state, after checking that every member is in the sub-set its address names,
    that its count is the sum of its sub-sets', and that no sub-set is left over."""
    state = {k.decode(): int(v) for k, v in connection.hgetall(table).items()}
    level, split = state["l"], state["s"]
    total = 0
    for key in subsets(connection, table):
        index = int(key.rsplit(b":", 1)[1])
        assert index < 2**level + split, f"{key!r}: a sub-set beyond the table's {2**level + split}"
        for value in connection.smembers(key):
            h = abs(int(value)) % 10**9
            assert h % 2 ** (level + 1 if h % 2**level < split else level) == index, (value, key)
            total += 1
    assert total == state["n"]
    return state


def encodings(connection: Redis, table: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for key in subsets(connection, table):
        name = connection.object("encoding", key)
        text = name.decode() if isinstance(name, bytes) else str(name)
        found[text] = found.get(text, 0) + 1
    return found


# -- encoding, no Redis -------------------------------------------------------------------------


@pytest.mark.unit
def test_a_member_is_the_fingerprint_as_a_signed_decimal_and_gives_it_back() -> None:
    for fp in [*EDGES, fingerprint("http://example.com/")]:
        value = member(fp)
        assert re.fullmatch(rb"-?[1-9][0-9]*|0", value), value  # canonical: what an intset takes
        assert int(value).to_bytes(8, "big", signed=True) == fp
    assert member(b"\xff" * 8) == b"-1" and member(b"\x80" + b"\x00" * 7) == b"-9223372036854775808"


@pytest.mark.unit
def test_a_chunk_is_a_msgpack_array_of_members_then_their_last_nine_digits() -> None:
    packed, raw, shape = chunk_of(EDGES)
    assert raw == b"".join(EDGES) and shape == b""
    assert packed[0] == 0xDD and int.from_bytes(packed[1:5], "big") == 2 * len(EDGES)
    at, strings = 5, []
    for _ in EDGES:  # fixstr: 0xa0 | length, then the bytes
        length = packed[at] - 0xA0
        strings.append(packed[at + 1 : at + 1 + length])
        at += 1 + length
    addresses = []
    for _ in EDGES:  # uint32: 0xce, then 4 bytes
        assert packed[at] == 0xCE
        addresses.append(int.from_bytes(packed[at + 1 : at + 5], "big"))
        at += 5
    assert at == len(packed)
    assert strings == [member(fp) for fp in EDGES]
    assert addresses == [int(s.lstrip(b"-")[-9:]) for s in strings]


# -- the tables, on a real Redis ------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_at_100k_urls_every_sub_set_is_an_intset_and_dedup_is_exact(redis_conn: Redis) -> None:
    front = frontier(redis_conn)
    urls = [f"http://example.com/p/{n}" for n in range(100_000)]
    assert all(mark(front, urls))
    table = keys.seen_table(SITE)
    state = check_table(redis_conn, table)
    assert state["n"] == 100_000 and 2 ** state["l"] + state["s"] == 100_000 // crawler.coord.seen.SUBSET_LOAD
    assert encodings(redis_conn, table) == {"intset": 500}
    assert max(redis_conn.scard(key) for key in subsets(redis_conn, table)) < 512
    others = [f"http://example.com/q/{n}" for n in range(100_000)]
    assert all(mark(front, others))  # no false "seen" on URLs never added
    assert not any(mark(front, urls + others))  # and every one added is seen
    assert encodings(redis_conn, table) == {"intset": 1000}
    assert stored(redis_conn, SITE)[1] == 200_000


def test_splits_across_levels_keep_every_member_where_its_address_says(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(crawler.coord.seen, "SUBSET_LOAD", 3)
    front = frontier(redis_conn)
    table = keys.seen_table(SITE)
    assert add_fingerprints(redis_conn, EDGES) == "1" * len(EDGES)
    added = list(EDGES)
    levels = set()
    for size in (1, 2, 7, 1, 30, 3, 100, 1, 250, 600):
        urls = [f"http://example.com/{len(added)}/{i}" for i in range(size)]
        assert all(mark(front, urls))
        added += [fingerprint(url) for url in urls]
        state = check_table(redis_conn, table)
        levels.add(state["l"])
        assert state["n"] == len(added) and state["n"] <= 3 * (2 ** state["l"] + state["s"])
        assert add_fingerprints(redis_conn, added) == "0" * len(added)
    assert len(levels) >= 6 and max(levels) == 8  # 1,008 members, 3 a sub-set: 2^8 + 80 of them
    assert fingerprints_of(redis_conn, SITE) == set(added)
    assert all(contains(redis_conn, SITE, fp) for fp in added)
    assert not contains(redis_conn, SITE, fingerprint("http://example.com/never"))
    # A repeated fingerprint within one call is new once.
    fresh = [fingerprint("http://example.com/twice")] * 2 + [EDGES[0]]
    assert add_fingerprints(redis_conn, fresh) == "100"


def test_a_sub_set_grown_past_an_intset_is_written_anew_when_split(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table filled with a larger load (or on a server with a smaller set-max-intset-entries) has
    hash-table sub-sets; splitting them writes them again, as intsets."""
    front, table = frontier(redis_conn), keys.seen_table(SITE)
    monkeypatch.setattr(crawler.coord.seen, "SUBSET_LOAD", 1000)
    urls = [f"http://example.com/{n}" for n in range(1_500)]
    assert all(mark(front, urls))
    assert encodings(redis_conn, table) == {"hashtable": 2}
    monkeypatch.setattr(crawler.coord.seen, "SUBSET_LOAD", 200)
    assert mark(front, ["http://example.com/one-more"]) == [True]
    assert encodings(redis_conn, table) == {"intset": 8}
    check_table(redis_conn, table)
    assert not any(mark(front, urls))


def test_forget_drops_one_url_from_the_sub_set_it_is_in(redis_conn: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crawler.coord.seen, "SUBSET_LOAD", 5)
    front = frontier(redis_conn)
    urls = [f"http://example.com/{n}" for n in range(200)]
    mark(front, urls)
    front.forget(urls[77])
    assert check_table(redis_conn, keys.seen_table(SITE))["n"] == 199
    assert mark(front, urls) == [n == 77 for n in range(200)]


def test_seen_for_a_while_each_time_bucket_is_a_table_whose_every_key_expires(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(crawler.coord.seen, "SUBSET_LOAD", 4)
    front = frontier(redis_conn, revisit_after=3600.0)
    urls = [f"http://example.com/{n}" for n in range(300)]
    assert all(mark(front, urls)) and not any(mark(front, urls))
    now = redisclock.now_ms(redis_conn)
    width = 3600_000 // SEEN_BUCKETS
    (window,) = [k for k in redis_conn.scan_iter(match=keys.seen_window(SITE, 0)[:-1] + "*") if k.count(b":") == 4]
    assert window == keys.seen_window(SITE, int(now // width)).encode()
    state = check_table(redis_conn, window.decode())
    assert state["n"] == 300 and 2 ** state["l"] + state["s"] == 75 and len(subsets(redis_conn, window.decode())) > 60
    for key in [window, *subsets(redis_conn, window.decode())]:
        assert 3600_000 < redis_conn.pttl(key) <= 3600_000 + width + 1000, key
    assert not redis_conn.exists(keys.seen_table(SITE))
    assert stored(redis_conn, SITE)[1] == 300


def test_reset_deletes_every_sub_set_table_and_old_set_and_counts_them(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(crawler.coord.seen, "SUBSET_LOAD", 10)
    mark(frontier(redis_conn), [f"http://example.com/{n}" for n in range(1_000)])
    mark(frontier(redis_conn, revisit_after=60.0), [f"http://example.com/w/{n}" for n in range(100)])
    redis_conn.sadd(keys.seen(SITE), *(fingerprint(f"http://example.com/old/{n}") for n in range(7)))
    mark(frontier(redis_conn, "other"), ["http://example.com/other"])
    found, count = stored(redis_conn, SITE)
    assert count == 1_107 and len(found) > 100
    assert reset_site(redis_conn, SITE).seen == 1_107
    assert redis_conn.keys(keys.seen(SITE) + "*") == []
    assert stored(redis_conn, "other")[1] == 1  # another site's left as it was
    assert all(mark(frontier(redis_conn), ["http://example.com/1", "http://example.com/old/1"]))


def test_a_crawl_begun_before_seen_tables_keeps_its_old_set_and_migrates(redis_conn: Redis) -> None:
    """The set of 8-byte members a crawl kept before seen tables is read; a URL met there moves into
    the table; migrate moves the rest, every URL seen throughout."""
    front = frontier(redis_conn)
    old = [f"http://example.com/old/{n}" for n in range(12_000)]
    redis_conn.sadd(keys.seen(SITE), *(fingerprint(url) for url in old))
    new = [f"http://example.com/new/{n}" for n in range(1_000)]
    assert mark(front, old[:100] + new) == [False] * 100 + [True] * 1_000
    assert redis_conn.scard(keys.seen(SITE)) == 11_900  # the 100 met moved into the table
    assert check_table(redis_conn, keys.seen_table(SITE))["n"] == 1_100
    assert stored(redis_conn, SITE)[1] == 13_000
    assert contains(redis_conn, SITE, fingerprint(old[5])) and contains(redis_conn, SITE, fingerprint(old[500]))
    assert not contains(redis_conn, SITE, fingerprint("http://example.com/never"))
    for url in (old[5], old[500]):  # forgotten from the table, or from the old set
        front.forget(url)
        assert mark(front, [url]) == [True]
    assert redis_conn.scard(keys.seen(SITE)) == 11_899 and stored(redis_conn, SITE)[1] == 13_000
    assert migrate(redis_conn, SITE) == 11_899
    assert not redis_conn.exists(keys.seen(SITE))
    assert check_table(redis_conn, keys.seen_table(SITE))["n"] == 13_000
    assert not any(mark(front, old + new))
    assert migrate(redis_conn, SITE) == 0


def test_once_no_old_set_is_left_the_table_says_so_and_no_call_looks_for_one_again(redis_conn: Redis) -> None:
    """Each call looked for the set of before seen tables (an EXISTS a page's links); once it is found
    gone (here: never made, or emptied by migration) the table holds o = 1 and calls look no more."""
    front = frontier(redis_conn)

    def exists_calls(urls: list[str]) -> int:
        before = int(redis_conn.info("commandstats").get("cmdstat_exists", {}).get("calls", 0))
        mark(front, urls)
        return int(redis_conn.info("commandstats").get("cmdstat_exists", {}).get("calls", 0)) - before

    assert exists_calls(["http://example.com/1"]) == 1
    assert redis_conn.hget(keys.seen_table(SITE), "o") == b"1"
    assert exists_calls(["http://example.com/2", "http://example.com/1"]) == 0
    other = frontier(redis_conn, "migrating")
    redis_conn.sadd(keys.seen("migrating"), fingerprint("http://example.com/old"))
    assert mark(other, ["http://example.com/old"]) == [False]  # read from the old set, moved into the table
    assert redis_conn.hget(keys.seen_table("migrating"), "o") is None
    assert mark(other, ["http://example.com/x"]) == [True]  # the old set is empty now: found gone
    assert redis_conn.hget(keys.seen_table("migrating"), "o") == b"1"


def test_old_time_buckets_are_read_while_they_last(redis_conn: Redis) -> None:
    front = frontier(redis_conn, revisit_after=60.0)
    seconds, micros = redis_conn.time()
    current = (int(seconds) * 1000 + int(micros) // 1000) // front.seen.bucket_width_ms
    redis_conn.sadd(keys.seen_bucket(SITE, current - 1), fingerprint("http://example.com/a"))
    assert mark(front, ["http://example.com/a", "http://example.com/b"]) == [False, True]
    assert redis_conn.scard(keys.seen_bucket(SITE, current - 1)) == 1


def test_the_dedup_of_a_table_asks_once_a_sub_set(redis_conn: Redis) -> None:
    front = frontier(redis_conn)
    mark(front, [f"http://example.com/{n}" for n in range(2_000)])  # 10 sub-sets
    before = redis_conn.info("commandstats")
    started = time.perf_counter()
    assert not any(mark(front, [f"http://example.com/{n}" for n in range(2_000)]))
    assert time.perf_counter() - started < 5
    after = redis_conn.info("commandstats")

    def calls(name: str) -> int:
        return int(after.get(f"cmdstat_{name}", {}).get("calls", 0)) - int(
            before.get(f"cmdstat_{name}", {}).get("calls", 0)
        )

    assert calls("smismember") + calls("sismember") == 10
    assert calls("sadd") == 0


def test_a_table_with_more_sub_sets_than_links_is_asked_one_sismember_a_link(redis_conn: Redis) -> None:
    front = frontier(redis_conn)
    urls = [f"http://example.com/{n}" for n in range(4_000)]  # 20 sub-sets
    mark(front, urls)
    before = redis_conn.info("commandstats")
    page = urls[:9] + ["http://example.com/new", urls[3]]  # 11 links (10 distinct), 20 sub-sets
    assert mark(front, page) == [False] * 9 + [True, False]
    after = redis_conn.info("commandstats")

    def calls(name: str) -> int:
        return int(after.get(f"cmdstat_{name}", {}).get("calls", 0)) - int(
            before.get(f"cmdstat_{name}", {}).get("calls", 0)
        )

    assert calls("sismember") == 10 and calls("smismember") == 0
    assert calls("sadd") == 1 + 1  # the new link, and the split 4,001 URLs make
    assert check_table(redis_conn, keys.seen_table(SITE))["n"] == 4_001


@pytest.mark.unit
def test_given_the_shape_a_chunk_names_each_members_sub_set_as_the_script_would() -> None:
    fps = [fingerprint(f"http://example.com/{n}") for n in range(50)]
    level, split = 5, 19  # 51 sub-sets: as many as members or more
    packed, _, shape = chunk_of(fps, (level, split))
    assert shape == b"5 19" and int.from_bytes(packed[1:5], "big") == 3 * 50
    numbers = [int(n) for n in re.findall(rb"[\xa0-\xbf]([0-9]+)", packed[-50 * 4 :])][-50:]
    for fp, number in zip(fps, numbers, strict=True):
        h = abs(int(member(fp))) % 10**9
        assert number == (h % 2 ** (level + 1) if h % 2**level < split else h % 2**level)
    assert chunk_of(fps, (5, 17))[2] == b""  # 49 sub-sets, fewer than members: the script groups them


def test_the_shape_of_the_last_reply_names_the_next_calls_sub_sets_and_a_stale_one_is_ignored(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    front = frontier(redis_conn)
    urls = [f"http://example.com/{n}" for n in range(3_000)]  # 15 sub-sets
    assert all(mark(front, urls))
    table = keys.seen_table(SITE)
    state = check_table(redis_conn, table)
    assert crawler.coord.seen._shapes[table] == (state["l"], state["s"]) == (3, 7)
    shapes: list[bytes] = []
    chunk_of_ = crawler.coord.seen.chunk_of
    monkeypatch.setattr(
        crawler.coord.seen, "chunk_of", lambda fps, shape=None: (c := chunk_of_(fps, shape), shapes.append(c[2]))[0]
    )
    page = urls[100:110] + ["http://example.com/new"]
    assert mark(front, page) == [False] * 10 + [True]
    assert shapes == [b"3 7"]  # 3,001 URLs: a split, 16 sub-sets, level 4
    assert crawler.coord.seen._shapes[table] == (4, 0)
    crawler.coord.seen._shapes[table] = (3, 6)  # as if another process had changed it since
    assert mark(front, urls[200:210] + ["http://example.com/new2"]) == [False] * 10 + [True]
    assert shapes[-1] == b"3 6" and crawler.coord.seen._shapes[table] == (4, 0)
    crawler.coord.seen._shapes[table] = (5, 0)  # a level it never had
    assert not any(mark(front, urls[:14]))
    assert shapes[-1] == b"5 0" and check_table(redis_conn, table)["n"] == 3_002


def test_sites_that_find_the_script_unloaded_are_marked_again_together(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis that has not loaded ADD_SEEN (just started, or restarted mid-crawl) refuses every call of a
    batch: the first is made again on its own, which loads it, the others together; one at a time they
    were a round trip a site at the first seed of 10,000 sites."""
    import redis.connection

    sites = [frontier(redis_conn, f"site{i}") for i in range(50)]
    mark_seen_together([(sites[0].seen, ["http://example.com/warm"])])
    redis_conn.script_flush()
    sends: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command
    monkeypatch.setattr(
        redis.connection.AbstractConnection,
        "send_packed_command",
        lambda self, command, check_health=True: (sends.append(1), send(self, command, check_health))[1],
    )
    fresh = mark_seen_together([(f.seen, [f"http://example.com/{f.site}", "http://example.com/"]) for f in sites])
    assert len(sends) <= 5  # the batch, the first alone (refused, loaded, run), the others again
    monkeypatch.undo()
    assert fresh == [[True, True]] * 50
    assert mark_seen_together([(f.seen, ["http://example.com/"]) for f in sites]) == [[False]] * 50
