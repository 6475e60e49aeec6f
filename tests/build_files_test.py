"""The Bazel BUILD files stay in step with the source tree; plain pytest, no Bazel needed.

Others add modules and tests all the time and CI does not run Bazel on every change, so these
checks (bazel/build_graph.py evaluates the BUILD files) catch what `bazel test` would trip on.
"""
from pathlib import Path

import pytest

from bazel import build_graph

# Under Bazel this file is a runfiles symlink: resolve() leads back to the source tree.
REPO = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("edp_tf", "edp_nlu", "experiments", "benchmarks", "tools", "tests")
TOOLING = ("experiments", "benchmarks", "tools")  # research tools, outside the wheel
# The commands a user runs; each needs a py_binary.
ENTRY_POINTS = ("edp_nlu/train", "edp_nlu/evaluate", "edp_nlu/privacy", "benchmarks/benchmark",
                "tools/audit", "tools/lira", "experiments/experiment")
# edp_nlu/models depends on nothing else of edp_nlu: not its sub-packages, not its commands
# (edp_nlu/__init__.py, the namespace, is all it shares).
NLU_BESIDE_MODELS = tuple(sorted(
    p.relative_to(REPO).as_posix() for p in (REPO / "edp_nlu").iterdir()
    if p.name not in ("models", "__init__.py", "BUILD", "__pycache__")))
# docs/design.md, layout: the library imports neither the application nor the tools; the
# application imports none of the tools; its models import nothing else of it; its corpora and
# label schemas never import its training run or scoring.
LAYERING = {"edp_tf": ("edp_nlu",) + TOOLING, "edp_nlu": TOOLING,
            "edp_nlu/models": NLU_BESIDE_MODELS,
            "edp_nlu/data": ("edp_nlu/pipeline", "edp_nlu/scoring")}
RUNNER = "bazel/pytest_runner.py"


@pytest.fixture(scope="module")
def graph():
    return build_graph.load_build_graph(REPO)


def test_every_module_test_and_data_file_is_in_a_target(graph):
    assert build_graph.uncovered_files(REPO, graph, SOURCE_DIRS) == []


def test_every_module_with_a_main_block_has_a_py_binary(graph):
    dirs = [d for d in SOURCE_DIRS if d != "tests"]
    assert build_graph.entry_points_without_binary(REPO, graph, dirs) == []


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_entry_point_has_a_py_binary(graph, path):
    package, name = path.rsplit("/", 1)
    if not (REPO / f"{path}.py").exists():
        pytest.skip(f"{path}.py does not exist yet: no //{package}:{name} target")
    target = graph.get(f"//{package}:{name}")
    assert target is not None and target.kind == "py_binary"
    assert target.main == f"{path}.py"


def test_every_py_test_runs_its_own_file_through_pytest(graph):
    tests = [t for t in graph.values() if t.kind == "py_test"]
    assert tests
    for t in tests:
        package = t.label[2:].split(":")[0]
        own = [s[len(package) + 1:] for s in t.srcs if s != RUNNER]
        assert t.main == RUNNER, t.label
        assert len(own) == 1 and t.args == (f"$(rootpath {own[0]})",), t.label
        assert "//:conftest" in t.deps, f"{t.label}: needs conftest.py (4 logical CPUs)"


def test_dependencies_name_existing_targets(graph):
    assert build_graph.unknown_deps(graph) == []


def test_first_party_imports_are_in_the_importers_dependencies(graph):
    assert build_graph.unmet_imports(REPO, graph) == []


def test_layering_rules_hold(graph):
    assert build_graph.layering_violations(graph, LAYERING) == []


# ---------------------------------------------------------------- the checker itself


@pytest.mark.parametrize("pattern,path,matches", [
    ("*.py", "a.py", True),
    ("*.py", "sub/a.py", False),  # `*` stays within one path segment.
    ("**/*.py", "a.py", True),  # `**` also matches zero directories.
    ("**/*.py", "x/y/a.py", True),
    ("**/test_*.py", "x/test_a.py", True),
    ("**/test_*.py", "x/a_test.py", False),
    ("**", "x/y", True),
])
def test_glob_match_follows_bazel(pattern, path, matches):
    assert build_graph.glob_match(pattern, path) is matches


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_checker_reports_what_the_build_files_miss(tmp_path):
    _write(tmp_path, {
        "lib/__init__.py": "",
        "lib/core.py": "from other import helper\n",
        "lib/forgotten.py": "",
        "lib/tool.py": "if __name__ == '__main__':\n    pass\n",
        "lib/core_test.py": "from lib import core\n",
        "lib/vocab.txt": "words\n",
        "lib/BUILD": 'py_library(name = "lib", srcs = ["__init__.py", "core.py", "tool.py"],'
                     ' deps = ["//missing"])\n',
        "other/__init__.py": "",
        "other/helper.py": "",
        "other/BUILD": 'py_library(name = "other", srcs = glob(["*.py"]))\n',
    })
    graph = build_graph.load_build_graph(tmp_path)
    assert sorted(build_graph.uncovered_files(tmp_path, graph, ["lib", "other"])) == [
        "lib/core_test.py: test file in no py_test",
        "lib/forgotten.py: module in no py_library",
        "lib/vocab.txt: file in no target's data",
    ]
    assert build_graph.entry_points_without_binary(tmp_path, graph, ["lib"]) == [
        "lib/tool.py: entry point (has a __main__ block) without a py_binary"]
    assert build_graph.unknown_deps(graph) == [
        "//lib:lib: depends on unknown target //missing:missing"]
    unmet = build_graph.unmet_imports(tmp_path, graph)
    assert "//lib:lib: lib/core.py needs other/__init__.py, which no dependency provides" in unmet
    assert "//lib:lib: lib/core.py needs other/helper.py, which no dependency provides" in unmet
    assert build_graph.layering_violations(graph, {"other": ("lib",)}) == []
    assert build_graph.layering_violations(graph, {"lib": ("other",)}) == []  # No dep on it yet.


def test_globs_stop_at_sub_packages_and_macros_load(tmp_path):
    _write(tmp_path, {
        "defs.bzl": 'def lib(name):\n'
                    '    native.py_library(name = name, srcs = native.glob(["**/*.py"]))\n',
        "BUILD": "",
        "pkg/BUILD": 'load("//:defs.bzl", "lib")\nlib(name = "pkg")\n',
        "pkg/a.py": "",
        "pkg/inner/b.py": "",
        "pkg/sub/BUILD": 'py_library(name = "sub", srcs = ["c.py"], deps = ["//pkg"])\n',
        "pkg/sub/c.py": "",
    })
    graph = build_graph.load_build_graph(tmp_path)
    assert graph["//pkg:pkg"].srcs == ("pkg/a.py", "pkg/inner/b.py")
    assert graph["//pkg/sub:sub"].deps == ("//pkg:pkg",)
    assert build_graph.layering_violations(graph, {"pkg/sub": ("pkg/inner",)}) == [
        "//pkg/sub:sub: brings in pkg/inner/b.py (pkg/sub must not depend on it)"]


def test_a_stale_size_or_tag_entry_fails_the_package(tmp_path):
    _write(tmp_path, {
        "BUILD": "",
        "bazel/BUILD": "",
        "bazel/defs.bzl": (REPO / "bazel" / "defs.bzl").read_text(),
        "pkg/BUILD": 'load("//bazel:defs.bzl", "pytest_files")\n'
                     'pytest_files(["test_a.py"], sizes = {"test_renamed": "small"})\n',
        "pkg/test_a.py": "",
    })
    with pytest.raises(build_graph.BuildFileError, match="test_renamed"):
        build_graph.load_build_graph(tmp_path)


def test_a_build_file_it_cannot_evaluate_is_named(tmp_path):
    _write(tmp_path, {"pkg/BUILD": 'py_library(name = "x", srcs = undefined_macro())\n'})
    with pytest.raises(build_graph.BuildFileError, match="pkg/BUILD"):
        build_graph.load_build_graph(tmp_path)


def _module_imports(package: str) -> dict:
    """{module: the package's modules it imports}, function-local imports included."""
    import ast

    root = REPO / package
    names = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for p in root.rglob("*.py") if not p.name.endswith("_test.py")}
    graph = {}
    for name, path in names.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = node.module
                found |= {f"{base}.{a.name}" for a in node.names} | {base}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in names and m != name and m != package}
    return graph


@pytest.mark.parametrize("package", ["edp_tf", "edp_nlu", *TOOLING])
def test_no_import_cycles(package):
    """A cycle makes import order matter and hides which module owns what (the mechanism
    and the accountant once imported each other)."""
    graph = _module_imports(package)
    cycles = []

    def visit(module, path):
        for nxt in sorted(graph[module]):
            if nxt == path[0]:
                cycles.append(" -> ".join(path + [nxt]))
            elif nxt not in path and nxt > path[0]:  # each cycle once, from its smallest module
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert cycles == []
