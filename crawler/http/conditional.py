"""Conditional refreshes: a page's validators (ETag, Last-Modified), kept from one fetch to the next.

A page with a refresh schedule is fetched again with ``If-None-Match`` and
``If-Modified-Since`` from its last fetch; a ``304 Not Modified`` costs a few hundred
bytes instead of the page, and no parse. Where the validators live: **in the frontier
entry of the page's scheduled refresh** (its eighth field, ``[etag, last_modified]``,
the date as epoch seconds), not in a per-site hash. The refresh entry exists anyway,
one per page, so this costs about 40 bytes a page and no Redis round trip: the download
job that gets the refresh has them in its task, and the one that schedules the next
refresh writes the new ones. A hash would cost a read per refresh, about 100 bytes a
page, and entries outliving the pages (it has no per-field expiry in Redis 6).

Validators are trusted only while the page's last parse did not fail: a parse that
fails marks the page in ``crawler:parse-failed:{SITE}`` (cleared by the next successful
parse), and such a page is fetched whole, so a 304 never stands for items that were not
stored.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from typing import Any

#: An ETag longer than this is not kept (a header that size is not a validator worth its bytes).
MAX_ETAG = 256

#: An ETag that can be sent back: visible ASCII only (RFC 7232 ``entity-tag``: ``W/``, quotes
#: and etagc; its obs-text, bytes over 0x7F, is left out, as is a space). httpx refuses a
#: header that is not ASCII: an ETag ``"café"`` kept made the refresh raise before it was sent.
_SENDABLE_ETAG = re.compile(rf"[\x21-\x7e]{{1,{MAX_ETAG}}}")

Validators = tuple[str | None, int | None]


def check_validators(value: Any) -> Validators | None:
    """``value`` (from a frontier entry or a job) as (etag, last-modified epoch seconds); ValueError if malformed."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError(f"validators must be [etag, last_modified], not {value!r:.100}")
    etag, modified = value
    if etag is not None and (not isinstance(etag, str) or not etag or len(etag) > MAX_ETAG or not etag.isprintable()):
        raise ValueError(f"bad ETag in validators: {etag!r:.100}")
    if modified is not None and (isinstance(modified, bool) or not isinstance(modified, int) or modified < 0):
        raise ValueError(f"bad Last-Modified in validators: {modified!r:.100}")
    return None if etag is None and modified is None else (etag, modified)


def validators_of(headers: Mapping[str, str], previous: Validators | None = None) -> Validators | None:
    """The validators a response's headers (lower-case names) give, each falling back on ``previous``.

    A 304 may repeat its validators or leave them out (RFC 9110 §15.4.5): what it leaves
    out stays as it was. An ETag that could not be sent back (not visible ASCII, or over
    ``MAX_ETAG``) and a Last-Modified that is not an HTTP date are not kept.
    """
    etag = headers.get("etag", "").strip() or None
    if etag is not None and not sendable_etag(etag):
        etag = None
    modified = _epoch(headers.get("last-modified"))
    old_etag, old_modified = previous or (None, None)
    return check_validators([etag or old_etag, modified if modified is not None else old_modified])


def sendable_etag(etag: str) -> bool:
    """Whether ``etag`` can be sent back in ``If-None-Match``: 1 to ``MAX_ETAG`` visible ASCII characters."""
    return _SENDABLE_ETAG.fullmatch(etag) is not None


def request_headers(validators: Validators | None) -> dict[str, str]:
    """``If-None-Match`` and ``If-Modified-Since`` for a refresh with these validators.

    An ETag that cannot be sent (kept by an older version, or written by hand: see
    ``sendable_etag``) is left out; the refresh asks with the date alone, or for the whole page.
    """
    if validators is None:
        return {}
    etag, modified = validators
    headers = {}
    if etag and sendable_etag(etag):
        headers["if-none-match"] = etag
    if modified is not None:
        headers["if-modified-since"] = email.utils.formatdate(modified, usegmt=True)
    return headers


def _epoch(value: str | None) -> int | None:
    """An HTTP date as whole epoch seconds, or None when absent or unreadable."""
    if not value or not value.isascii():
        return None
    try:
        moment = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        return None  # not an HTTP date (those are GMT): better none than a wrong one
    seconds = int(moment.timestamp())
    return seconds if seconds >= 0 else None
