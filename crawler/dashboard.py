"""``crawler dashboard``: rq-dashboard on the crawl's Redis, reading the crawler's JSON jobs on every page.

rq-dashboard (the ``dashboard`` extra) shows RQ's queues, jobs, registries and workers.
Run as ``rq-dashboard --json`` it reads queued jobs as JSON, but its workers view reads
each worker's current job with RQ's default serializer, pickle, and answers 500 while
a job runs (rq-dashboard 0.9: ``list_workers`` calls ``Worker.all()`` without the
serializer). ``make_app`` serves rq-dashboard's own blueprint with JSON as its
serializer, and that one view replaced by the same view given the serializer.
"""

from __future__ import annotations

import functools
from typing import Any

from rq import Worker
from rq.serializers import JSONSerializer

from .errors import ConfigError

#: The endpoint of rq-dashboard's workers view (blueprint ``rq_dashboard``, function ``list_workers``).
WORKERS_ENDPOINT = "rq_dashboard.list_workers"


def make_app(redis_url: str) -> Any:
    """A Flask app serving rq-dashboard for ``redis_url``; ConfigError when rq-dashboard is not installed."""
    try:
        from flask import Flask
        from rq_dashboard import default_settings, web  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ConfigError(f"crawler dashboard needs rq-dashboard ({exc}): pip install 'crawler[dashboard]'") from None
    web.config.serializer = JSONSerializer
    app = Flask("crawler.dashboard")
    app.config.from_object(default_settings)
    app.config["RQ_DASHBOARD_REDIS_URL"] = [redis_url]
    app.register_blueprint(web.blueprint)
    web.setup_rq_connection(app)
    if WORKERS_ENDPOINT not in app.view_functions:  # another rq-dashboard: its own view stays
        return app
    app.view_functions[WORKERS_ENDPOINT] = web.jsonify(functools.partial(_list_workers, web))
    return app


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
