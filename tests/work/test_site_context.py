"""A download reads its site once a URL (``jobs.context.SiteContext``) and passes it down its steps."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
from redis import Redis

from crawler.coord.task import DownloadTask
from crawler.demo import ShopSite
from crawler.settings import Settings
from crawler.work import jobs
from crawler.work.jobs.context import site_context
from crawler.work.runtime import Runtime

SITE = "demo"


def counting(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often ``rt`` is asked for a site's policy and its spider, from now on."""
    asked: Counter[str] = Counter()
    for name in ("policy", "spider"):
        real = getattr(rt, name)

        def ask(site: str, *args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            asked[_name] += 1
            return _real(site, *args, **kwargs)

        monkeypatch.setattr(rt, name, ask)
    return asked


@pytest.mark.parametrize("urls", [1, 3])
def test_each_url_of_a_job_asks_the_runtime_for_its_sites_policy_and_spider_once(
    redis_conn: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, urls: int
) -> None:
    """A URL's steps (robots.txt, the gate, the record, the refresh) took the policy and the spider from
    the runtime each time they needed one: four policies and three spiders a URL, each a possible Redis
    read. Now one each a URL: a job's first when it starts, a batch's next ones before each."""
    rt = Runtime(redis_conn, dataclasses.replace(settings, sites={SITE: {"interval": 0.01}}, gate_margin=0.0))
    try:
        with ShopSite(products=5, faults=False) as shop:
            rt.proxy(SITE)  # the site's proxies listed: a look-up of the spider of its own, once a process
            payloads = [DownloadTask(SITE, f"{shop.url}/product/1", "parse_product", refresh=60).to_json()]
            payloads += [DownloadTask(SITE, f"{shop.url}/product/{n}", "parse_product").to_json() for n in (2, 3)]
            asked = counting(rt, monkeypatch)
            jobs.download(*payloads[:urls], rt=rt)
            fetched = [entry.path for entry in shop.requests if entry.path.startswith("/product/")]
    finally:
        rt.close()
    assert fetched == [f"/product/{n}" for n in range(1, urls + 1)]  # robots.txt too, through the same gate
    assert asked == {"policy": urls, "spider": urls}


def test_a_sites_context_is_read_once_and_holds_what_its_steps_need(runtime: Runtime) -> None:
    context = site_context(runtime, SITE)
    spider = runtime.spider(SITE)
    assert context.spider is spider and context.policy is runtime.policy(SITE)
    assert context.domains == tuple(spider.domains()) and context.proxy is None
    assert context.user_agent == runtime.settings.user_agent  # the demo spider names none
    assert (context.logs_in, context.uses_cookies) == (False, False)
    assert context.batching == runtime.batching(SITE)
    task = DownloadTask(SITE, "http://127.0.0.1/p", headers={"User-Agent": "mine/1"})
    assert context.user_agent_for(task) == "mine/1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.proxy = "http://elsewhere:3128"  # type: ignore[misc]
