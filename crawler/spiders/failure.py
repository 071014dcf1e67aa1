"""What an errback is handed: a request that finally failed (``Failure``), and which errback a request has.

A request's ``errback`` (a spider method or its name, as callbacks are), else the spider's own
``errback`` (an attribute naming a method, or a method of that name), is called once, in a
parse worker, when the request has failed for good: retries spent, a status the crawler does
not retry, refused (robots.txt, an address or domain rule), or no answer. It may yield items
and requests as a callback does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spider import Page

#: What a failure's ``kind`` may be: an HTTP status (``status`` says which), no answer in time, no
#: connection, refused by a rule before any request (robots.txt, an address or domain), a body
#: over the cap, an answer that could not be read, or too many redirects; ``error`` for the rest.
KINDS = ("status", "timeout", "connection", "refused", "too_large", "bad_response", "redirects", "error")


@dataclass(frozen=True)
class Failure:
    """A request that finally failed, as its errback sees it.

    ``kind``: one of ``KINDS``; ``status``: the HTTP status when there was an answer; ``error``:
    the crawler's message, as the fetch record has it; ``attempts``: how many tries were made;
    ``page``: the answer, when there was one (its body, headers, selectors), else None;
    ``meta``: the request's, as its callback would have had it.
    """

    url: str
    method: str
    kind: str
    error: str
    attempts: int
    status: int | None = None
    page: Page | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def errback_of(spider: Any, requested: str | None) -> str | None:
    """The name of the errback a failed request of ``spider`` goes to: its own (``requested``), else
    the spider's ``errback`` (a method, or a name), else None (no errback: the failure is recorded only)."""
    if requested:
        return requested
    default = getattr(spider, "errback", None)
    if default is None or isinstance(default, str):
        return default or None
    name = getattr(default, "__name__", None)
    return str(name) if name else None
