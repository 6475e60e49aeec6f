"""Reads the project's BUILD files without Bazel, to check them in a plain pytest run.

The BUILD files and bazel/defs.bzl use only the Python-compatible subset of Starlark, so they are
executed here with recording stand-ins for the rules, `glob` and `load`. The checks then compare the
recorded targets with the source tree: a file nobody builds, a test no py_test runs, an entry point
without a py_binary, an import the importer's dependencies do not provide, a dependency on an
unknown target, a layering rule broken. Each check returns human-readable problems (empty: fine).
"""
from __future__ import annotations

import ast
import dataclasses
import fnmatch
import os
from pathlib import Path
from typing import Iterable

BUILD_NAMES = ("BUILD", "BUILD.bazel")
TEST_PATTERNS = ("*_test.py",)  # As pytest.ini collects them.
PYTHON_RULES = ("py_library", "py_binary", "py_test")
OTHER_RULES = ("filegroup", "test_suite", "sh_binary", "sh_test", "genrule")  # Recorded too.


@dataclasses.dataclass(frozen=True)
class Target:
    label: str  # "//pkg:name"
    kind: str  # "py_library", "py_test", ...
    srcs: tuple[str, ...] = ()  # Repository-relative paths.
    data: tuple[str, ...] = ()
    deps: tuple[str, ...] = ()  # Normalised labels.
    main: str | None = None
    tags: tuple[str, ...] = ()
    args: tuple[str, ...] = ()


class BuildFileError(ValueError):
    """A BUILD or .bzl file this reader cannot evaluate (names the file)."""


# ---------------------------------------------------------------- globbing and labels


def _ignored_paths(root: Path) -> set[str]:
    ignore = root / ".bazelignore"
    if not ignore.exists():
        return set()
    lines = (line.split("#")[0].strip().strip("/") for line in ignore.read_text().splitlines())
    return {line for line in lines if line}


def _is_package(directory: Path) -> bool:
    return any((directory / name).is_file() for name in BUILD_NAMES)


def _walk_files(root: Path, start: Path, stop_at_packages: bool) -> Iterable[Path]:
    """Files under `start`, not following symlinked directories, skipping .bazelignore'd paths."""
    ignored = _ignored_paths(root)
    for dirpath, dirnames, filenames in os.walk(start):
        here = Path(dirpath)
        kept = []
        for name in sorted(dirnames):
            child = here / name
            rel = child.relative_to(root).as_posix()
            if child.is_symlink() or rel in ignored or name == ".git":
                continue
            if stop_at_packages and _is_package(child):
                continue
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            yield here / name


def glob_match(pattern: str, path: str) -> bool:
    """Bazel glob semantics: `*` stays within a path segment, `**` spans any number of them."""
    return _match_parts(pattern.split("/"), path.split("/"))


def _match_parts(pattern: list[str], path: list[str]) -> bool:
    if not pattern:
        return not path
    if pattern[0] == "**":
        return any(_match_parts(pattern[1:], path[i:]) for i in range(len(path) + 1))
    return (bool(path) and fnmatch.fnmatchcase(path[0], pattern[0])
            and _match_parts(pattern[1:], path[1:]))


def glob_files(root: Path, package: str, include: Iterable[str],
               exclude: Iterable[str] = ()) -> list[str]:
    """The package-relative files `glob(include, exclude)` returns in package `package`."""
    package_dir = root / package
    include, exclude = list(include), list(exclude)
    found = []
    for path in _walk_files(root, package_dir, stop_at_packages=True):
        rel = path.relative_to(package_dir).as_posix()
        if (any(glob_match(p, rel) for p in include)
                and not any(glob_match(p, rel) for p in exclude)):
            found.append(rel)
    return sorted(found)


def normalise_label(label: str, package: str) -> str:
    """'//a' -> '//a:a', ':x' -> '//pkg:x', 'x' -> '//pkg:x'."""
    if label.startswith("@"):
        return label
    if label.startswith("//"):
        pkg, _, name = label[2:].partition(":")
        return f"//{pkg}:{name or pkg.rsplit('/', 1)[-1]}"
    return f"//{package}:{label.lstrip(':')}"


def _label_to_path(label: str) -> str:
    pkg, _, name = label[2:].partition(":")
    return f"{pkg}/{name}" if pkg else name


# ---------------------------------------------------------------- evaluating BUILD files


class _Package:
    """The rule stand-ins one BUILD file (and the macros it loads) call."""

    def __init__(self, root: Path, package: str, targets: dict[str, Target]):
        self.root, self.package, self.targets = root, package, targets

    def glob(self, include, exclude=(), **_):
        return glob_files(self.root, self.package, include, exclude)

    def _file(self, src: str) -> str:
        if src.startswith("//") or src.startswith(":"):
            return _label_to_path(normalise_label(src, self.package))
        return f"{self.package}/{src}" if self.package else src

    def rule(self, kind: str):
        def record(name, srcs=(), data=(), deps=(), main=None, tags=(), args=(), **_):
            label = normalise_label(":" + name, self.package)
            if label in self.targets:
                raise BuildFileError(f"{self.package or '//'}/BUILD: target {name!r} defined twice")
            self.targets[label] = Target(
                label=label, kind=kind,
                srcs=tuple(self._file(s) for s in srcs),
                data=tuple(self._file(s) for s in data),
                deps=tuple(normalise_label(d, self.package) for d in deps),
                main=self._file(main) if main else None,
                tags=tuple(tags), args=tuple(args))
        return record

    def namespace(self) -> dict:
        rules = {kind: self.rule(kind) for kind in PYTHON_RULES + OTHER_RULES}
        return dict(rules, glob=self.glob, package=lambda **_: None,
                    exports_files=lambda *_, **__: None, fail=self.fail)

    def fail(self, message, *_, **__):
        raise BuildFileError(f"{self.package or '(root)'}/BUILD: fail(): {message}")


def _exec_starlark(path: Path, env: dict) -> dict:
    try:
        code = compile(path.read_text(), str(path), "exec")
        exec(code, env)  # noqa: S102 - our own BUILD files, the Python subset of Starlark.
    except BuildFileError:
        raise
    except Exception as e:  # noqa: BLE001 - name the file whatever went wrong.
        raise BuildFileError(f"{path}: cannot evaluate: {type(e).__name__}: {e}") from e
    return env


def _make_load(root: Path, pkg: _Package, into: dict):
    """Starlark's load(): evaluates a .bzl file (its `native` is `pkg`) and binds symbols in
    `into`."""
    def load(bzl_label: str, *symbols: str, **aliases: str):
        path = root / _label_to_path(normalise_label(bzl_label, pkg.package))
        native = type("native", (), {k: staticmethod(v) for k, v in pkg.namespace().items()})
        module: dict = {"native": native, "fail": pkg.fail}
        module["load"] = _make_load(root, pkg, module)
        _exec_starlark(path, module)
        for local_name, symbol in [(s, s) for s in symbols] + list(aliases.items()):
            if symbol not in module:
                raise BuildFileError(f"{path}: has no symbol {symbol!r}")
            into[local_name] = module[symbol]
    return load


def packages(root: Path) -> list[str]:
    """Repository-relative directories holding a BUILD file ('' is the root package)."""
    found = {p.parent.relative_to(root).as_posix() for p in _walk_files(root, root, False)
             if p.name in BUILD_NAMES}
    return sorted("" if p == "." else p for p in found)


def load_build_graph(root: Path) -> dict[str, Target]:
    """Every target of every BUILD file under `root`, by normalised label."""
    root = Path(root)
    targets: dict[str, Target] = {}
    for package in packages(root):
        pkg = _Package(root, package, targets)
        build = next(root / package / n for n in BUILD_NAMES if (root / package / n).is_file())
        env = pkg.namespace()
        env["load"] = _make_load(root, pkg, env)
        _exec_starlark(build, env)
    return targets


# ---------------------------------------------------------------- checks


def _python_files(root: Path, dirs: Iterable[str]) -> list[str]:
    return [p.relative_to(root).as_posix() for d in dirs if (root / d).is_dir()
            for p in _walk_files(root, root / d, stop_at_packages=False)
            if "__pycache__" not in p.parts]


def is_test_file(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], p) for p in TEST_PATTERNS)


def uncovered_files(root: Path, graph: dict[str, Target], dirs: Iterable[str]) -> list[str]:
    """Files under `dirs` no target builds: modules outside every py_library, test files outside
    every py_test, other files outside every target's data (BUILD files and caches excepted)."""
    libraries = {f for t in graph.values() if t.kind == "py_library" for f in t.srcs}
    tests = {f for t in graph.values() if t.kind == "py_test" for f in t.srcs}
    data = {f for t in graph.values() for f in t.data + t.srcs}
    problems = []
    for path in _python_files(root, dirs):
        name = path.rsplit("/", 1)[-1]
        if name in BUILD_NAMES or name.endswith(".pyc"):
            continue
        if name.endswith(".py") and is_test_file(path):
            if path not in tests:
                problems.append(f"{path}: test file in no py_test")
        elif name.endswith(".py"):
            if path not in libraries:
                problems.append(f"{path}: module in no py_library")
        elif path not in data:
            problems.append(f"{path}: file in no target's data")
    return problems


def has_main_block(path: Path) -> bool:
    """True when the module has an `if __name__ == "__main__":` block (an entry point)."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if "__name__" in test and "__main__" in test:
                return True
    return False


def entry_points_without_binary(root: Path, graph: dict[str, Target],
                                dirs: Iterable[str]) -> list[str]:
    binaries = {t.main or (t.srcs[0] if t.srcs else None) for t in graph.values()
                if t.kind == "py_binary"}
    return [f"{path}: entry point (has a __main__ block) without a py_binary"
            for path in _python_files(root, dirs)
            if path.endswith(".py") and not is_test_file(path) and path not in binaries
            and has_main_block(root / path)]


def unknown_deps(graph: dict[str, Target]) -> list[str]:
    return [f"{t.label}: depends on unknown target {d}" for t in graph.values() for d in t.deps
            if not d.startswith("@") and d not in graph]


def closure_files(graph: dict[str, Target], label: str) -> set[str]:
    """Files a target brings into its runfiles: its own and its transitive dependencies'."""
    seen, stack, files = set(), [label], set()
    while stack:
        current = stack.pop()
        if current in seen or current not in graph:
            continue
        seen.add(current)
        files.update(graph[current].srcs, graph[current].data)
        stack.extend(graph[current].deps)
    return files


def _module_files(root: Path, module: str) -> list[str] | None:
    """The files importing `module` executes (package __init__s included); None if third-party."""
    parts = module.split(".")
    if not ((root / parts[0]).is_dir() or (root / (parts[0] + ".py")).is_file()):
        return None
    files = []
    for i in range(1, len(parts) + 1):
        base = "/".join(parts[:i])
        if (root / base / "__init__.py").is_file():
            files.append(base + "/__init__.py")
        elif (root / (base + ".py")).is_file():
            files.append(base + ".py")
            break
        elif not (root / base).is_dir():
            break  # An attribute (`from package import name`), not a module.
    return files


def imported_modules(path: Path, package: str) -> set[str]:
    """Absolute names of the modules a file imports anywhere (lazy imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return {n for n in names if n}


def unmet_imports(root: Path, graph: dict[str, Target]) -> list[str]:
    """First-party imports whose files are not in the importing target's runfiles."""
    problems = []
    for target in graph.values():
        if target.kind not in PYTHON_RULES:
            continue
        available = closure_files(graph, target.label)
        for src in target.srcs:
            if not src.endswith(".py") or not (root / src).is_file():
                continue
            package = src[: -len(".py")].replace("/", ".").rsplit(".", 1)[0]
            needed = set(_module_files(root, src[: -len(".py")].replace("/", ".")) or [])
            for module in imported_modules(root / src, package):
                needed.update(_module_files(root, module) or [])
            for missing in sorted(needed - available):
                problems.append(
                    f"{target.label}: {src} needs {missing}, which no dependency provides")
    return problems


def layering_violations(graph: dict[str, Target], rules: dict[str, tuple[str, ...]]) -> list[str]:
    """rules: directory -> directories (or files) its libraries must never bring in
    (docs/design.md, layout)."""
    problems = []
    for target in graph.values():
        pkg = target.label[2:].split(":")[0]
        if target.kind != "py_library":
            continue
        for owner, forbidden in rules.items():
            if pkg == owner or pkg.startswith(owner + "/"):
                bad = sorted(f for f in closure_files(graph, target.label)
                             if any(f == d or f.startswith(d + "/") for d in forbidden))
                problems += [f"{target.label}: brings in {f} ({owner} must not depend on it)"
                             for f in bad]
    return problems
