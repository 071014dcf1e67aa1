"""The command line: ``crawler`` and its commands, one module per command group.

Commands are thin: they parse options and call library functions. May import every
layer; nothing imports it but the console script and tests.
"""

from .app import main

__all__ = ["main"]
