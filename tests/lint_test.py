"""The lint gate: `ruff check .` (its rules are in pyproject.toml) and no first-party import
inside a function.

CI runs exactly `pytest`, so the gate is a test. Why no function-local imports of our own
modules: they hide a module's dependencies from its reader and from the layering and cycle
checks a reader trusts (tests/build_files_test.py), and they are how import cycles creep back in
unnoticed. ruff's PLC0415 flags every local import (TensorFlow's optional modules too) and cannot
be limited to first-party ones, hence the AST check here.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Under Bazel this file is a runfiles symlink: resolve() leads back to the source tree.
REPO = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("edp_tf", "edp_nlu", "experiments", "benchmarks", "tools", "tests", "bazel")
SOURCE_DIRS = FIRST_PARTY + ("examples",)
# An indented first-party import: only files with one are parsed (parsing all takes seconds).
_INDENTED_IMPORT = re.compile(
    rf"^[ \t]+(?:from[ \t]+\.|(?:from|import)[ \t]+(?:{'|'.join(FIRST_PARTY)})\b)", re.M)

# (file, function) -> why its first-party import must stay inside it. Each entry is checked to
# still be needed: a stale one fails the test.
_SPAWNED = ("runs in a spawned process, which imports this module afresh: it quiets TensorFlow's "
            "native logs (cli.quiet_unless_verbose) before edp_tf imports TensorFlow")
ALLOWED_LOCAL_IMPORTS = {
    ("benchmarks/release_benchmark.py", "one_run"): _SPAWNED,
    ("benchmarks/streaming_benchmark.py", "measure_epoch"): _SPAWNED,
    ("tools/faults.py", "child"): "edp_nlu.train defines its absl flags at import (--epochs, ...), "
    "which the fault tool's own command defines too: only the child process that runs train's "
    "main imports it",
}


def _python_files() -> list[Path]:
    files = sorted(p for p in REPO.glob("*.py"))
    for name in SOURCE_DIRS:
        files += sorted(p for p in (REPO / name).rglob("*.py") if "__pycache__" not in p.parts)
    return files


def _is_first_party(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] in FIRST_PARTY
    return any(alias.name.split(".")[0] in FIRST_PARTY for alias in node.names)


def local_first_party_imports(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function's qualified name, imported module) of each first-party import
    inside a function body (nested functions and classes within it included). Module-level
    blocks (`if __name__ == "__main__":`, the header that quiets TensorFlow) are not functions."""
    found = []

    def visit(node: ast.AST, scope: list[str], in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                visit(child, scope + [child.name], in_function or inner)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_function and _is_first_party(child):
                    module = ("." * getattr(child, "level", 0) + (child.module or "")
                              if isinstance(child, ast.ImportFrom)
                              else ", ".join(a.name for a in child.names))
                    found.append((child.lineno, ".".join(scope), module))
            else:
                visit(child, scope, in_function)

    visit(ast.parse(source), [], False)
    return found


def test_ruff_check_passes():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (
        f"ruff check found problems (`ruff check --fix .` fixes import order and unused "
        f"imports; the rest by hand):\n{result.stdout}{result.stderr}")


def test_no_first_party_import_inside_a_function():
    found, used = [], set()
    for path in _python_files():
        rel = path.relative_to(REPO).as_posix()
        source = path.read_text()
        if not _INDENTED_IMPORT.search(source):
            continue
        for line, function, module in local_first_party_imports(source):
            if (rel, function) in ALLOWED_LOCAL_IMPORTS:
                used.add((rel, function))
            else:
                found.append(f"{rel}:{line}: {function}() imports {module}")
    stale = sorted(set(ALLOWED_LOCAL_IMPORTS) - used)
    assert not found, ("first-party imports inside functions: move them to the module top (or, "
                       "if one must stay, add it to ALLOWED_LOCAL_IMPORTS with why):\n"
                       + "\n".join(found))
    assert not stale, f"ALLOWED_LOCAL_IMPORTS entries with no local import left: {stale}"


@pytest.mark.parametrize("source,expected", [
    ("from edp_tf import plan\n", []),  # module top
    ("if __name__ == '__main__':\n    from edp_nlu import cli\n", []),  # the quieting header
    ("def f():\n    import numpy\n    from tensorflow import keras\n", []),  # third party
    ("def f():\n    from edp_tf import plan\n", [(2, "f", "edp_tf")]),
    ("def f():\n    import edp_nlu.pipeline.builders\n", [(2, "f", "edp_nlu.pipeline.builders")]),
    ("async def f():\n    from .sibling import g\n", [(2, "f", ".sibling")]),
    ("class C:\n    def m(self):\n        if True:\n            from tools import audit\n",
     [(4, "C.m", "tools")]),
    ("def f():\n    def g():\n        from tests import tiny_runs\n",
     [(3, "f.g", "tests")]),
])
def test_local_import_check_finds_what_it_should(source, expected):
    assert local_first_party_imports(source) == expected


MAX_FUNCTION_LINES = 80
# (file, function) -> why it may be longer. Each entry is checked to still be needed.
_GRID = ("an experiment grid: one table of cells, each row with the why of its overrides in "
         "the order they were run; split, the history it records would be scattered")
ALLOWED_LONG_FUNCTIONS = {
    ("experiments/grids/atis.py", "_grid"): _GRID,
    ("experiments/grids/snips.py", "_grid"): _GRID,
    ("experiments/grids/pilot_snips_clc.py", "_grid"): _GRID,
}


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[int, str, int]]:
    """(line, qualified name, lines) of each function longer than `limit` lines (its
    decorators excluded, its docstring included)."""
    found = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = scope + [child.name]
                length = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and length > limit:
                    found.append((child.lineno, ".".join(name), length))
                visit(child, name)

    visit(ast.parse(source), [])
    return found


def test_no_function_is_longer_than_80_lines():
    found, used = [], set()
    for path in _python_files():
        rel = path.relative_to(REPO).as_posix()
        for line, function, length in long_functions(path.read_text()):
            if (rel, function) in ALLOWED_LONG_FUNCTIONS:
                used.add((rel, function))
            else:
                found.append(f"{rel}:{line}: {function}() has {length} lines")
    stale = sorted(set(ALLOWED_LONG_FUNCTIONS) - used)
    assert not found, (f"functions over {MAX_FUNCTION_LINES} lines: split them (or add one to "
                       "ALLOWED_LONG_FUNCTIONS with why):\n" + "\n".join(found))
    assert not stale, f"ALLOWED_LONG_FUNCTIONS entries no longer long: {stale}"


def test_long_function_check_counts_lines():
    short = "def f():\n" + "    x = 1\n" * 3
    nested = "class C:\n    def m(self):\n" + "        x = 1\n" * 5
    assert long_functions(short, limit=4) == []
    assert long_functions(short, limit=3) == [(1, "f", 4)]
    assert long_functions(nested, limit=5) == [(2, "C.m", 6)]
