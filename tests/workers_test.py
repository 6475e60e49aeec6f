"""Several hosts, one run, one ledger: `python -m edp_nlu.train --workers=2` starts two worker
processes; a worker killed mid-run stops the run with one clear line; the same run resumed by a
cluster manager (two processes whose TF_CONFIG names a chief job and a worker job, as Kubeflow's
TFJob sets it, not our launcher) finishes from the chief's last checkpoint, with every step that
ran charged in the chief's one ledger. One run crosses both ways of starting hosts: each start is
two TensorFlow processes on a 2-core machine, the suite's dearest tests.

The workers are processes, and killing one is what is tested. The launcher, the command's own
process, runs here (TensorFlow is imported already: a launcher process would import it only to
start its workers, ~7 CPU-s before either begins, twice)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import dp_accounting
import pytest

from edp_nlu.pipeline import worker_processes
from edp_tf import accounting
from tests.tiny_runs import SMALL_CLC_FLAGS, epochs_done, train_command

EPOCHS = 2  # killed in the second, resumed to the end
# 1,200 utterances: 30 steps an epoch at ~90 ms (each step's all-reduce crosses processes), so
# the second epoch still runs for seconds after the first one's state.json appears
FLAGS = [*SMALL_CLC_FLAGS, "--config.synthetic_size=1200", f"--epochs={EPOCHS}"]


def run_command(capfd, monkeypatch, run_dir, *extra) -> tuple:
    """(exit code, stdout, stderr) of `edp-train --workers=2 ...`, its launcher in this process:
    the workers' output reaches this process's file descriptors, as a user's terminal."""
    argv = ["edp-train", "--workers=2", f"--run_dir={run_dir}", *FLAGS, *extra]
    monkeypatch.setattr(sys, "argv", argv)  # the launcher starts each worker with sys.argv's flags
    with pytest.raises(SystemExit) as exited:
        train_command(capfd, *argv[1:])
    out, err = capfd.readouterr()
    return exited.value.code, out, err


def kill_second_worker_after_first_epoch(run_dir, finished: threading.Event, killed: list):
    """SIGKILLs worker 1 once the chief's first epoch is done (unless the run finished first)."""
    deadline = time.time() + 600
    while epochs_done(run_dir) < 1 and not finished.is_set() and time.time() < deadline:
        time.sleep(0.2)
    if finished.is_set():
        return
    with open(os.path.join(run_dir, "workers", "pids")) as f:
        killed.extend(int(line) for line in f.read().split())
    os.kill(killed[1], signal.SIGKILL)


def start_under_a_cluster_manager(run_dir: str, *extra: str) -> list:
    """The chief and the worker, each with the TF_CONFIG a cluster manager would give it."""
    ports = worker_processes.free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs = []
    for kind in ("chief", "worker"):
        env = dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": kind, "index": 0}}))
        log = open(os.path.join(os.path.dirname(run_dir), f"{kind}.log"), "a")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "edp_nlu.train", f"--run_dir={run_dir}", *FLAGS, *extra],
            env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def test_a_killed_worker_stops_the_run_and_a_cluster_manager_resumes_it(tmp_path, capfd,
                                                                        monkeypatch):
    run_dir = str(tmp_path / "run")
    finished, pids = threading.Event(), []
    killer = threading.Thread(target=kill_second_worker_after_first_epoch,
                              args=(run_dir, finished, pids))
    killer.start()
    try:
        code, _, err = run_command(capfd, monkeypatch, run_dir)
    finally:
        finished.set()
        killer.join()
    assert pids, "the run ended before a worker could be killed"
    assert code == 1
    assert "error: worker 1 of 2 was killed by SIGKILL" in err and "--resume" in err
    stopped_at = epochs_done(run_dir)
    assert 1 <= stopped_at < EPOCHS
    for pid in pids:  # no worker is left behind
        assert (not os.path.exists(f"/proc/{pid}")
                or "zombie" in open(f"/proc/{pid}/status").read().lower())

    procs = start_under_a_cluster_manager(run_dir, "--resume")
    for proc, kind in zip(procs, ("chief", "worker")):
        log = lambda: (tmp_path / f"{kind}.log").read_text()[-3000:]  # noqa: E731
        assert proc.wait(timeout=600) == 0, log()
    assert "test SER" in (tmp_path / "chief.log").read_text()  # the chief speaks for the run
    assert "test SER" not in (tmp_path / "worker.log").read_text()
    assert epochs_done(run_dir) == EPOCHS
    assert os.path.isdir(os.path.join(run_dir, "saved_model"))  # exported once, by the chief
    assert not os.path.exists(os.path.join(run_dir, "workers", "1", "saved_model"))
    with open(os.path.join(run_dir, "privacy.json")) as f:
        ledger = json.load(f)
    assert ledger["private"] and ledger["replicas"] == 2
    # Every epoch that ran is charged: an epoch interrupted after its charge runs again and is
    # charged again (over-counting, never under-counting), and the resumed attempt's charges
    # cover the epoch at least once.
    assert [e["epoch"] for e in ledger["epochs"]][:stopped_at] == list(range(stopped_at))
    assert EPOCHS <= len(ledger["epochs"]) <= EPOCHS + 1
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
