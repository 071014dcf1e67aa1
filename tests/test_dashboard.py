"""``crawler dashboard``: rq-dashboard's queues, jobs and workers pages against a running crawl."""

from __future__ import annotations

import sys
import time

import pytest
from crawling import installed_runtime, join_all, start_in_threads
from redis import Redis
from rq import Queue, Worker
from rq.serializers import JSONSerializer

from crawler import keys
from crawler.dashboard import make_app
from crawler.demo import ShopSite
from crawler.errors import ConfigError
from crawler.frontier import seed
from crawler.settings import Settings


def test_queues_jobs_and_workers_pages_answer_while_jobs_run(
    redis_url: str, redis_conn: Redis, settings: Settings
) -> None:
    queue = keys.download_queue("demo")
    with ShopSite(products=8, faults=False, latency=0.4) as shop, installed_runtime(redis_conn, settings) as rt:
        shop_url = shop.url
        seed(rt.frontier("demo"), [shop_url + "/"])
        threads, stop = start_in_threads(redis_conn)
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
