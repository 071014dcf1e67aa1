"""The bundled demo: a local shop to crawl (``ShopSite``) and its spider (``DemoShop``).

``crawler demo`` starts a ``ShopSite`` on loopback and crawls it with ``DemoShop``;
the tests and benchmarks use the same pair, checking results against
``ShopSite.expected_items()`` and the site's request log.
"""

from .shop import RequestLogEntry, ShopSite
from .spider import DemoShop

__all__ = ["DemoShop", "RequestLogEntry", "ShopSite"]
