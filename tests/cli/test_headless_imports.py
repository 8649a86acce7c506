"""The engine stays headless: no localspec module imports Textual or the TUI."""

from __future__ import annotations

import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import localspec

PACKAGE = Path(localspec.__file__).parent

# Imports every module in turn; sys.modules only grows, so the first module after which
# Textual appears is the one that pulled it in.
CHECK = """
import importlib, json, sys
culprits = []
for name in sys.argv[1:]:
    importlib.import_module(name)
    if any(m == "textual" or m.startswith(("textual.", "tui")) for m in sys.modules):
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


def test_no_import_statement_names_textual_or_tui():
    pattern = re.compile(r"^\s*(from|import)\s+(textual|tui)\b", re.MULTILINE)
    offenders = [str(p) for p in PACKAGE.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []
