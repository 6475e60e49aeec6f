"""`python -m edp_nlu.train --workers=2`: two worker processes, one run, one ledger; a worker
killed mid-run stops the run with one clear line, and --resume finishes it with a correct ledger.

The command runs in subprocesses: the workers are processes, and killing one is what is tested."""
import json
import os
import signal
import subprocess
import sys
import time

import dp_accounting
import pytest

from edp_nlu.pipeline import worker_processes
from edp_tf import accounting
from tests.tiny_runs import SMALL_CLC_FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS = 2  # killed in the second, resumed to the end
# 1,200 utterances: 30 steps an epoch at ~90 ms (each step's all-reduce crosses processes), so
# the second epoch still runs for seconds after the first one's state.json appears
FLAGS = [*SMALL_CLC_FLAGS, "--config.synthetic_size=1200", f"--epochs={EPOCHS}"]


def command(run_dir, *extra):
    return [sys.executable, "-m", "edp_nlu.train", "--workers=2", f"--run_dir={run_dir}",
            *FLAGS, *extra]


def epochs_done(run_dir) -> int:
    try:
        with open(os.path.join(run_dir, "state.json")) as f:
            return int(json.load(f).get("epochs_done", 0))
    except (OSError, ValueError):
        return 0  # not written yet (or being replaced)


def test_killed_worker_stops_the_run_and_resume_finishes_it(tmp_path):
    run_dir = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=REPO)
    launcher = subprocess.Popen(command(run_dir), cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while epochs_done(run_dir) < 1 and launcher.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert launcher.poll() is None, "the run ended before a worker could be killed"
    with open(os.path.join(run_dir, "workers", "pids")) as f:
        pids = [int(line) for line in f.read().split()]
    os.kill(pids[1], signal.SIGKILL)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 1
    assert "error: worker 1 of 2 was killed by SIGKILL" in err and "--resume" in err
    stopped_at = epochs_done(run_dir)
    assert 1 <= stopped_at < EPOCHS
    for pid in pids:  # no worker is left behind
        assert (not os.path.exists(f"/proc/{pid}")
                or "zombie" in open(f"/proc/{pid}/status").read().lower())

    resumed = subprocess.run(command(run_dir, "--resume"), cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("test SER") == 1  # one summary: the chief's
    assert epochs_done(run_dir) == EPOCHS
    assert not os.path.exists(os.path.join(run_dir, "workers"))  # scratch copies removed
    with open(os.path.join(run_dir, "privacy.json")) as f:
        ledger = json.load(f)
    assert ledger["private"] and ledger["replicas"] == 2
    # Every epoch that ran is charged: an epoch interrupted after its charge runs again and is
    # charged again (over-counting, never under-counting).
    charged = len(ledger["epochs"])
    assert EPOCHS <= charged <= EPOCHS + 1
    assert {e["noise_multiplier"] for e in ledger["epochs"]} == {1.0}
    # epsilon recomputed from the charged steps alone (PLD: the ledger's own accountant; RDP:
    # dp-accounting directly). Each charged epoch at its own steps: the killed epoch's charge is
    # the steps its ledger allowed to start (its flush interval ahead), not a whole epoch.
    steps = sum(e["steps"] for e in ledger["epochs"])
    q, delta = ledger["sampling_rate"], ledger["delta"]
    records = [accounting.plan_schedule(1.0, 1, e["steps"], first_epoch=e["epoch"])[0]
               for e in ledger["epochs"]]
    assert ledger["epsilon"] == pytest.approx(accounting.compute_epsilon(records, q, delta),
                                              rel=1e-9)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.0)), steps))
    assert ledger["epsilon_rdp"] == pytest.approx(rdp.get_epsilon(delta), rel=1e-6)


def test_workers_flag_is_removed_from_the_workers_command():
    argv = ["--workers=2", "--epochs=3", "--workers", "4", "--x"]
    assert worker_processes.without_workers_flag(argv) == ["--epochs=3", "--x"]
    assert worker_processes.worker_dir("runs/a", 0) == "runs/a"
    assert worker_processes.worker_dir("runs/a", 2) == os.path.join("runs/a", "workers", "2")
