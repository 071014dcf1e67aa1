"""Talking HTTP to the sites: one GET with its caps, content decoding, address rules, proxies, the cache.

No Redis and no database: a request in, a response or an error out. May import
``crawler.errors``, ``crawler.settings`` and ``crawler.spiders`` only.
"""
