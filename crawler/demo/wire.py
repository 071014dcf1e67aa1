"""Arrival times as a site sees them on the wire, for the loopback servers of tests and benches.

A handler thread's own clock reading comes late by however long the thread waited for a
CPU (tens of milliseconds on a loaded machine), so it can fake a short gap between two
requests or hide a real one. The kernel stamps each segment as it is received
(``SO_TIMESTAMPNS``); ``WireStampedHandler.arrival`` is that stamp for the last bytes the
handler read, which load cannot move. Where the platform gives no such stamp, it is
``time.time()`` when asked.
"""

from __future__ import annotations

import io
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: Python does not export the constant; 35 is Linux's (asm-generic, so x86-64 and arm64).
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = 16  # struct timespec: two 64-bit fields


class TimestampedReader(io.RawIOBase):
    """A socket's receiving side that keeps the kernel's timestamp of the last bytes read.

    ``arrival`` is the wall-clock time (seconds) at which the kernel received the segment
    the last ``readinto`` took bytes from, or None before any stamped read.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.arrival: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size, ancillary, _flags, _addr = self._sock.recvmsg_into([buffer], socket.CMSG_SPACE(_TIMESPEC))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC:
                seconds = int.from_bytes(data[:8], "little", signed=True)
                nanoseconds = int.from_bytes(data[8:16], "little", signed=True)
                self.arrival = seconds + nanoseconds / 1e9
        return size


class WireStampedServer(ThreadingHTTPServer):
    """A threaded HTTP server whose connections carry the kernel's receive timestamps."""

    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:
        # On the listening socket, so that accepted sockets have it from their first
        # segment on (a request can arrive before its handler thread starts).
        if SO_TIMESTAMPNS is not None:
            self.socket.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        super().server_bind()


class WireStampedHandler(BaseHTTPRequestHandler):
    """A request handler that reads through a ``TimestampedReader``: see ``arrival``."""

    _stamps: TimestampedReader | None = None

    def setup(self) -> None:
        super().setup()
        if SO_TIMESTAMPNS is not None and hasattr(self.connection, "recvmsg_into"):
            self.connection.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self._stamps = TimestampedReader(self.connection)
            self.rfile = io.BufferedReader(self._stamps)

    def arrival(self) -> float:
        """When the kernel received the last bytes read (the request line, once it is read)."""
        if self._stamps is not None and self._stamps.arrival is not None:
            return self._stamps.arrival
        return time.time()
