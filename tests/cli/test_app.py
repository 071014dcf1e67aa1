"""The ``crawler`` group loads a command's module when the command runs; ``--help`` lists every command."""

from __future__ import annotations

import importlib
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from crawler import demo
from crawler.cli.app import COMMAND_MODULES, cli
from crawler.work import runtime

MODULES = sorted(set(COMMAND_MODULES.values()))


@pytest.mark.parametrize("module_name", MODULES)
def test_every_command_of_a_module_is_in_the_table_under_its_module(module_name: str) -> None:
    module = importlib.import_module(f"crawler.cli.{module_name}")
    made = {command.name for command in module.COMMANDS}
    assert made == {name for name, where in COMMAND_MODULES.items() if where == module_name}


def test_every_command_module_of_the_package_is_in_the_table() -> None:
    import pkgutil

    import crawler.cli

    with_commands = {
        info.name
        for info in pkgutil.iter_modules(crawler.cli.__path__)
        if hasattr(importlib.import_module(f"crawler.cli.{info.name}"), "COMMANDS")
    }
    assert with_commands == set(MODULES)


def test_help_lists_every_command_with_its_short_help() -> None:
    done = CliRunner().invoke(cli, ["--help"])
    assert done.exit_code == 0, done.output
    ctx = click.Context(cli)
    for name in COMMAND_MODULES:
        command = cli.get_command(ctx, name)
        assert command is not None
        short = command.get_short_help_str(limit=30).removesuffix("...")
        assert any(line.split()[:1] == [name] and short in line for line in done.output.splitlines()), name


def test_an_unknown_command_is_a_usage_error() -> None:
    done = CliRunner().invoke(cli, ["statu"])
    assert done.exit_code == 2
    assert "No such command 'statu'" in done.output


def test_the_bundled_spiders_are_the_workers_own() -> None:
    assert demo.BUNDLED_SPIDERS == runtime.BUNDLED_SPIDERS


#: What the every-site commands must not import at start-up (issue 46): the work layer, HTTP, rq's
#: worker; ``crawler sites`` not the database either (``status`` imports it for its rates, as it runs).
NOT_IMPORTED = {
    "sites": ("crawler.work", "crawler.http", "httpx", "sqlalchemy", "crawler.store"),
    "status": ("crawler.work", "crawler.http", "httpx", "sqlalchemy", "crawler.store"),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(NOT_IMPORTED))
def test_the_every_site_commands_import_neither_the_workers_nor_http(name: str) -> None:
    # httpx._main is None in sys.modules: marked absent by crawler/__init__.py, never imported
    loaded = "[k for k, v in sys.modules.items() if v is not None]"
    code = (
        "import sys, click; from crawler.cli.app import cli; "
        f"assert cli.get_command(click.Context(cli), {name!r}) is not None; "
        f"print(sorted(m for m in {NOT_IMPORTED[name]!r} if any(k == m or k.startswith(m + '.') for k in {loaded})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
