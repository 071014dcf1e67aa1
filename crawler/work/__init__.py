"""The workers: the download and parse jobs, their worker loops, the launcher, events, robots, sitemaps.

What runs a crawl, wired per process by ``runtime``. May import every layer below it
(``crawler.errors``, ``crawler.settings``, ``spiders``, ``http``, ``coord``, ``store``);
never ``ops`` or ``cli``.
"""
