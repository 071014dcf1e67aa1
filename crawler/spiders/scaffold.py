"""``crawler new NAME URL``: a new spider module, ready to run and to edit."""

from __future__ import annotations

import keyword
import shlex
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ConfigError
from .check import SITE_NAME

TEMPLATE = '''"""{name}: the spider of {host_text} (written by `crawler new`).

Edit it, then check it and run it:

    crawler fetch {url_text}     # what the site answers
    crawler parse {name} {url_text}   # what parse yields
    crawler crawl {name}
    crawler export {name} -o {name}.jsonl
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from crawler import Page, Request, Spider


class {cls}(Spider):
    name = "{name}"
    # Where the crawl starts (`crawler seed {name}` seeds these).
    start_urls = [{url_literal}]
    # Hosts (and their subdomains) the crawl may request: links to any other host are dropped.
    allowed_domains = [{host_literal}]
    # Seconds between two requests to the site, counted across every worker on every host.
    # Be polite: one request a second is a common ceiling; `crawler set {name} --interval 2`
    # changes it while the crawl runs.
    interval = 1.0
    # The item field that identifies an item: an item yielded again with the same key
    # updates the one stored. None: the page URL and the item's position on the page.
    item_key = "url"

    def parse(self, page: Page) -> Iterator[Request]:
        """Every page: follow its links, each page they lead to parsed by ``parse_item``."""
        # Narrow the selector to the links worth following, e.g. "a.product, a.next".
        yield from page.follow_all("a", callback=self.parse_item)

    def parse_item(self, page: Page) -> Iterator[dict[str, Any] | Request]:
        """A page to extract: one item (a dict, stored under its ``item_key``), then its links."""
        yield {{
            "url": page.url,
            # page.text(selector): the first match's text, its spacing as the page shows it ("" if none).
            "title": page.text("title") or None,
            # "price": page.text(".price"),
        }}
        yield from self.parse(page)
'''


def check_name(name: str) -> None:
    """ConfigError unless ``name`` can name a site and its module: an ASCII identifier, not a keyword."""
    if not (name.isidentifier() and SITE_NAME.match(name)) or keyword.iskeyword(name):
        raise ConfigError(
            f"site name {name!r}: a Python identifier of letters, digits and _ (starting with a letter or digit, "
            "at most 64 characters), not a keyword"
        )


def check_url(url: str) -> str:
    """``url``'s host; ConfigError unless ``url`` is an http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018  # a port that is not a number raises
    except ValueError as exc:
        raise ConfigError(f"URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not host or any(c.isspace() for c in url):
        raise ConfigError(f"URL {url!r}: give an http:// or https:// URL with a host")
    return host


def spider_source(name: str, url: str) -> str:
    """The module ``crawler new`` writes for site ``name`` starting at ``url`` (both checked)."""
    check_name(name)
    host = check_url(url)
    cls = "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Site"
    if cls[0].isdigit():
        cls = f"Site{cls}"
    return TEMPLATE.format(
        name=name,
        cls=cls,
        url_text=_docstring_text(shlex.quote(url)),
        host_text=_docstring_text(host),
        url_literal=_literal(url),
        host_literal=_literal(host),
    )


def _literal(text: str) -> str:
    """A Python string literal of ``text`` (``repr``), in double quotes as ruff formats them when it can be."""
    literal = repr(text)
    if literal.startswith("'") and '"' not in text:
        return f'"{literal[1:-1]}"'  # repr chose single quotes, so ``text`` holds no quote of either kind
    return literal


def _docstring_text(text: str) -> str:
    """``text`` escaped to sit inside a triple-double-quoted docstring and read back as itself: backslashes,
    quotes and unprintable characters escaped as ``repr`` escapes them."""
    return repr(text)[1:-1].replace('"', '\\"')


def write_spider(sites_dir: str | Path, name: str, url: str) -> Path:
    """Write ``sites_dir/NAME.py`` (the directory made if missing); ConfigError if it exists or cannot be written."""
    source = spider_source(name, url)
    path = Path(sites_dir) / f"{name}.py"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as out:
            out.write(source)
    except FileExistsError:
        raise ConfigError(f"{path} exists: not overwritten (choose another name, or delete it)") from None
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    return path
