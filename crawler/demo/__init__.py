"""The bundled demo: a local shop to crawl (``ShopSite``) and its spider (``DemoShop``).

``crawler demo`` starts a ``ShopSite`` on loopback and crawls it with ``DemoShop``;
the tests and benchmarks use the same pair, checking results against
``ShopSite.expected_items()`` and the site's request log.
"""

from ..spiders.spider import Spider
from .shop import RequestLogEntry, ShopSite
from .spider import DemoShop

#: Spiders that ship with the package and are always available (found by name: ``load_spiders``'s ``extra``).
BUNDLED_SPIDERS: tuple[type[Spider], ...] = (DemoShop,)

__all__ = ["BUNDLED_SPIDERS", "DemoShop", "RequestLogEntry", "ShopSite"]
