"""What operators look at and run: status, screens, watch, stats and report, metrics, failures, reset, rekey, dev tools.

Reads what the workers leave in Redis and the database. May import every layer below it
(``spiders``, ``http``, ``coord``, ``store``, ``work``); never ``cli``.
"""
