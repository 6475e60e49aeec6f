"""`edp-train` under a cluster manager: two processes whose TF_CONFIG the test sets (a chief job
and a worker job, as Kubeflow's TFJob does), not our --workers launcher. The manager loses the
non-chief host mid-epoch and stops the job (as Vertex AI fails a job whose worker fails); the
same two commands with --resume finish it, from the chief's last checkpoint, with every step
that ran charged in the chief's one ledger."""
import json
import os
import signal
import subprocess
import sys
import time

from edp_nlu.pipeline import worker_processes
from edp_tf import accounting
from tests.tiny_runs import SMALL_CLC_FLAGS, epochs_done

EPOCHS = 2
# 1,200 utterances: 30 steps an epoch, each all-reduced across the two processes (~90 ms), so
# the second epoch runs for seconds after the chief's first state.json
FLAGS = [*SMALL_CLC_FLAGS, "--config.synthetic_size=1200", f"--epochs={EPOCHS}"]


def _start(run_dir: str, ports: list, *extra: str) -> list:
    """The chief and the worker, each with the TF_CONFIG a cluster manager would give it."""
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


def _running_epoch(run_dir: str) -> int:
    """The epoch whose steps the chief's ledger has started charging (its durable bound)."""
    try:
        with open(os.path.join(run_dir, "privacy.json")) as f:
            return int((json.load(f).get("in_progress") or {}).get("epoch", -1))
    except (OSError, ValueError):
        return -1  # not written yet (or being replaced)


def _log(tmp_path, kind: str) -> str:
    return (tmp_path / f"{kind}.log").read_text()[-3000:]


def test_a_lost_host_and_a_resume_under_a_cluster_managers_tf_config(tmp_path):
    run_dir = str(tmp_path / "run")
    chief, worker = _start(run_dir, worker_processes.free_ports(2))
    deadline = time.time() + 600
    while _running_epoch(run_dir) < 1 and chief.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert chief.poll() is None, "the run ended before the host could be lost:\n" + _log(
        tmp_path, "chief")
    time.sleep(0.5)  # a few of the second epoch's steps run
    worker.send_signal(signal.SIGKILL)  # the non-chief host is lost mid-epoch
    chief.send_signal(signal.SIGKILL)  # and the manager stops the job
    chief.wait(), worker.wait()
    lost_at = epochs_done(run_dir)
    assert 1 <= lost_at < EPOCHS

    procs = _start(run_dir, worker_processes.free_ports(2), "--resume")
    for proc, kind in zip(procs, ("chief", "worker")):
        assert proc.wait(timeout=600) == 0, _log(tmp_path, kind)
    assert epochs_done(run_dir) == EPOCHS
    assert "test SER" in _log(tmp_path, "chief")  # the chief speaks for the run
    assert os.path.isdir(os.path.join(run_dir, "saved_model"))  # exported once, by the chief
    assert not os.path.exists(os.path.join(run_dir, "workers", "1", "saved_model"))
    with open(os.path.join(run_dir, "privacy.json")) as f:
        ledger = json.load(f)
    assert ledger["private"] is True and ledger["replicas"] == 2
    # a single host's two epochs, plus what the lost attempt ran of the second (charged at its
    # durable bound on resume, so never less than ran): every step that ran is charged
    assert [e["epoch"] for e in ledger["epochs"]] == [0, 1, 1]
    # the rest of the second epoch ran again from the chief's last checkpoint (at its end, or
    # inside the epoch): the two charges cover the epoch at least once
    whole, lost, again = (e["steps"] for e in ledger["epochs"])
    assert lost >= 1 and again <= whole <= lost + again
    records = [accounting.EpochRecord.from_dict(e) for e in ledger["epochs"]]
    assert ledger["epsilon"] == accounting.compute_epsilon(
        records, ledger["sampling_rate"], ledger["delta"])
