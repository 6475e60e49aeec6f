"""`python -m edp_nlu.train --workers=N`: N worker processes on this machine train one run.

Each worker is `python -m edp_nlu.train` again with the same flags, its TF_CONFIG (worker i of
N on 127.0.0.1 ports) and `--worker_index=i`; together they form a MultiWorkerMirroredStrategy
(edp_tf.multi_worker). Worker 0, the chief, owns the run directory: the one ledger, metrics,
checkpoints and the export. Worker i > 0 keeps its own copies in `<run_dir>/workers/<i>/`,
which the launcher removes after a clean finish.

A worker that dies leaves its peers blocked in a collective, so the launcher watches them all:
when one exits with an error it stops the others and says so in one line. The run continues with
`--resume` from the chief's last checkpoint (its ledger charged every epoch it began, so epsilon
can only be over-counted); each other worker then starts from a copy of the chief's directory,
so all of them resume from the same epoch.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

from edp_nlu.pipeline.run_files import BUDGET_EXIT
from edp_tf import multi_worker

# What a resumed worker needs from the chief's directory (it restores from its own copy).
_RESUME_FILES = ("config.json", "state.json", "metrics.json", "privacy.json",
                 "preprocessor.json", "label_schema.json")
_STOP_GRACE_SECONDS = 10


def worker_dir(run_dir: str, index: int) -> str:
    """Where worker `index` writes: the run directory for the chief, a scratch copy otherwise."""
    return run_dir if index == 0 else os.path.join(run_dir, "workers", str(index))


def free_ports(count: int) -> list:
    """Ports on 127.0.0.1 that were free a moment ago (bound together, so all distinct)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def without_workers_flag(argv: Sequence[str]) -> list:
    """The command line of each worker: the launcher's, without its --workers flag."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            out.append(arg)
    return out


def _prepare(run_dir: str, workers: int, resume: bool) -> None:
    scratch = os.path.join(run_dir, "workers")
    shutil.rmtree(scratch, ignore_errors=True)  # a failed run's copies are stale
    if not resume:
        return
    for index in range(1, workers):
        prepare_worker(run_dir, index, resume)


def prepare_worker(run_dir: str, index: int, resume: bool) -> None:
    """Worker `index` > 0's directory: empty for a new run; for a resume, a copy of the chief's
    files and checkpoints, so that every worker restores the chief's last checkpoint (the
    chief's files are the run's: the one ledger charged every step). A worker started by a
    cluster manager does this itself, on the run directory every host sees."""
    target = worker_dir(run_dir, index)
    shutil.rmtree(target, ignore_errors=True)  # an earlier attempt's copies are stale
    os.makedirs(target)
    if not resume:
        return
    for name in _RESUME_FILES:
        if os.path.exists(os.path.join(run_dir, name)):
            shutil.copy2(os.path.join(run_dir, name), target)
    if os.path.isdir(os.path.join(run_dir, "checkpoints")):
        shutil.copytree(os.path.join(run_dir, "checkpoints"),
                        os.path.join(target, "checkpoints"))


def _stop(procs: Sequence[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.time() + _STOP_GRACE_SECONDS
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch(argv: Sequence[str], workers: int, run_dir: str, resume: bool) -> int:
    """Runs `workers` copies of the training command `argv` (sys.argv without --workers) as one
    multi-worker run in `run_dir`; returns the exit code (0 when every worker finished)."""
    if workers < 2:
        raise ValueError(f"--workers={workers}: a multi-worker run needs at least 2 workers")
    os.makedirs(run_dir, exist_ok=True)
    _prepare(run_dir, workers, resume)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(workers)]
    procs = []
    for index in range(workers):
        env = dict(os.environ, TF_CONFIG=multi_worker.tf_config(addresses, index))
        command = [sys.executable, "-m", "edp_nlu.train", *argv, f"--run_dir={run_dir}",
                   f"--worker_index={index}"] + (["--resume"] if resume else [])
        if index == 0:  # the chief speaks for the run
            procs.append(subprocess.Popen(command, env=env))
        else:
            os.makedirs(worker_dir(run_dir, index), exist_ok=True)
            log = open(os.path.join(worker_dir(run_dir, index), "worker.log"), "w")
            procs.append(subprocess.Popen(command, env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    _write_pids(run_dir, procs)
    stopped = []  # SIGTERM (a preempted machine) or SIGINT reaching the launcher

    def stop(signum, frame):
        stopped.append(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            codes = [proc.poll() for proc in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                index, code = failed[0]
                _stop(procs)
                where = ("" if index == 0 else
                         f" (its log: {os.path.join(worker_dir(run_dir, index), 'worker.log')})")
                if code == BUDGET_EXIT:  # every worker reads the same ledger: the same answer
                    print(f"error: the privacy budget stopped the run (worker {index}{where} "
                          "says why, in one line, with the way out)", file=sys.stderr,
                          flush=True)
                    return BUDGET_EXIT
                print(f"error: worker {index} of {workers} {_describe(code)}{where}; the other "
                      f"workers were stopped. Continue from the last checkpoint with --resume "
                      f"--workers={workers} --run_dir={run_dir}", file=sys.stderr, flush=True)
                return 1
            if all(c == 0 for c in codes):
                shutil.rmtree(os.path.join(run_dir, "workers"), ignore_errors=True)
                return 0
            time.sleep(0.5)
    except KeyboardInterrupt:
        _stop(procs)
        signum = stopped[0] if stopped else signal.SIGINT
        print(f"stopped by {signal.Signals(signum).name}: the workers were stopped; every step "
              f"that ran is charged in privacy.json. Continue from the last checkpoint with "
              f"--resume --workers={workers} --run_dir={run_dir}", file=sys.stderr, flush=True)
        return 128 + signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _write_pids(run_dir: str, procs) -> None:
    """`<run_dir>/workers/pids`: the worker processes (to watch or stop them from outside)."""
    os.makedirs(os.path.join(run_dir, "workers"), exist_ok=True)
    with open(os.path.join(run_dir, "workers", "pids"), "w") as f:
        f.write("\n".join(str(p.pid) for p in procs) + "\n")
