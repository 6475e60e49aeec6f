"""Every combination DPConfig accepts keeps the sensitivity its Mechanism states.

Brute force on a one-weight model: the private step (z = 0, SGD(1), alpha = 1) is run on a batch
and on its neighbour without one unit (an example, or a user's rows at user level: their rows
become padding, as when Poisson sampling leaves them out), and the two updates, scaled back to
the clipped sum by D, may differ by at most S x C. The data are adversarial: the removed unit's
gradient is ten times larger than, and opposite to, its micro-batch partner's, so a micro-batch
of several examples swings from +C to -C (the factor 2 of S = 2 is reached, not only allowed).
"""
import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import DPConfig, PrivateModel, make_strategy

C = 1.0
ROWS = 4
# loss 0.5 (w x - y)^2 at w = 0 has gradient -y x: row 0 pushes +40, row 1 -4, rows 2-3 small;
# averaged over a micro-batch (k_e = 2 or 4) row 1 alone still exceeds C
X = np.ones((ROWS, 1), "float32")
Y = np.array([[-40.0], [4.0], [0.3], [-0.2]], "float32")

KNOBS = {
    "microbatch_size": (None, 1, 2),
    "privacy_unit": ("example", "user"),
    "user_estimator": ("fixed", "clipped"),
    "clipping": ("flat", "per_layer"),
    "local_epochs": (0, 1),
    "noise_mode": ("calibrated", "paper"),
    "per_example_method": ("ghost", "loop"),
}


def _accepted():
    """Each combination DPConfig's validator accepts (user level: users of 2 rows, 2 expected)."""
    for values in itertools.product(*KNOBS.values()):
        kwargs = dict(zip(KNOBS, values))
        if kwargs["privacy_unit"] == "user":
            kwargs["expected_batch_size"] = 2.0
        try:
            DPConfig(l2_norm_clip=C, noise_multiplier=0.0, **kwargs)
        except ValueError:
            continue
        if kwargs["per_example_method"] == "loop" and kwargs["microbatch_size"] is None:
            continue  # the method is unused without micro-batches: the same step twice
        yield kwargs


def _loss(y_true, y_pred):
    return 0.5 * keras.ops.sum(keras.ops.square(y_pred - y_true), axis=-1)


def _updates(config, full, neighbour, x=X, y=Y):
    """The updates of one step on the batch weighted `full` and on its neighbour, weighted
    `neighbour`, from w = 0 each, and the Mechanism the step accounts. One fit of two steps,
    the weight put back to 0 between them: the same traced step (the one a run takes) on the
    two datasets, traced once."""
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    private = PrivateModel(model, config)
    private.compile(optimizer=keras.optimizers.SGD(1.0), loss=_loss)
    batches = [tf.data.Dataset.from_tensors((x, y, np.asarray(w, "float32")))
               for w in (full, neighbour)]
    updates = []

    class FromZero(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            updates.append(-model.get_weights()[0].ravel())
            model.layers[0].kernel.assign(np.zeros((1, 1), "float32"))

    private.fit(batches[0].concatenate(batches[1]), epochs=1, verbose=0, callbacks=[FromZero()])
    assert len(updates) == 2
    return updates[0], updates[1], private.mechanism


@pytest.fixture(scope="module")
def one_replica():
    return make_strategy(1)


@pytest.mark.parametrize("kwargs", list(_accepted()), ids=lambda k: ",".join(
    f"{v}" for v in k.values()))
def test_removing_one_unit_moves_the_clipped_sum_by_at_most_s_c(one_replica, kwargs):
    config = DPConfig(l2_norm_clip=C, noise_multiplier=0.0, **kwargs)
    removed = np.ones(ROWS, "float32")
    removed[0] = 0.0
    if kwargs["privacy_unit"] == "user":
        removed[1] = 0.0  # the user's whole micro-batch (rows 0 and 1)
    with one_replica.scope():
        full, neighbour, mechanism = _updates(config, np.ones(ROWS, "float32"), removed)
    moved = float(np.linalg.norm(full - neighbour)) * mechanism.expected_microbatches
    assert moved <= mechanism.sensitivity * C * (1 + 1e-5), (moved, mechanism.sensitivity)
    if kwargs["microbatch_size"] != 1 and kwargs["privacy_unit"] == "example":
        assert moved > 1.5 * C  # the adversarial pair reaches S = 2: S = 1 would be wrong


# Augmentation multiplicity: the loss of an example is the mean over its copies, clipped once.
# Example 0's copies (gradients -y: +40, -4, +6, -30) average far above C whatever k; example 1's
# (+1.6, -1.0, +3.0, -2.6) each exceed C but average 0.3 (k = 2) or 0.25 (k = 4), where clipping
# copy by copy would give 0.
COPIES_Y = np.array([-40.0, 4.0, -6.0, 30.0, -1.6, 1.0, -3.0, 2.6], "float32")


def _copies(k):
    """(x, y) of 2 examples x k copies, each example's consecutive, as the sampler lays them."""
    y = np.concatenate([COPIES_Y[:k], COPIES_Y[4:4 + k]])[:, None]
    return np.ones((2 * k, 1), "float32"), y


@pytest.mark.parametrize("k,method,clipping", [
    (1, "ghost", "flat"), (2, "vectorized", "per_layer"), (4, "ghost", "flat"),
    (4, "loop", "flat")])
def test_an_example_with_k_copies_moves_the_clipped_sum_by_at_most_c(one_replica, k, method,
                                                                       clipping):
    """Removing one example (its k rows become padding) moves the clipped sum by at most C
    whatever k, and the clipped sum is sum_i clip_C(mean of example i's copies' gradients):
    averaged before clipping, not clipped copy by copy."""
    config = DPConfig(l2_norm_clip=C, noise_multiplier=0.0, microbatch_size=1,
                      augment_copies=k, expected_batch_size=2.0, per_example_method=method,
                      clipping=clipping)
    x, y = _copies(k)
    removed = np.ones(2 * k, "float32")
    removed[:k] = 0.0
    with one_replica.scope():
        full, neighbour, mechanism = _updates(config, np.ones(2 * k, "float32"), removed, x, y)
    assert (mechanism.sensitivity, mechanism.expected_microbatches) == (1, 2.0)
    scale = mechanism.expected_microbatches
    means = [-y[:k].mean(), -y[k:].mean()]  # d/dw 0.5 (w - y)^2 at w = 0, x = 1
    clipped = [g * min(1.0, C / abs(g)) for g in means]
    assert float(full[0]) * scale == pytest.approx(sum(clipped), rel=1e-5, abs=1e-6)
    moved = float(np.linalg.norm(full - neighbour)) * scale
    assert 0.5 * C < moved <= C * (1 + 1e-5), moved


@pytest.mark.parametrize("k", [1, 2])
def test_bandmf_keeps_the_clipped_sums_sensitivity(one_replica, k):
    """BandMF only correlates the noise: the clipped sum it is added to moves by at most S C
    when one example goes, as DP-SGD's (the banded analysis needs exactly that per step)."""
    config = DPConfig(l2_norm_clip=C, noise_multiplier=0.0, microbatch_size=k,
                      expected_batch_size=float(ROWS), bandmf_bands=2)
    removed = np.ones(ROWS, "float32")
    removed[0] = 0.0
    with one_replica.scope():
        full, neighbour, mechanism = _updates(config, np.ones(ROWS, "float32"), removed)
    assert mechanism.bands == 2
    moved = float(np.linalg.norm(full - neighbour)) * mechanism.expected_microbatches
    assert moved <= mechanism.sensitivity * C * (1 + 1e-5), (moved, mechanism.sensitivity)
    # The removed example's pull is clipped, not lost.
    assert moved > 0.5 * C * mechanism.sensitivity
