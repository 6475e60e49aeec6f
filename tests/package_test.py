"""`pip install .` gives a user the library and the edp-* commands, under two namespaces of their
own (edp_tf, edp_nlu) and without tests or research tools: the wheel is built from a copy of the
tree, its contents and entry points checked, then installed apart and run outside the repo.
"""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edp_nlu import console

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("edp_tf", "edp_nlu", "experiments", "benchmarks", "tools")  # copied; two are built
COMMANDS = ("train", "evaluate", "privacy")
# `python -m tools.audit` etc., from a checkout
TOOLS = ("audit", "lira", "experiment", "benchmark")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in PACKAGES:  # a copy: the build writes build/ and *.egg-info beside its sources
        shutil.copytree(REPO / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = out.glob("edp_tf-*.whl")
    return built


def test_the_wheel_holds_the_library_the_application_and_its_commands(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = z.read(info).decode()
        metadata = z.read(info.replace("entry_points.txt", "METADATA")).decode()
    for module in ("edp_tf/__init__.py", "edp_tf/private_model.py", "edp_tf/ghost/__init__.py",
                   "edp_nlu/models/crf.py", "edp_nlu/models/bert/bert_joint.py", "edp_nlu/train.py",
                   "edp_nlu/console.py", "edp_nlu/configs/default.py",
                   "edp_nlu/configs/snips_clc.py"):
        assert module in names, module
    assert {n.split("/")[0] for n in names if not n.startswith("edp_tf-")} == {"edp_tf", "edp_nlu"}
    assert not [n for n in names if n.endswith("_test.py") or n.endswith("conftest.py")
                or n.endswith("/BUILD")]
    for command in COMMANDS:
        assert f"edp-{command} = edp_nlu.console:{command}" in entry_points
    for tool in TOOLS:
        assert f"edp-{tool} " not in entry_points
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    library = [r for r in requires if "extra ==" not in r]
    assert {r.split()[1].split("==")[0] for r in library} >= {"tensorflow", "keras",
                                                               "dp-accounting", "numpy"}
    assert not [r for r in library if "keras-hub" in r]  # the application's, under [nlu]
    assert [r for r in requires if "keras-hub" in r and 'extra == "nlu"' in r]


def test_the_installed_wheel_imports_and_runs_its_commands_outside_the_repo(wheel, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--target", str(target), str(wheel)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = dict(os.environ, PYTHONPATH=str(target))
    # where the packages come from, without importing TensorFlow (edp-train --help below
    # imports the installed edp_tf and edp_nlu.train's modules)
    where = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                            "print(u.find_spec('edp_tf').origin); "
                            "print(u.find_spec('edp_nlu').origin); "
                            "from edp_nlu.configs import config_file; "
                            "print(config_file('snips_clc'))"],  # --config=snips_clc
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert where.returncode == 0, where.stderr[-3000:]
    assert all(line.startswith(str(target)) for line in where.stdout.split())
    helped = subprocess.run([str(target / "bin" / "edp-train"), "--help"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    # absl's --help exits with 1; it must show the command's docstring and its own flags
    assert "train a joint intent + slot model" in helped.stdout, helped.stderr[-3000:]
    assert "--run_dir" in helped.stdout and "--resume" in helped.stdout
    planned = subprocess.run([str(target / "bin" / "edp-privacy"), "--dataset_size=3000",
                              "--batch_size=64", "--epochs=2", "--noise_multiplier=1.0"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "Private: yes" in planned.stdout


def test_a_command_without_the_nlu_extra_says_how_to_get_it(monkeypatch):
    def missing(name):
        raise ModuleNotFoundError("No module named 'ml_collections'", name="ml_collections")

    monkeypatch.setattr(console.importlib, "import_module", missing)
    with pytest.raises(SystemExit) as stopped:
        console.train()
    assert str(stopped.value) == ("error: edp-train is the NLU application, which needs its "
                                  "extra dependencies (ml_collections is missing): pip install "
                                  "'edp-tf[nlu]'")
