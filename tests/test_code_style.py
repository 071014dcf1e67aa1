"""The code's style and types are checked by the test command: ruff (lint and format) and mypy.

Each tool runs from the test environment (``.[test]`` installs them), on the whole
repository for ruff and on ``crawler`` for mypy (settings in ``pyproject.toml``).
"""

from __future__ import annotations

import subprocess
import sys
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
