"""Content-codings undone as a body streams in, each stage handing on a bounded step at a time."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Protocol

from ..errors import BodyTooLarge

try:  # brotli ≥ 1.2 can bound its output; an older one cannot, so br is then not accepted
    import brotli

    _BROTLI = hasattr(brotli.Decompressor, "can_accept_more_data")
except ImportError:  # pragma: no cover - depends on what is installed
    _BROTLI = False

#: Most bytes one decoding stage hands on at a time (bounds memory above the cap).
DECODE_STEP = 256 * 1024

#: The content-codings this module decodes, as sent in Accept-Encoding.
ACCEPTED_ENCODINGS = "gzip, deflate, br" if _BROTLI else "gzip, deflate"

#: wbits for a gzip-wrapped deflate stream.
_GZIP_WBITS = 16 + zlib.MAX_WBITS


class DecodeError(Exception):
    """The body is not what its Content-Encoding says, or the coding is unknown."""


class _Stage(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]:
        """Decoded output of ``data``, in pieces of at most about ``DECODE_STEP`` bytes."""
        ...


class ContentDecoder:
    """Undoes a Content-Encoding chain (``gzip, gzip``, …) as the body streams in.

    Each stage is pulled lazily by the next, so each holds at most one piece of about
    ``DECODE_STEP`` bytes; the reader can stop at its cap after at most one more step
    than the cap. Raises DecodeError for an unknown coding or a corrupt body.
    """

    def __init__(self, header: str):
        codings = [coding.strip().lower() for coding in header.split(",") if coding.strip()]
        # Codings are listed in the order they were applied: undo the last one first.
        self._stages = [_stage_for(coding) for coding in reversed(codings) if coding != "identity"]

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Decoded pieces of the next raw bytes of the body."""
        return self._through(0, data)

    def _through(self, index: int, data: bytes) -> Iterator[bytes]:
        if index == len(self._stages):
            if data:
                yield data
            return
        for piece in self._stages[index].feed(data):
            yield from self._through(index + 1, piece)


def _stage_for(coding: str) -> _Stage:
    if coding in ("gzip", "x-gzip", "deflate"):
        return _ZlibStage(coding)
    if coding == "br" and _BROTLI:
        return _BrotliStage()
    raise DecodeError(f"unsupported content-coding {coding!r}")


class _ZlibStage:
    """gzip (every member), or deflate zlib-wrapped or raw, inflated a bounded step at a time."""

    def __init__(self, coding: str):
        self._gzip = coding != "deflate"
        self._inflater = zlib.decompressobj(_GZIP_WBITS) if self._gzip else None
        self._head = b""  # deflate: the first bytes, until they tell zlib-wrapped from raw
        self._ended = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._ended:
            return
        if self._inflater is None:
            self._head += data
            if len(self._head) < 2:
                return
            data, self._head = self._head, b""
            self._inflater = zlib.decompressobj(zlib.MAX_WBITS if _is_zlib_header(data) else -zlib.MAX_WBITS)
        while True:
            if self._inflater.eof:
                if not data:
                    return
                if not (self._gzip and data.startswith(b"\x1f")):
                    self._ended = True  # bytes after the end of the stream are ignored, as browsers do
                    return
                self._inflater = zlib.decompressobj(_GZIP_WBITS)  # another gzip member follows
            try:
                out = self._inflater.decompress(data, DECODE_STEP)
            except zlib.error as exc:
                raise DecodeError(str(exc)) from exc
            data = self._inflater.unconsumed_tail or self._inflater.unused_data
            if out:
                yield out
            # A full step may leave output inside zlib: go round again, with no new input if need be.
            if not data and len(out) < DECODE_STEP:
                return


def _is_zlib_header(data: bytes) -> bool:
    """Whether ``data`` starts with a zlib header (RFC 1950): deflate method, check bits right."""
    return data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class _BrotliStage:
    """br, decompressed a bounded step at a time (brotli ≥ 1.2)."""

    def __init__(self) -> None:
        self._decompressor = brotli.Decompressor()

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            while not self._decompressor.can_accept_more_data():  # output left from the last feed
                yield self._decompressor.process(b"", output_buffer_limit=DECODE_STEP)
            out = self._decompressor.process(data, output_buffer_limit=DECODE_STEP)
            while out:
                yield out
                if self._decompressor.is_finished():
                    return
                out = self._decompressor.process(b"", output_buffer_limit=DECODE_STEP)
        except brotli.error as exc:
            raise DecodeError(f"brotli: {exc}") from exc


def inflate_capped(data: bytes, cap: int) -> bytes:
    """``zlib.decompress(data)``, but raises BodyTooLarge as soon as the output passes ``cap``
    bytes (never inflating more than ``cap + 1``), and zlib.error for a corrupt or
    truncated stream."""
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, cap + 1)
    if len(out) > cap:
        raise BodyTooLarge(f"compressed body inflates past the cap of {cap} bytes")
    if not inflater.eof:
        raise zlib.error("incomplete or truncated zlib stream")
    return out
