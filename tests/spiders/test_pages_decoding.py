"""How a page's bytes become text (``crawler.spiders.decoding``): charset labels that name no
character set, JSON decoded as JSON, and bytes that do not decode; through ``Page``, the meta
refresh check, and a real crawl of a loopback site."""

from __future__ import annotations

import codecs
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from crawler.http.redirects import meta_refresh_target
from crawler.spiders.decoding import charset, html_text, json_text
from crawler.spiders.spider import Page, Spider
from crawler.testing import crawl

URL = "http://shop.example/"

#: Python codecs that are no text encoding, and text codecs that are no character set.
NOT_CHARSETS = ["hex", "base64", "zlib", "rot13", "uu", "bz2", "quopri", "undefined", "x-undefined"]
NOT_CHARSETS += ["unicode_escape", "raw_unicode_escape", "idna", "punycode", "utf-7", "no-such-charset"]

#: Labels that name nothing however they are read: NUL bytes, a kilobyte of letters, quotes, non-ASCII.
MALFORMED_LABELS = ["utf-8\x00", "\x00koi8-r", "x" * 5000, "utf" * 30 + "-8", '"utf-8"', "utf-8;", "ütf-8", " "]


def koi8_page() -> bytes:
    return '<meta charset="koi8-r"><p>Привет</p>'.encode("koi8-r")


# -- 1. a label that names no character set counts as none -----------------------------------------


@pytest.mark.parametrize("label", NOT_CHARSETS)
def test_a_header_charset_that_is_no_character_set_is_skipped_for_the_pages_meta(label: str) -> None:
    assert Page(URL, koi8_page(), encoding=label).text("p") == "Привет"


@pytest.mark.parametrize("label", NOT_CHARSETS)
def test_a_meta_charset_that_is_no_character_set_is_skipped_for_utf8(label: str) -> None:
    page = Page(URL, f'<meta charset="{label}"><p>café \\u003cb\\u003e +ADw-i+AD4-</p>'.encode())
    assert page.text("p") == "café \\u003cb\\u003e +ADw-i+AD4-"  # escapes stay text, as browsers show them
    xml = Page(URL, f'<?xml version="1.0" encoding="{label}"?><p>café</p>'.encode())
    assert xml.text("p") == "café"


def test_a_header_charset_that_names_one_still_wins_over_the_pages() -> None:
    body = '<meta charset="koi8-r"><p>café</p>'.encode("latin-1")
    assert Page(URL, body, encoding="ISO-8859-1").text("p") == "café"
    assert Page(URL, body, encoding=" Latin1 ").text("p") == "café"  # any case, ASCII spaces around


def test_x_user_defined_in_the_header_decodes_as_the_encoding_standard_says() -> None:
    # ASCII is itself, 0x80-0xFF the private-use characters U+F780-U+F7FF (what browsers show).
    assert Page(URL, b"<p>a\x80\xff</p>", encoding="x-user-defined").text("p") == "a\uf780\uf7ff"


def test_a_meta_declaring_utf16_is_read_as_utf8_as_htmls_prescan_reads_it() -> None:
    # A declaration readable as ASCII cannot be in UTF-16 (w3lib would read the page as UTF-16BE).
    assert Page(URL, '<meta charset="utf-16"><p>café</p>'.encode()).text("p") == "café"


def test_a_bom_still_wins_over_a_label_that_names_nothing() -> None:
    body = codecs.BOM_UTF16_LE + "<p>café</p>".encode("utf-16-le")
    assert Page(URL, body, encoding="hex").text("p") == "café"


@pytest.mark.parametrize("label", ["hex", "base64", "zlib", "undefined", "idna", "punycode"])
def test_a_meta_refresh_in_a_page_declaring_no_character_set_is_still_found(label: str) -> None:
    stub = f'<meta charset="{label}"><meta http-equiv="refresh" content="0; url=/caf\u00e9">'.encode()
    assert meta_refresh_target(URL, stub) == "http://shop.example/caf%C3%A9"
    header = b'<meta http-equiv="refresh" content="0; url=/next">'
    assert meta_refresh_target(URL, header, charset=label) == "http://shop.example/next"


# -- 2. JSON decoded as JSON ----------------------------------------------------------------------------

DATA = {"html": "<meta charset='koi8-r'>é", "name": "Привет", "n": 1}


@pytest.mark.parametrize("meta", ["<meta charset='koi8-r'>", "<meta charset=koi8-r>", '<meta charset="koi8-r">'])
def test_json_is_not_decoded_by_a_meta_charset_inside_one_of_its_strings(meta: str) -> None:
    data = {**DATA, "html": meta + "é"}
    body = json.dumps(data, ensure_ascii=False).encode()
    for headers in ({"content-type": "application/json"}, {"content-type": "text/html"}, {}):
        assert Page(URL, body, headers=headers).json() == data
    # The text of a JSON response is what json() parses.
    assert Page(URL, body, headers={"content-type": "application/json; charset=utf-8"}).text == body.decode()


@pytest.mark.parametrize(
    "encoded",
    [
        pytest.param(json.dumps(DATA, ensure_ascii=False).encode(codec), id=codec)
        for codec in ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be", "utf-8-sig", "utf-16", "utf-32")
    ],
)
def test_json_in_utf16_or_utf32_with_or_without_a_bom_and_utf8_with_one_parses(encoded: bytes) -> None:
    assert Page(URL, encoded, headers={"content-type": "application/json"}).json() == DATA
    # The header's charset does not override what the first bytes say about UTF-8, -16 and -32.
    assert Page(URL, encoded, encoding="utf-8").json() == DATA


def test_json_honours_a_header_charset_only_when_it_names_a_character_set() -> None:
    latin = json.dumps({"name": "café"}, ensure_ascii=False).encode("latin-1")
    assert Page(URL, latin, encoding="iso-8859-1").json() == {"name": "café"}
    utf8 = json.dumps({"name": "café"}, ensure_ascii=False).encode()
    for label in ["hex", "base64", "zlib", "undefined", "idna", "utf-7", "utf-8\x00", "utf-16"]:
        assert Page(URL, utf8, encoding=label).json() == {"name": "café"}, label


def test_json_text_and_html_text_differ_only_in_the_meta_sniffing() -> None:
    body = '"<meta charset=koi8-r>é"'.encode()
    assert json.loads(json_text(body)) == "<meta charset=koi8-r>é"
    assert html_text(body) != json_text(body)  # HTML rules take the meta: é read as KOI8-R


# -- 3. nothing a site sends makes decoding raise --------------------------------------------------


@pytest.mark.parametrize("label", MALFORMED_LABELS)
def test_a_malformed_label_names_no_character_set_in_the_header_or_the_page(label: str) -> None:
    assert charset(label) is None
    assert Page(URL, koi8_page(), encoding=label).text("p") == "Привет"
    page = Page(URL, f"<meta charset='{label}'><p>café</p>".encode("utf-8", "surrogatepass"))
    assert page.text("p") == "café"


@pytest.mark.parametrize(
    ("label", "body", "text"),
    [
        ("utf-8", b"caf\xe9 \xff ok", "caf\ufffd \ufffd ok"),
        ("shift_jis", b"\x82\xa0 \x82 ok", "\u3042 \ufffd ok"),
        ("utf-16-le", b"o\x00k\x00!", "ok\ufffd"),
        ("gb18030", b"\x80 \xff ok", "\u20ac \ufffd ok"),  # 0x80 is the euro sign, as the Encoding Standard says
        ("iso-2022-jp", b"\x1b$B\xff\xff\x1b(B ok", "\ufffd\ufffd ok"),
    ],
)
def test_bytes_invalid_in_the_declared_encoding_become_replacement_characters(
    label: str, body: bytes, text: str
) -> None:
    assert Page(URL, body, encoding=label).text == text
    assert Page(URL, body, headers={"content-type": "application/json"}, encoding=label).text == text


@pytest.mark.parametrize("label", ["undefined", "idna", "punycode"])
def test_a_label_whose_codec_refuses_every_byte_decodes_as_utf8(label: str) -> None:
    # Python's undefined, idna and punycode codecs raise even with errors="replace".
    assert Page(URL, "<p>café</p>".encode(), encoding=label).text("p") == "café"
    assert Page(URL, b'{"a": "\xc3\xa9"}', encoding=label).json() == {"a": "é"}


# -- a real crawl: each page recorded, none raised out of its job ------------------------------------

#: Path -> (Content-Type, body) of the loopback site.
SITE: dict[str, tuple[str, bytes]] = {
    "/robots.txt": ("text/plain", b"User-agent: *\nAllow: /\n"),
    "/": (
        "text/html; charset=utf-8",
        b'<a href="/header-hex">1</a><a href="/meta-zlib">2</a><a href="/refresh-base64">3</a>'
        b'<a href="/refresh-header-undefined">4</a><a href="/api">5</a>',
    ),
    "/header-hex": ("text/html; charset=hex", koi8_page()),
    "/meta-zlib": ("text/html", '<meta charset="zlib"><p>café</p>'.encode()),
    "/refresh-base64": (
        "text/html",
        b'<meta charset="base64"><meta http-equiv="refresh" content="0; url=/landing"><p>stub</p>',
    ),
    "/refresh-header-undefined": (
        "text/html; charset=undefined",
        b'<meta http-equiv="refresh" content="0; url=/landing-2"><p>stub</p>',
    ),
    "/landing": ("text/html; charset=rot13", "<p>arrivé</p>".encode()),
    "/landing-2": ("text/html; charset=idna", "<p>arrivé 2</p>".encode()),
    "/api": ("application/json; charset=uu", json.dumps(DATA, ensure_ascii=False).encode("utf-16")),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        content_type, body = SITE.get(self.path, ("text/plain", b"not here"))
        self.send_response(200 if self.path in SITE else 404)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class CharsetSpider(Spider):
    name = "charsets"
    allowed_domains = ["127.0.0.1"]
    content_types = ("text/html", "application/json")

    def parse(self, page: Page) -> Iterator[Any]:
        if page.url.endswith("/api"):
            yield {"url": page.url, "text": page.json()["html"]}
            return
        yield {"url": page.url, "text": page.text("p")}
        yield from page.follow_all("a")


def test_pages_declaring_no_character_set_are_crawled_and_meta_refreshes_recorded_as_redirects(site: str) -> None:
    result = crawl(CharsetSpider, [site + "/"], interval=0.05, timeout=30)
    texts = {item["url"].removeprefix(site): item["text"] for item in result.items}
    assert texts == {
        "/": "",
        "/header-hex": "Привет",
        "/meta-zlib": "café",
        "/landing": "arrivé",
        "/landing-2": "arrivé 2",
        "/api": "<meta charset='koi8-r'>é",
    }
    by_url = {(r["kind"], r["url"].removeprefix(site)): r for r in result.fetches}
    for stub, target in (("/refresh-base64", "/landing"), ("/refresh-header-undefined", "/landing-2")):
        record = by_url["download", stub]
        assert (record["outcome"], record["error"]) == ("redirect", f"meta refresh to {site}{target}")
    assert not result.failed
