"""`python -m edp_nlu.train`: train a joint intent + slot model, privately by default.

    python -m edp_nlu.train                       # CLC, per-example DP-SGD, synthetic corpus
    python -m edp_nlu.train --config=snips_clc --mechanism=sgd --run_dir=runs/snips  # or a .py path
    python -m edp_nlu.train --config.batch_size=256 --target_epsilon=8 --run_dir=runs/x
    python -m edp_nlu.train --run_dir=runs/x --resume        # continue an interrupted run
    python -m edp_nlu.train --workers=2 --run_dir=runs/w     # two worker processes, one run

The run directory holds config.json, metrics.json, privacy.json (the ledger), tensorboard/,
checkpoints/ and saved_model/ (the serving export). Logs carry counts and metrics only, never
utterance text.
"""
from __future__ import annotations

if __name__ == "__main__":  # before ml_collections imports TensorFlow: its native logs read the
    from edp_nlu import cli  # setting once, at import

    cli.quiet_unless_verbose()

import os  # noqa: E402
import sys  # noqa: E402
from typing import Optional  # noqa: E402

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from edp_nlu import cli  # noqa: E402
from edp_nlu.configs import accept_names, config_file  # noqa: E402

# The run's machinery imports TensorFlow; `--help` and a misspelt flag answer without it.
callbacks = cli.on_first_use("edp_nlu.pipeline.callbacks")
public_start = cli.on_first_use("edp_nlu.pipeline.public_start")
recipes = cli.on_first_use("edp_nlu.pipeline.recipes")
run_files = cli.on_first_use("edp_nlu.pipeline.run_files")
timing = cli.on_first_use("edp_nlu.pipeline.timing")
training = cli.on_first_use("edp_nlu.pipeline.training")
worker_processes = cli.on_first_use("edp_nlu.pipeline.worker_processes")
multi_worker = cli.on_first_use("edp_tf.multi_worker")
strategies = cli.on_first_use("edp_tf.strategy")

# Shortcuts for the most used config fields (a given flag overrides --config.<field>).
SHORTCUTS = ("mechanism", "model", "data_dir", "replicas", "epochs", "target_epsilon",
             "noise_multiplier", "decay", "decay_rate")


def define_flags(values: flags.FlagValues = flags.FLAGS, argv=None) -> None:
    """Defined only when run as a command: other commands use some of the same flag names and
    tests run several commands in one process (each on its own `values`; `argv`, the command
    line, lets the config file's `--config.<field>` flags be known before parsing)."""
    v = dict(flag_values=values)
    accept_names(config_flags.DEFINE_config_file(
        "config", config_file("default"), "Experiment config file, or the name of a packaged one "
        "(snips_clc: edp_nlu/configs/snips_clc.py).", sys_argv=argv, **v), values)
    flags.DEFINE_string("run_dir", None, "Run directory (default: runs/<config name>-<time>).",
                        **v)
    flags.DEFINE_bool("resume", False, "Continue the run in --run_dir from its checkpoint.", **v)
    flags.DEFINE_enum("mechanism", None, ["sgd", "edp", "dpsgd"], "Training mechanism.", **v)
    flags.DEFINE_enum("model", None, ["clc", "bert"], "Model.", **v)
    flags.DEFINE_string("data_dir", None, "Joint-format dir or NLU-Evaluation CSV(s).", **v)
    flags.DEFINE_integer("replicas", None, "Replicas (GPUs, else logical CPUs).", **v)
    flags.DEFINE_integer("epochs", None, "Epochs, >= 1 (leave it out for the config's: 0 in "
                         "a config file means automatic, edp_nlu/pipeline/recipes.py).",
                         lower_bound=1, **v)
    flags.DEFINE_float("target_epsilon", None, "Calibrate z0 to this epsilon.", **v)
    flags.DEFINE_float("noise_multiplier", None, "z0 (when no target epsilon).", **v)
    flags.DEFINE_enum("decay", None, ["none", "linear", "exponential"], "Noise decay.", **v)
    flags.DEFINE_float("decay_rate", None, "Decay rate tau.", **v)
    flags.DEFINE_integer(
        "workers", 1, "Worker processes on this machine, one MultiWorkerMirroredStrategy run over "
        "127.0.0.1 (edp_nlu/pipeline/worker_processes.py); on CPUs each worker is one replica.",
        lower_bound=1, **v)
    flags.DEFINE_integer("worker_index", None, "Set by --workers for each worker. Under a "
                         "cluster manager (TF_CONFIG set: Kubeflow's TFJob, Vertex AI) leave it "
                         "out: each process takes its task from TF_CONFIG (docs/multi_host.md).",
                         **v)
    flags.DEFINE_bool(
        "recompute_metrics", False, "With --resume on a finished run: restore its last "
        "checkpoint and recompute its final metrics (test scores, attacks), instead of printing "
        "its summary.", **v)


def main(argv, values: flags.FlagValues = flags.FLAGS):
    del argv
    f = values
    config = f.config
    with config.unlocked():
        for field in SHORTCUTS:
            if f[field].value is not None:
                config[field] = f[field].value
    # The strategy first: logical CPU devices must exist before TensorFlow initialises.

    run_dir = f.run_dir or run_files.default_run_dir(config)
    if f.resume and f.worker_index is None:  # the chief checks, once, before any work
        config = _resumed_config(config, run_dir, f)
        finished = run_files.finished_summary(run_dir)
        if (finished is not None and int(config.epochs) <= finished["epochs"]
                and not f.recompute_metrics):
            print(f"{run_dir} is finished ({finished['epochs']} epochs): nothing to resume. "
                  "Its summary:", flush=True)
            print(training.summary_line(finished), flush=True)
            return
    if _as_one_of_several_workers(config, run_dir, f):
        return
    strategy = strategies.make_strategy(int(config.replicas))
    try:
        summary = training.train(config, run_dir, resume=f.resume, strategy=strategy)
    except callbacks.StoppedBySignal as stopped:  # a graceful stop, not a failure to hide
        print(f"{stopped}", file=sys.stderr, flush=True)
        sys.exit(128 + stopped.signum)
    except training.BudgetSpentError as spent:  # before any step: one line and the way out
        print(f"error: {spent}", file=sys.stderr, flush=True)
        sys.exit(training.BUDGET_EXIT)
    except Exception as error:  # noqa: BLE001 (a full disk is told in one line, others raise)
        if not run_files.disk_full(error):
            raise
        print(f"error: the disk is full ({run_files.disk_full(error)}); nothing written so far "
              f"is lost (every file is replaced whole, and the ledger charges every step that "
              f"ran). Free space, then continue with: python -m edp_nlu.train "
              f"--run_dir={run_dir} --resume", file=sys.stderr, flush=True)
        sys.exit(1)
    print(training.summary_line(summary), flush=True)
    print(timing.breakdown_line(summary["timing"]), flush=True)
    if summary.get("stopped"):  # a script sees that the run trained fewer epochs than asked
        sys.exit(training.BUDGET_EXIT)


def _requested_fields(values: flags.FlagValues) -> dict:
    """The config fields this command line sets: --config.<field>=... and the shortcut flags."""
    requested = {}
    for name, value in values.flag_values_dict().items():
        if name.startswith("config.") and values[name].present:
            requested[name[len("config."):]] = value
    for field in SHORTCUTS:
        if values[field].present:
            requested[field] = values[field].value
    return requested


def _resumed_config(config, run_dir: str, values: flags.FlagValues):
    """The run's own config (config.json); a command that asks for another run is refused in
    one line naming each differing field, rather than silently ignored. More epochs extend it
    (the ledger still refuses any epoch over the budget)."""
    plain = public_start.source_dir(run_dir)
    if (not os.path.exists(os.path.join(run_dir, run_files.CONFIG_FILE))
            and os.path.exists(os.path.join(plain, run_files.STATE_FILE))):
        raise ValueError(f"--resume: {run_dir} holds only its plain run on the public corpus "
                         f"({plain}): the private run has not started. Run the same command "
                         "without --resume: it continues the plain run, then starts it")
    saved = run_files.load_run_config(run_dir, "--resume: --run_dir")
    requested = _requested_fields(values)
    given_file = None
    if values["config"].present:  # compared as it ran: private_ fields in their places
        private = requested.get("mechanism", config.mechanism) != "sgd"
        given_file = recipes.with_private_fields(config, private)
    diffs = run_files.resume_differences(saved, requested, given_file)
    if diffs:
        raise ValueError(
            f"--resume: {run_dir} was made with "
            + ", ".join(f"{f}={old!r} (asked: {new!r})" for f, old, new in diffs)
            + ". Resume with the run's own settings (other --epochs, or a higher "
            "--target_epsilon, may change it), or start a new --run_dir")
    with saved.unlocked():  # kept in config.json by training.train
        if "epochs" in requested:
            saved.epochs = int(requested["epochs"])
        if "target_epsilon" in requested:
            saved.target_epsilon = float(requested["target_epsilon"])
        for field in run_files.RESUME_SETTINGS:
            if field in requested:
                value = requested[field]
                value = value if isinstance(value, bool) else float(value)
                run_files.set_field(saved, field, value)
    return saved


def _as_one_of_several_workers(config, run_dir: str, values: flags.FlagValues) -> bool:
    """Runs the --workers launcher, one of its workers, or a worker a cluster manager started
    (TF_CONFIG); False when this process trains alone."""
    if values.workers > 1 and values.worker_index is None:
        sys.exit(worker_processes.launch(worker_processes.without_workers_flag(sys.argv[1:]),
                                         values.workers, run_dir, values.resume))
    if values.worker_index is not None:
        _worker(config, run_dir, values, values.worker_index)
        return True
    external = _cluster_managers_index(values)
    if external is None:
        return False
    _cluster_worker(config, values, external)
    return True


def _cluster_managers_index(values: flags.FlagValues) -> Optional[int]:
    """This process's worker index in a cluster whose TF_CONFIG a cluster manager set
    (Kubeflow's TFJob, Vertex AI, a launcher of the user's), or None: no TF_CONFIG, a cluster
    of one, or our own --workers launcher (which passes --worker_index)."""
    raw = os.environ.get("TF_CONFIG")
    if not raw or values.worker_index is not None or values.workers > 1:
        return None
    index, workers = multi_worker.cluster_position(raw)
    return index if workers > 1 else None


def _cluster_worker(config, values: flags.FlagValues, index: int) -> None:
    """Worker `index` of a cluster manager's run: the run directory must be the same path on
    every host (shared storage); a worker other than the chief prepares its own copy there, as
    our launcher does for --workers."""
    if values.run_dir is None:
        raise ValueError("TF_CONFIG names a cluster: give every worker the same --run_dir, on "
                         "storage every host sees (the chief's files are the run's)")
    if index > 0:
        worker_processes.prepare_worker(values.run_dir, index, values.resume)
    return _worker(config, values.run_dir, values, index, CLUSTER_COLLECTIVE_TIMEOUT)


# Under a cluster manager no launcher of ours stops the others when a host dies: each
# collective then fails after this long instead of blocking forever, the ledger charges what
# ran, and the manager's restart with --resume continues from the chief's last checkpoint.
# Long enough for the slowest legitimate wait (a peer tracing a large model's first step).
CLUSTER_COLLECTIVE_TIMEOUT = 600.0


def _worker(config, run_dir: str, values: flags.FlagValues, index: int,
            timeout_seconds: Optional[float] = None) -> None:
    """One worker of a multi-worker run (--workers, or a cluster manager's TF_CONFIG): the same
    training, in its own directory (the chief's is the run's); the replica count is the
    strategy's (workers x devices per worker)."""
    strategy = multi_worker.make_multi_worker_strategy(timeout_seconds)
    own_dir = worker_processes.worker_dir(run_dir, index)
    if values.resume:  # the chief checked the command; the worker takes its own files
        config = _resumed_config(config, own_dir, values)
    elif config.replicas != strategy.num_replicas_in_sync:
        with config.unlocked():
            config.replicas = strategy.num_replicas_in_sync
    try:
        summary = training.train(config, own_dir, resume=values.resume, strategy=strategy,
                                 export=index == 0)
    except training.BudgetSpentError as spent:  # before any step: one line and the way out
        print(f"error: {spent}", file=sys.stderr, flush=True)
        sys.exit(training.BUDGET_EXIT)
    if index == 0:
        print(training.summary_line(summary), flush=True)
    if summary.get("stopped"):  # every worker stops at the same epoch: the launcher says so
        sys.exit(training.BUDGET_EXIT)


if __name__ == "__main__":
    cli.define_flags_or_exit(define_flags)
    cli.run(main)
