"""Where fit's batches come from: a ledger for a sampler accepts only that sampler's batches.

Every entry point of `fit` a Keras user reaches for: arrays, a dict of arrays, a tf.data
pipeline of their own, a sampler's dataset transformed afterwards, a generator, another
sampler's dataset; then what is accepted: the sampler's dataset as it is, repeated with
steps_per_epoch, mapped row by row, with validation_data, from a later initial_epoch.
"""
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import DPConfig, PrivateModel, batch_source, ledger, privacy_facts, sampling

N_EX, Q, REPLICAS = 64, 0.25, 2
DELTA = 0.1 / N_EX


@pytest.fixture(scope="module")
def strategy():
    return edp_tf.make_strategy(REPLICAS)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N_EX, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], "float32")).astype("float32")


def _model(strategy, sampler, **kwargs):
    with strategy.scope():
        model = PrivateModel(
            keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]),
            DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0,
                     expected_batch_size=sampler.expected_batch_size), **kwargs)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _load(run_dir):
    with open(os.path.join(run_dir, "privacy.json")) as f:
        return json.load(f)


def _generator(x, y):
    while True:
        yield x[:16], y[:16]


REFUSED = {
    # Keras shuffles the arrays and cuts fixed batches: every example in every epoch once
    "arrays": lambda s, x, y: dict(x=x, y=y, batch_size=16),
    "dict of arrays": lambda s, x, y: dict(x={"dense_input": x}, y=y, batch_size=16),
    "own tf.data": lambda s, x, y: dict(
        x=tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N_EX).batch(16)),
    "sampler's dataset reshaped": lambda s, x, y: dict(
        x=s.dataset(x, y).unbatch().batch(16)),
    "sampler's dataset mapped by hand": lambda s, x, y: dict(
        x=s.dataset(x, y).map(lambda a, b, w: (a, b, w))),
    "generator": lambda s, x, y: dict(x=_generator(x, y), steps_per_epoch=2),
    "another sampler": lambda s, x, y: dict(
        x=sampling.PoissonSampler(N_EX, 0.5, replicas=REPLICAS).dataset(x, y)),
}


@pytest.mark.parametrize("entry", sorted(REFUSED))
def test_a_ledger_for_a_sampler_refuses_batches_it_did_not_draw(strategy, data, tmp_path, entry):
    sampler = sampling.PoissonSampler(N_EX, Q, replicas=REPLICAS)
    model = _model(strategy, sampler)
    led = ledger.PrivacyLedger.for_sampler(str(tmp_path), sampler, DELTA)
    with pytest.raises(ValueError, match="another sampler" if entry == "another sampler"
                       else "holds only for the sampler's Poisson batches"):
        model.fit(**REFUSED[entry](sampler, *data), epochs=1, verbose=0, callbacks=[led])
    assert not os.path.exists(os.path.join(tmp_path, "privacy.json"))  # refused before a step
    assert not model.wrapped_model.built or model.optimizer.iterations.numpy() == 0


def test_arrays_under_a_ledger_without_its_sampler_are_not_private(strategy, data, tmp_path):
    sampler = sampling.PoissonSampler(N_EX, Q, replicas=REPLICAS)
    model = _model(strategy, sampler)
    led = ledger.PrivacyLedger(str(tmp_path), N_EX, DELTA)
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[led])
    content = _load(tmp_path)
    assert content["private"] is False
    (sentence,) = content["not_covered"]
    assert "arrays batched by Keras" in sentence


def test_the_samplers_batches_are_accounted_on_every_accepted_path(strategy, data, tmp_path):
    """repeat=True with steps_per_epoch, a row-wise map_rows, validation_data, a later
    initial_epoch, and a ledger made without the sampler that verifies it from the batches."""
    x, y = data
    sampler = sampling.PoissonSampler(N_EX, Q, replicas=REPLICAS)
    model = _model(strategy, sampler)
    batches = batch_source.map_rows(sampler.dataset(x, y, repeat=True),
                                    lambda a, b: (a * 1.0, b), name="scale_rows")
    led = ledger.PrivacyLedger(str(tmp_path), N_EX, DELTA)  # the sampler comes with the batches
    history = model.fit(batches, epochs=2, steps_per_epoch=3, verbose=0, callbacks=[led],
                        validation_data=(x[:16], y[:16]))
    content = _load(tmp_path)
    assert content["private"] is True and content["not_covered"] == []
    assert [e["steps"] for e in content["epochs"]] == [3, 3]  # what ran, not the sampler's 4
    assert ledger.VALIDATION_SENTENCE in content["assumes"]
    assert content["batch_source"]["row_maps"] == ["scale_rows"]
    # the training statistics are hidden by default; the validation loss is shown (assumed),
    # and epsilon, a function of the ledger
    assert set(history.history) == {"noise_multiplier", "val_loss", "epsilon"}

    resumed = _model(strategy, sampler)
    led = ledger.PrivacyLedger.for_sampler(str(tmp_path), sampler, DELTA)
    resumed.fit(sampler.dataset(x, y), epochs=3, initial_epoch=2, verbose=0, callbacks=[led])
    content = _load(tmp_path)
    assert [e["epoch"] for e in content["epochs"]] == [0, 1, 2] and content["private"] is True
    assert ledger.VALIDATION_SENTENCE in content["assumes"]  # an earlier fit's stays


def test_training_statistics_shown_are_listed_as_not_covered(strategy, data, tmp_path):
    x, y = data
    sampler = sampling.PoissonSampler(N_EX, Q, replicas=REPLICAS)
    model = _model(strategy, sampler, training_statistics=True)
    led = ledger.PrivacyLedger.for_sampler(str(tmp_path), sampler, DELTA)
    history = model.fit(sampler.dataset(x, y), epochs=1, verbose=0, callbacks=[led])
    assert {"loss", "clipped_fraction", "preclip_norm"} <= set(history.history)
    content = _load(tmp_path)
    assert privacy_facts.TRAINING_STATISTICS_SENTENCE in content["not_covered"]
    # the library's run writes its ledger alone, and its artifact list names what fit showed
    assert os.listdir(tmp_path) == ["privacy.json"]
    assert "the ledger (privacy.json when run_dir is given)" in content["artifacts"]["covered"]
    assert any("loss, metrics and clipping statistics" in a
               for a in content["artifacts"]["not_covered"])
    with pytest.raises(ValueError, match="training_statistics"):
        PrivateModel(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]),
                     DPConfig(), training_statistics="yes")


def test_map_rows_keeps_the_mask_and_the_rows_whatever_fn_does(data):
    """fn sees one row without its mask and cannot drop, duplicate, mix rows or touch the mask:
    padding rows keep mask 0 and every batch keeps the sampler's size."""
    x, y = data
    sampler = sampling.PoissonSampler(N_EX, Q, replicas=REPLICAS, seed=3)
    plain = list(sampler.dataset(x, y))
    mapped = list(batch_source.map_rows(sampler.dataset(x, y), lambda a, b: (a * 2.0, b)))
    assert len(mapped) == len(plain)
    for (px, py, pw), (mx, my, mw) in zip(plain, mapped):
        assert mx.shape[0] == sampler.max_batch_size
        np.testing.assert_array_equal(mw.numpy(), pw.numpy())  # the sampler's mask, untouched
        np.testing.assert_allclose(mx.numpy(), 2.0 * px.numpy())
    with pytest.raises(ValueError, match="one row's"):
        batch_source.map_rows(sampler.dataset(x, y), lambda a, b: (a, b, tf.ones([])))
    with pytest.raises(ValueError, match="has none"):
        batch_source.map_rows(tf.data.Dataset.range(3), lambda t: t)
    # a registration does not travel: another dataset object is not the sampler's
    assert batch_source.describe(sampler.dataset(x, y).take(2)).kind == "dataset"
