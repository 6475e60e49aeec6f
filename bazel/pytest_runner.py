"""Entry point of every Bazel py_test: runs one test file under pytest.

Bazel's py_test would run the file as a plain script; going through pytest keeps the fixtures,
parametrisation and the root conftest.py (4 logical CPU devices, set before TensorFlow starts).
"""
import os
import sys


def main(argv: list[str]) -> int:
    try:
        import pytest
    except ImportError:
        sys.stderr.write(
            f"bazel/pytest_runner.py: {sys.executable} has no pytest. Bazel must run the project's "
            "virtualenv: use bazel/test.sh, or pass --python_path=<checkout>/.venv/bin/python.\n")
        return 2
    args = list(argv)
    if os.environ.get("XML_OUTPUT_FILE"):  # Per-test-case results for Bazel's test.xml.
        args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
    if os.environ.get("TEST_TMPDIR"):  # Keep pytest's tmp_path inside Bazel's sandboxed temp dir.
        args.append("--basetemp=" + os.path.join(os.environ["TEST_TMPDIR"], "pytest"))
    return int(pytest.main(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
