"""The spider author's commands: ``crawler new``, ``crawler fetch``, ``crawler parse``, ``crawler shell``.

Registered on the ``crawler`` group by ``crawler.cli.app``; thin shells over
``crawler.ops.devtools``, ``crawler.ops.shell`` and ``crawler.spiders.scaffold``.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import click

from ..coord.session import redacted_set_cookie
from ..errors import ConfigError
from ..http.fetch import Response
from ..ops.devtools import fetch_as_worker, page_of, parse_meta, route, run_callback, seen_in, site_for, summary_lines
from ..ops.devtools import verdict as worker_verdict
from ..spiders.items import ItemError
from ..spiders.scaffold import check_name, write_spider
from ..spiders.spider import Page, Spider
from .context import Context, pass_context


@click.command("fetch")
@click.argument("url")
@click.option("--site", "site_name", help="The site whose gate and robots.txt apply [the one whose domains allow URL].")
@click.option("--headers", "headers_only", is_flag=True, help="Print the status and headers only, on stdout.")
@click.option("--render", is_flag=True, help="Render URL in the browser and print its DOM [as the spider says].")
@click.option("--render-wait", metavar="CSS", help="With --render: take the DOM once this selector is in it.")
@pass_context
def fetch_(
    obj: Context, url: str, site_name: str | None, headers_only: bool, render: bool, render_wait: str | None
) -> None:
    """Download URL as a worker would (robots.txt, the site's gate, the caps): status, headers, body."""
    site = site_for(obj.spider_set, url, site_name)
    response = fetch_as_worker(obj.runtime_for(site), site, url, render_meta(render, render_wait))
    head = _head(response, site, obj.spider_set.get(site))
    if headers_only:
        click.echo(head)
        return
    click.echo(head + "\n", err=True)
    click.echo(response.body, nl=False)  # bytes: written as received, whatever the charset


def render_meta(render: bool, render_wait: str | None) -> dict[str, Any]:
    """``--render`` / ``--render-wait`` as a request's meta carries them (``Request``)."""
    if render_wait is not None and not render:
        raise click.BadParameter("needs --render", param_hint="--render-wait")
    return {"render": True, **({"render_wait": render_wait} if render_wait else {})} if render else {}


def _head(response: Response, site: str, spider: type[Spider]) -> str:
    what = worker_verdict(response, spider.content_types, spider.follow_meta_refresh)
    lines = [
        f"HTTP {response.status} {response.url} (site {site}, {len(response.body)} bytes in "
        f"{response.elapsed:.3f}s): {what}"
    ]
    lines += [f"{name}: {value}" for name, value in response.headers.items()]
    lines += [f"set-cookie: {redacted_set_cookie(value)}" for value in response.set_cookies]  # values are secrets
    return "\n".join(lines)


@click.command("parse")
@click.argument("site")
@click.argument("url")
@click.option("--callback", default="parse", show_default=True, help="The spider method to run on the page.")
@click.option("--meta", "meta_json", metavar="JSON", help="The request's meta, a JSON object (page.meta).")
@click.option(
    "--body",
    "body_file",
    type=click.Path(dir_okay=False, exists=True),
    help="Parse this saved file as URL's body instead of downloading it.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def parse_(
    obj: Context, site: str, url: str, callback: str, meta_json: str | None, body_file: str | None, as_json: bool
) -> None:
    """Run one callback on URL and print its items and requests, with where each would go."""
    spider = obj.spider_set.get(site)()
    meta = parse_meta(meta_json)
    try:
        spider.callback(callback)
    except AttributeError as exc:
        raise ConfigError(str(exc.args[0] if exc.args else exc)) from None
    if body_file is not None:
        with open(body_file, "rb") as f:
            page = Page(url, f.read(), meta=meta)
    else:
        response = fetch_as_worker(obj.runtime_for(site), site, url)
        page = page_of(response, meta, spider.content_types, spider.follow_meta_refresh)
    try:
        outputs = run_callback(spider, page, callback)
    except Exception as exc:
        # The spider's own bug: its traceback is what its author needs, then the one-line verdict.
        click.echo(traceback.format_exc().rstrip(), err=True)
        if isinstance(exc, ItemError):  # process_item or a pipeline: the step and the message
            raise ConfigError(f"{exc} (on {url})") from None
        raise ConfigError(f"{callback} raised {type(exc).__name__} on {url}") from None
    routed = route(outputs.requests, spider.domains(), seen_in(obj.redis_for(site), site))
    if as_json:
        click.echo(
            json.dumps(
                {"items": outputs.items, "dropped": outputs.dropped, "requests": [r.as_dict() for r in routed]},
                indent=2,
                ensure_ascii=False,
                default=str,
            )
        )
        return
    for line in summary_lines(outputs, routed):
        click.echo(line)


@click.command("shell")
@click.argument("site")
@click.argument("url", required=False)
@click.option("--plain", is_flag=True, help="Python's own console even if IPython is installed.")
@click.option("--render", is_flag=True, help="Render URL in the browser: page is its DOM [as the spider says].")
@click.option("--render-wait", metavar="CSS", help="With --render: take the DOM once this selector is in it.")
@pass_context
def shell_(obj: Context, site: str, url: str | None, plain: bool, render: bool, render_wait: str | None) -> None:
    """An interactive prompt with SITE's spider and a fetched page bound (IPython when installed)."""
    from ..ops.shell import Shell

    obj.site(site)
    shell = Shell(obj.runtime_for(site), site, echo=click.echo)
    if url is not None:
        shell.fetch(url, render_meta(render, render_wait))
    if not sys.stdin.isatty() and not plain:
        plain = True  # IPython wants a terminal; piped commands go to the plain console
    shell.interact(plain=plain)


#: The commands this module adds to ``crawler`` (``app`` registers them).
@click.command()
@click.argument("name")
@click.argument("url")
@pass_context
def new(obj: Context, name: str, url: str) -> None:
    """Write sites/NAME.py: a spider for the site at URL, ready to run and to edit (never overwrites)."""
    check_name(name)
    if name in obj.spider_set.spiders or name in obj.spider_set.by_name:
        raise ConfigError(f"a spider named {name!r} exists already")
    path = write_spider(obj.settings.sites_dir, name, url)
    click.echo(f"wrote {path}: edit it, then `crawler crawl {name}`")


COMMANDS = [fetch_, parse_, shell_, new]
