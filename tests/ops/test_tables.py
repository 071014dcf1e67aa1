"""``print_table`` prints what rich prints of the same table, character for character, whatever the cells."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from crawler.ops.tables import Cell, plain_text, print_table


class AsciiFile(io.StringIO):
    encoding = "ascii"


HEADERS = ("site", "interval (s)", "from", "robots", "allowed domains", "start URLs")


def rich_output(console_of, headers, rows) -> str:  # type: ignore[no-untyped-def]
    console, out = console_of()
    table = Table(*headers)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return out.getvalue()


def ours(console_of, headers, rows) -> str:  # type: ignore[no-untyped-def]
    console, out = console_of()
    print_table(console, headers, rows)
    return out.getvalue()


def consoles(width: int) -> list:  # type: ignore[type-arg]
    def pipe() -> tuple[Console, io.StringIO]:
        out = io.StringIO()
        return Console(file=out, width=width), out

    def plain_terminal() -> tuple[Console, io.StringIO]:
        out = io.StringIO()
        return Console(file=out, width=width, force_terminal=True, color_system=None), out

    def colour_terminal() -> tuple[Console, io.StringIO]:
        out = io.StringIO()
        return Console(file=out, width=width, force_terminal=True, color_system="truecolor"), out

    def ascii_pipe() -> tuple[Console, io.StringIO]:  # an ASCII stdout (LANG=C): rich draws the box in ASCII
        out = AsciiFile()
        console = Console(file=out, width=width)
        assert console.options.ascii_only
        return console, out

    return [pipe, plain_terminal, colour_terminal, ascii_pipe]


WORDS = ["a", "shop", "www.example.com", "www.site00042.example", "x" * 40, "1", "-", "spider", "config"]
ODD = ["", "é", "两个字", "tab\there", "two\nlines", "[bold]markup[/bold]", ":smile:", "trailing ", " lead", "a  b"]


def random_cell(rng: random.Random) -> Cell:
    text = (
        rng.choice(ODD)
        if rng.random() < 0.1
        else ", ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 1, 1, 2, 3])))
    )
    return text if rng.random() < 0.3 else Text(text)


@pytest.mark.parametrize("seed", range(12))
def test_a_table_is_what_rich_prints_whatever_its_cells_and_width(seed: int) -> None:
    rng = random.Random(seed)
    width = rng.choice([40, 80, 120, 200])
    rows = [[random_cell(rng) for _ in HEADERS] for _ in range(rng.choice([1, 2, 5, 15]))]
    for console_of in consoles(width):
        assert ours(console_of, HEADERS, rows) == rich_output(console_of, HEADERS, rows), (width, console_of.__name__)


def test_the_sites_table_of_many_plain_rows_is_rich_s_with_long_domains_cut() -> None:
    rows: list[list[Cell]] = [
        [Text(f"eco{i:05d}"), Text("1"), Text("spider"), "yes", Text(f"www.site{i:05d}.example"), "1"]
        for i in range(40)
    ]
    rows[7][4] = Text("www.site00007.example, shop.site00007.example")  # wraps: rich renders this row itself
    for console_of in consoles(80):
        assert ours(console_of, HEADERS, rows) == rich_output(console_of, HEADERS, rows)
    assert "www.site00012.exam… " in ours(consoles(80)[0], HEADERS, rows)


def test_an_empty_table_is_rich_s() -> None:
    for console_of in consoles(80):
        assert ours(console_of, HEADERS, []) == rich_output(console_of, HEADERS, [])


def test_plain_text_is_the_text_of_cells_rich_shows_as_they_are() -> None:
    assert plain_text(Text("www.example.com")) == "www.example.com"
    assert plain_text("yes") == "yes"
    assert plain_text("[b]x[/b]") is None  # markup
    assert plain_text(":smile:") is None  # an emoji code
    assert plain_text(Text("é")) is None and plain_text(Text("a\tb")) is None
    assert plain_text(Text("x ")) is None  # rich trims the space
    assert plain_text(Text("x", justify="right")) is None
