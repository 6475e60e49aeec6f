"""make_private's own checkpoint: written after the ledger closes each epoch, restored by
resume=True before the first step, never ahead of the ledger."""
import json
import os

import keras
import numpy as np
import pytest

import edp_tf
from edp_tf import checkpointer


def _model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(2)])


def _private(model, run_dir, resume=False):
    private = edp_tf.make_private(model, target_epsilon=8.0, epochs=3, batch_size=16,
                                  run_dir=run_dir, resume=resume)
    private.compile(keras.optimizers.Adam(0.05),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return private


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(160, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


class _WeightsAtStart(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.weights = [w.copy() for w in self.model.wrapped_model.get_weights()]
        self.iterations = int(self.model.optimizer.iterations.numpy())


def test_resume_continues_from_the_checkpoint_of_the_last_epoch_the_ledger_charged(tmp_path):
    x, y = _data()
    first = _private(_model(0), str(tmp_path))
    first.fit(x, y, epochs=2, verbose=0)
    trained = first.wrapped_model.get_weights()
    committed = checkpointer.latest(str(tmp_path / checkpointer.DIRECTORY))
    assert committed["epochs_done"] == 2  # epochs 0 and 1 ran; the ledger charged both
    ledger = json.loads((tmp_path / "privacy.json").read_text())
    assert len(ledger["epochs"]) == 2
    assert any(checkpointer.DIRECTORY in line for line in ledger["artifacts"]["covered"])

    again = _private(_model(1), str(tmp_path), resume=True)  # other initial weights
    seen = _WeightsAtStart()
    again.fit(x, y, epochs=1, verbose=0, callbacks=[seen])
    for got, want in zip(seen.weights, trained):
        np.testing.assert_array_equal(got, want)
    assert seen.iterations > 0  # the optimizer's moments and step count came back too
    assert len(json.loads((tmp_path / "privacy.json").read_text())["epochs"]) == 3


def test_a_checkpoint_ahead_of_the_ledger_is_refused(tmp_path):
    x, y = _data()
    first = _private(_model(0), str(tmp_path))
    first.fit(x, y, epochs=1, verbose=0)
    directory = str(tmp_path / checkpointer.DIRECTORY)
    path = os.path.join(directory, checkpointer.LATEST)
    with open(path) as handle:
        commit = json.load(handle)
    commit["checkpoints"][0]["epochs_done"] = 6  # mixed up by hand
    with open(path, "w") as handle:
        json.dump(commit, handle)
    again = _private(_model(1), str(tmp_path), resume=True)
    with pytest.raises(ValueError, match="holds epoch 5, but the ledger has charged 1"):
        again.fit(x, y, epochs=1, verbose=0)


def test_without_a_run_dir_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x, y = _data()
    _private(_model(0), None).fit(x, y, epochs=1, verbose=0)
    assert os.listdir(tmp_path) == []


class _WeightsAtEpochEnd(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = {}

    def on_epoch_end(self, epoch, logs=None):
        self.weights[epoch] = [w.copy() for w in self.model.wrapped_model.get_weights()]


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path):
    x, y = _data()
    first, seen = _private(_model(0), str(tmp_path)), _WeightsAtEpochEnd()
    first.fit(x, y, epochs=3, verbose=0, callbacks=[seen])
    directory = str(tmp_path / checkpointer.DIRECTORY)
    names = sorted(os.listdir(directory))
    assert not any(name.startswith("ckpt-1.") for name in names)  # only the two newest kept
    assert checkpointer.latest(directory)["epochs_done"] == 3
    data = next(n for n in names if n.startswith("ckpt-3.data"))
    with open(os.path.join(directory, data), "r+b") as handle:  # a full disk cut it short
        handle.truncate(os.path.getsize(os.path.join(directory, data)) // 2)
    assert checkpointer.latest(directory)["epochs_done"] == 2

    again = _private(_model(1), None)  # other initial weights
    assert checkpointer.restore(directory, again, epochs_charged=3) == 1
    for got, want in zip(again.wrapped_model.get_weights(), seen.weights[1]):
        np.testing.assert_array_equal(got, want)
