"""What several workers cost per private step: N worker processes on loopback (TF_CONFIG set
here, as a cluster manager would), a model of d trained weights whose compute is negligible,
so the step is the all-reduce of d gradient values plus each worker's share of the noise.

    python -m benchmarks.workers_scale --workers=1,2,4 --weights=100000,1000000,4000000,16000000 \
        --steps=20 --output=results/benchmarks/workers_scale/loopback.json

Checked against the ring all-reduce model of docs/multi_host.md: each replica sends and
receives 2 (N - 1) / N x 4 d bytes per step; the fit gives loopback's effective bandwidth.
"""
from __future__ import annotations

if __name__ == "__main__":  # before edp_tf loads TensorFlow: its native logs read the setting once
    from edp_nlu import cli

    cli.quiet_unless_verbose()

import json
import os
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

import edp_tf
from edp_nlu.pipeline import worker_processes

_WORKERS = flags.DEFINE_list("workers", ["1", "2", "4"], "Worker counts.")
_WEIGHTS = flags.DEFINE_list("weights", ["100000", "1000000", "4000000"], "Trained weights d.")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per point.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON file for the results.")
_ROLE = flags.DEFINE_integer("worker_of", 0, "Internal: this process is a worker of N.")
_D = flags.DEFINE_integer("d", 0, "Internal: the weights of this point.")

ROWS_PER_REPLICA = 8
INPUT_WIDTH = 100


def _worker(workers: int, d: int, steps: int) -> None:
    """One worker: eDP steps of a Dense model of d weights; the chief prints the median."""
    import keras
    import tensorflow as tf

    strategy = (edp_tf.make_multi_worker_strategy(timeout_seconds=300) if workers > 1
                else tf.distribute.get_strategy())
    batch = ROWS_PER_REPLICA * strategy.num_replicas_in_sync
    x = np.random.default_rng(0).normal(size=(batch, INPUT_WIDTH)).astype("float32")
    y = np.zeros((batch, d // INPUT_WIDTH), "float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((INPUT_WIDTH,)),
                                  keras.layers.Dense(d // INPUT_WIDTH, use_bias=False)])
        private = edp_tf.PrivateModel(model, edp_tf.DPConfig(noise_multiplier=1.0))
        private.compile(keras.optimizers.SGD(0.0), "mse")
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    private.fit(data, steps_per_epoch=2, epochs=1, verbose=0)  # tracing and warm-up
    iterator = iter(strategy.experimental_distribute_dataset(data))
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        out = private.train_function(iterator)
        if hasattr(out, "get_value"):
            out = out.get_value()
        float(np.asarray(tf.nest.flatten(out)[0]))  # wait for the step to finish
        times.append(time.perf_counter() - started)
    if edp_tf.multi_worker.worker_index(strategy) == 0:
        print("RESULT " + json.dumps({"workers": workers, "weights": d,
                                      "median_step_s": float(np.median(times))}), flush=True)


def _point(workers: int, d: int, steps: int) -> dict:
    ports = worker_processes.free_ports(workers)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    procs = []
    for index in range(workers):
        env = dict(os.environ)
        if workers > 1:
            env["TF_CONFIG"] = edp_tf.multi_worker.tf_config(addresses, index)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "benchmarks.workers_scale", f"--worker_of={workers}",
             f"--d={d}", f"--steps={steps}"], env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    lines = [line for out in outs for line in out.splitlines() if line.startswith("RESULT ")]
    if len(lines) != 1:
        raise RuntimeError(f"point N={workers} d={d}: no result ({outs})")
    return json.loads(lines[0][len("RESULT "):])


def main(argv) -> None:
    del argv
    if _ROLE.value:
        return _worker(_ROLE.value, _D.value, _STEPS.value)
    rows = [_point(int(n), int(d), _STEPS.value) for d in _WEIGHTS.value
            for n in _WORKERS.value]
    for row in rows:
        n, d = row["workers"], row["weights"]
        row["allreduce_bytes_per_replica"] = 2 * (n - 1) / n * 4 * d
        print(f"N={n} d={d:>9}: {1000 * row['median_step_s']:8.1f} ms per step", flush=True)
    result = {"rows": rows, "rows_per_replica": ROWS_PER_REPLICA,
              "load_average_end": list(os.getloadavg()),
              "command": "python -m benchmarks.workers_scale " + " ".join(sys.argv[1:])}
    if _OUTPUT.value:
        os.makedirs(os.path.dirname(_OUTPUT.value) or ".", exist_ok=True)
        with open(_OUTPUT.value, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    app.run(main)
