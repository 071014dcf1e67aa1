"""Everything that coordinates workers through Redis: keys, Lua scripts, gate, scheduler, frontier.

Job life, the pages stream, counters, pacing, policy and quarantine: the state the fleet
shares, every key named in ``keys``. May import ``crawler.errors``, ``crawler.settings``,
``crawler.spiders`` and ``crawler.http``; never the database, the workers or the commands.
"""
