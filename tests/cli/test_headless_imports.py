"""The engine stays headless and the CLI starts light.

The rule: importing any `localspec` module never loads Textual or the `tui` package; only
the chat command, when it runs, imports the chat (inside its function). And
`localspec --help` loads neither llama.cpp nor numpy, jinja2 or Textual.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import localspec
from localspec.cli import COMMANDS

PACKAGE = Path(localspec.__file__).parent
UI = ("textual", "tui")
HEAVY = ("numpy", "llama_cpp", "jinja2", *UI)

# Imports every module in turn; sys.modules only grows, so the first module after which
# Textual appears is the one that pulled it in.
CHECK = """
import importlib, json, sys
culprits = []
for name in sys.argv[1:]:
    importlib.import_module(name)
    if any(m.split(".")[0] in ("textual", "tui") for m in sys.modules):
        culprits.append(name)
        break
print(json.dumps(culprits))
"""


def modules() -> list[str]:
    names = ["localspec"]
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="localspec."):
        if info.name != "localspec.__main__":
            names.append(info.name)
    return names


def test_no_localspec_module_imports_textual():
    names = modules()
    assert "localspec.cli.chat" in names and "localspec.conversations" in names
    r = subprocess.run(
        [sys.executable, "-c", CHECK, *names], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_time_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) for each import that runs when the module is imported: at the top,
    in top-level blocks and class bodies; not in functions, nor under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                yield from import_time_imports(child)
        else:
            yield from import_time_imports(node)


def ui_imports(source: str) -> list[tuple[int, str]]:
    return [
        (line, name)
        for line, name in import_time_imports(ast.parse(source))
        if name.split(".")[0] in UI
    ]


def test_the_static_check_finds_module_level_imports_only():
    source = """
import os
from textual.app import App
if os.name:
    import tui.app
else:
    pass
try:
    import textual
except ImportError:
    pass
class C:
    from tui import pair
if TYPE_CHECKING:
    from tui.pair import PairSpec
def run():
    from tui.app import run_chat
    import textual.widgets
"""
    assert ui_imports(source) == [
        (3, "textual.app"),
        (5, "tui.app"),
        (9, "textual"),
        (13, "tui"),
    ]


def test_no_localspec_module_imports_textual_or_tui_at_import_time():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in ui_imports(path.read_text())
    ]
    assert offenders == []


def test_the_chat_is_imported_plainly_not_by_name():
    """`importlib.import_module("tui…")` would hide the dependency from readers and mypy."""
    offenders = [
        str(path.relative_to(PACKAGE.parent))
        for path in sorted(PACKAGE.rglob("*.py"))
        if 'import_module("tui' in path.read_text() or "import_module('tui" in path.read_text()
    ]
    assert offenders == []


def loaded_by(*argv: str) -> set[str]:
    """The top-level packages `python -m localspec ARGV` imports, from `-X importtime`."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "localspec", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage: localspec")
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in r.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_loads_no_heavy_package(command: str | None):
    loaded = loaded_by(*([command] if command else []), "--help")
    assert {"argparse", "localspec"} <= loaded  # the listing is read right
    assert sorted(loaded & set(HEAVY)) == []
