"""A run stopped by a signal: SIGTERM (a preempted machine) finishes the current step, exits with
a line saying how to resume, and --resume finishes the run with every step that ran charged once.

The command runs in subprocesses, as a user runs it (see test_workers.py for why)."""
import json
import os
import signal
import subprocess
import sys
import time

from tests.tiny_runs import SMALL_CLC_FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS = 3
FLAGS = [*SMALL_CLC_FLAGS, "--replicas=1", f"--epochs={EPOCHS}"]


def _read(run_dir, name):
    try:
        with open(os.path.join(run_dir, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}  # not written yet (or being replaced)


def test_sigterm_stops_after_a_step_and_resume_charges_each_step_once(tmp_path):
    run_dir = str(tmp_path / "run")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    command = [sys.executable, "-m", "trainers.train", f"--run_dir={run_dir}", *FLAGS]
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while (_read(run_dir, "state.json").get("epochs_done", 0) < 1 and job.poll() is None
           and time.time() < deadline):
        time.sleep(0.1)
    time.sleep(0.5)  # into the second epoch's steps
    assert job.poll() is None, "the run ended before it could be stopped"
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=300)
    assert job.returncode == 128 + signal.SIGTERM, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("stopped by SIGTERM")]
    assert f"--run_dir={run_dir} --resume" in line
    stopped = _read(run_dir, "privacy.json")
    steps = _read(run_dir, "state.json")["steps_per_epoch"]
    done = _read(run_dir, "state.json")["epochs_done"]
    assert 1 <= done < EPOCHS
    # the epoch cut short is charged for the steps it ran, and is not checkpointed
    charged = [(e["epoch"], e["steps"]) for e in stopped["epochs"]]
    assert charged[:done] == [(t, steps) for t in range(done)]
    assert len(charged) in (done, done + 1) and stopped["in_progress"] is None
    if len(charged) == done + 1:
        assert charged[-1][0] == done and 1 <= charged[-1][1] < steps

    resumed = subprocess.run(command + ["--resume"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = _read(run_dir, "privacy.json")
    again = [(e["epoch"], e["steps"]) for e in final["epochs"]]
    # every planned step, plus the cut-short steps that ran and were not kept: none lost,
    # none twice
    assert again[:len(charged)] == charged
    assert again[len(charged):] == [(t, steps) for t in range(done, EPOCHS)]
    assert _read(run_dir, "state.json")["epochs_done"] == EPOCHS
    assert os.path.isfile(os.path.join(run_dir, "saved_model", "saved_model.pb"))
