"""`PrivateModel.freeze_until`: the first epochs train only the unfrozen variables (DP linear
probing, then fine-tuning), on 2 logical CPU replicas (edp_tf/conftest.py)."""
import keras
import numpy as np
import pytest

from edp_tf import DPConfig, PrivateModel
from edp_tf.testing import mse, per_example_update, small_model, small_regression


class _WeightsAtEpochEnd(keras.callbacks.Callback):
    def __init__(self, model):
        super().__init__()
        self._inner, self.seen = model, []  # not self._model: Keras sets that to the PrivateModel

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append([w.copy() for w in self._inner.get_weights()])


def _private(strategy, init, config, lr=0.1, optimizer=keras.optimizers.SGD):
    with strategy.scope():  # the optimizer too: its slot variables are mirrored
        inner = small_model()
        inner.set_weights(init)
        private = PrivateModel(inner, config)
        private.compile(optimizer=optimizer(lr), loss=mse)
    return inner, private


@pytest.mark.parametrize("microbatch_size", [None, 1, 2])
def test_frozen_variables_stay_exactly_put_then_join(strategy, microbatch_size):
    """With large noise, any noise or signal reaching the first layer would move it: it must
    stay bit-identical for the frozen epoch, while the head moves; in epoch 2 both move."""
    x, y = small_regression(seed=3)
    init = small_model().get_weights()
    inner, private = _private(strategy, init, DPConfig(
        l2_norm_clip=1.0, noise_multiplier=5.0, microbatch_size=microbatch_size))
    private.freeze_until(1, inner.layers[0].trainable_variables)
    seen = _WeightsAtEpochEnd(inner)
    private.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[seen])
    first_kernel, first_bias, head_kernel, _ = seen.seen[0]
    np.testing.assert_array_equal(first_kernel, init[0])
    np.testing.assert_array_equal(first_bias, init[1])
    assert not np.allclose(head_kernel, init[2])
    assert not np.allclose(seen.seen[1][0], init[0])  # joined in epoch 2


def test_frozen_norm_is_excluded_from_clipping(strategy):
    """While frozen, the first layer's gradient must not use up the clip norm: without noise,
    the head's update is per-example clipping of the head's gradient alone (computed the slow
    way on a model of the head only). Any share of C spent on the frozen layer would shrink
    every clipped example's update (C is small: all examples are clipped)."""
    x, y = small_regression(seed=4)
    x, y = x[:16], y[:16]
    init = small_model().get_weights()
    C, lr = 0.05, 0.5
    inner, private = _private(strategy, init, DPConfig(l2_norm_clip=C, noise_multiplier=0.0,
                                                       microbatch_size=1), lr=lr)
    private.freeze_until(1, inner.layers[0].trainable_variables)
    private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)

    hidden = np.tanh(x @ init[0] + init[1])  # the frozen layer's output, the head's input
    head = keras.Sequential([keras.Input((7,)), keras.layers.Dense(3)])
    head.set_weights(init[2:])
    want = per_example_update(head, hidden, y, [1.0, 1.0], C, lr)
    got = inner.get_weights()[2:]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    # and the reference differs from clipping the whole model's gradient
    whole = per_example_update(small_model_with(init), x, y, [1.0] * 4, C, lr)[2:]
    assert not np.allclose(whole[0], want[0], rtol=1e-3)


def small_model_with(weights):
    model = small_model()
    model.set_weights(weights)
    return model


def test_resumed_after_the_frozen_epochs_trains_everything(strategy):
    """Decided by epoch: resuming at initial_epoch >= the freeze's end freezes nothing."""
    x, y = small_regression(seed=5)
    init = small_model().get_weights()
    inner, private = _private(strategy, init, DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0))
    private.freeze_until(1, inner.layers[0].trainable_variables)
    private.fit(x, y, batch_size=16, epochs=2, initial_epoch=1, shuffle=False, verbose=0)
    assert not np.allclose(inner.get_weights()[0], init[0])


def test_resumed_inside_the_freeze_keeps_it_until_its_end(strategy):
    """fit(initial_epoch=1) with freeze_until(2): epoch 1 is still frozen (the uninterrupted
    run's schedule), epoch 2 trains everything."""
    x, y = small_regression(seed=7)
    init = small_model().get_weights()
    inner, private = _private(strategy, init, DPConfig(l2_norm_clip=1.0, noise_multiplier=3.0))
    private.freeze_until(2, inner.layers[0].trainable_variables)
    seen = _WeightsAtEpochEnd(inner)
    private.fit(x, y, batch_size=16, epochs=3, initial_epoch=1, shuffle=False, verbose=0,
                callbacks=[seen])
    np.testing.assert_array_equal(seen.seen[0][0], init[0])
    assert not np.allclose(seen.seen[0][2], init[2])
    assert not np.allclose(seen.seen[1][0], init[0])


def test_adam_state_of_frozen_variables_starts_when_they_join(strategy):
    """The optimizer is built with every trainable variable before the first step (else the
    joining variables would be unknown to it); while frozen their Adam moments stay zero."""
    x, y = small_regression(seed=6)
    init = small_model().get_weights()
    inner, private = _private(strategy, init, DPConfig(l2_norm_clip=1.0, noise_multiplier=2.0),
                              lr=0.01, optimizer=keras.optimizers.Adam)
    private.freeze_until(2, inner.layers[0].trainable_variables)
    private.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    opt = private.optimizer
    kernel = inner.layers[0].kernel
    index = opt._get_variable_index(kernel)
    assert not np.any(opt._momentums[index].numpy())
    np.testing.assert_array_equal(kernel.numpy(), init[0])
    private.fit(x, y, batch_size=16, epochs=3, initial_epoch=2, shuffle=False, verbose=0)
    assert np.any(opt._momentums[index].numpy())


def test_freeze_until_refuses_what_it_cannot_do(strategy):
    init = small_model().get_weights()
    inner, private = _private(strategy, init, DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0))
    with pytest.raises(ValueError, match="integer >= 0"):
        private.freeze_until(-1, inner.layers[0].trainable_variables)
    with pytest.raises(ValueError, match="every trainable variable"):
        private.freeze_until(1, inner.trainable_variables)
    with strategy.scope():
        sparse = PrivateModel(small_model(), DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                      sparse_embeddings=True))
    with pytest.raises(ValueError, match="sparse_embeddings or local_epochs"):
        sparse.freeze_until(1, sparse.wrapped_model.layers[0].trainable_variables)
    stranger = keras.Variable(np.zeros(3, np.float32), name="stranger")
    with pytest.raises(ValueError, match="stranger.*not a trainable variable"):
        private.freeze_until(1, [stranger])


def test_a_freeze_and_a_projection_are_refused_together_in_either_order(strategy):
    init = small_model().get_weights()
    inner, private = _private(strategy, init, DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0))
    private.freeze_until(1, inner.layers[0].trainable_variables)
    x, y = np.zeros((4, 5), np.float32), np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="freeze_until cannot be combined with project_onto"):
        private.project_onto_public_gradients(x, y, rank=1)
    private.freeze_until(0, ())  # off: the projection is allowed
    private.project_onto_public_gradients(x, y, rank=1)
    with pytest.raises(ValueError, match="freeze_until cannot be combined with project_onto"):
        private.freeze_until(1, inner.layers[0].trainable_variables)
