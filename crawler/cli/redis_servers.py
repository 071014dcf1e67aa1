"""``crawler redis list|start|stop``: see and steer the Redis servers a command here could use.

Registered on the ``crawler`` group by ``crawler.cli.app``. Credentials are never shown.
"""

from __future__ import annotations

import click

from ..coord.connection import LOCALHOST_URL, EmbeddedRedis, answers
from ..settings import REDIS_EMBEDDED, redact_url, split_shards
from .context import Context, pass_context


@click.group("redis")
def redis_group() -> None:
    """List, start and stop the Redis servers commands here use."""


def _embedded(obj: Context) -> EmbeddedRedis:
    return EmbeddedRedis(obj.settings.state_dir, persistent=True)


def _size(path_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if path_bytes < 1024 or unit == "GiB":
            return f"{path_bytes:.0f} {unit}" if unit == "B" else f"{path_bytes:.1f} {unit}"
        path_bytes /= 1024  # type: ignore[assignment]
    return ""


@redis_group.command("list")
@pass_context
def list_(obj: Context) -> None:
    """Every Redis a command here could use, which one it uses (*), and whether it answers."""
    chosen = obj.redis_choice  # resolving never starts a server
    configured = obj.settings.redis_url
    rows = []
    if configured and configured != REDIS_EMBEDDED:
        shards = split_shards(configured)
        for name, url in shards:  # each shard of several on a line of its own
            kind = "configured" if len(shards) == 1 else f"shard {name}"
            rows.append((kind, url, "answers" if answers(url) else "does not answer"))
    server = _embedded(obj)
    if server.running():
        state = f"running, pid {server.pid() or '?'}"
    elif server.data_file.exists():
        state = "stopped, data kept"
    else:
        state = "none"
    if server.data_file.exists():
        state += f", {_size(server.data_file.stat().st_size)} in {server.data_file}"
    rows.append(("embedded", server.url, state))
    rows.append(("localhost", LOCALHOST_URL, "answers" if answers(LOCALHOST_URL) else "does not answer"))
    for kind, url, state in rows:
        mark = "*" if url == chosen.url else " "
        click.echo(f"{mark} {kind:<10}  {redact_url(url)}  {state}")
    used = f"the shards above ({len(split_shards(configured))})" if len(split_shards(configured)) > 1 else None
    click.echo(f"commands here use {used or chosen.describe()}", err=True)


@redis_group.command("start")
@pass_context
def start(obj: Context) -> None:
    """Start the embedded Redis server of the state directory (its data is kept there)."""
    server = _embedded(obj)
    if not server.start():
        click.echo(f"the embedded Redis server is already running: {server.url}")
        return
    click.echo(f"started the embedded Redis server: {server.url} (data in {server.data_file})")


@redis_group.command("stop")
@pass_context
def stop(obj: Context) -> None:
    """Stop the embedded Redis server of the state directory (its data is kept)."""
    server = _embedded(obj)
    pid = server.pid()
    if not server.shutdown():
        click.echo(f"no embedded Redis server is running in {server.state_dir}")
        return
    click.echo(f"stopped the embedded Redis server (pid {pid or '?'}); its data stays in {server.data_file}")


#: The commands this module adds to ``crawler`` (``app`` registers them).
COMMANDS = [redis_group]
