"""Host names to the IP address a gate is keyed by (``gate_by = "ip"``), cached per process.

Names are resolved with the system resolver (``getaddrinfo``), the one the connection
itself uses, so ``/etc/hosts``, nsswitch and search domains give the gate and the
request the same answer. The system resolver gives no TTL, so an answer is kept for
``ADDRESS_TTL`` (60 s), and a failure for ``FAILURE_TTL`` (5 s). dnspython would give
the real TTL but asks the name servers directly, past ``/etc/hosts`` and nsswitch: a
name could then key one address while the request goes to another. A record that
changes is followed within a minute, which is what a gate needs: requests to a server
that moved go on being spaced, by the old key, for at most that long.

Of several addresses, the lowest (IPv4 before IPv6, then numerically) keys the gate:
every worker on every host picks the same one whatever order its resolver returns
them in (round-robin DNS rotates it).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable

#: Seconds a resolved address is reused before the name is resolved again.
ADDRESS_TTL = 60.0
#: Seconds a name that did not resolve is not asked again.
FAILURE_TTL = 5.0

Resolver = Callable[[str], list[str]]


def system_addresses(host: str) -> list[str]:
    """Every address ``host`` resolves to with the system resolver (TCP), as text; [] if none."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    return [str(info[4][0]).split("%")[0] for info in infos]


def lowest(addresses: list[str]) -> str | None:
    """The address that keys a gate: IPv4 before IPv6, then the numerically lowest."""
    parsed = []
    for text in addresses:
        try:
            parsed.append(ipaddress.ip_address(text))
        except ValueError:
            continue
    return str(min(parsed, key=lambda ip: (ip.version, int(ip)))) if parsed else None


class AddressCache:
    """``host`` → the address its gate is keyed by, each answer kept ``ttl`` seconds. Thread-safe."""

    def __init__(
        self, ttl: float = ADDRESS_TTL, resolve: Resolver = system_addresses, failure_ttl: float = FAILURE_TTL
    ):
        self.ttl = ttl
        self.failure_ttl = failure_ttl
        self.resolve = resolve
        self._answers: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def address(self, host: str) -> str | None:
        """The address ``host``'s requests are spaced by, or None when it does not resolve.

        An IP address names itself (no lookup).
        """
        host = host.strip("[]").rstrip(".").lower()
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            pass
        now = time.monotonic()
        with self._lock:
            cached = self._answers.get(host)
        if cached is not None and cached[0] > now:
            return cached[1]
        answer = lowest(self.resolve(host))
        with self._lock:
            self._answers[host] = (now + (self.ttl if answer else self.failure_ttl), answer)
        return answer
