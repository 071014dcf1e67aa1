"""``crawler dashboard``: rq-dashboard's queues, jobs and workers pages against a running crawl."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from crawling import installed_runtime, join_all, start_in_threads
from redis import Redis
from rq import Queue, Worker
from rq.serializers import JSONSerializer
from werkzeug.serving import make_server

from crawler.coord import keys
from crawler.coord.connection import redis_server_binary
from crawler.coord.frontier import seed
from crawler.demo import ShopSite
from crawler.errors import ConfigError
from crawler.ops.dashboard import make_app
from crawler.settings import Settings


def test_queues_jobs_and_workers_pages_answer_while_jobs_run(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    queue = keys.download_queue("demo")
    with ShopSite(products=8, faults=False, latency=0.4) as shop, installed_runtime(redis_conn, settings) as rt:
        shop_url = shop.url
        seed(rt.frontier("demo"), [shop_url + "/"])
        threads, stop = start_in_threads(rt)
        try:
            deadline = time.monotonic() + 30
            while not any(w.get_current_job_id() for w in Worker.all(redis_conn, serializer=JSONSerializer)):
                assert time.monotonic() < deadline, "no worker ever ran a job"
                time.sleep(0.02)
            client = make_app(redis_url).test_client()
            pages = {
                path: client.get(path, follow_redirects=True)
                for path in (
                    "/0/view/queues",
                    "/0/view/workers",
                    "/0/view/jobs",
                    "/0/data/queues.json",
                    "/0/data/workers.json",
                    f"/0/data/jobs/{queue}/started/8/asc/1.json",
                    f"/0/data/jobs/{queue}/queued/8/asc/1.json",
                )
            }
        finally:
            stop.set()
            join_all(threads, stop)
    assert {path: r.status_code for path, r in pages.items()} == dict.fromkeys(pages, 200)
    assert queue in [q["name"] for q in pages["/0/data/queues.json"].get_json()["queues"]]
    workers = pages["/0/data/workers.json"].get_json()["workers"]
    assert {queue} == {name for w in workers for name in w["queues"]}
    running = [w["current_job"] for w in workers if w["current_job"] != "idle"]
    assert running and all(shop_url in job["description"] for job in running)  # the URL each is fetching
    assert Queue(queue, connection=redis_conn).key.startswith(Queue.redis_queue_namespace_prefix)


def test_without_rq_dashboard_the_command_says_what_to_install(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    monkeypatch.setitem(sys.modules, "rq_dashboard", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'crawler\[dashboard\]'"):
        make_app(redis_url)


# Safety: a real HTTP server, a Redis with a password ------------------------------------------

SECRET = "hunter2-dash-secret"


@pytest.fixture
def locked_redis_url(tmp_path: Path) -> Iterator[str]:
    """A private redis-server that wants ``SECRET``, its URL carrying it as ``?password=``."""
    socket = tmp_path / "r.sock"
    server = subprocess.Popen(
        [redis_server_binary(), "--port", "0", "--unixsocket", str(socket), "--requirepass", SECRET, "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    try:
        url = f"unix://{socket}?db=0&password={SECRET}"
        deadline = time.monotonic() + 10
        while not _answers(url):  # the socket's file comes before the server listens on it
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def _answers(url: str) -> bool:
    """Whether the Redis at ``url`` answers a PING."""
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except redis.ConnectionError:
        return False


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served over real HTTP on a loopback port, in a thread; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


def eight_download_jobs(url: str) -> Queue:
    queue = Queue(keys.download_queue("demo"), connection=Redis.from_url(url), serializer=JSONSerializer)
    for n in range(8):
        queue.enqueue("crawler.work.jobs.download", f"http://shop.example/{n}")
    return queue


def test_dashboard_pages_never_show_the_redis_password(locked_redis_url: str) -> None:
    eight_download_jobs(locked_redis_url)
    with serving(make_app(locked_redis_url)) as base:
        pages = [httpx.get(base + path) for path in ("/", "/0/view/jobs", "/0/view/workers", "/0/data/queues.json")]
    assert [page.status_code for page in pages] == [200] * 4
    assert keys.download_queue("demo") in [q["name"] for q in pages[-1].json()["queues"]]
    assert not [page.url for page in pages if SECRET in page.text]
    assert "password=***" in pages[0].text  # the URL is shown, redacted


def test_dashboard_changes_no_state_on_get_or_post_and_its_queue_keeps_its_jobs(locked_redis_url: str) -> None:
    queue = eight_download_jobs(locked_redis_url)
    name, first = queue.name, queue.job_ids[0]
    with serving(make_app(locked_redis_url)) as base:
        requeue_on_get = httpx.get(f"{base}/requeue/{name}")
        own_post = httpx.post(f"{base}/queue/{name}/queued/empty", headers={"Origin": base})
        compact = httpx.post(f"{base}/queue/{name}/compact")
        delete = httpx.post(f"{base}/job/{first}/delete")
    assert [r.status_code for r in (requeue_on_get, own_post, compact, delete)] == [403] * 4
    assert "crawler pause" in own_post.text
    assert queue.count == 8


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Host": "evil.example"},
        {"Host": "evil.example:9181", "Origin": "http://evil.example:9181"},  # DNS rebinding
        {"Sec-Fetch-Site": "cross-site"},
    ],
)
def test_dashboard_refuses_a_foreign_host_or_origin(locked_redis_url: str, headers: dict[str, str]) -> None:
    queue = eight_download_jobs(locked_redis_url)
    with serving(make_app(locked_redis_url)) as base:
        page = httpx.get(base + "/0/data/queues.json", headers=headers)
        empty = httpx.post(f"{base}/queue/{queue.name}/queued/empty", headers=headers)
    assert (page.status_code, empty.status_code) == (403, 403)
    assert keys.download_queue("demo") not in page.text
    assert queue.count == 8


def test_dashboard_answers_a_name_it_is_told_and_asks_for_credentials(locked_redis_url: str) -> None:
    app = make_app(locked_redis_url, username="ops", password="pw-of-ops", allowed_hosts=["crawl.internal"])
    with serving(app) as base:
        anonymous = httpx.get(base + "/0/data/queues.json", headers={"Host": "crawl.internal"})
        wrong = httpx.get(base + "/0/data/queues.json", auth=("ops", "nope"))
        right = httpx.get(base + "/0/data/queues.json", auth=("ops", "pw-of-ops"), headers={"Host": "crawl.internal"})
    assert (anonymous.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert anonymous.headers["WWW-Authenticate"].startswith("Basic")


def test_dashboard_on_a_public_address_without_credentials_is_refused(redis_url: str, tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("crawler")
    command = [str(script), "--redis-url", redis_url, "dashboard", "--host", "0.0.0.0", "--port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLER_DASHBOARD")}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)  # else serves
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: crawler dashboard on 0.0.0.0 (not loopback) needs --username and --password"
    ]


@pytest.mark.integration
def test_dashboard_opens_a_sentinel_url_whose_sentinel_asks_for_a_password(tmp_path: Path) -> None:
    """rq-dashboard's own parser of Sentinel URLs drops ``sentinel_password``: the Sentinel refused it."""
    from sentinels import sentinel_binaries

    from crawler.demo.sentinel import LocalSentinel

    trio = LocalSentinel(tmp_path, *sentinel_binaries(), sentinel_password="pw-of-sentinel").start()
    try:
        primary = Redis(port=trio.primary_port() or 0)
        Queue(keys.download_queue("demo"), connection=primary, serializer=JSONSerializer).enqueue_call(
            "crawler.work.jobs.download", args=(), job_id="j1"
        )
        client = make_app(trio.url).test_client()
        answer = client.get("/0/data/queues.json")
        assert answer.status_code == 200, answer.data[:300]
        assert keys.download_queue("demo") in [q["name"] for q in answer.get_json()["queues"]]
        assert b"pw-of-sentinel" not in client.get("/0/view/queues").data
    finally:
        trio.stop()
