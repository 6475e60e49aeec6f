"""make_private's fit on a tf.data pipeline against the same examples as arrays: examples per
second of whole fits, side by side in one process (the pipeline's one pass included).

    python -m benchmarks.pipeline_throughput --rows=20000 --epochs=3 --repeats=3

Why: a pipeline is taken by one pass that collects its examples, then the library draws the
Poisson batches as from arrays (edp_tf/input_pipelines.py); the difference is that pass.
"""
from __future__ import annotations

import json
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import edp_tf

_ROWS = flags.DEFINE_integer("rows", 20000, "Training examples.")
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Epochs per fit.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Fits per input kind (they take turns).")
_BATCH = flags.DEFINE_integer("batch_size", 200, "make_private's batch_size.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON file for the results.")


def _fit(given, rows: int, epochs: int, batch: int) -> float:
    """Seconds of one make_private fit (a fresh model and wrapper) on `given`."""
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(2)])
    private = edp_tf.make_private(model, target_epsilon=8.0, epochs=epochs, batch_size=batch)
    private.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    started = time.perf_counter()
    private.fit(*given, verbose=0)
    return time.perf_counter() - started


def main(argv) -> None:
    del argv
    rng = np.random.default_rng(0)
    rows, epochs, batch = _ROWS.value, _EPOCHS.value, _BATCH.value
    x = rng.normal(size=(rows, 20)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    kinds = {"arrays": lambda: (x, y),
             "tf.data (shuffled, batched)": lambda: (
                 tf.data.Dataset.from_tensor_slices((x, y)).shuffle(rows).batch(256),)}
    _fit(kinds["arrays"](), rows, 1, batch)  # the first trace of the process, untimed
    seconds = {k: [] for k in kinds}
    for _ in range(_REPEATS.value):
        for kind, given in kinds.items():
            seconds[kind].append(_fit(given(), rows, epochs, batch))
    result = {kind: {"median_s": float(np.median(s)),
                     "examples_per_s": rows * epochs / float(np.median(s))}
              for kind, s in seconds.items()}
    base = result["arrays"]["median_s"]
    for r in result.values():
        r["ratio_to_arrays"] = r["median_s"] / base
    report = {"rows": rows, "epochs": epochs, "batch_size": batch, "result": result,
              "command": "python -m benchmarks.pipeline_throughput " + " ".join(sys.argv[1:])}
    print(json.dumps(report, indent=2))
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    app.run(main)
