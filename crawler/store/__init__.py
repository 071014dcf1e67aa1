"""The database: schema and upserts, migrations, the outbox of records waiting for it, export.

May import ``crawler.errors``, ``crawler.settings``, ``crawler.spiders``, ``crawler.http``
and ``crawler.coord`` (the outbox waits in Redis); never the workers or the commands.
"""
