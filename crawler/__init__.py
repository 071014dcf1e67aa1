"""A distributed, politely rate-limited web crawler on Redis and RQ.

Spider authors need only the names below; everything else is internal.
"""

import sys

# httpx imports its command-line client, and with it rich and pygments (some 4 MiB a
# process), whenever they are installed; the crawler never runs it. Marked absent before
# the first import of httpx, that import fails and httpx puts its stub in place (``httpx.main``
# then says the CLI is not installed). Left alone when something imported it already.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

from .settings import Auto  # noqa: E402 (after the line above, which must precede any import of httpx)
from .spiders.failure import Failure  # noqa: E402
from .spiders.items import DropItem  # noqa: E402
from .spiders.rules import Rule  # noqa: E402
from .spiders.spider import Page, Request, Spider  # noqa: E402

__all__ = ["Auto", "DropItem", "Failure", "Page", "Request", "Rule", "Spider"]
__version__ = "0.1.0"
