"""A body's bytes made text: an HTML page by the charset browsers would take, JSON as RFC 8259 reads it.

A charset label is a hint from the server or the page, taken only when it names a character
set: a Python codec that is not one (``hex``, ``base64``, ``zlib``, ``rot13``,
``unicode_escape``, ``undefined``), a name nobody knows, or a value with NUL bytes counts as
no label, as browsers and Scrapy (w3lib) ignore it. Bytes that do not decode become U+FFFD.
Nothing here raises on what a site sends.
"""

from __future__ import annotations

import codecs
import json
import re
from functools import lru_cache

from w3lib.encoding import html_body_declared_encoding, read_bom, resolve_encoding, to_unicode

#: The Encoding Standard's x-user-defined, which Python has no codec for: an ASCII byte is itself,
#: a byte 0x80-0xFF the private-use character U+F780-U+F7FF.
X_USER_DEFINED = "x-user-defined"
_X_USER_DEFINED = {byte: 0xF700 + byte for byte in range(0x80, 0x100)}

#: Python's text codecs that are no character set: they turn escapes into characters (``\u003c``,
#: or UTF-7's ``+ADw-``, into live markup), decode host names, or refuse every byte.
_NOT_CHARSETS = frozenset(
    {"idna", "punycode", "raw-unicode-escape", "unicode-escape", "undefined", "utf-7", "mbcs", "oem"}
)

#: How a charset label can be spelled (the Encoding Standard's labels and Python's codec names);
#: anything else (a NUL byte, a quote, a kilobyte of letters) names none.
_LABEL = re.compile(r"[a-z0-9._:-]{1,40}")
_ASCII_WHITESPACE = " \t\n\f\r"

_UTF_16_32 = ("utf-16", "utf-32")


def charset(label: str | None) -> str | None:
    """The Python codec the charset ``label`` names, read as browsers and w3lib read labels
    (``latin1`` is ``cp1252``, ``utf-16`` little-endian), or ``X_USER_DEFINED``; None when it
    names no character set."""
    if not label:
        return None
    label = label.strip(_ASCII_WHITESPACE).lower()
    return _codec(label) if _LABEL.fullmatch(label) else None


@lru_cache(maxsize=256)
def _codec(label: str) -> str | None:
    if label == X_USER_DEFINED:
        return X_USER_DEFINED
    name = resolve_encoding(label)
    if name is None or name in _NOT_CHARSETS or not codecs.lookup(name)._is_text_encoding:
        return None
    # The Encoding Standard's "utf-16" label is UTF-16LE; Python would take the machine's order.
    return {"utf-16": "utf-16-le", "utf-32": "utf-32-be"}.get(name, name)


def decode(data: bytes, encoding: str) -> str:
    """``data`` decoded with ``encoding`` (a name ``charset`` returned), invalid bytes made U+FFFD."""
    if encoding == X_USER_DEFINED:
        return data.decode("latin-1").translate(_X_USER_DEFINED)
    return to_unicode(data, encoding)


def html_text(body: bytes, content_type_charset: str | None = None) -> str:
    """``body`` decoded as browsers and Scrapy decode an HTML page.

    A byte-order mark first, then the ``Content-Type`` header's charset, then the page's
    own ``<meta charset>`` (or ``http-equiv``, or an XML declaration) in its first 4 KB,
    then UTF-8; a label that names no character set is skipped for the next.
    """
    bom, mark = read_bom(body)
    if bom is not None and mark is not None:
        return decode(body[len(mark) :], bom)
    return decode(body, charset(content_type_charset) or _declared(body) or "utf-8")


def _declared(body: bytes) -> str | None:
    encoding = charset(html_body_declared_encoding(body))
    # A page whose declaration reads as ASCII is not UTF-16: HTML's prescan takes UTF-8 then.
    return "utf-8" if encoding is not None and encoding.startswith(_UTF_16_32) else encoding


def json_text(body: bytes, content_type_charset: str | None = None) -> str:
    """``body`` decoded as JSON is (RFC 8259; Python's ``json.loads(bytes)``), never by a ``<meta>``.

    A byte-order mark first; else UTF-16 or UTF-32 when the zero bytes of the first
    characters say so (JSON's first two characters are ASCII); else the ``Content-Type``
    header's charset if it names an ASCII-compatible character set; else UTF-8.
    """
    # JSON's own detection, not w3lib's read_bom: browsers (and w3lib >= 2.6) read a UTF-32LE
    # mark as UTF-16LE's, which JSON is not. Every encoding it names is a Python Unicode codec.
    detected = json.detect_encoding(body)
    if detected != "utf-8":
        return body.decode(detected, "replace")
    declared = charset(content_type_charset)
    return decode(body, declared if declared is not None and not declared.startswith(_UTF_16_32) else "utf-8")


def is_json(content_type: str | None) -> bool:
    """Whether ``content_type`` (a Content-Type header's value) is JSON: ``application/json``,
    ``text/json`` or a ``+json`` type."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media in ("application/json", "text/json") or media.endswith("+json")
