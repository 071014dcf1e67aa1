"""Tables of many rows, printed as rich prints them without rendering every cell: ``print_table``.

rich renders a table cell by cell, some 0.6 ms a row of six: ``crawler sites`` took 6 s to print
10,000 sites. Where no styles are written (no colour system: a pipe, a file), a row whose cells
are plain ASCII text, each fitting its column or one word cut with an ellipsis, is the same line
whatever rich would have done around it, and is written as such. rich still lays the table out
(its columns measured on the few rows that set their widths), prints the header and the bottom
edge, and renders any other row itself, at the widths of the whole table.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

#: A cell: a ``Text`` (never markup), or a string rich reads as console markup.
Cell = Text | str
#: What ``Text.truncate`` ends a word cut to fit with (``overflow="ellipsis"``, a column's default).
ELLIPSIS = "…"


def print_table(console: Console, headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> None:
    """Print ``Table(*headers)`` holding ``rows`` on ``console``: the same text as ``console.print(table)``.

    On a console that writes styles (a terminal with colours) the table is rich's, whole.
    Otherwise a row of plain cells (``plain_text``) is written as rich lays it out
    (``_Layout.line``); rich renders the others, measured with the rows that set the widths.
    """
    if console.color_system is not None or not rows:
        console.print(_table(headers, rows))
        return
    texts = [_plain_row(row) for row in rows]
    measured = _measured_rows(texts)
    layout = _Layout.of(console, headers, [row for i, row in enumerate(rows) if i in measured])
    if layout is None:  # a layout this does not write rows for: rich's, whole
        console.print(_table(headers, rows))
        return
    out = list(layout.header)
    for row, plain in zip(rows, texts, strict=True):
        line = layout.line(plain) if plain is not None else None
        out += [line] if line is not None else layout.rich_lines(console, headers, row)
    out.append(layout.bottom)
    console.file.write("\n".join(out) + "\n")
    console.file.flush()


def _table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], widths: Sequence[int] | None = None) -> Table:
    """The table ``print_table`` prints; ``widths``: each column's, fixed."""
    table = Table(*headers) if widths is None else Table(*(Column(h, width=w) for h, w in zip(headers, widths)))
    for row in rows:
        table.add_row(*row)
    return table


def plain_text(cell: Cell) -> str | None:
    """The text rich renders ``cell`` as, with any styles, when it is plain: a ``Text`` with no justify,
    overflow or wrap of its own, or a string with nothing rich would read as markup or an emoji code;
    printable ASCII only (a cell of width each), no space at the end (rich trims it). Else None."""
    if isinstance(cell, Text):
        if cell.justify is not None or cell.overflow is not None or cell.no_wrap is not None:
            return None
        text = cell.plain
    elif "[" in cell or ":" in cell:
        return None
    else:
        text = cell
    if text.endswith(" ") or not (text.isascii() and text.isprintable()):
        return None
    return text


def _plain_row(row: Sequence[Cell]) -> list[str] | None:
    texts = [plain_text(cell) for cell in row]
    return None if None in texts else texts  # type: ignore[return-value]


def _measured_rows(texts: Sequence[list[str] | None]) -> set[int]:
    """The rows rich measures the columns by: every row not plain, and for each column the plain row of
    its longest cell and the one of its longest word (a column's width is set by the most of its cells'
    widths and of their longest words: ``Table._measure_column``)."""
    measured = {i for i, row in enumerate(texts) if row is None}
    plain = [(i, row) for i, row in enumerate(texts) if row is not None]
    for column in range(len(plain[0][1]) if plain else 0):
        measured.add(max(plain, key=lambda p: len(p[1][column]))[0])
        measured.add(max(plain, key=lambda p: _longest_word(p[1][column]))[0])
    return measured


def _longest_word(text: str) -> int:
    return len(text) if " " not in text else max(map(len, text.split()), default=0)


class _Layout:
    """How rich lays out a table: its header's lines and bottom edge, its columns' widths, its rows' box."""

    def __init__(self, header: list[str], bottom: str, widths: list[int], edges: tuple[str, str, str]):
        self.header = header
        self.bottom = bottom
        self.widths = widths  # without the padding
        self.edges = edges  # a row's left edge, divider and right edge

    @classmethod
    def of(cls, console: Console, headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> _Layout | None:
        """The layout of ``Table(*headers)`` with ``rows`` (at least one) as ``console`` prints it; None when
        it is not one whose rows ``line`` writes (a box whose last row differs from the others)."""
        table = _table(headers, rows)
        with console.capture() as capture:
            console.print(table)
        lines = capture.get().split("\n")[:-1]
        box = table.box.substitute(console.options, safe=console.safe_box) if table.box else None
        if box is None or len(lines) < 4 or (box.mid_left, box.mid_vertical) != (box.foot_left, box.foot_vertical):
            return None
        top = lines[0]
        if not (top.startswith(box.top_left) and top.endswith(box.top_right)):
            return None
        widths = [len(part) for part in top[len(box.top_left) : -len(box.top_right)].split(box.top_divider)]
        separator = box.get_row(widths, "head", edge=True)
        if len(widths) != len(headers) or min(widths) < 3 or separator not in lines:
            return None
        header = lines[: lines.index(separator) + 1]
        return cls(header, lines[-1], [width - 2 for width in widths], (box.mid_left, box.mid_vertical, box.mid_right))

    def line(self, texts: Sequence[str]) -> str | None:
        """The line rich makes of a row of plain cells (``plain_text``), or None when it may make something
        else: a cell with a space that does not fit (rich would wrap it)."""
        cells = []
        for text, width in zip(texts, self.widths, strict=True):
            if len(text) > width:
                if " " in text:
                    return None
                text = text[: width - 1] + ELLIPSIS  # one word too long: cut (``overflow="ellipsis"``)
            cells.append(" " + text.ljust(width) + " ")
        left, divider, right = self.edges
        return left + divider.join(cells) + right

    def rich_lines(self, console: Console, headers: Sequence[str], row: Sequence[Cell]) -> list[str]:
        """``row``'s lines as rich renders it in a table of these widths: as a row of the whole table."""
        with console.capture() as capture:
            console.print(_table(headers, [row], self.widths))
        return capture.get().split("\n")[len(self.header) : -2]
