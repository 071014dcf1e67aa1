"""``crawler dashboard``: rq-dashboard on the crawl's Redis, read-only, reading the crawler's JSON jobs.

rq-dashboard (the ``dashboard`` extra) shows RQ's queues, jobs, registries and workers.
Run as ``rq-dashboard --json`` it reads queued jobs as JSON, but its workers view reads
each worker's current job with RQ's default serializer, pickle, and answers 500 while
a job runs (rq-dashboard 0.9: ``list_workers`` calls ``Worker.all()`` without the
serializer). ``make_app`` serves rq-dashboard's own blueprint with JSON as its
serializer, and that one view replaced by the same view given the serializer.

rq-dashboard has no authentication and changes state from its pages (empty a queue,
delete or requeue jobs; ``/requeue/<queue>`` even on GET). Emptying a download queue
loses its URLs, already marked seen. So the app ``make_app`` builds:

- is read-only: every state-changing endpoint, and every method but GET and HEAD,
  answers 403 (``crawler pause``, ``crawler reset`` and the other commands change state
  with the crawler's bookkeeping);
- answers only to a ``Host`` that is an IP address, ``localhost`` or a name it is told
  (``allowed_hosts``), which stops DNS rebinding, and refuses a request whose ``Origin``
  is not its own or whose ``Sec-Fetch-Site`` is ``cross-site`` (cross-site requests);
- asks for HTTP basic credentials when given a username;
- shows the Redis URL without its password, user or secret parameters;
- opens Redis as the crawler does (``coord.connection.client_for``), one client a URL: rq-dashboard's
  own parser of ``redis+sentinel://`` URLs drops the primary's user and the Sentinels' password
  (``sentinel_password``), and it made a new client on every request.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from rq import Worker
from rq.serializers import JSONSerializer

from ..coord.connection import client_for
from ..errors import ConfigError
from ..settings import redact_url, scrub, url_secrets

#: The endpoint of rq-dashboard's workers view (blueprint ``rq_dashboard``, function ``list_workers``).
WORKERS_ENDPOINT = "rq_dashboard.list_workers"
#: rq-dashboard 0.9's endpoints that change Redis: refused, whatever the method.
WRITE_ENDPOINTS = frozenset(
    f"rq_dashboard.{name}"
    for name in ("delete_job_view", "requeue_job_view", "requeue_all", "empty_queue", "compact_queue")
)
#: Methods that read; any other is refused.
READ_METHODS = frozenset({"GET", "HEAD"})
#: The answer to a request that would change state.
READ_ONLY = (
    "crawler dashboard is read-only: emptying or requeueing RQ jobs from it would lose URLs the crawler "
    "has marked seen; use crawler pause / resume / reset / seed --force instead\n"
)
#: Host names a dashboard answers to besides IP addresses and those it is told.
LOCAL_NAMES = frozenset({"localhost"})


def make_app(
    redis_url: str | Sequence[str],
    *,
    username: str | None = None,
    password: str | None = None,
    allowed_hosts: Iterable[str] = (),
) -> Any:
    """A read-only Flask app serving rq-dashboard for ``redis_url`` (several: one instance each, as shards);
    ConfigError when rq-dashboard is not installed.

    With ``username``, every request needs HTTP basic credentials ``username``:``password``.
    ``allowed_hosts`` are the host names (besides IP addresses and ``localhost``) it answers to.
    """
    try:
        from flask import Flask
        from rq_dashboard import default_settings, web  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ConfigError(f"crawler dashboard needs rq-dashboard ({exc}): pip install 'crawler[dashboard]'") from None
    if password and not username:
        raise ConfigError("crawler dashboard: a password needs a username")
    web.config.serializer = JSONSerializer
    web.from_url = _clients()  # looked up on every request, as the one below
    # The pages show the instance list through this function (looked up on every request).
    web.escape_format_instance_list = _redacted_urls
    app = Flask("crawler.ops.dashboard")
    app.config.from_object(default_settings)
    urls = [redis_url] if isinstance(redis_url, str) else list(redis_url)
    app.config["RQ_DASHBOARD_REDIS_URL"] = urls
    app.config["RQ_DASHBOARD_DISABLE_DELETE"] = True  # hides the delete and empty buttons
    app.register_blueprint(web.blueprint)
    web.setup_rq_connection(app)
    hosts = LOCAL_NAMES | {host.lower() for host in allowed_hosts}
    app.before_request(functools.partial(_guard, hosts, username, password))
    secrets = sorted({secret for url in urls for secret in url_secrets(url)}, key=len, reverse=True)
    app.after_request(functools.partial(_scrub, secrets))
    if WORKERS_ENDPOINT in app.view_functions:  # another rq-dashboard: its own view stays
        app.view_functions[WORKERS_ENDPOINT] = web.jsonify(functools.partial(_list_workers, web))
    return app


def _clients() -> Any:
    """rq-dashboard's ``from_url(url, sentinel_options, client_options)``: the crawler's client for
    ``url`` (the options are rq-dashboard's settings of passwords, which the crawler's URLs carry), made once."""
    made: dict[str, Any] = {}

    def from_url(url: str, sentinel_options: Any = None, client_options: Any = None) -> tuple[None, Any]:
        client = made.get(url)
        if client is None:
            client = made[url] = client_for(url)
        return None, client

    return from_url


def _redacted_urls(urls: str | list[str] | tuple[str, ...]) -> list[str]:
    return [redact_url(url) for url in ([urls] if isinstance(urls, str) else urls)]


def _guard(hosts: frozenset[str], username: str | None, password: str | None) -> Any:
    """None to serve the request, else the refusal (403 foreign or writing, 401 without credentials)."""
    from flask import request

    if not _host_allowed(request.host, hosts):
        return "crawler dashboard: unknown Host (add it with --allow-host)\n", 403
    if _cross_site(request.host, request.headers.get("Origin"), request.headers.get("Sec-Fetch-Site")):
        return "crawler dashboard: cross-site request refused\n", 403
    if username is not None and not _authorized(request.authorization, username, password or ""):
        return "crawler dashboard: credentials needed\n", 401, {"WWW-Authenticate": 'Basic realm="crawler dashboard"'}
    if request.method not in READ_METHODS or request.endpoint in WRITE_ENDPOINTS:
        return READ_ONLY, 403
    return None


def _host_allowed(host: str, names: frozenset[str]) -> bool:
    """Whether a ``Host`` header names an IP address or one of ``names`` (a rebound DNS name is neither)."""
    name = urlsplit(f"//{host}").hostname or ""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name in names
    return True


def _cross_site(host: str, origin: str | None, fetch_site: str | None) -> bool:
    """Whether a browser says the request comes from another site (``Origin`` not ``host``, or ``Sec-Fetch-Site``)."""
    if fetch_site is not None and fetch_site.lower() == "cross-site":
        return True
    return origin is not None and urlsplit(origin).netloc.lower() != host.lower()


def _authorized(auth: Any, username: str, password: str) -> bool:
    if auth is None or auth.username is None or auth.password is None:
        return False
    # compare_digest on both, so the time taken does not tell which one is wrong.
    user_ok = hmac.compare_digest(auth.username.encode(), username.encode())
    return hmac.compare_digest(auth.password.encode(), password.encode()) and user_ok


def _scrub(secrets: list[str], response: Any) -> Any:
    """``response`` with the Redis URL's secrets taken out of its text (a page rq-dashboard renders another way)."""
    if secrets and not response.direct_passthrough and response.mimetype in ("text/html", "application/json"):
        response.set_data(scrub(response.get_data(as_text=True), secrets))
    return response


def _list_workers(web: Any, instance_number: int) -> dict[str, Any]:
    """rq-dashboard's ``list_workers``, its workers read with the JSON serializer."""
    from flask import current_app  # rq-dashboard puts its connection on the app (``setup_rq_connection``)

    workers = [
        {
            "name": worker.name,
            "pid": worker.pid,
            "queues": [queue.name for queue in worker.queues],
            "state": str(worker.get_state()),
            "current_job": web.serialize_current_job(worker.get_current_job()),
            "last_heartbeat": worker.last_heartbeat,
            "birth_date": worker.birth_date,
            "successful_job_count": worker.successful_job_count,
            "failed_job_count": worker.failed_job_count,
            "total_working_time": worker.total_working_time,
            "version": getattr(worker, "version", ""),
            "python_version": getattr(worker, "python_version", ""),
        }
        for worker in Worker.all(connection=getattr(current_app, "redis_conn"), serializer=JSONSerializer)
    ]
    return {"workers": sorted(workers, key=lambda w: (w["state"], w["queues"], w["name"]))}
