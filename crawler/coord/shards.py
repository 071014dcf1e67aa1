"""Shards: the Redis instances a crawl's sites are spread over, and which one holds each site.

A ``REDIS_URL`` naming several instances (``a=redis://h1/0,b=redis://h2/0``) makes each a
shard. Every key of a site carries its ``{SITE}`` tag, so a site is a unit that lives
whole on one shard: where its keys are (it is in that shard's ``crawler:sites``); a site
not yet on any goes to the shard the config file names (``sites.SITE.shard``), else to
the one rendezvous hashing over the names picks, so adding a shard moves only the sites
that hash to it. Shards share nothing: each has its own ready set, pages stream and
reaper, and workers serve each on its own; the database is one. One URL is one shard,
``default``, and costs nothing more than before: no lookup is made.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import redis
from redis import Redis

from ..errors import ConfigError
from ..settings import DEFAULT_SHARD, Settings, redact_url, split_shards
from . import keys


@dataclass(frozen=True)
class Shard:
    """One Redis of a crawl: its name in ``REDIS_URL`` and its URL."""

    name: str
    url: str

    def describe(self) -> str:
        """``a (redis://***@h1:6379/0)``: credentials hidden."""
        return f"{self.name} ({redact_url(self.url)})"


def shards_of(redis_url: str) -> tuple[Shard, ...]:
    """The shards a resolved ``REDIS_URL`` names (one, ``default``, for a plain URL)."""
    return tuple(Shard(name, url) for name, url in split_shards(redis_url)) or (Shard(DEFAULT_SHARD, redis_url),)


def rendezvous(site: str, names: Sequence[str]) -> str:
    """The shard of ``names`` that ``site`` hashes to: highest random weight, so removing a shard moves
    only its own sites and adding one takes about 1/n of the others'."""
    return max(names, key=lambda name: (_weight(name, site), name))


def _weight(name: str, site: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{name}\0{site}".encode(), digest_size=8).digest(), "big")


class ShardSet:
    """A crawl's shards and a client for each, connected when first asked for.

    ``connect(url)``: the client of a shard (``connection.connect``, or a worker's pooled one).
    """

    def __init__(self, shards: Sequence[Shard], settings: Settings, connect: Callable[[str], Redis]):
        if not shards:
            raise ConfigError("no Redis shard configured")
        self.shards = tuple(shards)
        self.settings = settings
        self._connect = connect
        self._clients: dict[str, Redis] = {}
        #: Where each site was found by a ``locate`` over every shard: looked up once for this set's life.
        self._found: dict[str, str] = {}

    @property
    def names(self) -> list[str]:
        return [shard.name for shard in self.shards]

    @property
    def several(self) -> bool:
        return len(self.shards) > 1

    def shard(self, name: str) -> Shard:
        """The shard called ``name``; ConfigError naming the shards there are otherwise."""
        for shard in self.shards:
            if shard.name == name:
                return shard
        raise ConfigError(f"no shard {name!r}; the shards are: {', '.join(self.names)}")

    def client(self, name: str) -> Redis:
        """The client of shard ``name``, connected the first time."""
        if name not in self._clients:
            self._clients[name] = self._connect(self.shard(name).url)
        return self._clients[name]

    def clients(self) -> list[tuple[str, Redis]]:
        """Every shard's name and client, in the order ``REDIS_URL`` names them."""
        return [(name, self.client(name)) for name in self.names]

    def answering(self) -> tuple[list[tuple[str, Redis]], dict[str, str]]:
        """The shards that answer, with their clients, and why each of the others does not: for the
        commands that only read, which show what they can of a crawl one of whose shards is down."""
        up, down = [], {}
        for name in self.names:
            try:
                client = self.client(name)
                client.ping()
            except (ConfigError, redis.RedisError) as exc:
                down[name] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                continue
            up.append((name, client))
        return up, down

    def home(self, site: str) -> str:
        """The shard a site not yet on any goes to: the config file's ``sites.SITE.shard``, else ``rendezvous``."""
        named = self.settings.sites.get(site, {}).get("shard")
        return str(named) if named else rendezvous(site, self.names)

    def locate(self, sites: Iterable[str], among: Sequence[str] | None = None) -> dict[str, str]:
        """Each site's shard: the one that holds it, else its ``home``. One round trip a shard, the first
        time a site is asked for (a set lives for one command, or one process's start).

        A site on several (a ``crawler move`` cut short) is taken where its ``home`` is among
        them, else on the first named; ``crawler move`` run again finishes the move. ``among``:
        only those shards are asked (the others are down), and a site found on none whose home
        is another is left out.
        """
        wanted = list(dict.fromkeys(sites))
        if not self.several:
            return dict.fromkeys(wanted, self.names[0])
        if among is None and all(site in self._found for site in wanted):
            return {site: self._found[site] for site in wanted}
        asked = self.names if among is None else [name for name in self.names if name in among]
        held: dict[str, list[str]] = {site: [] for site in wanted}
        for name in asked:
            client = self.client(name)
            with client.pipeline(transaction=False) as pipe:
                for site in wanted:
                    pipe.sismember(keys.sites(), site)
                for site, there in zip(wanted, pipe.execute(), strict=True):
                    if there:
                        held[site].append(name)
        found = {}
        for site, where in held.items():
            home = self.home(site)
            if where or home in asked:
                found[site] = home if not where or home in where else where[0]
        if among is None:
            self._found.update(found)
        return found

    def where(self, site: str) -> str:
        """The shard of one site (``locate``)."""
        return self.locate([site])[site]

    def client_for(self, site: str) -> Redis:
        """The client of the shard holding ``site`` (``locate``)."""
        return self.client(self.where(site))

    def by_shard(self, sites: Iterable[str], among: Sequence[str] | None = None) -> dict[str, list[str]]:
        """``sites`` grouped by their shard (``locate``), in the order of ``names``; shards without one left out."""
        located = self.locate(sites, among)
        return {
            name: [site for site, there in located.items() if there == name]
            for name in self.names
            if name in located.values()
        }

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
