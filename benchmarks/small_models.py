"""Small models, per-example DP-SGD against plain Keras training: seconds per epoch, side by side.

    python -m benchmarks.small_models --output=results/benchmarks/small_models/cpu.json

Each model (the README's text classifier, a tabular MLP, a small Conv2D net, a token tagger)
trains for `--epochs` epochs twice, taking turns `--repeats` times: plain `model.fit` at the
same batch size (the fastest honest plain training: Keras' own loop, its compiled step) and
`edp_tf.make_private(...).fit` (Poisson batches of the same expected size, per-example
clipping). The first epoch of each fit holds the trace and is left out: the ratio is that of
the epochs after it, the ones a long run is made of.
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
from edp_tf import microbatch

_ROWS = flags.DEFINE_integer("rows", 8000, "Training examples per model.")
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Epochs per fit (the first is not timed).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Fits per model and mode (they take turns).")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Batch size (make_private's expected one).")
_MODELS = flags.DEFINE_list("models", ["text", "tabular", "conv2d", "tagger"], "Models.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON file for the results.")
_GRADIENTS = flags.DEFINE_bool(
    "gradients_only", False, "Instead: milliseconds of one batch's per-example gradients and "
    "clip (edp_tf.microbatch, ghost norms) against plain training's batch gradient, per model.")
_JIT = flags.DEFINE_bool("jit_compile", False, "With --gradients_only: both compiled by XLA.")


def _text(rng, rows):
    x = rng.integers(1, 200, size=(rows, 8)).astype("int32")
    model = keras.Sequential([keras.Input((8,), dtype="int32"), keras.layers.Embedding(200, 16),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
    return model, x, (x[:, 0] % 3).astype("int32")


def _tabular(rng, rows):
    x = rng.normal(size=(rows, 32)).astype("float32")
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
    return model, x, (x[:, 0] > 0).astype("int32")


def _conv2d(rng, rows):
    x = rng.normal(size=(rows, 16, 16, 1)).astype("float32")
    model = keras.Sequential([
        keras.Input((16, 16, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    return model, x, (x[:, 0, 0, 0] > 0).astype("int32")


def _tagger(rng, rows):
    x = rng.integers(1, 200, size=(rows, 12)).astype("int32")
    inp = keras.Input((12,), dtype="int32")
    h = keras.layers.Embedding(200, 16)(inp)
    h = keras.layers.Dense(32, activation="relu")(h)
    model = keras.Model(inp, keras.layers.Dense(5)(h))
    return model, x, (x % 5).astype("int32")


MODELS = {"text": _text, "tabular": _tabular, "conv2d": _conv2d, "tagger": _tagger}


class _EpochTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _epoch_seconds(name: str, private: bool, rows: int, epochs: int, batch: int) -> float:
    """Median seconds of the epochs after the first of one fit (a fresh model)."""
    model, x, y = MODELS[name](np.random.default_rng(0), rows)
    times = _EpochTimes()
    if private:
        trained = edp_tf.make_private(model, target_epsilon=8.0, epochs=epochs,
                                      batch_size=batch)
        trained.compile(keras.optimizers.Adam(1e-3), _loss())
        trained.fit(x, y, verbose=0, callbacks=[times])
    else:
        model.compile(keras.optimizers.Adam(1e-3), _loss())
        model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, callbacks=[times])
    return float(np.median(times.seconds[1:]))


def _gradient_milliseconds(name: str, batch: int, repeats: int = 30) -> dict:
    """One batch's per-example gradients and clip against the plain batch gradient (ms)."""
    model, x, y = MODELS[name](np.random.default_rng(0), batch)
    variables = model.trainable_variables
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    plan = microbatch.ClipPlan(1, 1.0, (1.0,) * len(variables), 1.0, method="ghost")
    weights = tf.ones([batch])

    def private():
        return microbatch.gradients(model, per_example, variables, x, y, weights,
                                    plan).clip(1.0).clipped_sum

    def plain():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(per_example(y, model(x, training=True)))
        return tape.gradient(loss, variables)

    result = {}
    for mode, step in (("private_ms", tf.function(private, jit_compile=_JIT.value)),
                       ("plain_ms", tf.function(plain, jit_compile=_JIT.value))):
        step()  # the trace
        started = time.perf_counter()
        for _ in range(repeats):
            step()
        result[mode] = (time.perf_counter() - started) / repeats * 1000
    result["ratio"] = result["private_ms"] / result["plain_ms"]
    return result


def main(argv) -> None:
    del argv
    if _GRADIENTS.value:
        for name in _MODELS.value:
            r = _gradient_milliseconds(name, _BATCH.value)
            print(f"{name}: per-example gradients and clip {r['private_ms']:.2f} ms, plain "
                  f"gradient {r['plain_ms']:.2f} ms, {r['ratio']:.2f}x", flush=True)
        return
    rows, epochs, batch = _ROWS.value, _EPOCHS.value, _BATCH.value
    result = {}
    for name in _MODELS.value:
        seconds = {"plain": [], "private": []}
        for _ in range(_REPEATS.value):
            for mode in seconds:
                seconds[mode].append(_epoch_seconds(name, mode == "private", rows, epochs, batch))
        plain, private = (float(np.median(seconds[m])) for m in ("plain", "private"))
        result[name] = {"plain_s_per_epoch": plain, "private_s_per_epoch": private,
                        "ratio": private / plain, "runs": seconds}
        print(f"{name}: plain {plain:.3f} s/epoch, private {private:.3f} s/epoch, "
              f"{private / plain:.2f}x", flush=True)
    report = {"rows": rows, "epochs": epochs, "batch_size": batch, "result": result,
              "command": "python -m benchmarks.small_models " + " ".join(sys.argv[1:])}
    if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    app.run(main)
