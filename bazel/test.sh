#!/usr/bin/env bash
# Offline `bazel test` with Debian's bazel-bootstrap (4.2.3) and the project's virtualenv; see docs/bazel.md.
#   bazel/test.sh                              # bazel test //...
#   bazel/test.sh //edp_tf:config_test        # any `bazel test` arguments
#   PYTHON=/path/to/venv/bin/python bazel/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v bazel >/dev/null 2>&1; then
  echo "bazel/test.sh: installing Debian's bazel-bootstrap" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq bazel-bootstrap >/dev/null
fi

# The tests run the virtualenv's interpreter (TensorFlow and the rest come from it). Its path is
# absolute and differs per checkout, so it goes in an uncommitted rc file that .bazelrc imports.
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || { echo "bazel/test.sh: no Python at $py: run ./install.sh (or set PYTHON)" >&2; exit 2; }
py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # Absolute, symlink kept (it is the venv).
echo "build --python_path=$py" > bazel/python.bazelrc

[ $# -gt 0 ] || set -- //...
# --batch: no Bazel server is left running after the tests.
exec bazel --batch test "$@"
