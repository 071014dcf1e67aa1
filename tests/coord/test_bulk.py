"""``read_many``: a pipeline's replies, raw, in one round trip; the connection left as clean as a pipeline leaves it."""

from __future__ import annotations

import pytest
from crawling import count_round_trips
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, ResponseError
from redis.retry import Retry

from crawler.coord.bulk import KEYS_AT_ONCE, any_exist, pairs, read_chunks, read_many, transact_many


def fill(connection: Redis) -> None:
    connection.rpush("list", "a", "b", "c")
    connection.zadd("zset", {"x": 1, "y": 2})
    connection.hset("hash", mapping={"f": "1", "g": "2"})
    connection.set("string", "text")


COMMANDS = [
    ("LLEN", "list"),
    ("LLEN", "none"),
    ("ZCARD", "zset"),
    ("HGETALL", "hash"),
    ("HGETALL", "none"),
    ("HMGET", "hash", "f", "nope", "g"),
    ("GET", "string"),
    ("LRANGE", "list", 0, -1),
]


def test_the_replies_are_a_pipelines_raw_in_one_round_trip(redis_conn: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(redis_conn)
    stored = redis_conn.hgetall("hash")
    sends = count_round_trips(monkeypatch)
    replies = read_many(redis_conn, COMMANDS * 1000)
    assert len(sends) == 1
    assert replies == replies[:8] * 1000
    hashes = [pairs(replies[3]), pairs(replies[4])]  # a flat list of fields and values, or a dict over RESP3
    assert [*replies[:3], *replies[5:8]] == [3, 0, 2, [b"1", None, b"2"], b"text", [b"a", b"b", b"c"]]
    assert hashes == [stored, {}] == [{b"f": b"1", b"g": b"2"}, {}]
    assert read_many(redis_conn, []) == [] and len(sends) == 1  # nothing to read: nothing sent


def test_an_error_reply_raises_after_every_reply_is_read_and_the_connection_reads_on(redis_conn: Redis) -> None:
    fill(redis_conn)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        read_many(redis_conn, [("LLEN", "list"), ("LLEN", "hash"), ("ZCARD", "zset")])
    assert redis_conn.connection_pool._created_connections == 1  # type: ignore[attr-defined]
    assert read_many(redis_conn, [("ZCARD", "zset")]) == [2]  # no reply of the failed call is left to read
    assert redis_conn.llen("list") == 3


def test_a_connection_lost_is_retried_as_the_client_retries(redis_conn: Redis, redis_url: str) -> None:
    fill(redis_conn)
    own = redis_conn.client_id()  # the pool's one connection, which read_many takes next
    cut(redis_url, own)
    assert read_many(redis_conn, [("LLEN", "list")]) == [3]


def test_it_reads_fakeredis_too(fake_redis: Redis) -> None:
    fill(fake_redis)
    replies = read_many(fake_redis, COMMANDS[:6])
    assert [*replies[:3], pairs(replies[3]), pairs(replies[4]), replies[5]] == [
        3,
        0,
        2,
        {b"f": b"1", b"g": b"2"},
        {},
        [b"1", None, b"2"],
    ]


def test_pairs_reads_a_hash_over_resp2_and_resp3() -> None:
    assert pairs([b"a", b"1", b"b", b"2"]) == {b"a": b"1", b"b": b"2"}
    assert pairs({b"a": b"1"}) == {b"a": b"1"}
    assert pairs([]) == {}


def test_a_transaction_sent_raw_runs_as_one_and_answers_as_the_clients_raw_replies(redis_conn: Redis) -> None:
    """``transact_many``: MULTI, the commands, EXEC, in one send; a command refused as it runs raises
    once the others ran (as a client's transaction does), one refused as it is queued runs nothing."""
    with redis_conn.pipeline(transaction=True) as pipe:  # queued as the crawler queues them, never sent
        pipe.rpush("l", "a", "b")
        pipe.zadd("z", {"m": 1}, nx=True)
        pipe.sadd("s", "x")
        pipe.zrangebyscore("z", "-inf", "(5", start=0, num=1)
        pipe.llen("l")
        assert transact_many(redis_conn, [args for args, _ in pipe.command_stack]) == [2, 1, 1, [b"m"], 2]
    assert transact_many(redis_conn, []) == []
    redis_conn.set("str", "v")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        transact_many(redis_conn, [("RPUSH", "l", "c"), ("LPUSH", "str", "x"), ("SADD", "s", "y")])
    assert redis_conn.llen("l") == 3 and redis_conn.sismember("s", "y")  # the others ran
    with pytest.raises(ResponseError):
        transact_many(redis_conn, [("RPUSH", "l", "d"), ("NOSUCHCOMMAND",)])
    assert redis_conn.llen("l") == 3  # nothing ran


def test_chunks_are_read_in_order_with_the_next_one_sent_before_the_replies_are_read(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(redis_conn)
    sends = count_round_trips(monkeypatch)
    chunks = [COMMANDS[:3], COMMANDS[3:], [], COMMANDS[:1] * 500]
    reads = read_chunks(redis_conn, iter(chunks))
    first = next(reads)
    assert len(sends) == 2  # the first chunk, and the next one sent before the first's replies were read
    got = [first, *reads]
    assert len(sends) == 3 and redis_conn.connection_pool._created_connections == 1  # type: ignore[attr-defined]
    assert got == [read_many(redis_conn, chunk) for chunk in chunks]
    before = len(sends)
    assert list(read_chunks(redis_conn, [])) == [] and len(sends) == before  # nothing to read: nothing sent


def test_chunks_error_reply_raises_with_its_chunk_and_the_connection_is_dropped(redis_conn: Redis) -> None:
    fill(redis_conn)
    reads = read_chunks(redis_conn, [[("LLEN", "list")], [("LLEN", "hash")], [("ZCARD", "zset")]])
    assert next(reads) == [3]
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        next(reads)
    assert read_many(redis_conn, [("ZCARD", "zset")]) == [2]  # no reply of the unread chunk is read later


def cut(redis_url: str, client_id: int) -> None:
    """Kill the connection ``client_id`` from another client, as a network cut or a restart would."""
    other = Redis.from_url(redis_url)
    try:
        other.client_kill_filter(_id=client_id)
    finally:
        other.close()


def test_chunks_in_flight_are_sent_again_on_a_connection_lost(redis_conn: Redis, redis_url: str) -> None:
    fill(redis_conn)
    client = Redis.from_url(redis_url, retry=Retry(NoBackoff(), 1))  # one retry (the crawler's clients: none)
    own = client.client_id()  # the pool's one connection, which read_chunks takes next
    # The second chunk waits in Redis (a pop of an empty list, 0.2 s at most) while the connection is cut.
    reads = read_chunks(client, [[("LLEN", "list")], [("BLPOP", "empty", 0.2)], [("GET", "string")]])
    assert next(reads) == [3]
    cut(redis_url, own)
    try:
        assert list(reads) == [[None], [b"text"]]  # the second and third chunks sent again, on a new connection
        assert client.client_id() != own
    finally:
        client.close()


def test_chunks_raise_a_connection_lost_when_the_client_does_not_retry(redis_conn: Redis, redis_url: str) -> None:
    fill(redis_conn)
    own = redis_conn.client_id()
    reads = read_chunks(redis_conn, [[("LLEN", "list")], [("BLPOP", "empty", 0.2)], [("GET", "string")]])
    assert next(reads) == [3]
    cut(redis_url, own)
    with pytest.raises(ConnectionError):
        list(reads)
    assert read_many(redis_conn, [("LLEN", "list")]) == [3]


def test_chunks_left_before_their_end_close_their_connection(redis_conn: Redis) -> None:
    fill(redis_conn)
    reads = read_chunks(redis_conn, [[("LLEN", "list")], [("ZCARD", "zset")]])
    assert next(reads) == [3]
    reads.close()  # the second chunk's replies are unread
    assert read_many(redis_conn, [("GET", "string")]) == [b"text"]


def test_any_exist_says_which_groups_name_a_key_in_a_few_commands_whatever_their_number(redis_conn: Redis) -> None:
    """Five keys a group, 2,000 groups: one EXISTS a batch of KEYS_AT_ONCE keys, then one a group of a batch
    that named a key only; an emptied list is no key; a group of no keys exists not."""
    groups = [[f"g{i}:{kind}" for kind in "abcde"] for i in range(2000)]
    redis_conn.delete(*(key for group in groups[:50] for key in group))

    def counted() -> tuple[list[bool], int]:
        before = int(redis_conn.info("stats")["total_commands_processed"])
        found = any_exist(redis_conn, [*groups, []])
        return found, int(redis_conn.info("stats")["total_commands_processed"]) - before - 1

    found, spent = counted()
    assert found == [False] * 2001 and spent == 2000 * 5 // KEYS_AT_ONCE
    redis_conn.rpush("g7:c", "x")
    redis_conn.zadd("g1999:e", {"m": 1})
    redis_conn.rpush("g8:a", "y")
    redis_conn.lpop("g8:a")  # emptied: no key
    found, spent = counted()
    assert [i for i, one in enumerate(found) if one] == [7, 1999]
    assert spent == 2000 * 5 // KEYS_AT_ONCE + 2 * KEYS_AT_ONCE // 5  # the two batches that named one, a group each
    redis_conn.delete("g7:c", "g1999:e")
