"""Macros shared by the project's BUILD files.

Globs keep the targets in step with the files other people add; tests/build_files_test.py checks
that nothing falls through (every module in a library, every test file in a py_test, every entry
point in a py_binary, every first-party import inside the importer's dependencies).
"""

_TEST_FILES = ["**/*_test.py"]

def py_sources():
    """This package's Python modules, sub-directories included up to the next Bazel package."""
    return native.glob(["**/*.py"], exclude = _TEST_FILES)

def test_sources():
    """This package's pytest files (`*_test.py`), as pytest.ini collects them."""
    return native.glob(_TEST_FILES)

def package_data():
    """Non-Python files a module may read at run time (vocabularies, templates, fixtures)."""
    return native.glob(["**"], exclude = [
        "**/*.py",
        "**/*.pyc",
        "**/__pycache__/**",
        "BUILD",
        "**/.*",
    ])

def pytest_files(srcs, deps = [], data = [], sizes = {}, tags = {}):
    """One py_test per file, named after it, that runs pytest on that file.

    Args:
      srcs: the test files.
      deps: libraries the tests import.
      data: files the tests read.
      sizes: test name -> Bazel size ("small", "medium" (default), "large", "enormous").
      tags: test name -> extra tags ("manual" keeps a test out of `bazel test //...`).
    """
    names = [src[:-len(".py")] for src in srcs]
    for key in list(sizes) + list(tags):
        if key not in names:
            fail("pytest_files: sizes/tags name %s, which is no test file of this package" % key)
    for src in srcs:
        name = src[:-len(".py")]
        native.py_test(
            name = name,
            srcs = [src, "//bazel:pytest_runner.py"],
            main = "//bazel:pytest_runner.py",
            args = ["$(rootpath %s)" % src],
            deps = deps + ["//:conftest"],
            data = data,
            size = sizes.get(name, "medium"),
            tags = tags.get(name, []),
        )

def py_entry_points(names, deps):
    """A py_binary for each `<name>.py` of `names` that exists (entry points are added over time)."""
    for src in native.glob([name + ".py" for name in names]):
        native.py_binary(
            name = src[:-len(".py")],
            srcs = [src],
            main = src,
            deps = deps,
        )
