"""`python -m trainers.train`: train a joint intent + slot model, privately by default.

    python -m trainers.train                                  # CLC, per-example DP-SGD, synthetic corpus
    python -m trainers.train --config=configs/snips_clc.py --mechanism=sgd --run_dir=runs/snips
    python -m trainers.train --config.batch_size=256 --target_epsilon=8 --run_dir=runs/x
    python -m trainers.train --run_dir=runs/x --resume        # continue an interrupted run
    python -m trainers.train --workers=2 --run_dir=runs/w     # two worker processes, one run

The run directory holds config.json, metrics.json, privacy.json (the ledger), tensorboard/,
checkpoints/ and saved_model/ (the serving export). Logs carry counts and metrics only, never
utterance text.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "default.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG, "Experiment config file.")
_RUN_DIR = flags.DEFINE_string("run_dir", None, "Run directory (default: runs/<config name>-<time>).")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run in --run_dir from its checkpoint.")
# Shortcuts for the most used config fields (a given flag overrides --config.<field>).
_MECHANISM = flags.DEFINE_enum("mechanism", None, ["sgd", "edp", "dpsgd"], "Training mechanism.")
_MODEL = flags.DEFINE_enum("model", None, ["clc", "bert"], "Model.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Joint-format dir or NLU-Evaluation CSV(s).")
_REPLICAS = flags.DEFINE_integer("replicas", None, "Replicas (GPUs, else logical CPUs).")
_EPOCHS = flags.DEFINE_integer("epochs", None, "Epochs.")
_TARGET_EPS = flags.DEFINE_float("target_epsilon", None, "Calibrate z0 to this epsilon.")
_NOISE = flags.DEFINE_float("noise_multiplier", None, "z0 (when no target epsilon).")
_DECAY = flags.DEFINE_enum("decay", None, ["none", "linear", "exponential"], "Noise decay.")
_DECAY_RATE = flags.DEFINE_float("decay_rate", None, "Decay rate tau.")
_WORKERS = flags.DEFINE_integer(
    "workers", 1, "Worker processes on this machine, one MultiWorkerMirroredStrategy run over "
    "127.0.0.1 (trainers/workers.py); on CPUs each worker is one replica.", lower_bound=1)
_WORKER_INDEX = flags.DEFINE_integer("worker_index", None, "Set by --workers for each worker.")

_SHORTCUTS = {
    "mechanism": _MECHANISM, "model": _MODEL, "data_dir": _DATA_DIR, "replicas": _REPLICAS,
    "epochs": _EPOCHS, "target_epsilon": _TARGET_EPS, "noise_multiplier": _NOISE,
    "decay": _DECAY, "decay_rate": _DECAY_RATE,
}


def main(argv):
    del argv
    config = _CONFIG.value
    with config.unlocked():
        for field, flag in _SHORTCUTS.items():
            if flag.value is not None:
                config[field] = flag.value
    # The strategy first: logical CPU devices must exist before TensorFlow initialises.
    from edp_tf import make_strategy

    from trainers import run as run_lib
    from trainers import rundir

    run_dir = _RUN_DIR.value or rundir.default_run_dir(config)
    if _WORKERS.value > 1 and _WORKER_INDEX.value is None:
        from trainers import workers

        sys.exit(workers.launch(workers.without_workers_flag(sys.argv[1:]), _WORKERS.value, run_dir,
                                _RESUME.value))
    if _WORKER_INDEX.value is not None:
        return _worker(config, run_dir)
    if _RESUME.value:
        config = rundir.load_run_config(run_dir)
    strategy = make_strategy(int(config.replicas))
    summary = run_lib.train(config, run_dir, resume=_RESUME.value, strategy=strategy)
    print(run_lib.summary_line(summary), flush=True)


def _worker(config, run_dir: str) -> None:
    """One worker of a --workers run: the same training, in its own directory (the chief's is
    the run's); the replica count is the strategy's (workers x devices per worker)."""
    from edp_tf import make_multi_worker_strategy

    from trainers import run as run_lib
    from trainers import rundir, workers

    strategy = make_multi_worker_strategy()
    index = _WORKER_INDEX.value
    own_dir = workers.worker_dir(run_dir, index)
    if _RESUME.value:
        config = rundir.load_run_config(own_dir)
    elif config.replicas != strategy.num_replicas_in_sync:
        with config.unlocked():
            config.replicas = strategy.num_replicas_in_sync
    summary = run_lib.train(config, own_dir, resume=_RESUME.value, strategy=strategy,
                            export=index == 0)
    if index == 0:
        print(run_lib.summary_line(summary), flush=True)


if __name__ == "__main__":
    from trainers import cli

    cli.quiet_unless_verbose()
    cli.run(main)
