"""docs/CONFIGURATION.md keeps up with the code: every setting and every CLI flag is in it.

A setting added to ``Settings`` or a flag added to any ``crawler`` command fails here
until the reference mentions it; a changed default fails until the table says so.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from crawler.cli.app import cli
from crawler.settings import SITE_KEYS, Settings, read_environment

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "CONFIGURATION.md"
HEADING = re.compile(r"^#{2,4} .*?`(crawler[^`]*)`", re.MULTILINE)


def reference() -> str:
    return REFERENCE.read_text(encoding="utf-8")


def commands(group: click.Group = cli, path: str = "crawler") -> list[tuple[str, click.Command]]:
    """Every command of the CLI, the root group included, with its full name."""
    found: list[tuple[str, click.Command]] = [(path, group)]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # a lazily loaded command's module is imported here
        command = group.get_command(ctx, name)
        assert command is not None, f"`{path}` lists `{name}` but has no such command"
        if isinstance(command, click.Group):
            found += commands(command, f"{path} {name}")
        else:
            found.append((f"{path} {name}", command))
    return found


def sections() -> dict[str, str]:
    """The reference's text under each heading that names a command (`crawler worker`)."""
    text = reference()
    marks = list(HEADING.finditer(text))
    found = {}
    for mark, following in zip(marks, marks[1:] + [None], strict=True):
        end = following.start() if following is not None else len(text)
        found.setdefault(mark.group(1).strip(), text[mark.end() : end])
    return found


def settings_rows() -> dict[str, str]:
    """The row of the settings table for each config key."""
    rows = {}
    for line in reference().splitlines():
        match = re.match(r"\| `(\w+)` \|", line)
        if match:
            rows.setdefault(match.group(1), line)
    return rows


def environment_variable(name: str) -> str:
    return name.upper() if name in ("redis_url", "database_url") else f"CRAWLER_{name.upper()}"


SETTINGS = list(dataclasses.fields(Settings))
COMMANDS = commands()


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda f: f.name)
def test_every_setting_has_a_row_with_its_variable_and_default(setting: dataclasses.Field) -> None:
    row = settings_rows().get(setting.name)
    assert row is not None, f"docs/CONFIGURATION.md: no row for the setting `{setting.name}`"
    if setting.name == "sites":  # config file only
        return
    variable = environment_variable(setting.name)
    sample = "redis://example.invalid:6379/0" if setting.default is None else str(setting.default)
    assert setting.name in read_environment({variable: sample}), f"{variable} does not set {setting.name}"
    assert f"`{variable}`" in row, f"the row of `{setting.name}` does not name `{variable}`"
    if setting.default is not None:
        spellings = {str(setting.default)}
        if isinstance(setting.default, float):
            spellings.add(f"{setting.default:g}")
        assert any(s in row for s in spellings), f"`{setting.name}`: its row lacks the default {setting.default!r}"


@pytest.mark.parametrize("key", sorted(SITE_KEYS))
def test_every_per_site_key_is_documented(key: str) -> None:
    assert f"`sites.NAME.{key}`" in reference()


@pytest.mark.parametrize("path,command", COMMANDS, ids=[path for path, _ in COMMANDS])
def test_every_command_has_a_section_naming_each_of_its_flags_and_choices(path: str, command: click.Command) -> None:
    section = sections().get(path)
    assert section is not None, f"docs/CONFIGURATION.md: no heading for `{path}`"
    for param in command.params:
        if isinstance(param, click.Option):
            for flag in param.opts + param.secondary_opts:
                assert f"`{flag}" in section, f"`{path}`: the flag {flag} is not documented"
        if isinstance(param.type, click.Choice):
            for choice in param.type.choices:
                assert str(choice) in section, f"`{path}`: {param.name} value {choice!r} is not documented"
