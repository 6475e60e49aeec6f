"""`python -m tools.faults`: a small private run killed, stopped, starved of disk and damaged
at random steps, resumed after each fault until it finishes, then checked; a table of faults
tried, survived and lost.

    python -m tools.faults --seed=1 --chains=12 --faults_per_chain=4 --worker_chains=3
    python -m tools.faults --seed=7 --chains=1 --kinds=sigterm,kill_in_checkpoint
    python -m tools.faults --seed=3 --chains=1 --kinds=kill_in_startup,kill_in_tracing,storm

A chain is one run directory: each attempt is `python -m edp_nlu.train --resume` with one fault
armed at a step the seed chose, then the attempt without a fault finishes the run. A fault
survives when the run finishes, its export loads and serves, and its ledger has lost nothing:
every step that ran (a witness file, written after each step outside the run directory) is
charged, every epoch of the uninterrupted run is charged with its steps and noise multiplier,
and epsilon recomputed from the charged epochs is the ledger's. Steps charged that did not run
(a crash's epoch is charged the bound the ledger kept on disk, at most flush_steps beyond the
steps that ran) are counted apart, per kill: over-counting is safe. Storms (`--storms`) SIGKILL
the plain command with a target epsilon five times at random moments, then check that the
resumed run trained every epoch asked within the target.

Faults inside the process are armed through the EDP_TF_FAULT environment variable, which only
this command's child entry point reads; `python -m edp_nlu.train` itself has no fault hooks.
Disk-full faults need a small filesystem: a tmpfs mounted for the run (root only); without one
they are reported as not run. Two-worker chains (`--workers=2`) are faulted from outside: a
worker SIGKILLed, the launcher sent SIGTERM.
"""
from __future__ import annotations

if __name__ == "__main__":  # before TensorFlow is imported (see edp_nlu/cli.py)
    from edp_nlu import cli

    cli.quiet_unless_verbose()

import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Optional  # noqa: E402

from absl import flags  # noqa: E402

import edp_nlu.models.export as export
from edp_nlu.pipeline import builders, training
from edp_tf import accounting, batch_source, private_model
from edp_tf.mechanism import noise_multiplier_at

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = "EDP_TF_FAULT"

# Faults armed inside the training process, at a step chosen by the seed.
IN_PROCESS = {
    "sigkill": "SIGKILL after a step (out of memory, a lost machine)",
    "sigterm": "SIGTERM after a step (a preempted machine): finish the step, stop",
    "sigint": "SIGINT after a step (Ctrl-C)",
    "input_error": "an exception in the input pipeline",
    "kill_in_checkpoint": "SIGKILL after a checkpoint's files, before its commit",
    "enospc_ledger": "disk full when the ledger is written",
    "enospc_checkpoint": "disk full while a checkpoint is written",
    "enospc_export": "disk full while the SavedModel is written",
    "kill_in_export": "SIGKILL while the SavedModel is written",
    "kill_in_startup": "SIGKILL during start-up (data loaded, the model being built)",
    "kill_in_tracing": "SIGKILL while the first step is traced",
}
# Done by this command between two attempts.
BETWEEN = {"truncated_checkpoint": "the newest checkpoint's data file cut to half its size"}
# Two-worker runs, from outside.
WORKERS = {"worker_sigkill": "two workers: one of them SIGKILLed during an epoch",
           "launcher_sigterm": "two workers: the launcher sent SIGTERM during an epoch"}
# Chains of their own: five SIGKILLs from outside at random moments of the plain command with a
# target epsilon (the ledger replans), then the resume that finishes it.
STORMS = {"storm": "five SIGKILLs in a row at random moments (--target_epsilon=8)",
          "worker_storm": "two workers: five SIGKILLs of the whole job at random moments "
                          "(--target_epsilon=8)"}
KINDS = {**IN_PROCESS, **BETWEEN, **WORKERS, **STORMS}
STORM_KILLS = 5
STORM_TARGET = 8.0
FLUSH_STEPS = 8  # the ledger's default flush_steps: the most a kill may over-charge
NEEDS_SMALL_DISK = ("enospc_ledger", "enospc_checkpoint", "enospc_export")
AT_THE_END = ("enospc_export", "kill_in_export")  # the export is written once, after training
EXPECTED_EXIT = {"sigkill": -signal.SIGKILL, "kill_in_checkpoint": -signal.SIGKILL,
                 "kill_in_export": -signal.SIGKILL, "kill_in_startup": -signal.SIGKILL,
                 "kill_in_tracing": -signal.SIGKILL, "sigterm": 128 + signal.SIGTERM,
                 "sigint": 128 + signal.SIGINT, "input_error": 1, "enospc_ledger": 1,
                 "enospc_checkpoint": 1, "enospc_export": 1, "worker_sigkill": 1,
                 "launcher_sigterm": 128 + signal.SIGTERM}

# A per-example CLC small enough for seconds per epoch (tests/tiny_runs.py's SMALL_CLC_FLAGS).
RUN_FLAGS = (
    "--config.synthetic_size=1200", "--config.batch_size=32", "--config.max_words=8",
    "--config.clc.word_vectors=glove-6b-50d", "--config.clc.vocabulary_size=2000",
    "--config.clc.lstm_units=8", "--config.clc.num_lstm_layers=1",
    "--config.clc.char_embedding_dim=8", "--config.clc.char_filters=8",
    "--config.learning_rate=0.01", "--config.target_epsilon=0", "--noise_multiplier=1.0",
    "--mechanism=dpsgd", "--replicas=1", "--decay=linear", "--decay_rate=0.1")


def storm_flags() -> tuple:
    """The storms' plain command: RUN_FLAGS (read when called, so a test's smaller run applies)
    with a budget instead of a fixed multiplier, as a user would run it."""
    return tuple(f for f in RUN_FLAGS if f not in ("--config.target_epsilon=0",
                                                   "--noise_multiplier=1.0")) + (
        f"--target_epsilon={STORM_TARGET:g}",)


# ------------------------------------------------------------------------- inside the child
def _witness(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def fill_disk(path: str, leave: int = 64 << 10) -> None:
    """Fills the filesystem of `path`'s directory, leaving `leave` bytes, with a ballast file."""
    stats = os.statvfs(os.path.dirname(path))
    size = max(0, stats.f_bavail * stats.f_frsize - leave)
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)


def _arm(spec: dict) -> None:
    """Installs the fault of `spec` into this (child) process before training starts.

    Each kind of fault patches one place (a training step, the input pipeline, a checkpoint
    write, model building, the step's tracing, the export); the step counter that times them
    is shared, so the helpers below get the same `state`.
    """
    kind, at, witness = spec["kind"], int(spec["step"]), spec["witness"]
    ballast = spec.get("ballast")
    state = {"steps": 0, "armed": True, "epoch": None}
    _arm_step_faults(kind, at, witness, ballast, state)
    if kind == "input_error":
        _arm_input_error(at)
    if kind in ("kill_in_checkpoint", "enospc_checkpoint"):
        _arm_checkpoint_fault(kind, at, ballast, state)
    if kind == "kill_in_startup":
        def killed_while_building(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        training._build = killed_while_building

    if kind == "kill_in_tracing":  # the step's Python body runs only while it is traced

        def killed_while_tracing(self, data):
            os.kill(os.getpid(), signal.SIGKILL)

        private_model.PrivateModel.train_step = killed_while_tracing

    if kind in AT_THE_END:
        _arm_export_fault(kind, ballast)


def _arm_step_faults(kind: str, at: int, witness, ballast, state: dict) -> None:
    """Wraps training.train to add a callback that witnesses every epoch and step (for every
    kind: the parent reads where the child got to) and fires the step-timed faults at `at`."""
    import keras

    class Fault(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            state["epoch"] = epoch
            _witness(witness, f"begin {epoch}")

        def on_train_batch_end(self, batch, logs=None):
            state["steps"] += 1
            _witness(witness, f"step {state['epoch']}")
            if kind == "none" or not state["armed"] or state["steps"] < at:
                return
            if kind == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif kind in ("sigterm", "sigint"):
                state["armed"] = False
                os.kill(os.getpid(), signal.SIGTERM if kind == "sigterm" else signal.SIGINT)
            elif kind == "enospc_ledger":  # the next write is the ledger's, at the epoch's end
                state["armed"] = False
                fill_disk(ballast, leave=0)

    train = training.train

    def train_with_fault(*args, **kwargs):
        kwargs["callbacks"] = tuple(kwargs.get("callbacks", ())) + (Fault(),)
        return train(*args, **kwargs)

    training.train = train_with_fault


def _arm_input_error(at: int) -> None:
    """The input pipeline fails at element `at` (a tf.data error inside fit)."""
    import tensorflow as tf

    datasets = builders.datasets

    def failing_datasets(*args, **kwargs):
        ds, *rest = datasets(*args, **kwargs)

        def check(index, element):
            failed = tf.debugging.assert_less(
                index, tf.constant(at, tf.int64), message="injected input pipeline fault")
            with tf.control_dependencies([failed]):
                return tf.nest.map_structure(tf.identity, element)

        failing = ds.enumerate().map(check)
        source = batch_source.describe(ds)
        if source.kind == "sampler":  # the sampler's batches, unchanged until the fault
            batch_source._mark(failing, source.sampler)
        return (failing, *rest)

    builders.datasets = failing_datasets


def _arm_checkpoint_fault(kind: str, at: int, ballast, state: dict) -> None:
    """From step `at` on, a checkpoint write is killed before its commit or runs out of disk."""
    import tensorflow as tf

    write = tf.train.Checkpoint.write

    def faulty_write(self, file_prefix, options=None):
        if state["steps"] < at:
            return write(self, file_prefix, options)
        if kind == "enospc_checkpoint":
            fill_disk(ballast, leave=16 << 10)  # part of the files gets written
            return write(self, file_prefix, options)
        prefix = write(self, file_prefix, options)
        os.kill(os.getpid(), signal.SIGKILL)  # files written, commit not
        return prefix

    tf.train.Checkpoint.write = faulty_write  # the commit after it is what is tested


def _arm_export_fault(kind: str, ballast) -> None:
    """The SavedModel export at the end runs out of disk, or is killed once written."""
    serving = export.export_serving_model

    def faulty_export(task, preprocessor, path):
        if kind == "enospc_export":
            fill_disk(ballast, leave=64 << 10)
            return serving(task, preprocessor, path)
        serving(task, preprocessor, path)
        os.kill(os.getpid(), signal.SIGKILL)

    export.export_serving_model = faulty_export

def child(argv) -> None:
    """The child entry point: `python -m edp_nlu.train`'s main, with EDP_TF_FAULT armed."""
    from edp_nlu import train

    spec = json.loads(os.environ.get(ENV, "null"))
    if spec:
        _arm(spec)
    return train.main(argv)


# ------------------------------------------------------------------------- the harness
@dataclasses.dataclass
class Outcome:
    kind: str
    survived: bool
    lost_steps: int = 0
    over_charged_steps: int = 0
    why: str = ""
    kill_over: Optional[int] = None  # a SIGKILL's charge minus the steps that ran in its epoch
    epochs_trained: int = 0  # of the finished run (state.json), against
    epochs_asked: int = 0


def in_progress(run_dir: str) -> Optional[dict]:
    return (_read(os.path.join(run_dir, "privacy.json"), {}) or {}).get("in_progress")


def kill_over_charge(run_dir: str, witness: str, before: int,
                     previous: Optional[dict] = None) -> tuple[int, str]:
    """(steps the killed attempt's epoch is charged beyond those that ran, "" or what is
    wrong): the ledger's `in_progress.steps`, what a resume charges, against the witness's
    steps of that epoch in this attempt (its entries after the first `before`). `previous`:
    `in_progress` before the attempt; still there, it is an earlier attempt's (this one died
    before its resume charged it) and this one charged nothing."""
    led = _read(os.path.join(run_dir, "privacy.json"), {}) or {}
    charge = led.get("in_progress")
    ran = witnessed(witness)[before:]
    steps = ran[-1][1] if ran else 0
    if charge is not None and charge == previous and not ran:
        return 0, ""
    if charge is None:  # killed before a step, or between two epochs
        return 0, "" if steps == 0 or _closed(led, ran) else f"{steps} steps ran, none charged"
    if not ran or ran[-1][0] != charge["epoch"]:
        return 0, f"epoch {charge['epoch']} is charged but was not begun"
    over = int(charge["steps"]) - steps
    if over < 0:
        return over, f"{steps} steps ran, {charge['steps']} charged"
    return over, "" if over <= FLUSH_STEPS else f"over-charged {over} > {FLUSH_STEPS}"


def _closed(led: dict, ran: list) -> bool:
    """The attempt's last epoch begun was charged whole (killed after its end)."""
    last = (led.get("epochs") or [{}])[-1]
    return bool(ran) and last.get("epoch") == ran[-1][0] and last.get("steps") == ran[-1][1]


class SmallDisk:
    """A tmpfs for the run directories (disk-full faults), or None where it cannot be mounted."""

    def __init__(self, size_mb: int):
        self.path = tempfile.mkdtemp(prefix="edp-faults-disk-")
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                                  self.path], capture_output=True, text=True)
        self.ok = mounted.returncode == 0
        self.reason = "" if self.ok else (mounted.stderr.strip() or "mount failed")

    def close(self) -> None:
        if self.ok:
            subprocess.run(["umount", "-l", self.path], capture_output=True)
        shutil.rmtree(self.path, ignore_errors=True)


def _read(path: str, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def _environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _command(run_dir: str, epochs: int, resume: bool, flags: Optional[tuple] = None) -> list:
    """The child's command line; `flags` None: RUN_FLAGS as they are when called."""
    flags = RUN_FLAGS if flags is None else flags
    return [sys.executable, "-c", "from edp_nlu import cli; cli.quiet_unless_verbose(); "
            "from tools import faults; from edp_nlu import train; train.define_flags(); "
            "cli.run(faults.child)", *flags,
            f"--epochs={epochs}", f"--run_dir={run_dir}"] + (["--resume"] if resume else [])


def attempt(run_dir: str, epochs: int, resume: bool, spec: Optional[dict],
            timeout: float = 900, flags: Optional[tuple] = None) -> subprocess.CompletedProcess:
    """One `edp_nlu.train` attempt in a child process, with the fault of `spec` armed."""
    env = _environment()
    if spec:
        env[ENV] = json.dumps(spec)
    return subprocess.run(_command(run_dir, epochs, resume, flags), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def killed_attempt(run_dir: str, epochs: int, resume: bool, witness: str, delay: float,
                   flags: Optional[tuple] = None) -> subprocess.CompletedProcess:
    """One attempt SIGKILLed from outside `delay` s after it started (if it is still running)."""
    env = dict(_environment(), **{ENV: json.dumps({"kind": "none", "step": 0,
                                                    "witness": witness})})
    command = _command(run_dir, epochs, resume, storm_flags() if flags is None else flags)
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        job.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        job.kill()
    out, err = job.communicate(timeout=900)
    return subprocess.CompletedProcess(command, job.returncode, out, err)


def worker_attempt(run_dir: str, epochs: int, resume: bool, kind: Optional[str], epoch: int,
                   delay: float, timeout: float = 900) -> subprocess.CompletedProcess:
    """One `--workers=2` attempt; `kind` is done from outside `delay` seconds after the chief's
    ledger marks `epoch` in progress (the ledger is the only clock a finished process leaves)."""
    command = [sys.executable, "-m", "edp_nlu.train", "--workers=2", *RUN_FLAGS,
               f"--epochs={epochs}", f"--run_dir={run_dir}"] + (["--resume"] if resume else [])
    command = [c for c in command if c != "--replicas=1"]
    started = time.time()
    job = subprocess.Popen(command, cwd=REPO, env=_environment(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline, fired = time.time() + timeout, False
    if kind is not None:
        while job.poll() is None and time.time() < deadline:
            # this attempt's own files: a ledger left by a killed attempt still shows the
            # epoch it was in, and its pids are gone
            if _in_progress(run_dir, started) >= epoch and _read_pids(run_dir, started):
                time.sleep(delay)
                if job.poll() is not None:
                    break
                try:
                    if kind == "worker_sigkill":
                        os.kill(_read_pids(run_dir, started)[epoch % 2], signal.SIGKILL)
                    else:
                        job.send_signal(signal.SIGTERM)
                except ProcessLookupError:  # that worker has just ended: try again
                    continue
                fired = True
                break
            time.sleep(0.05)
    out, err = job.communicate(timeout=max(1, deadline - time.time()))
    return subprocess.CompletedProcess(command, job.returncode, out, err), fired


def _worker_command(run_dir: str, epochs: int, resume: bool) -> list:
    """The storms' plain command with `--workers=2` (each worker one replica)."""
    return [sys.executable, "-m", "edp_nlu.train", "--workers=2",
            *[f for f in storm_flags() if f != "--replicas=1"], f"--epochs={epochs}",
            f"--run_dir={run_dir}"] + (["--resume"] if resume else [])


def worker_job_killed(run_dir: str, epochs: int, resume: bool, delay: float,
                      epoch: Optional[int] = None,
                      timeout: float = 900) -> subprocess.CompletedProcess:
    """One two-worker attempt whose whole job (launcher and workers, one process group) is
    SIGKILLed as a lost machine would end it: `delay` s after it started, or, given `epoch`,
    `delay` s after the chief's ledger marks that epoch in progress (a clock that follows the
    run whatever the machine's load)."""
    command = _worker_command(run_dir, epochs, resume)
    started = time.time()
    job = subprocess.Popen(command, cwd=REPO, env=_environment(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = started + timeout
    while epoch is not None and job.poll() is None and time.time() < deadline:
        if _in_progress(run_dir, started) >= epoch:
            break
        time.sleep(0.05)
    try:
        job.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:  # ended meanwhile
            pass
    out, err = job.communicate(timeout=max(1.0, deadline - time.time()))
    return subprocess.CompletedProcess(command, job.returncode, out, err)


def _newer(path: str, than: float) -> bool:
    try:
        return os.path.getmtime(path) >= than
    except OSError:
        return False


def _read_pids(run_dir: str, since: float) -> list:
    """The worker pids the launcher wrote after `since` ([] before)."""
    path = os.path.join(run_dir, "workers", "pids")
    try:
        if not _newer(path, since):
            return []
        with open(path) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _in_progress(run_dir: str, since: float) -> int:
    """The epoch the chief's ledger, written after `since`, marks in progress (-1: none)."""
    path = os.path.join(run_dir, "privacy.json")
    if not _newer(path, since):
        return -1
    led = _read(path, {}) or {}
    return int((led.get("in_progress") or {}).get("epoch", -1))


def truncate_newest_checkpoint(run_dir: str) -> Optional[str]:
    """Cuts the newest committed checkpoint's data file to half; returns it (None if none)."""
    state = _read(os.path.join(run_dir, "state.json"), {}) or {}
    committed = state.get("checkpoints") or []
    if not committed:
        return None
    for name in sorted(committed[0]["files"]):
        if ".data-" in name:
            path = os.path.join(run_dir, "checkpoints", name)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            return path
    return None


def witnessed(path: str) -> list:
    """[(epoch, steps that ran)] per epoch begun, in order, from a witness file."""
    runs = []
    if not os.path.exists(path):
        return runs
    with open(path) as f:
        for line in f:
            what, epoch = line.split()
            if what == "begin":
                runs.append([int(epoch), 0])
            else:
                runs[-1][1] += 1
    return [tuple(r) for r in runs]


def align(ran: list, charged: list) -> Optional[list]:
    """[(steps that ran, steps charged)] pairing each charged epoch with an epoch begun, in
    order (None if they cannot be paired). An epoch begun whose attempt died before its first
    step (start-up, tracing) may be uncharged; every charge is of an epoch begun (the witness
    writes `begin` before the ledger can charge), and an epoch that ran a step is charged."""
    def walk(i: int, j: int) -> Optional[list]:
        if i == len(ran):
            return [] if j == len(charged) else None
        epoch, steps = ran[i]
        if j < len(charged) and charged[j][0] == epoch:
            rest = walk(i + 1, j + 1)
            if rest is not None:
                return [(steps, charged[j][1])] + rest
        return walk(i + 1, j) if steps == 0 else None

    return walk(0, 0)


def check_run(run_dir: str, reference: dict, witness: Optional[str]) -> tuple[int, int, str]:
    """(steps lost, steps over-charged, what is wrong or "") of a finished run."""
    state = _read(os.path.join(run_dir, "state.json"), {}) or {}
    led = _read(os.path.join(run_dir, "privacy.json"), {}) or {}
    if state.get("epochs_done") != reference["epochs"] or not state.get("finished"):
        return 0, 0, f"not finished: state.json {state.get('epochs_done')} epochs"
    if led.get("in_progress") is not None:
        return 0, 0, "privacy.json still has an epoch in progress"
    charged = [(e["epoch"], e["steps"]) for e in led["epochs"]]
    wrong = kept_differences(led["epochs"], reference["records"])
    if wrong:
        return 0, 0, wrong
    records = [accounting.EpochRecord.from_dict(e) for e in led["epochs"]]
    epsilon = accounting.compute_epsilon(records, led["sampling_rate"], led["delta"],
                                         accounting.as_extra_events(led["extra_events"]))
    if abs(epsilon - led["epsilon"]) > 1e-9 * max(1.0, epsilon):
        return 0, 0, f"epsilon {led['epsilon']} is not the charged epochs' {epsilon}"
    lost = over = 0
    if witness is not None:
        pairs = align(witnessed(witness), charged)
        if pairs is None:
            ran = witnessed(witness)
            return sum(s for _, s in ran), 0, f"epochs begun {ran} vs charged {charged}"
        for steps, paid in pairs:
            lost += max(0, steps - paid)
            over += max(0, paid - steps)
    else:  # two workers: no witness; every epoch begun is charged in full or as it ran
        over = sum(s for _, s in charged) - sum(s for s, _ in reference["records"].values())
    bad = _export_problem(run_dir)
    return lost, over, bad or ("" if not lost else f"{lost} steps ran and are not charged")


def kept_differences(charged: list, reference: dict) -> str:
    """"" if the last charge of each epoch (the one the finished run kept) is the
    uninterrupted run's record ({epoch: (steps, z)}): its z, and its steps, or fewer when an
    earlier charge of the epoch precedes it (the epoch's rest after a checkpoint inside it);
    else what differs."""
    kept, seen = {}, set()
    for e in charged:
        kept[e["epoch"]] = (e["steps"], round(e["noise_multiplier"], 12), e["epoch"] in seen)
        seen.add(e["epoch"])
    if set(kept) != set(reference):
        return (f"epochs charged {sorted(kept)} differ from the uninterrupted run's "
                f"{sorted(reference)}")
    for epoch, (steps, z, continued) in sorted(kept.items()):
        want_steps, want_z = reference[epoch]
        if z != want_z or not (steps == want_steps or continued and 0 < steps < want_steps):
            return (f"epoch {epoch} kept {steps} steps at z {z}, the uninterrupted run "
                    f"{want_steps} at z {want_z}")
    return ""


# The export is loaded in a fresh interpreter (no op registered beyond TensorFlow's, as a
# server would load it); a test that already holds TensorFlow may load it in its own process
# instead, saving an interpreter's start.
PROBE_IN_PROCESS = False
PROBE_UTTERANCE = "play some jazz"


def _export_problem(run_dir: str) -> str:
    """"" if saved_model/ loads and tags an utterance, else what went wrong."""
    path = os.path.join(run_dir, "saved_model")
    if PROBE_IN_PROCESS:
        problem = _probe_here(path)
        if problem:
            return problem
    else:
        probe = ("import sys, tensorflow as tf; m = tf.saved_model.load(sys.argv[1]); "
                 f"out = m.serve(tf.constant([{PROBE_UTTERANCE!r}])); "
                 "print(sorted(out) if isinstance(out, dict) else type(out).__name__)")
        done = subprocess.run([sys.executable, "-c", probe, path], capture_output=True,
                              text=True, env=dict(_environment(), TF_CPP_MIN_LOG_LEVEL="3"))
        if done.returncode:
            return "saved_model does not load: " + done.stderr.strip().splitlines()[-1]
    for leftover in ("saved_model.partial", "saved_model.previous"):
        if os.path.exists(os.path.join(run_dir, leftover)):
            return f"{leftover} left behind"
    return ""


def _probe_here(path: str) -> str:
    """The probe of _export_problem in this process: "" or what went wrong."""
    import tensorflow as tf

    try:
        model = tf.saved_model.load(path)  # held: serve() reads the model's variables
        model.serve(tf.constant([PROBE_UTTERANCE]))
    except Exception as error:  # noqa: BLE001 (reported as the probe's last line was)
        return f"saved_model does not load: {type(error).__name__}: {error}"
    return ""


def plan_chain(rng: random.Random, kinds: list, faults: int) -> list:
    """`faults` fault kinds drawn from `kinds`; at most one export fault, and it is last (the
    export is written once). The step of each is drawn when its attempt starts, among the steps
    left to run."""
    body = [k for k in kinds if k not in AT_THE_END]
    end = [k for k in kinds if k in AT_THE_END]
    if not body:
        return [rng.choice(end)]
    return [rng.choice(body) for _ in range(faults - bool(end))] + (
        [rng.choice(end)] if end else [])


def steps_left(run_dir: str, reference: dict) -> int:
    state = _read(os.path.join(run_dir, "state.json"), {}) or {}
    return ((reference["epochs"] - int(state.get("epochs_done", 0))) * reference["steps_per_epoch"]
            - int(state.get("steps_done", 0)))


def reference_run(work: str, epochs: int) -> dict:
    """The uninterrupted run: its charged records and steps per epoch."""
    run_dir = os.path.join(work, "reference")
    started = time.time()
    done = attempt(run_dir, epochs, False, None)
    if done.returncode:
        raise RuntimeError("the uninterrupted run failed:\n" + done.stderr[-3000:])
    led = _read(os.path.join(run_dir, "privacy.json"))
    return {"epochs": epochs, "steps_per_epoch": led["epochs"][0]["steps"],
            "seconds": round(time.time() - started, 1),
            "records": {e["epoch"]: (e["steps"], round(e["noise_multiplier"], 12))
                        for e in led["epochs"]}}


def planned_reference(steps_per_epoch: int, epochs: int) -> dict:
    """The records an uninterrupted run of RUN_FLAGS charges, from its flags (z0 = 1, linear
    decay 0.1) rather than from a run: what the quick test compares against."""
    return {"epochs": epochs, "steps_per_epoch": steps_per_epoch,
            "records": {t: (steps_per_epoch, round(noise_multiplier_at(t, 1.0, "linear", 0.1), 12))
                        for t in range(epochs)}}


def run_chain(name: str, chain: list, rng: random.Random, base: str, reference: dict,
              disk: Optional[SmallDisk], log) -> list:
    """Runs one chain of single-process faults; returns an Outcome per fault injected."""
    on_disk = disk is not None and disk.ok and any(k in NEEDS_SMALL_DISK for k in chain)
    run_dir = os.path.join(disk.path if on_disk else base, name)
    witness = os.path.join(base, name + ".witness")
    ballast = os.path.join(disk.path, "ballast") if on_disk else None
    epochs, outcomes, problems, kill_overs = reference["epochs"], [], [], []
    started = False
    for kind in chain:
        resume = started
        if kind == "truncated_checkpoint":
            damaged = truncate_newest_checkpoint(run_dir) if started else None
            log(f"  {name}: {kind}: {damaged or 'no committed checkpoint yet: not injected'}")
            if damaged:
                problems.append("")
                outcomes.append(kind)
                kill_overs.append(None)
            continue
        left = steps_left(run_dir, reference)
        step = rng.randint(0 if kind == "input_error" else 1, max(1, left - 1))
        spec = {"kind": kind, "step": step, "witness": witness, "ballast": ballast}
        before, previous = len(witnessed(witness)), in_progress(run_dir)
        done = attempt(run_dir, epochs, resume, spec)
        started = started or os.path.exists(os.path.join(run_dir, "config.json"))
        if ballast and os.path.exists(ballast):
            os.remove(ballast)  # the user frees the disk
        expected = EXPECTED_EXIT[kind]
        last = (done.stderr.strip().splitlines() or [""])[-1]
        ok = done.returncode == expected or (done.returncode == 0 and _finished(run_dir))
        if kind in ("enospc_ledger", "enospc_checkpoint", "enospc_export") and ok \
                and done.returncode and "disk is full" not in last:
            ok = False
        over, wrong = (kill_over_charge(run_dir, witness, before, previous)
                       if done.returncode == -signal.SIGKILL else (None, ""))
        ok = ok and not wrong
        problems.append("" if ok else wrong or f"exit {done.returncode} (expected {expected}): "
                                               f"{last}")
        log(f"  {name}: {kind} at step {step}: exit {done.returncode}: {last}"
            + ("" if over is None else f"; over-charged {over}"))
        outcomes.append(kind)
        kill_overs.append(over)
    final = attempt(run_dir, epochs, started, {"kind": "none", "step": 0, "witness": witness})
    if final.returncode:
        why = "the resumed run failed: " + (final.stderr.strip().splitlines() or [""])[-1]
        return [Outcome(k, False, why=why) for k in outcomes]
    lost, over, why = check_run(run_dir, reference, witness)
    log(f"  {name}: finished; lost {lost}, over-charged {over} steps {why}")
    results = []
    trained = int((_read(os.path.join(run_dir, "state.json"), {}) or {}).get("epochs_done", 0))
    for kind, problem, over in zip(outcomes, problems, kill_overs):
        results.append(Outcome(kind, not why and not problem, 0, 0, why or problem, over,
                               trained, epochs))
    if results:  # the chain's ledger totals, once
        results[-1].lost_steps, results[-1].over_charged_steps = lost, over
    shutil.rmtree(run_dir, ignore_errors=True)
    return results


def run_worker_chain(name: str, chain: list, rng: random.Random, base: str, reference: dict,
                     log) -> list:
    run_dir = os.path.join(base, name)
    epochs, outcomes, problems = reference["epochs"], [], []
    for kind in chain:
        state = _read(os.path.join(run_dir, "state.json"), {}) or {}
        epoch = rng.randint(int(state.get("epochs_done", 0)), epochs - 1)
        delay = round(rng.uniform(0.0, 1.5), 2)
        resume = os.path.exists(os.path.join(run_dir, "config.json"))
        done, fired = worker_attempt(run_dir, epochs, resume, kind, epoch, delay)
        last = (done.stderr.strip().splitlines() or [""])[-1]
        if not fired:
            log(f"  {name}: {kind}: the run ended first (exit {done.returncode}): not injected")
            continue
        ok = done.returncode == EXPECTED_EXIT[kind] and "--resume" in last
        problems.append("" if ok else f"exit {done.returncode}: {last}")
        log(f"  {name}: {kind} {delay} s into epoch {epoch}: exit {done.returncode}: "
            f"{last[:160]}")
        outcomes.append(kind)
    final, _ = worker_attempt(run_dir, epochs, True, None, 0, 0.0)
    if final.returncode:
        why = "the resumed run failed: " + (final.stderr.strip().splitlines() or [""])[-1]
        return [Outcome(k, False, why=why) for k in outcomes]
    _, over, why = check_run(run_dir, reference, None)
    log(f"  {name}: finished; over-charged {over} steps {why}")
    results = [Outcome(k, not why and not p, 0, 0, why or p) for k, p in zip(outcomes, problems)]
    if results:
        results[-1].over_charged_steps = over
    shutil.rmtree(run_dir, ignore_errors=True)
    return results


def run_storm_chain(name: str, chain: list, rng: random.Random, base: str, reference: dict,
                    log) -> list:
    """Five SIGKILLs from outside at random moments of the plain command with a target epsilon
    (each `uniform(0, the uninterrupted run's time)` after its attempt started; one that comes
    after the run finished is not counted), then the resume that finishes it: every epoch
    asked is trained, epsilon is at most the target, no step that ran is uncharged, and each
    kill's charge exceeds its epoch's steps by at most FLUSH_STEPS."""
    run_dir = os.path.join(base, name)
    witness = os.path.join(base, name + ".witness")
    epochs, span = reference["epochs"], float(reference.get("seconds", 90.0))
    overs, problems = [], []
    for _ in range(3 * STORM_KILLS):
        if len(overs) == STORM_KILLS:
            break
        resume = os.path.exists(os.path.join(run_dir, "config.json"))
        before, previous = len(witnessed(witness)), in_progress(run_dir)
        delay = round(rng.uniform(0.0, span), 2)
        done = killed_attempt(run_dir, epochs, resume, witness, delay)
        last = (done.stderr.strip().splitlines() or [""])[-1]
        if done.returncode != -signal.SIGKILL:
            log(f"  {name}: the attempt ended before the kill at {delay} s (exit "
                f"{done.returncode}): {last[:160]}")
            if done.returncode != 0:
                return [Outcome("storm", False, why=f"exit {done.returncode}: {last}")]
            break
        over, wrong = kill_over_charge(run_dir, witness, before, previous)
        log(f"  {name}: SIGKILL {delay} s after the start: over-charged {over} {wrong}")
        overs.append(over)
        problems.append(wrong)
    resume = os.path.exists(os.path.join(run_dir, "config.json"))  # all kills in start-up: not
    final = attempt(run_dir, epochs, resume, {"kind": "none", "step": 0, "witness": witness},
                    flags=storm_flags())
    if final.returncode:
        why = (f"the resumed run failed (exit {final.returncode}): "
               + (final.stderr.strip().splitlines() or [""])[-1])
        return [Outcome("storm", False, why=why, kill_over=o) for o in overs]
    state = _read(os.path.join(run_dir, "state.json"), {}) or {}
    led = _read(os.path.join(run_dir, "privacy.json"), {}) or {}
    trained = int(state.get("epochs_done", 0))
    charged = [(e["epoch"], e["steps"]) for e in led.get("epochs", [])]
    pairs = align(witnessed(witness), charged)
    why = ""
    if trained != epochs or not state.get("finished") or state.get("stopped"):
        why = f"trained {trained} of {epochs} epochs ({state.get('stopped')})"
    elif led.get("epsilon", math.inf) > STORM_TARGET:
        why = f"epsilon {led.get('epsilon')} > target {STORM_TARGET}"
    elif pairs is None or any(paid < ran for ran, paid in pairs):
        why = f"steps that ran are not charged: {witnessed(witness)} vs {charged}"
    log(f"  {name}: finished; {trained} of {epochs} epochs, epsilon {led.get('epsilon'):.4g} "
        f"{why}")
    results = [Outcome("storm", not why and not p, 0, o, why or p, o, trained, epochs)
               for o, p in zip(overs, problems)]
    shutil.rmtree(run_dir, ignore_errors=True)
    return results


# The share of an uninterrupted two-worker run's time spent before its first step (launching
# the workers, loading, tracing), as measured on this machine.
WORKER_STARTUP_SHARE = 0.5


def worker_seconds(base: str, reference: dict) -> float:
    """Seconds of an uninterrupted run of the two-worker storm command, measured once and kept
    in the reference (`base`/reference.json) so that the storms' kills fall inside a run."""
    if "worker_epoch_seconds" not in reference:
        run_dir = os.path.join(base, "reference_workers")
        shutil.rmtree(run_dir, ignore_errors=True)
        started = time.time()
        done = subprocess.run(_worker_command(run_dir, reference["epochs"], False), cwd=REPO,
                              env=_environment(), capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise RuntimeError("the uninterrupted two-worker run failed:\n" + done.stderr[-3000:])
        reference["worker_seconds"] = round(time.time() - started, 1)
        epochs = (_read(os.path.join(run_dir, "metrics.json"), {}) or {}).get("epochs", [])
        seconds = sorted(e["seconds"] for e in epochs if e.get("seconds"))
        reference["worker_epoch_seconds"] = seconds[len(seconds) // 2] if seconds else None
        path = os.path.join(base, "reference.json")
        kept = _read(path, {}) or {}
        with open(path, "w") as f:
            json.dump(dict(kept, worker_seconds=reference["worker_seconds"],
                           worker_epoch_seconds=reference["worker_epoch_seconds"]), f)
        shutil.rmtree(run_dir, ignore_errors=True)
    return float(reference["worker_seconds"])


def run_worker_storm_chain(name: str, chain: list, rng: random.Random, base: str,
                           reference: dict, log) -> list:
    """A storm of the two-worker command: STORM_KILLS SIGKILLs of the whole job (a quarter in
    start-up, the others a uniform time into an epoch left, from `worker_seconds`), then the
    resume that finishes it. No witness runs inside the workers, so what is checked
    is the finished run's: every epoch asked trained, epsilon at most the target, nothing left
    in progress, and each epoch charged at least its steps; the steps charged beyond the
    uninterrupted run's are the storm's total over-charge (lost work included)."""
    run_dir = os.path.join(base, name)
    epochs, span = reference["epochs"], worker_seconds(base, reference)
    kills = 0
    for _ in range(3 * STORM_KILLS):
        if kills == STORM_KILLS:
            break
        resume = os.path.exists(os.path.join(run_dir, "config.json"))
        done_epochs = int((_read(os.path.join(run_dir, "state.json"), {}) or {})
                          .get("epochs_done", 0))
        # a kill in start-up (launch, loading, tracing) one time in four (and once every epoch
        # has run: during the test metrics or the export), else during an epoch left, a random
        # time into it after the chief's ledger marks it in progress
        if rng.random() < 0.25 or done_epochs >= epochs:
            epoch, delay = None, round(rng.uniform(0.0, WORKER_STARTUP_SHARE * span), 2)
        else:
            epoch = rng.randint(done_epochs, epochs - 1)
            per_epoch = reference.get("worker_epoch_seconds") or span / (2 * epochs)
            delay = round(rng.uniform(0.0, float(per_epoch)), 2)
        done = worker_job_killed(run_dir, epochs, resume, delay, epoch)
        last = (done.stderr.strip().splitlines() or [""])[-1]
        if done.returncode not in (-signal.SIGKILL, 128 + signal.SIGKILL):
            log(f"  {name}: the attempt ended before the kill at {delay} s (exit "
                f"{done.returncode}): {last[:160]}")
            if done.returncode != 0:
                return [Outcome("worker_storm", False, why=f"exit {done.returncode}: {last}")]
            break
        kills += 1
        log(f"  {name}: SIGKILL of the job {delay} s after "
            + ("the start" if epoch is None else f"epoch {epoch} began")
            + f" (in progress: {in_progress(run_dir)})")
    resume = os.path.exists(os.path.join(run_dir, "config.json"))
    final = subprocess.run(_worker_command(run_dir, epochs, resume), cwd=REPO,
                           env=_environment(), capture_output=True, text=True, timeout=1800)
    if final.returncode:
        why = (f"the resumed run failed (exit {final.returncode}): "
               + (final.stderr.strip().splitlines() or [""])[-1])
        return [Outcome("worker_storm", False, why=why) for _ in range(kills)]
    state = _read(os.path.join(run_dir, "state.json"), {}) or {}
    led = _read(os.path.join(run_dir, "privacy.json"), {}) or {}
    trained = int(state.get("epochs_done", 0))
    per_epoch = {}
    for e in led.get("epochs", []):
        per_epoch[e["epoch"]] = per_epoch.get(e["epoch"], 0) + e["steps"]
    short = {t: n for t, n in per_epoch.items() if n < reference["records"][t][0]}
    why = ""
    if trained != epochs or not state.get("finished") or state.get("stopped"):
        why = f"trained {trained} of {epochs} epochs ({state.get('stopped')})"
    elif led.get("epsilon", math.inf) > STORM_TARGET:
        why = f"epsilon {led.get('epsilon')} > target {STORM_TARGET}"
    elif led.get("in_progress") is not None or short or len(per_epoch) != epochs:
        why = f"epochs charged fewer steps than they ran: {per_epoch}"
    over = sum(per_epoch.values()) - sum(s for s, _ in reference["records"].values())
    log(f"  {name}: finished; {trained} of {epochs} epochs, epsilon {led.get('epsilon'):.4g}, "
        f"{over} steps charged beyond the uninterrupted run {why}")
    results = [Outcome("worker_storm", not why, 0, 0, why, None, trained, epochs)
               for _ in range(kills)]
    if results:
        results[-1].over_charged_steps = over
    shutil.rmtree(run_dir, ignore_errors=True)
    return results


def _finished(run_dir: str) -> bool:
    return bool((_read(os.path.join(run_dir, "state.json"), {}) or {}).get("finished"))


def _per_kill(mine: list) -> str:
    overs = [o.kill_over for o in mine if o.kill_over is not None]
    return f"{sum(overs) / len(overs):.1f} / {max(overs)}" if overs else ""


def _epochs(mine: list) -> str:
    asked = sum(o.epochs_asked for o in mine)
    return f"{sum(o.epochs_trained for o in mine)} / {asked}" if asked else ""


def table(outcomes: list, skipped: dict) -> str:
    """Faults tried and survived per kind, a SIGKILL's steps charged beyond those that ran in
    its epoch (mean / max per kill), and the epochs the finished runs trained against those
    asked (summed over the faults of the kind); steps lost and over-charged are a run's totals
    (a chain's faults share one ledger), so they are summed over the runs in the last row."""
    rows = ["| fault | what | tried | survived | over-charged per kill (mean / max) | "
            "epochs trained / asked |", "|---|---|---:|---:|---:|---:|"]
    for kind in KINDS:
        mine = [o for o in outcomes if o.kind == kind]
        if mine:
            rows.append(f"| {kind} | {KINDS[kind]} | {len(mine)} | "
                        f"{sum(o.survived for o in mine)} | {_per_kill(mine)} | "
                        f"{_epochs(mine)} |")
        elif kind in skipped:
            rows.append(f"| {kind} | {KINDS[kind]} | not run: {skipped[kind]} | | | |")
    rows.append(f"| **all** | | {len(outcomes)} | {sum(o.survived for o in outcomes)} | "
                f"{_per_kill(outcomes)} | {_epochs(outcomes)} |")
    lost = sum(o.lost_steps for o in outcomes)
    over = sum(o.over_charged_steps for o in outcomes)
    return "\n".join(rows) + (
        f"\n\nSteps lost from the ledger (ran, not charged): **{lost}**. Steps over-charged "
        f"(charged for an epoch a crash cut short beyond the steps that ran, at most "
        f"flush_steps = {FLUSH_STEPS} per kill; safe): {over}.")


def _guarded(chain: list, log, run, *args) -> list:
    """`run(*args)`; an error of the harness itself counts each fault of the chain as lost."""
    try:
        return run(*args)
    except Exception as error:  # noqa: BLE001 (reported in the table, not hidden)
        log(f"  the chain failed: {type(error).__name__}: {error}")
        return [Outcome(k, False, why=f"{type(error).__name__}: {error}") for k in chain]


def run_suite(seed: int, chains: int, faults_per_chain: int, worker_chains: int, epochs: int,
              kinds: list, work: Optional[str] = None, log=print,
              after_chain=None, storms: int = 0,
              worker_storms: int = 0) -> tuple[list, dict]:
    """Runs the suite; returns (outcomes, {kind: why it was not run}). `after_chain(outcomes,
    skipped)` runs after each chain (the table so far, for a soak that may be cut short).

    Each chain draws from its own generator (seed, chain), and its outcomes are kept in
    `work`: the same command with the same --work_dir resumes a soak, rerunning only the
    chains that have no outcome file (the uninterrupted run is kept too)."""
    work = work or tempfile.mkdtemp(prefix="edp-faults-")
    os.makedirs(work, exist_ok=True)
    skipped = {}
    single = [k for k in kinds if k in IN_PROCESS or k in BETWEEN]
    disk = None
    if any(k in NEEDS_SMALL_DISK for k in single):
        disk = SmallDisk(256)
        if not disk.ok:
            skipped.update({k: f"no small filesystem ({disk.reason})"
                            for k in single if k in NEEDS_SMALL_DISK})
            single = [k for k in single if k not in NEEDS_SMALL_DISK]
    worker_kinds = [k for k in kinds if k in WORKERS]
    plans = ([(f"chain{i}", run_chain, single) for i in range(chains if single else 0)]
             + [(f"workers{i}", run_worker_chain, worker_kinds)
                for i in range(worker_chains if worker_kinds else 0)]
             + [(f"storm{i}", run_storm_chain, ["storm"])
                for i in range(storms if "storm" in kinds else 0)]
             + [(f"wstorm{i}", run_worker_storm_chain, ["worker_storm"])
                for i in range(worker_storms if "worker_storm" in kinds else 0)])
    outcomes = []
    try:
        reference = _read(os.path.join(work, "reference.json"))
        if reference is None or reference["epochs"] != epochs:
            log(f"seed {seed}: the uninterrupted run ({epochs} epochs) ...")
            reference = reference_run(work, epochs)
            with open(os.path.join(work, "reference.json"), "w") as f:
                json.dump(reference, f)
        reference["records"] = {int(k): tuple(v) for k, v in reference["records"].items()}
        for name, run, pool in plans:
            done_file = os.path.join(work, f"{name}.json")
            kept = _read(done_file)
            if kept is not None and kept["seed"] == seed:
                outcomes += [Outcome(**o) for o in kept["outcomes"]]
                log(f"{name}: kept from an earlier run of this command")
                continue
            rng = random.Random(f"{seed}-{name}")
            chain = (plan_chain(rng, pool, faults_per_chain) if run is run_chain
                     else ["storm"] if run is run_storm_chain
                     else ["worker_storm"] if run is run_worker_storm_chain
                     else [rng.choice(pool) for _ in range(faults_per_chain)])
            log(f"{name}: {chain}")
            shutil.rmtree(os.path.join(work, name), ignore_errors=True)
            if os.path.exists(os.path.join(work, name + ".witness")):
                os.remove(os.path.join(work, name + ".witness"))
            args = (disk, log) if run is run_chain else (log,)
            mine = _guarded(chain, log, run, name, chain, rng, work, reference, *args)
            with open(done_file, "w") as f:
                json.dump({"seed": seed, "chain": chain,
                           "outcomes": [dataclasses.asdict(o) for o in mine]}, f, indent=1)
            outcomes += mine
            if after_chain:
                after_chain(outcomes, skipped)
    finally:
        if disk is not None:
            disk.close()
    return outcomes, skipped


def main(argv):
    del argv
    seed = _SEED.value if _SEED.value is not None else random.SystemRandom().randrange(10**6)
    kinds = list(_KINDS.value or KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"--kinds: unknown {unknown}; known: {', '.join(KINDS)}")
    # stopped from outside: unwind, so that the small filesystem is unmounted
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.time()
    command = "python -m tools.faults " + " ".join(
        f"--{name}={flags.FLAGS[name].value}" for name in ("chains", "faults_per_chain",
                                                           "worker_chains", "storms",
                                                           "worker_storms", "epochs")) + (
        f" --seed={seed}" + (f" --kinds={','.join(kinds)}" if _KINDS.value else ""))

    def write(outcomes, skipped, final=False):
        if _OUTPUT.value:
            os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
            status = "" if final else " (in progress: the chains so far)"
            with open(_OUTPUT.value, "w") as f:
                f.write(f"Command: `{command}`{status}; {time.time() - started:.0f} s.\n\n"
                        f"{table(outcomes, skipped)}\n")

    outcomes, skipped = run_suite(seed, _CHAINS.value, _FAULTS.value, _WORKER_CHAINS.value,
                                  _EPOCHS.value, kinds, _WORK_DIR.value, after_chain=write,
                                  storms=_STORMS.value, worker_storms=_WORKER_STORMS.value)
    write(outcomes, skipped, final=True)
    failed = [o for o in outcomes if not o.survived]
    print(f"\n{command}: {time.time() - started:.0f} s\n{table(outcomes, skipped)}")
    for o in failed:
        print(f"LOST: {o.kind}: {o.why}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    _SEED = flags.DEFINE_integer("seed", None, "Seed of the fault plan (default: drawn, printed).")
    _CHAINS = flags.DEFINE_integer("chains", 4, "Single-process chains (run directories).")
    _FAULTS = flags.DEFINE_integer("faults_per_chain", 4, "Faults per chain.")
    _WORKER_CHAINS = flags.DEFINE_integer("worker_chains", 1, "Two-worker chains.")
    _STORMS = flags.DEFINE_integer("storms", 1, f"Storm chains ({STORM_KILLS} SIGKILLs each).")
    _WORKER_STORMS = flags.DEFINE_integer(
        "worker_storms", 0, f"Two-worker storm chains ({STORM_KILLS} SIGKILLs of the job each).")
    _EPOCHS = flags.DEFINE_integer("epochs", 3, "Epochs of each run.")
    _KINDS = flags.DEFINE_list("kinds", None, f"Fault kinds (default all): {', '.join(KINDS)}.")
    _WORK_DIR = flags.DEFINE_string("work_dir", None, "Where the runs go (default: a temp dir).")
    _OUTPUT = flags.DEFINE_string("output", None, "Also write the table (markdown) here.")
    cli.run(main)
