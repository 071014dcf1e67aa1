"""Addresses: the one a host name's gate is keyed by (``gate_by = "ip"``), and which are private.

The private ones are those not globally routable unicast (``is_public_address``): the
fetcher's address cap, robots.txt redirects and page redirects all ask it.

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

Every lookup here and in the fetcher (``resolve_within``) runs in a thread of its own and
is waited for at most a given time: ``getaddrinfo`` blocks and takes no timeout, so a
hostile name server could otherwise hold a worker for as long as it likes. A lookup that
outlasts its wait goes on in its thread (nothing can stop it) while the worker moves on;
at most ``RESOLVER_THREADS`` run at once in a process, and a name already being looked up
is not asked again but waited for, so hanging names cost threads, never the process all
of them.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

#: Seconds a resolved address is reused before the name is resolved again.
ADDRESS_TTL = 60.0
#: Seconds a name that did not resolve is not asked again.
FAILURE_TTL = 5.0

#: Seconds a lookup for a gate's key (or a redirect's check) is waited for.
RESOLVE_TIMEOUT = 10.0
#: Most lookups under way at once in a process (each holds a thread until its resolver answers).
RESOLVER_THREADS = 16

Resolver = Callable[[str], list[str]]
AddrInfo = tuple[Any, ...]


class ResolveTimeout(OSError):
    """A lookup was not answered within its wait (or no lookup thread was free within it)."""


class _Lookup:
    """One ``getaddrinfo`` under way: its answer, or the exception it raised, once ``done``."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.infos: list[AddrInfo] = []
        self.error: BaseException | None = None


_lookups: dict[tuple[str, int | None], _Lookup] = {}
_lookups_lock = threading.Lock()
_lookup_slots = threading.BoundedSemaphore(RESOLVER_THREADS)


def _after_fork() -> None:
    """A forked child has none of its parent's lookup threads: forget their lookups and slots."""
    global _lookups_lock, _lookup_slots
    _lookups.clear()
    _lookups_lock = threading.Lock()
    _lookup_slots = threading.BoundedSemaphore(RESOLVER_THREADS)


os.register_at_fork(after_in_child=_after_fork)


def resolve_within(host: str, port: int | None, timeout: float) -> list[AddrInfo]:
    """``socket.getaddrinfo(host, port)`` for TCP, waited for at most ``timeout`` seconds.

    Raises ResolveTimeout past it (the lookup goes on in its thread, see the module
    docstring), and what ``getaddrinfo`` raises (``socket.gaierror``, UnicodeError). An IP
    address is looked up in the calling thread: it needs no name server.
    """
    if _is_address(host):
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    deadline = time.monotonic() + max(timeout, 0.0)
    key = (host, port)
    with _lookups_lock:
        lookup = _lookups.get(key)
        fresh = lookup is None
        if lookup is None:
            lookup = _lookups[key] = _Lookup()
    if fresh and not _start(key, lookup, deadline):
        raise ResolveTimeout(f"resolving {host}: no lookup thread free within {timeout:g}s")
    if not lookup.done.wait(max(deadline - time.monotonic(), 0.0)):
        raise ResolveTimeout(f"resolving {host} took longer than {timeout:g}s")
    if lookup.error is not None:
        raise lookup.error
    return lookup.infos


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _start(key: tuple[str, int | None], lookup: _Lookup, deadline: float) -> bool:
    """Run ``lookup`` in a thread of its own once one of the slots is free; False if none is by ``deadline``."""
    if not _lookup_slots.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
        with _lookups_lock:
            _lookups.pop(key, None)
        lookup.error = ResolveTimeout(f"resolving {key[0]}: no lookup thread free")
        lookup.done.set()
        return False
    # A daemon thread, not a ThreadPoolExecutor's: those are joined at exit, so a hung lookup would hold the process.
    threading.Thread(target=_look_up, args=(key, lookup), name=f"resolve-{key[0][:40]}", daemon=True).start()
    return True


def _look_up(key: tuple[str, int | None], lookup: _Lookup) -> None:
    try:
        lookup.infos = socket.getaddrinfo(key[0], key[1], type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except BaseException as exc:  # handed to every waiter, raised there
        lookup.error = exc
    finally:
        with _lookups_lock:
            _lookups.pop(key, None)
        lookup.done.set()
        _lookup_slots.release()


def system_addresses(host: str, timeout: float = RESOLVE_TIMEOUT) -> list[str]:
    """Every address ``host`` resolves to with the system resolver (TCP), as text; [] if none
    (or no answer within ``timeout`` seconds)."""
    try:
        infos = resolve_within(host, None, timeout)
    except (UnicodeError, OSError):  # socket.gaierror and ResolveTimeout are OSErrors
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


# -- which addresses are private: the one definition the fetcher, robots.txt and redirects use --


def names_its_address(url: str) -> bool:
    """Whether ``url``'s host is an IP address or ``localhost``: named outright, so trusted to be reached."""
    host = (urlsplit(url).hostname or "").rstrip(".")
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_public_address(address: str) -> bool:
    """Whether ``address`` (IPv4 or IPv6) is globally routable unicast: not private, loopback,
    link-local, reserved, shared, multicast or unspecified."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def is_private_host(host: str, timeout: float = RESOLVE_TIMEOUT) -> bool:
    """Whether ``host`` (a name or an address) resolves to an address that is not public
    (``is_public_address``); the lookup is waited for ``timeout`` seconds at most (``system_addresses``)."""
    # unresolvable: the fetch itself will fail and be recorded
    return any(not is_public_address(text) for text in system_addresses(host, timeout))


def redirects_inward(source: str, target: str, timeout: float = RESOLVE_TIMEOUT) -> bool:
    """Whether a redirect leads from a public host to a private or loopback one (SSRF); each
    host's lookup is waited for ``timeout`` seconds at most."""
    source_host, target_host = urlsplit(source).hostname or "", urlsplit(target).hostname or ""
    return not is_private_host(source_host, timeout) and is_private_host(target_host, timeout)
