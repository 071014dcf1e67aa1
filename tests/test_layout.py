"""The package's shape: layers, no import cycles, and docs/ARCHITECTURE.md's tree in step with the code.

Read from the source with ``ast`` (nothing is imported). Every module of ``crawler/``
belongs to a layer of ``LAYERS``; an import (at module level or in a function) may
name its own layer or one listed before it, never one after; the imports between
modules, function-level ones included, form no cycle. ``docs/ARCHITECTURE.md`` holds
the tree of modules with each one's docstring's first line, and the import contract,
exactly as ``tree()`` and ``contract()`` render them: ``python tests/test_layout.py``
prints both, to paste when a module is added, moved or redocumented.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "crawler"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"

#: Layers from the bottom up: the modules (or packages) each holds, what belongs there, and
#: the layers it may import besides its own. Nothing may import a layer above it.
LAYERS: list[tuple[str, tuple[str, ...], str, tuple[str, ...]]] = [
    (
        "base",
        ("crawler.backoff", "crawler.errors", "crawler.settings", "crawler.urls"),
        "the exception tree; settings and their checks; backoff; URLs, canonical and checked",
        (),
    ),
    ("spiders", ("crawler.spiders",), "the spider author's API", ("base",)),
    ("demo", ("crawler.demo",), "the bundled demo shop and its spider", ("base", "spiders")),
    ("http", ("crawler.http",), "talking HTTP to the sites; no Redis, no database", ("base", "spiders")),
    ("coord", ("crawler.coord",), "everything the fleet coordinates through Redis", ("base", "spiders", "http")),
    ("store", ("crawler.store",), "the database, and records waiting for it", ("base", "spiders", "http", "coord")),
    (
        "work",
        ("crawler.work",),
        "the workers, their jobs, what they run per process",
        ("base", "spiders", "demo", "http", "coord", "store"),
    ),
    (
        "ops",
        ("crawler.ops",),
        "what operators look at and run",
        ("base", "spiders", "demo", "http", "coord", "store", "work"),
    ),
    (
        "cli",
        ("crawler.cli",),
        "the command line",
        ("base", "spiders", "demo", "http", "coord", "store", "work", "ops"),
    ),
    (
        "api",
        ("crawler", "crawler.testing"),
        "the public names: `crawler`, `crawler.testing`",
        ("base", "spiders", "demo", "http", "coord", "store", "work", "ops", "cli"),
    ),
]
NAMES = [name for name, _, _, _ in LAYERS]


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    in_function: bool


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports() -> list[Import]:
    """Every import of a crawler module by a crawler module, resolved to the module it names."""
    known = modules()
    found = []
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        functions = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            for target in targets:
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target != name:
                    found.append(Import(name, target, node.lineno, id(node) in functions))
    return found


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the layer holding ``module`` (its longest matching prefix)."""
    best: tuple[int, int] | None = None
    for index, (_, members, _, _) in enumerate(LAYERS):
        for member in members:
            if module == member or module.startswith(member + ".") and member != "crawler":
                if best is None or len(member) > best[1]:
                    best = (index, len(member))
    return None if best is None else best[0]


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def tree() -> str:
    """The package's tree, one line a module: its path and its docstring's first line."""
    lines = []
    for name, path in modules().items():
        rel = path.relative_to(ROOT)
        shown = f"{rel.parent}/" if path.name == "__init__.py" else str(rel)
        depth = len(rel.parts) - (2 if path.name == "__init__.py" else 1)
        label = "  " * depth + (shown.rsplit("/", 2)[-2] + "/" if path.name == "__init__.py" else rel.name)
        lines.append(f"{label:<28} {first_line(path)}".rstrip())
    return "\n".join(lines)


def contract() -> str:
    """The import contract as a Markdown table: each layer, what it holds, what it may import."""
    rows = ["| layer | holds | may import |", "| --- | --- | --- |"]
    for name, members, holds, allowed in LAYERS:
        below = ", ".join(f"`{n}`" for n in allowed) or "nothing of the crawler"
        names = ", ".join(f"`{m}`" for m in members)
        rows.append(f"| `{name}`: {names} | {holds} | {below} |")
    return "\n".join(rows)


def test_every_module_belongs_to_a_layer() -> None:
    lost = [name for name in modules() if layer_of(name) is None]
    assert not lost, f"add these modules to a layer of LAYERS (tests/test_layout.py): {lost}"


@pytest.mark.parametrize("edge", imports(), ids=lambda e: f"{e.source}->{e.target}")
def test_an_import_names_its_own_layer_or_one_below(edge: Import) -> None:
    source, target = layer_of(edge.source), layer_of(edge.target)
    assert source is not None and target is not None
    assert target == source or NAMES[target] in LAYERS[source][3], (
        f"{edge.source}:{edge.line} imports {edge.target}: layer {LAYERS[source][0]!r} may not import "
        f"{LAYERS[target][0]!r} (see LAYERS)"
    )


def test_a_layer_may_import_only_layers_below_it() -> None:
    for index, (name, _, _, allowed) in enumerate(LAYERS):
        assert set(allowed) <= set(NAMES[:index]), f"layer {name!r} may import a layer above it"


@pytest.mark.slow
def test_no_import_cycles_function_level_imports_included() -> None:
    found = cycles(imports())
    assert not found, f"import cycles: {found}"


def test_every_subpackage_says_what_belongs_there_and_what_it_may_import() -> None:
    for path in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert doc, f"{path.relative_to(ROOT)} has no docstring"
        if path.parent.name not in ("demo",):
            assert "import" in doc, f"{path.relative_to(ROOT)}: its docstring does not say what it may import"


def test_the_tests_mirror_the_packages() -> None:
    """A test module lives in the directory of the subpackage it tests (``tests/work/`` for
    ``crawler/work/``); only tests of the package as a whole (layout, style, docs, the
    top-level modules) and shared helpers sit in ``tests/`` itself."""
    tests = ROOT / "tests"
    subpackages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    directories = {path.name for path in tests.iterdir() if path.is_dir() and not path.name.startswith((".", "_"))}
    assert directories <= subpackages, f"test directories that name no subpackage: {sorted(directories - subpackages)}"
    top_level = {path.stem.removeprefix("test_") for path in tests.glob("test_*.py")}
    whole_package = {"code_style", "layout", "docs", "sites", "redaction"}
    modules = {path.stem for path in PACKAGE.glob("*.py")}
    assert top_level <= whole_package | modules, (
        f"move these into their subpackage's directory: {sorted(top_level - whole_package - modules)}"
    )


def test_architecture_shows_the_tree_of_modules_as_they_are() -> None:
    assert "```text\n" + tree() + "\n```" in ARCHITECTURE.read_text(), (
        "docs/ARCHITECTURE.md's tree is out of date; paste `python tests/test_layout.py`'s tree:\n" + tree()
    )


def test_architecture_shows_the_import_contract_the_tests_enforce() -> None:
    assert contract() in ARCHITECTURE.read_text(), (
        "docs/ARCHITECTURE.md's import contract is out of date; paste:\n" + contract()
    )


#: Most lines a module of the package may have, and a function (from its ``def`` to the end of its body).
MOST_MODULE_LINES = 600
MOST_FUNCTION_LINES = 60


def over_limits(source: str, where: str) -> list[tuple[str, int]]:
    """What of module ``source`` (at path ``where``) is over the limits, with its lines: the module
    as ``where``, a function as ``where:Qualified.name``."""
    found = []
    lines = len(source.splitlines())
    if lines > MOST_MODULE_LINES:
        found.append((where, lines))

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and length > MOST_FUNCTION_LINES:
                    found.append((f"{where}:{name}", length))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


@pytest.mark.slow  # parses every module of crawler/
def test_no_module_is_over_600_lines_nor_a_function_over_60() -> None:
    found = [
        (label, lines)
        for path in sorted(PACKAGE.rglob("*.py"))
        for label, lines in over_limits(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, (
        f"split these (at most {MOST_MODULE_LINES} lines a module, {MOST_FUNCTION_LINES} a function): {found}"
    )


def test_the_size_check_sees_a_long_module_and_a_long_function_nested_or_not() -> None:
    body = "".join(f"    x = {n}\n" for n in range(MOST_FUNCTION_LINES - 1))
    fits = f"def fits():\n{body}"
    assert over_limits(fits, "m.py") == []
    long = "class C:\n    def method(self):\n        def inner():\n" + textwrap.indent(body, " " * 8)
    assert over_limits(long, "m.py") == [("m.py:C.method", MOST_FUNCTION_LINES + 1)]
    assert over_limits(fits + "y = 1\n" * (MOST_MODULE_LINES - MOST_FUNCTION_LINES + 1), "m.py") == [
        ("m.py", MOST_MODULE_LINES + 1)
    ]


#: Modules that may spell a key: the one that builds them, and the one that renames keys of before.
KEY_BUILDERS = {"crawler.coord.keys", "crawler.ops.rekey"}


def hand_built_keys(source: str) -> list[int]:
    """Lines of ``source`` with a string that starts a crawler key, or that builds one from ``keys.PREFIX``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("crawler:"):
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "PREFIX":
            lines.append(node.lineno)
    return lines


@pytest.mark.slow
def test_every_redis_key_is_built_in_keys() -> None:
    found = {
        name: hand_built_keys(path.read_text())
        for name, path in modules().items()
        if name not in KEY_BUILDERS and hand_built_keys(path.read_text())
    }
    assert not found, f"Redis keys built by hand (build them in crawler/coord/keys.py): {found}"
    assert hand_built_keys('NAMESPACE = "crawler:gate"\nGate(c, "x", 1, namespace=keys.PREFIX + "lock")') == [1, 2]


@pytest.mark.slow
def test_the_checks_see_a_cycle_and_an_upward_import() -> None:
    """The checks themselves: a cycle and an import of a higher layer are found."""
    made = [
        Import("crawler.coord.a", "crawler.coord.b", 1, False),
        Import("crawler.coord.b", "crawler.coord.a", 2, True),
    ]
    assert cycles(made) == [["crawler.coord.a", "crawler.coord.b"]]
    assert (
        NAMES[layer_of("crawler.coord.gate") or 0] == "coord" and NAMES[layer_of("crawler.spiders") or 0] == "spiders"
    )
    assert "coord" not in LAYERS[NAMES.index("http")][3]
    assert layer_of("crawler") == layer_of("crawler.testing") == len(LAYERS) - 1
    assert any(e.in_function for e in imports()), "function-level imports are seen (the CLI's lazy ones)"


if __name__ == "__main__":
    sys.stdout.write(tree() + "\n\n" + contract() + "\n")


@pytest.mark.integration
def test_the_cli_leaves_out_the_modules_a_worker_process_never_uses() -> None:
    """Every worker process starts from the CLI's imports: rich (status screens), lxml (sitemaps),
    PostgreSQL's dialect and httpx's own CLI (rich and pygments) cost some 8 MiB each process
    that never uses them, so they are imported where used."""
    code = (
        "import sys; import crawler.cli.app; from crawler.store.database import Store; "
        "print(sorted(m for m in ('rich', 'pygments', 'lxml', 'sqlalchemy.dialects.postgresql') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
