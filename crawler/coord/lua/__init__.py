"""The crawler's Lua scripts, one ``NAME.lua`` file each beside this module, and their loader.

Every script is headed by a comment saying what it does, what its ``KEYS`` and ``ARGV``
are, what it returns, and where it stands on Redis Cluster (``Cluster:``: one key, one
slot, or cross-slot and why; see docs/SCALING.md). Files named ``_NAME.lua`` are helpers
(a shared Lua function): a line ``--@include _NAME.lua`` in a script stands for the
helper's text.
"""

from __future__ import annotations

import functools
import re
import threading
import weakref
from importlib import resources

from redis import Redis
from redis.commands.core import Script

#: A line that stands for a helper's text.
_INCLUDE = re.compile(r"^--@include (_[a-z_]+\.lua)$", re.MULTILINE)


def _read(filename: str) -> str:
    return resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")


@functools.cache
def source(name: str) -> str:
    """The text of script ``name`` (``crawler/coord/lua/NAME.lua``), its helpers included.

    FileNotFoundError for a script that does not exist.
    """
    return _INCLUDE.sub(lambda match: _read(match[1]).rstrip("\n"), _read(f"{name}.lua"))


_registered: weakref.WeakKeyDictionary[Redis, dict[str, Script]] = weakref.WeakKeyDictionary()
_registering = threading.Lock()


def script(connection: Redis, name: str) -> Script:
    """Script ``name`` registered on ``connection``: run with EVALSHA, loaded on first use.

    One ``Script`` per connection and name, made once: a gate or frontier object made per
    request asks for its scripts every time (registering hashes the source). Found, it is
    read without the lock: the hundreds of threads of a download process ask for scripts
    all the time, and a lock they all share held them up in turn (``Frontier.move``).
    """
    found = _registered.get(connection, {}).get(name)  # a dict read is atomic: no lock once made
    if found is not None:
        return found
    with _registering:
        scripts = _registered.setdefault(connection, {})
        found = scripts.get(name)
        if found is None:
            found = scripts[name] = connection.register_script(source(name))
        return found


def names() -> list[str]:
    """Every script's name (helpers left out), sorted."""
    files = (entry.name for entry in resources.files(__name__).iterdir())
    return sorted(f[: -len(".lua")] for f in files if f.endswith(".lua") and not f.startswith("_"))
