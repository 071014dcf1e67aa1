"""URLs: one canonical spelling (w3lib's, with shortcuts held to it), http(s) only, allowed domains."""

from __future__ import annotations

import random
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import pytest
from w3lib.url import canonicalize_url

from crawler.errors import RefusedURL
from crawler.urls import canonicalize, host_allowed

# canonicalize ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.com/a#frag", "http://example.com/a"),
        ("http://example.com/a?b=2&a=1", "http://example.com/a?a=1&b=2"),
        ("http://example.com:80/a", "http://example.com/a"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("https://example.com:8443/a", "https://example.com:8443/a"),
        ("HTTP://Example.COM/a", "http://example.com/a"),
        ("http://example.com", "http://example.com/"),
        ("  http://example.com/p  ", "http://example.com/p"),
    ],
)
def test_canonicalize_normalizes_one_spelling(url: str, expected: str) -> None:
    assert canonicalize(url) == expected


def test_different_spellings_of_one_url_canonicalize_the_same() -> None:
    spellings = [
        "http://example.com/list?page=2&sort=price",
        "HTTP://EXAMPLE.com:80/list?sort=price&page=2#top",
        "http://Example.Com/list?sort=price&page=2",
        " http://example.com:80/list?page=2&sort=price#",
    ]
    assert len({canonicalize(u) for u in spellings}) == 1


@pytest.mark.parametrize(
    "url",
    [
        "mailto:someone@example.com",
        "javascript:alert(1)",
        "ftp://example.com/file",
        "data:text/html,hi",
        "/relative/path",
        "",
        "http:///no-host",
        "http://",
        "http://example.com:99999/",
        "http://example.com:abc/",
        "http://exa mple.com/",
    ],
)
def test_canonicalize_refuses_non_http_hostless_and_malformed(url: str) -> None:
    with pytest.raises(RefusedURL):
        canonicalize(url)


def old_canonicalize(url: str) -> str:
    """``canonicalize`` as written before its shortcuts: the oracle they are held to."""
    url = url.strip()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RefusedURL(f"malformed URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise RefusedURL(f"not an http(s) URL: {url!r}")
    host = (parts.hostname or "").lower()
    if not host or any(c.isspace() for c in host) or "%" in host:
        raise RefusedURL(f"URL has no valid host: {url!r}")
    try:
        canonical = canonicalize_url(url, keep_fragments=False)
    except (ValueError, UnicodeError) as exc:
        raise RefusedURL(f"malformed URL {url!r}: {exc}") from None
    if port == {"http": 80, "https": 443}[scheme]:
        parts = urlsplit(canonical)
        netloc = parts.netloc.rsplit(":", 1)[0]
        canonical = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    return canonical


def outcome(function: Callable[[str], str], url: str) -> str:
    try:
        return function(url)
    except RefusedURL as exc:
        return f"refused: {exc}"


SCHEMES = ["http://", "https://", "HTTP://", "Https://", "ftp://", "mailto:", "", "//", " http://", "http:/"]
HOSTS = [
    "example.com",
    "Example.COM",
    "a.b-c.example.com",
    "127.0.0.1",
    "[::1]",
    "[::1",
    "exa mple.com",
    "",
    "xn--bcher-kva.example",
    "bücher.example",
    "example.com:80",
    "example.com:443",
    "example.com:8443",
    "user:pw@example.com",
    "example.com:abc",
    "example.com:99999",
    "ex%41mple.com",
    "example.com.",
    "localhost",
    "127.0.0.1:8080",
    "10.0.255.1:65535",
    "10.0.0.1:65536",
    "1.2.3.4:0",
    "1.2.3.4:080",
    "256.1.1.1",
    "01.2.3.4",
    "1.2.3",
    "example.com:1",
    "http.example:80",
]
PATH_PIECES = [
    "/",
    "/",
    "/",
    "a",
    "b-c",
    "x.html",
    "~u",
    ".",
    "..",
    "//",
    ";p",
    "%2f",
    "%41",
    " ",
    "\t",
    "é",
    ":",
    "@",
    "'",
    "(",
    "|",
    "[",
    "\\",
    "+",
    "\ud800",
]
TAILS = ["", "", "", "?b=2&a=1", "?q", "?", "#f", "#", "#f g", "#é", "?x=1#f", "#\ud800", "  "]


def random_urls(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        rng.choice(SCHEMES)
        + rng.choice(HOSTS)
        + "".join(rng.choices(PATH_PIECES, k=rng.randrange(0, 6)))
        + rng.choice(TAILS)
        for _ in range(n)
    ]


def test_canonicalize_gives_what_it_always_gave_for_any_url() -> None:
    plain = [f"https://docs.example/{p}" for p in ("a/b.html", "a/b.html#x", "a/./b", "a/../b", "a;p", "A/~b/", "")]
    for url in (plain + random_urls(5_000, seed=7)) * 2:  # twice: the second time from the caches
        assert outcome(canonicalize, url) == outcome(old_canonicalize, url), url


# host_allowed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://example.com/", True),
        ("http://www.example.com/", True),
        ("http://a.b.example.com/x", True),
        ("http://EXAMPLE.com/", True),
        ("http://evilexample.com/", False),
        ("http://example.com.evil.net/", False),
        ("http://other.org/", False),
        ("not a url", False),
    ],
)
def test_host_allowed_takes_subdomains_but_not_lookalikes(url: str, allowed: bool) -> None:
    assert host_allowed(url, ["example.com"]) is allowed
