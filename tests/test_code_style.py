"""The code's style and types are checked by the test command: ruff (lint and format) and mypy.

Each tool runs from the test environment (``.[test]`` installs them), on the whole
repository for ruff and on ``crawler`` for mypy (settings in ``pyproject.toml``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_tool(*command: str) -> subprocess.CompletedProcess[str]:
    tool = Path(sys.executable).with_name(command[0])
    if not tool.exists():
        pytest.fail(f"{command[0]} is not installed in the test environment: pip install -e '.[test]'")
    return subprocess.run([str(tool), *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_ruff_finds_nothing() -> None:
    result = run_tool("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_the_code_is_formatted_by_ruff() -> None:
    result = run_tool("ruff", "format", "--check", ".")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout + result.stderr


@pytest.mark.integration
def test_mypy_finds_nothing_in_the_package() -> None:
    result = run_tool("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_every_benchmark_module_imports() -> None:
    """The benchmarks are not type-checked: at least every name they import from the crawler must exist."""
    names = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")
    code = "import importlib\n" + "".join(f"importlib.import_module('bench.{name}')\n" for name in names)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def imported_distributions(package: Path) -> dict[str, set[str]]:
    """The distributions whose modules ``package``'s code imports (the standard library and the package
    itself left out), each with the modules that import it; a module no installed distribution holds
    is listed under its own name."""
    holders = importlib.metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == package.name:
                    continue
                for distribution in holders.get(top, [top]):
                    found.setdefault(normalized(distribution), set()).add(str(path.relative_to(ROOT)))
    return found


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions() -> set[str]:
    """Every distribution ``pyproject.toml`` declares: the dependencies and every extra's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    return {normalized(re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0]) for requirement in requirements}


@pytest.mark.slow  # parses every module of crawler/ and reads every installed distribution's metadata
def test_every_package_the_code_imports_is_declared() -> None:
    """What ``crawler/`` imports, directly, is declared in ``pyproject.toml`` (a dependency or an extra's),
    not left to arrive with another package (httpcore with httpx, Flask with rq-dashboard)."""
    missing = {name: sorted(where) for name, where in imported_distributions(ROOT / "crawler").items()}
    missing = {name: where for name, where in missing.items() if name not in declared_distributions()}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
