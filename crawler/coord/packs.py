"""Frontier packs: a run of a list's entries kept in one list element, compressed together.

An element of a frontier list (``keys.frontier``) is one entry (``DownloadTask.to_entry``: compact
JSON, which starts with ``[``) or a pack: PACK_MARK, then the zlib-compressed entries joined by
newlines (JSON text holds none). A page's links share most of their text, so a pack of them takes
a fraction of the bytes the entries took one an element (93.6 B a queued 86-character URL). The
frontier's order is the entries' order, a pack's in its place. A list's count of entries is its
length plus the site's extra count for its priority (``keys.frontier_extra``): the entries its
packs hold beyond one each.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

#: The first byte of a pack (an entry starts with ``[``).
PACK_MARK = b"\x00"
#: Entries of one push below which they are queued one an element: too few to share much.
PACK_LEAST = 8
#: Entries a pack holds at most: what a refill taking a few of them decompresses.
PACK_MOST = 128
#: zlib's level: 1 packs varied links to 25 B an entry for 0.9 us of CPU, 6 to 24 B for 1.8 us.
PACK_LEVEL = 1
#: Bytes a pack may decompress to at most (a pack written by hand is refused past it).
UNPACKED_MOST = 64 * 1024 * 1024


def pack(entries: Sequence[str]) -> tuple[list[str | bytes], int]:
    """The elements to push for ``entries`` (in order), and the entries their packs hold beyond one each."""
    if len(entries) < PACK_LEAST:
        return list(entries), 0
    elements: list[str | bytes] = []
    extra = 0
    for start in range(0, len(entries), PACK_MOST):
        run = entries[start : start + PACK_MOST]
        if len(run) == 1:
            elements.append(run[0])
            continue
        elements.append(pack_run([entry.encode() for entry in run]))
        extra += len(run) - 1
    return elements, extra


def pack_run(entries: Sequence[bytes]) -> bytes:
    """One pack of ``entries`` (two or more)."""
    return PACK_MARK + zlib.compress(b"\n".join(entries), PACK_LEVEL)


def unpack(element: bytes | str) -> list[bytes]:
    """The entries of a list element: itself, or a pack's. ValueError for a pack that does not decompress."""
    if isinstance(element, str):
        element = element.encode()
    if not element.startswith(PACK_MARK):
        return [element]
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(element[1:], UNPACKED_MOST)
    except zlib.error as exc:
        raise ValueError(f"a frontier pack that does not decompress: {exc}") from exc
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError("a frontier pack cut short, or larger than it may be")
    return raw.split(b"\n")


@dataclass
class Taken:
    """What a refill takes from the head of one list: ``entries`` (in order), read from ``elements``
    (the head as read); the first ``whole`` elements go, and the last read is replaced by
    ``rest`` when only part of it was taken; ``extra`` is the change to the list's extra count.
    ``refused``: elements that are not entries nor packs (kept aside by the caller)."""

    elements: list[bytes]
    entries: list[bytes] = field(default_factory=list)
    whole: int = 0
    rest: bytes | None = None
    extra: int = 0
    refused: list[tuple[bytes, str]] = field(default_factory=list)


def take(head: Sequence[bytes], wanted: int) -> Taken:
    """Up to ``wanted`` entries from a list whose first elements are ``head``, in order."""
    taken = Taken(elements=[])
    for element in head:
        if len(taken.entries) >= wanted:
            break
        taken.elements.append(element)
        try:
            entries = unpack(element)
        except ValueError as exc:
            taken.refused.append((element, str(exc)))
            taken.whole += 1
            continue
        room = wanted - len(taken.entries)
        taken.extra -= len(entries) - 1
        if len(entries) <= room:
            taken.entries += entries
            taken.whole += 1
            continue
        taken.entries += entries[:room]
        rest = entries[room:]
        taken.rest = rest[0] if len(rest) == 1 else pack_run(rest)
        taken.extra += len(rest) - 1
    return taken
