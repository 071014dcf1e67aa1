"""A site's live settings and spider arguments as this process holds them, read from Redis when due.

Both are read together, in one round trip, at most once a second a site and process, and
not at all while no change was announced since the last read (``changes``). A download
job's claim and a parse worker's batch carry the reads along (``read_site_along``,
``read_sites_due``) so that a job seldom makes a round trip of its own for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from redis import Redis

from ..coord import keys
from ..coord.bulk import Arg, pairs, read_many
from ..coord.changes import ChangeWatch
from ..coord.policy import LIVE_REFRESH, PolicyCache, SitePolicy
from ..coord.replies import text_map
from ..coord.spiderargs import ARGS_REFRESH, build_spider, usable_args
from ..settings import Settings
from ..spiders.loading import SpiderSet
from ..spiders.spider import Spider

#: Seconds before a site's live settings and spider arguments are due for a re-read that a download
#: job's claim reads them along (``SiteReads.read_site_along``): the job reads them within that time.
READ_ALONG_AHEAD = 0.25
#: The share of LIVE_REFRESH a token of ``changes`` may be old when it says a site's settings still
#: hold: they then count as read when it was, and are due again within the rest of LIVE_REFRESH.
TOKEN_AGE = 0.25


class SiteReads:
    """Each site's policy (``coord.policy``) and spider instance (built with the crawl's spider
    arguments) in this process; safe to share between its threads."""

    def __init__(self, connection: Redis, settings: Settings, spider_set: SpiderSet):
        self.connection = connection
        self.spider_set = spider_set
        self.policies = PolicyCache(connection, settings, spider_set.named(), refresh=self._read_site)
        #: Whether a site's live settings and spider arguments were written since they were read here.
        self.changes = ChangeWatch(connection)
        self._site_reads: dict[str, tuple[float, bytes | None]] = {}  # site -> (read at, token then)
        self._spiders: dict[str, tuple[float, dict[str, str], Spider]] = {}  # site -> (read at, arguments, spider)
        self._raw_args: dict[str, dict[str, str]] = {}  # site -> its spider arguments as last read
        self._lock = threading.Lock()

    def spider(self, site: str) -> Spider:
        """The instance of ``site``'s spider in this process, built with the crawl's spider arguments.

        The arguments are read from Redis at most once per ARGS_REFRESH seconds; when they
        changed, a new instance is built with them (``spiderargs``), which later calls get.
        """
        # A dict's get is atomic: no lock to read, so look-ups of many sites' threads never queue.
        held = self._spiders.get(site)
        if held is not None and time.monotonic() - held[0] < ARGS_REFRESH:
            return held[2]
        self.spider_set.get(site)  # ConfigError for a site with no spider, before anything is read
        self._read_site(site)
        return self._spiders[site][2]

    def held_policy(self, site: str) -> SitePolicy:
        """``site``'s policy as last read here, however old (``policy`` when none is held): for what
        may lag a read, asked where a re-read would be a round trip of its own."""
        return self.policies.held(site) or self.policy(site)

    def held_spider(self, site: str) -> Spider:
        """``site``'s spider instance as last built here, however old its arguments (``spider`` when none is)."""
        held = self._spiders.get(site)
        return held[2] if held is not None else self.spider(site)

    def _read_site(self, site: str, fresh: bool = False) -> None:
        """Read ``site``'s live settings and spider arguments from Redis, in one round trip, and keep
        both: the policy (``policies.put``) and the spider instance (``_put_args``). Each is read
        once a second at most, a site and process; read together, the two cost one call. Not read
        when no change was announced since the last read (``_still_holds``), unless ``fresh``."""
        if not fresh and self._still_holds(site):
            return
        with self.connection.pipeline(transaction=False) as pipe:
            keep = self._read_site_in(pipe, site)
            keep(pipe.execute())

    def has_spider(self, site: str) -> bool:
        """Whether this process has a spider for ``site`` (one lookup: no dict of every spider built)."""
        return site in self.policies.spiders

    def read_site_along(self, pipe: Any, site: str, always: bool = False) -> Callable[[list[Any]], None] | None:
        """Queue in ``pipe`` the reads ``_read_site`` makes, if ``site``'s are due within READ_ALONG_AHEAD
        seconds (the job about to run would read them); what to call with the replies to the commands
        it queued, else None. A download job's claim carries them (``joblife.claim``), which saves a
        round trip a job. ``always``: whether due or not (a pipeline that goes anyway, some time
        before the reads are used).
        """
        if site not in self.policies.spiders:
            return None  # no spider here: the job is handed back unread
        now = time.monotonic()
        held = self._spiders.get(site)
        policy_at = self.policies.read_at(site)
        if (
            not always
            and held is not None
            and policy_at is not None
            and now - held[0] < ARGS_REFRESH - READ_ALONG_AHEAD
            and now - policy_at < LIVE_REFRESH - READ_ALONG_AHEAD
        ):
            return None
        if self._still_holds(site):  # nothing changed since the last read: none is needed
            return None
        return self._read_site_in(pipe, site)

    def read_sites_due(self, sites: Iterable[str]) -> None:
        """``read_site_along`` for each of ``sites``, in one round trip (none if none is due; ``bulk.read_many``):
        a parse worker's batch of pages, read before its pages are parsed, each needing its site's spider;
        ``crawler seed --all``'s chunk of sites."""
        reads = _HashReads()
        kept: list[tuple[int, Callable[[list[Any]], None]]] = []
        for site in dict.fromkeys(sites):
            start = len(reads.commands)
            keep = self.read_site_along(reads, site)
            if keep is not None:
                kept.append((start, keep))
        if not kept:
            return
        replies = [pairs(reply) for reply in read_many(self.connection, reads.commands)]
        for start, keep in kept:
            keep(replies[start : start + 2])

    def _read_site_in(self, pipe: Any, site: str) -> Callable[[list[Any]], None]:
        """Queue ``_read_site``'s two reads in ``pipe``; what keeps them, given their two replies."""
        seen, _ = self.changes.token(TOKEN_AGE * LIVE_REFRESH)  # before the reads: a change after it, after it
        now = time.monotonic()
        pipe.hgetall(keys.live_settings(site))
        pipe.hgetall(keys.spider_args(site))

        def keep(replies: list[Any]) -> None:
            live, args = replies
            self.policies.put(site, text_map(live), now)
            self._put_args(site, text_map(args), now)
            self._site_reads[site] = (now, seen)

        return keep

    def _still_holds(self, site: str) -> bool:
        """Whether ``site``'s live settings and spider arguments held here still hold, as no change was
        announced since they were read (``changes``): if so they count as read when the token was
        last seen unchanged (at most TOKEN_AGE of LIVE_REFRESH ago), and are not read."""
        read = self._site_reads.get(site)
        held = self._spiders.get(site)
        if read is None or held is None or self.policies.held(site) is None:
            return False
        confirmed = self.changes.confirms(read[1], read[0], TOKEN_AGE * min(LIVE_REFRESH, ARGS_REFRESH))
        if confirmed is None:
            return False
        # As of when the token was read, not now: a change announced since is in force within LIVE_REFRESH.
        self.policies.touch(site, confirmed)
        self._spiders[site] = (max(confirmed, held[0]), held[1], held[2])
        return True

    def _put_args(self, site: str, raw: dict[str, str], read_at: float) -> None:
        """Keep ``site``'s spider built with ``raw`` arguments (those that hold): the instance held
        when they did not change, else a new one (``build_spider``)."""
        held = self._spiders.get(site)
        if held is not None and self._raw_args.get(site) == raw:  # the usual case: nothing changed
            self._spiders[site] = (read_at, held[1], held[2])
            return
        cls = self.spider_set.get(site)
        args = usable_args(cls, raw)
        self._raw_args[site] = dict(raw)
        if held is not None and held[1] == args:  # the arguments that hold did not change
            self._spiders[site] = (read_at, args, held[2])
            return
        with self._lock:  # built under the lock: two threads reading at once build one instance
            held = self._spiders.get(site)
            spider = held[2] if held is not None and held[1] == args else build_spider(cls, args)
            self._spiders[site] = (read_at, args, spider)

    def policy(self, site: str) -> SitePolicy:
        """``site``'s politeness in force, read again when due (``policies``)."""
        return self.policies.get(site)


class _HashReads:
    """Stands for a pipeline where only ``HGETALL``s are queued (``_read_site_in``): the commands, for ``read_many``."""

    def __init__(self) -> None:
        self.commands: list[tuple[Arg, ...]] = []

    def hgetall(self, name: str) -> None:
        self.commands.append(("HGETALL", name))
