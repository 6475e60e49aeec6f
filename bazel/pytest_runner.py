"""Entry point of every Bazel py_test: runs one test file under pytest.

Bazel's py_test would run the file as a plain script; going through pytest keeps the fixtures,
parametrisation and the root conftest.py (4 logical CPU devices, set before TensorFlow starts).
"""
import importlib.util
import os
import sys

# Present only in the project's virtualenv; Bazel falls back to any `python` on the PATH.
_REQUIRED = ("pytest", "tensorflow")


def main(argv: list[str]) -> int:
    missing = [name for name in _REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        sys.stderr.write(
            f"bazel/pytest_runner.py: {sys.executable} has no {', '.join(missing)}. Bazel must run "
            "the project's virtualenv: use bazel/test.sh, or pass "
            "--python_path=<checkout>/.venv/bin/python.\n")
        return 2
    import pytest

    args = list(argv)
    if os.environ.get("XML_OUTPUT_FILE"):  # Per-test-case results for Bazel's test.xml.
        args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
    if os.environ.get("TEST_TMPDIR"):  # Keep pytest's tmp_path inside Bazel's test temp dir.
        args.append("--basetemp=" + os.path.join(os.environ["TEST_TMPDIR"], "pytest"))
    return int(pytest.main(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
