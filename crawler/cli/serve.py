"""``crawler dashboard``, ``metrics``: long-running servers that show the fleet."""

from __future__ import annotations

import ipaddress
import time
from typing import Any

import click

from ..errors import ConfigError
from ..settings import redact_shards
from .context import Context, pass_context


def serve_metrics(obj: Context, host: str, port: int) -> Any:
    """Serve the fleet's metrics from a daemon thread of this process; one line on stderr says where."""
    from ..ops.metrics import MetricsCollector, ShardedMetrics, address, serve

    spiders = obj.spider_set.named()
    collectors = [(name, MetricsCollector(client, spiders, obj.settings)) for name, client in obj.shards.clients()]
    server = serve(ShardedMetrics(collectors) if obj.shards.several else collectors[0][1], host, port)
    click.echo(
        f"metrics at http://{address(host, server.server_port)}/metrics from Redis {redact_shards(obj.redis_url)}",
        err=True,
    )
    return server


@click.command("dashboard")
@click.option("--port", default=9181, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--username", envvar="CRAWLER_DASHBOARD_USERNAME", help="Ask for HTTP basic credentials, this user.")
@click.option("--password", envvar="CRAWLER_DASHBOARD_PASSWORD", help="The password of --username.")
@click.option("--allow-host", "allowed_hosts", multiple=True, help="A host name the dashboard answers to (repeatable).")
@pass_context
def dashboard_(
    obj: Context, port: int, host: str, username: str | None, password: str | None, allowed_hosts: tuple[str, ...]
) -> None:
    """Serve rq-dashboard (RQ's queues, jobs and workers) for this Redis, read-only, until Ctrl-C.

    It answers to IP addresses, localhost and --allow-host names only, refuses cross-site
    requests, and off loopback needs --username and --password.
    Needs the dashboard extra: pip install 'crawler[dashboard]'.
    """
    from ..ops.dashboard import make_app

    if not _loopback(host) and not (username and password):
        raise ConfigError(f"crawler dashboard on {host} (not loopback) needs --username and --password")
    obj.read_only = True
    for _, client in obj.shards.clients():
        client.ping()
    urls = [shard.url for shard in obj.shards.shards]  # rq-dashboard's instance list: a shard each
    app = make_app(urls, username=username, password=password, allowed_hosts=allowed_hosts)
    click.echo(f"dashboard at http://{host}:{port}/ for Redis {redact_shards(obj.redis_url)}", err=True)
    app.run(host=host, port=port)


def _loopback(host: str) -> bool:
    """Whether ``host`` (an address to listen on) is a loopback address or ``localhost``."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


@click.command("metrics")
@click.option(
    "--port",
    default=9108,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to listen on (0: any free port).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@pass_context
def metrics_(obj: Context, port: int, host: str) -> None:
    """Serve the fleet's Prometheus metrics, read from Redis on every scrape, until Ctrl-C."""
    obj.read_only = True
    for _, client in obj.shards.clients():
        client.ping()
    server = None
    try:  # a Ctrl-C as the server starts stops it as well
        server = serve_metrics(obj, host, port)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


#: The commands this module adds to ``crawler`` (``app`` registers them).
COMMANDS = [dashboard_, metrics_]
