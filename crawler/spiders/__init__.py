"""The spider author's API: ``Spider``, ``Request``, ``Page``, and loading and checking spiders.

What a spider module imports and what the crawler learns from it; nothing here touches
Redis, HTTP or the database. May import ``crawler.errors`` and ``crawler.settings`` only.
"""
