"""Finding a project's spiders: every module of its ``sites/`` imported, each spider checked.

A module that fails to import, or a spider whose attributes are wrong (``check``), is
reported by name, file and line; the others load (``load_spiders``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, SpiderLoadError
from .check import Verdicts, check_spider, import_failure
from .spider import Spider


@dataclass
class SpiderSet:
    """Spiders found in a directory, the modules that failed to load, and spiders known by name only."""

    spiders: dict[str, type[Spider]]
    errors: list[SpiderLoadError]
    #: Spiders ``get`` finds by name that are neither listed (``spiders``) nor matched by domain:
    #: the bundled demo, which ``crawler sites`` does not show and a loopback URL does not pick.
    by_name: dict[str, type[Spider]] = field(default_factory=dict)

    def get(self, name: str) -> type[Spider]:
        """The spider class named ``name``; ConfigError naming the known ones if none."""
        if name in self.spiders:
            return self.spiders[name]
        for error in self.errors:
            if error.module == name or error.site == name:
                raise error
        if name in self.by_name:
            return self.by_name[name]
        known = ", ".join(sorted(self.spiders)) or "none"
        raise ConfigError(f"unknown site {name!r} (known: {known})")

    def named(self) -> dict[str, type[Spider]]:
        """Every spider ``get`` finds, by name (a project's spider wins over a bundled one)."""
        return {**self.by_name, **self.spiders}


def load_spiders(directory: str | Path, extra: Iterable[type[Spider]] = ()) -> SpiderSet:
    """Import every ``*.py`` module in ``directory`` and collect its Spider subclasses.

    A module that fails to import is reported in ``errors`` by name, file and line, and
    so is a spider whose attributes are wrong (``spidercheck``); the others load.
    ``extra`` spiders (the bundled demo) are found by name only (``SpiderSet.by_name``).
    """
    spiders: dict[str, type[Spider]] = {}
    errors: list[SpiderLoadError] = []
    path = Path(directory)
    for file in sorted(path.glob("*.py")) if path.is_dir() else []:
        if file.name.startswith("_"):
            continue
        try:
            module = _import_file(file)
        except Exception as exc:  # any error in user code is reported, not raised
            errors.append(SpiderLoadError(file.stem, import_failure(file, exc)))
            continue
        verdicts: Verdicts = {}  # a module's spiders share their base's values: each checked once (``check_spider``)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Spider) and obj is not Spider and obj.name:
                if obj.__module__ == module.__name__:
                    problem = check_spider(obj, file, verdicts)
                    if problem:
                        errors.append(SpiderLoadError(file.stem, problem, site=str(obj.name)))
                    else:
                        spiders[obj.name] = obj
    return SpiderSet(spiders, errors, {s.name: s for s in extra})


def _import_file(file: Path) -> Any:
    module_name = f"crawler_sites.{file.stem}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module
