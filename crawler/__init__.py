"""A distributed, politely rate-limited web crawler on Redis and RQ.

Spider authors need only the names below; everything else is internal.
"""

from .settings import Auto
from .spiders.items import DropItem
from .spiders.spider import Page, Request, Spider

__all__ = ["Auto", "DropItem", "Page", "Request", "Spider"]
__version__ = "0.1.0"
