"""The Lua scripts (``crawler/lua``): headed by their KEYS and ARGV, touching only keys passed
in KEYS (none built inside, but for the sub-sets of seen tables: a script that says ``-- Built keys:``
in its header may touch ``KEYS[i] .. ':' .. n``, named from a key it was passed, in its slot, or
read the RQ hash of a job it hands out, ``prefix .. job``), and every key of one site in that site's slot."""

from __future__ import annotations

import hashlib
import inspect
import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.crc import key_slot
from rq import Queue
from rq.job import Job

from crawler.coord import counters, failover, inflight, keys, lua, pages, reaper
from crawler.coord.frontier import Frontier
from crawler.coord.gate import site_gate
from crawler.coord.pacing import Auto, Pacer
from crawler.coord.scheduler import Scheduler, frontier_sizes
from crawler.spiders.spider import Request

LUA_DIR = Path(lua.__file__).parent
ROOT = Path(__file__).resolve().parents[2]
SITES = ["shop", "a", "www.example-shop_2.co.uk", "X" * 64]


def header(name: str) -> list[str]:
    """The comment lines a script file starts with."""
    lines = (LUA_DIR / f"{name}.lua").read_text().splitlines()
    return lines[: next(i for i, line in enumerate(lines) if not line.startswith("--"))]


def cluster_line(name: str) -> str:
    """What a script's header says about Redis Cluster (its ``-- Cluster:`` paragraph, joined)."""
    lines = header(name)
    start = next(i for i, line in enumerate(lines) if line.startswith("-- Cluster: "))
    said = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("-- ") or line.startswith("--@"):
            break
        said.append(line)
    return " ".join(line[3:] for line in said)


def builds_keys(name: str) -> bool:
    """Whether a script says it names keys from its KEYS (``-- Built keys: KEYS[i] .. ':' .. n``)."""
    return any(line.startswith("-- Built keys: ") for line in header(name))


#: RQ's job hashes: a script that says it reads one (``-- Built keys: the RQ hash ...``) may.
JOB_PREFIX = Job.redis_job_namespace_prefix.encode()
#: A key named from a key passed in KEYS: that key, ``:`` and a number (a seen table's sub-set).
BUILT = re.compile(rb"(.+):\d+")


def undeclared(name: str, declared: set[bytes], touched: set[bytes]) -> set[bytes]:
    """The keys a call of ``name`` touched that it had no right to: not in its KEYS, nor (for a
    script that says ``-- Built keys:``) a key of its KEYS followed by ``:`` and a number."""
    left = touched - declared
    if builds_keys(name):
        job_hashes = any("RQ hash" in line for line in header(name))
        left = {
            key
            for key in left
            if not ((m := BUILT.fullmatch(key)) and m[1] in declared)
            and not (job_hashes and key.startswith(JOB_PREFIX))
        }
    return left


def in_one_slot(name: str) -> bool:
    return cluster_line(name).startswith(("Cluster: one key", "Cluster: one slot"))


def test_there_are_scripts_and_helpers() -> None:
    assert {"pick_site", "next_job", "promote_due", "add_seen", "acquire_or_pttl", "pace"} <= set(lua.names())
    assert all(not name.startswith("_") for name in lua.names())


@pytest.mark.parametrize("name", lua.names())
def test_every_script_is_headed_by_its_keys_argv_reply_and_cluster_slot(name: str) -> None:
    lines = header(name)
    assert lines[0].startswith(f"-- {name.upper()}: "), f"{name}.lua: first line names the script and says what it does"
    for field in ("-- KEYS[1] = ", "-- ARGV", "-- Returns ", "-- Cluster: "):
        assert any(line.startswith(field) for line in lines), f"{name}.lua: no {field.strip()!r} line in its header"
    said = cluster_line(name)
    assert said.startswith(("Cluster: one key", "Cluster: one slot", "Cluster: cross-slot: ")), said


@pytest.mark.parametrize("name", sorted(p.stem for p in LUA_DIR.glob("_*.lua")))
def test_every_helper_says_what_it_is(name: str) -> None:
    assert header(name)[0].startswith("-- Helper: "), f"{name}.lua"


def test_includes_are_expanded_and_every_script_compiles(redis_conn: Redis) -> None:
    for name in lua.names():
        text = lua.source(name)
        assert "--@include" not in text, name
        redis_conn.script_load(text)  # a syntax error answers an error


def key_arguments(code: str) -> Iterator[tuple[str, str]]:
    """(command, key expression) of every ``redis.call('COMMAND', key, …)`` in ``code``."""
    for match in re.finditer(r"redis\.call\(\s*'([A-Z]+)'", code):
        depth, args, current = 1, [], ""
        for char in code[match.end() :]:
            if char in "({":
                depth += 1
            elif char in ")}":
                depth -= 1
                if depth == 0:
                    break
            if char == "," and depth == 1:
                args.append(current.strip())
                current = ""
            else:
                current += char
        args.append(current.strip())
        command, rest = match[1], args[1:]
        if command in ("XINFO", "XGROUP"):
            rest = rest[1:]  # a subcommand comes first
        if command not in ("TIME", "PUBLISH") and rest:  # a channel is not a key
            yield command, rest[0]


def code_of(name: str) -> str:
    """A script's code without comment lines."""
    return "\n".join(line for line in lua.source(name).splitlines() if not line.lstrip().startswith("--"))


def key_aliases(code: str) -> set[str]:
    """Local names a script gives to its KEYS (``local a, b = KEYS[1], KEYS[2]``, ``local t = {KEYS[i]}``),
    and names given to those (``gate = own_gate``)."""
    aliases: set[str] = set()
    for names in re.findall(r"local ([\w, ]+) =\s*\{?KEYS\[", code):
        aliases |= {alias.strip() for alias in names.split(",")}
    for name, value in re.findall(r"(?:local )?(\w+) = (\w+)\n", code):
        if value in aliases:
            aliases.add(name)
    return aliases


@pytest.mark.parametrize("name", lua.names())
def test_every_script_takes_its_keys_from_keys_and_builds_none(name: str) -> None:
    code = code_of(name)
    aliases = key_aliases(code)
    for command, key in key_arguments(code):
        assert "ARGV" not in key, f"{name}: {command} on a key from ARGV: {key}"
        if builds_keys(name):  # its keys are checked as it runs (undeclared): KEYS, or named from them
            assert ".." not in key or re.match(r"(t\.)?prefix \.\. ", key), f"{name}: {command} on {key}"
            continue
        assert ".." not in key, f"{name}: {command} on a key built in the script: {key}"
        table = key.split("[")[0] if re.fullmatch(r"\w+\[[^]]+\]", key) else key
        assert table == "KEYS" or table in aliases, f"{name}: {command} on {key}, not one of KEYS"


@pytest.mark.parametrize("name", [n for n in lua.names() if not in_one_slot(n)])
def test_cross_slot_scripts_are_named_in_the_scaling_docs(name: str) -> None:
    assert name.upper() in (ROOT / "docs" / "SCALING.md").read_text(), f"docs/SCALING.md: say what {name} needs"


def site_keys(site: str) -> list[str]:
    """Every key keys.py builds for ``site`` (dummy values for the other parameters)."""
    dummies: dict[str, Any] = {"origin": "https://www.shop.example:443", "index": 29012345, "priority": -7, "read": "r"}
    built = []
    for name, function in inspect.getmembers(keys, inspect.isfunction):
        parameters = list(inspect.signature(function).parameters)
        if parameters[:1] != ["site"] or name in ("download_queue", "site_of_queue"):
            continue
        built.append(function(site, *(dummies[p] for p in parameters[1:])))
    return built


@pytest.mark.parametrize("site", SITES)
def test_every_key_of_a_site_hashes_to_the_sites_cluster_slot(redis_conn: Redis, site: str) -> None:
    queue = Queue(keys.download_queue(site), connection=redis_conn)
    rq_keys = [queue.key, queue.intermediate_queue_key]
    rq_keys += [
        registry.key
        for registry in (
            queue.started_job_registry,
            queue.failed_job_registry,
            queue.finished_job_registry,
            queue.scheduled_job_registry,
            queue.deferred_job_registry,
            queue.canceled_job_registry,
        )
    ]
    built = site_keys(site) + [keys.gate(site), keys.frontier(site, 0), keys.frontier(site, 1000)] + rq_keys
    assert len(built) > 20
    assert {key: key_slot(key.encode()) for key in built} == {key: key_slot(site.encode()) for key in built}
    assert all(f"{{{site}}}" in key for key in built)


def test_a_gate_several_sites_share_is_in_the_slot_of_its_own_name() -> None:
    for name in (keys.shared_gate_name("srv-1"), keys.ip_gate_name("203.0.113.7"), keys.ip_gate_name("2001:db8::1")):
        assert key_slot(keys.gate(name).encode()) == key_slot(name.encode())


def test_the_queue_name_gives_back_its_site() -> None:
    for site in SITES:
        assert keys.site_of_queue(keys.download_queue(site)) == site
    assert keys.site_of_queue("parse") is None
    assert keys.site_of_queue("download:shop") is None  # the name before hash tags


def test_the_scripts_are_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["package-data"]["crawler.coord.lua"] == ["*.lua"]


# -- what the scripts touch, seen by MONITOR --------------------------------------------------


def _unescape(arg: str) -> bytes:
    """An argument as MONITOR quotes it (sdscatrepr), back to its bytes."""
    out, i = bytearray(), 0
    simple = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}
    while i < len(arg):
        if arg[i] == "\\" and arg[i + 1] == "x":
            out += bytes([int(arg[i + 2 : i + 4], 16)])
            i += 4
        elif arg[i] == "\\":
            out += simple[arg[i + 1]]
            i += 2
        else:
            out += arg[i].encode()
            i += 1
    return bytes(out)


class Touched:
    """Keys declared by the EVALSHA calls, and keys the commands run by scripts touched; also per script."""

    def __init__(self) -> None:
        self.declared: set[bytes] = set()
        self.touched: set[bytes] = set()
        #: Per script name: the keys one call declared and the keys that call touched.
        self.calls: list[tuple[str, set[bytes], set[bytes]]] = []


#: Script names by the SHA1 that EVALSHA names them by.
SCRIPT_BY_SHA = {hashlib.sha1(lua.source(name).encode()).hexdigest().encode(): name for name in lua.names()}


@contextmanager
def watching(connection: Redis, redis_url: str) -> Iterator[Touched]:
    """What the scripts run in the block declare and touch (MONITOR on another connection)."""
    watcher = Redis.from_url(redis_url, socket_timeout=10)
    seen = Touched()
    lines: list[str] = []
    with watcher.monitor() as monitor:
        yield seen
        connection.echo("end of the block")
        while True:
            line = monitor.connection.read_response()
            text = line.decode("latin-1") if isinstance(line, bytes) else str(line)
            if '"ECHO" "end of the block"' in text:
                break
            lines.append(text)
    watcher.close()
    for text in lines:
        args = [_unescape(a) for a in re.findall(r'"((?:[^"\\]|\\.)*)"', text)]
        if args[0].upper() == b"EVALSHA":
            declared = set(args[3 : 3 + int(args[2])])
            seen.declared |= declared
            seen.calls.append((SCRIPT_BY_SHA.get(args[1], args[1].decode()), declared, set()))
        elif "lua]" in text:  # a command of the script called last (MONITOR shows a call before its commands)
            try:
                touched = {k.encode() if isinstance(k, str) else k for k in connection.command_getkeys(*args)}
            except Exception:  # a command with no key (TIME)
                continue
            seen.touched |= touched
            seen.calls[-1][2].update(touched)


def assert_declared(seen: Touched) -> None:
    """Every key the scripts touched was passed in their KEYS (or named from one: ``undeclared``)."""
    assert seen.touched, "no script ran"
    for name, declared, touched in seen.calls:
        assert not undeclared(name, declared, touched), sorted(undeclared(name, declared, touched))


def assert_one_slot(seen: Touched) -> None:
    assert_declared(seen)
    assert len({key_slot(key) for key in seen.touched | seen.declared}) == 1, sorted(seen.touched | seen.declared)


def test_gate_and_pace_scripts_touch_only_the_sites_slot(redis_conn: Redis, redis_url: str) -> None:
    gate = site_gate(redis_conn, "shop", 0.05, pace_key=keys.conf("shop"))
    with watching(redis_conn, redis_url) as seen:
        assert gate.try_acquire() == 0.0
        assert gate.rearm()
        assert gate.release()
        Pacer(redis_conn).observe(
            keys.conf("shop"), gate.key, Auto(), elapsed=0.2, status=503, error=None, margin=0.0, since_send=0.1
        )
        Scheduler(redis_conn).close_gate("shop", 0.5, "Retry-After")
    assert_one_slot(seen)
    assert keys.gate("shop").encode() in seen.touched and keys.conf("shop").encode() in seen.touched


@pytest.mark.parametrize("revisit_after", [None, 60.0])
def test_dedup_and_frontier_scripts_touch_only_the_sites_slot(
    redis_conn: Redis, redis_url: str, revisit_after: float | None
) -> None:
    frontier = Frontier(redis_conn, "shop", ["shop.example"], 60, 60, revisit_after=revisit_after)
    requests = [Request(f"https://shop.example/p/{i}", priority=i % 3) for i in range(20)]
    with watching(redis_conn, redis_url) as seen:
        frontier.add(requests + requests[:5])  # ADD_SEEN (or its time buckets)
    assert_one_slot(seen)
    if revisit_after is not None:  # the time buckets, every one of them passed in KEYS
        assert any(key.startswith(keys.seen("shop").encode() + b":") for key in seen.touched)
    with watching(redis_conn, redis_url) as seen:
        assert frontier_sizes(redis_conn, ["shop"]) == [20]
        redis_conn.delete(keys.frontier("shop", 2))
        Scheduler(redis_conn).forget_empty_levels("shop", [0, 1, 2])
    assert_one_slot(seen)
    assert keys.frontier("shop", 1).encode() in seen.touched
    assert redis_conn.zrange(keys.levels("shop"), 0, -1) == [b"0", b"1"]


def test_the_lastmod_script_touches_only_the_sites_slot(redis_conn: Redis, redis_url: str) -> None:
    with watching(redis_conn, redis_url) as seen:
        reply = lua.script(redis_conn, "newer_lastmod")(keys=[keys.lastmod("shop")], args=[b"\x00" * 8, 1700000000])
    assert reply == b"n"
    assert_one_slot(seen)


def test_the_pages_scripts_touch_only_the_stream(redis_conn: Redis, redis_url: str) -> None:
    pages.ensure_group(redis_conn)
    pages.add(redis_conn, {"site": "shop"}, b"body")
    (entry_id, _, _), *_ = pages.read(redis_conn, "c1", 10, 0)
    with watching(redis_conn, redis_url) as seen:
        assert pages.touch(redis_conn, "c1", [entry_id]) == {entry_id}
        assert [e[0] for e in pages.reclaim(redis_conn, "c2", 0, 10)] == [entry_id]
        assert pages.forget(redis_conn, 0, "c1") == 1
    assert_one_slot(seen)
    assert seen.touched == {keys.pages().encode()}


def test_a_shared_gate_read_with_a_sites_adaptive_interval_spans_two_slots(redis_conn: Redis, redis_url: str) -> None:
    """What docs/SCALING.md says: such a site's gate scripts could not run on Redis Cluster as they are."""
    gate = site_gate(redis_conn, keys.shared_gate_name("srv-1"), 0.05, pace_key=keys.conf("shop"))
    with watching(redis_conn, redis_url) as seen:
        assert gate.try_acquire() == 0.0
    assert {key_slot(key) for key in seen.touched} == {key_slot(b"shop"), key_slot(b"shared:srv-1")}


def test_every_script_touches_only_keys_passed_in_its_keys(redis_conn: Redis, redis_url: str) -> None:
    """Each call of each script, cross-slot ones included, checked on its own: nothing is built inside."""
    from crawler.coord.frontier import DownloadTask
    from crawler.coord.scheduler import publish_conf

    front = Frontier(redis_conn, "shop", ["shop.example"], 60, 60)
    timed = Frontier(redis_conn, "timed", ["shop.example"], 60, 60, revisit_after=30.0)
    scheduler = Scheduler(redis_conn, ["shop", "shared"])
    publish_conf(redis_conn, "shop", 0.0, 0.0)
    publish_conf(redis_conn, "shared", 0.0, 0.0, gate_key=keys.gate(keys.shared_gate_name("srv")))
    Frontier(redis_conn, "shared", ["shop.example"], 60, 60).add([Request("https://shop.example/s")])
    gate = site_gate(redis_conn, "shop", 0.05, pace_key=keys.conf("shop"))
    pages.ensure_group(redis_conn)
    pages.add(redis_conn, {"site": "shop"}, b"body")
    with watching(redis_conn, redis_url) as seen:
        front.add([Request(f"https://shop.example/p/{i}", priority=i % 2) for i in range(8)])  # ADD_SEEN
        timed.add([Request("https://shop.example/t")])  # ADD_SEEN_FOR_A_WHILE
        front.forget("https://shop.example/p/3")  # FORGET_SEEN
        for _ in range(4):  # PICK_SITE, NEXT_JOB (refills: EVICT-free; shared gate: called again)
            step = scheduler.next()
            if step.refill and step.job_id is None:
                assert step.site is not None
                Frontier(redis_conn, step.site, ["shop.example"], 60, 60).refill(2)
        front.add([Request("https://shop.example/urgent", priority=9)])  # EVICT of jobs made below it
        scheduler.schedule("shop", DownloadTask("shop", "https://shop.example/r").to_entry(), 0)  # SCHEDULE
        redis_conn.zadd(keys.delayed(), {"no tabs here": 0})
        assert scheduler.promote_due() == 2  # DUE_MEMBERS, PROMOTE_DUE (one malformed)
        assert frontier_sizes(redis_conn, ["shop", "timed"])[0] > 0  # FRONTIER_SIZE
        scheduler.forget_empty_levels("shop", [0, 1, 5])  # FORGET_EMPTY_LEVELS
        assert gate.try_acquire() == 0.0  # ACQUIRE_OR_PTTL
        assert gate.rearm() and gate.release()  # REARM, RELEASE_IF_OWNER
        assert gate.try_acquire() == 0.0
        gate.sent()
        assert gate.rearm_sent_now()  # REARM_SENT
        sent = site_gate(redis_conn, "sent", 0.05, ready_member="shop")
        assert sent.try_acquire() == 0.0
        sent.sent()
        assert sent.rearm_sent_now()  # REARM_SENT moving the site's turn in the ready set
        Pacer(redis_conn).observe(
            keys.conf("shop"), gate.key, Auto(), elapsed=0.2, status=503, error=None, margin=0.0, since_send=0.1
        )  # PACE
        scheduler.close_gate("shop", 0.5, "Retry-After")  # CLOSE_GATE
        held = [(keys.gate("shop"), failover.HeldGate(500, keys.conf("shop"), 250))]
        lua.script(redis_conn, "hold_gates")(*failover.hold_arguments(held, 0.1))  # HOLD_GATES
        scheduler.batch_over("shop")  # BATCH_OVER
        lua.script(redis_conn, "newer_lastmod")(keys=[keys.lastmod("shop")], args=[b"\x00" * 8, 1700000000])
        (entry_id, _, _), *_ = pages.read(redis_conn, "c1", 10, 0)
        pages.touch(redis_conn, "c1", [entry_id])  # TOUCH_PAGES
        pages.reclaim(redis_conn, "c2", 0, 10)  # RECLAIM_PAGES
        pages.forget(redis_conn, 0, "c1")  # FORGET_CONSUMERS
        lua.script(redis_conn, "add_counts")(
            keys=[keys.reset_epoch(), keys.stats("shop"), keys.reset_at("shop"), keys.metrics("shop")],
            args=["", 1, 1, 1, "x", 1, "y", 2, "z", "0.5"],
        )
        with redis_conn.pipeline(transaction=True) as pipe:
            counters.forget(pipe, "shop")  # FORGET_COUNTS
            pipe.execute()
        inflight.note_busy(redis_conn, "host:1:a", 10)  # MARK_BUSY
        assert inflight.busy_processes(redis_conn) == 1  # COUNT_BUSY
        inflight.note_idle(redis_conn, "host:1:a")
        assert dict(reaper.survey(redis_conn, [keys.download_queue("shop")]))  # SURVEY_QUEUES
    for name, declared, touched in seen.calls:
        wrong = undeclared(name, declared, touched)
        assert not wrong, f"{name} touched keys not in its KEYS: {sorted(wrong)}"
    assert {name for name, _, _ in seen.calls} == set(lua.names())


def test_a_registered_script_is_handed_out_without_the_registration_lock(redis_conn: Redis) -> None:
    """The hundreds of threads of a download process ask for scripts all the time: once made, a
    script is read without the lock that making one takes, so they do not wait on each other."""
    import threading

    made = lua.script(redis_conn, "next_job")
    handed: list[Any] = []
    with lua._registering:  # another thread making a script holds it
        reader = threading.Thread(target=lambda: handed.append(lua.script(redis_conn, "next_job")))
        reader.start()
        reader.join(2)
        assert handed == [made], "a script already made waited for the registration lock"


def test_a_frontier_has_no_lazy_attribute_whose_first_read_takes_a_lock_of_its_class(redis_conn: Redis) -> None:
    """On Python 3.11 a ``cached_property``'s first read on any instance takes one lock of the class: a
    download process's frontiers (one a site) waited on it in turn as 1,000 sites' first refills came."""
    from functools import cached_property

    assert [name for name, value in vars(Frontier).items() if isinstance(value, cached_property)] == []
    frontier = Frontier(redis_conn, "demo", [], 0, 0)
    assert {"scheduler", "_add_seen", "_add_seen_buckets", "move"} <= set(vars(frontier))


def test_the_fake_redis_fixture_refuses_lua_on_its_client_and_its_pipelines(fake_redis: Redis) -> None:
    """fakeredis runs scripts, but not with a server's atomicity: a script is tested on redis_conn."""
    script = lua.script(fake_redis, "add_counts")
    with pytest.raises(AssertionError, match="EVALSHA on fake_redis"):
        script(keys=[keys.stats("shop")], args=[])
    with pytest.raises(AssertionError, match="EVAL on fake_redis"):
        fake_redis.eval("return 1", 0)
    pipe = fake_redis.pipeline()
    with pytest.raises(AssertionError, match="EVAL on fake_redis"):
        pipe.eval("return 1", 0)
    fake_redis.set("plain", 1)  # every other command answers
    assert fake_redis.get("plain") == b"1"
