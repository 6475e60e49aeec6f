"""Per-layer scales: each policy's values and what it reports to the ledger."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import DPConfig, PrivateModel
from edp_tf.testing import mse, small_model, small_regression


def test_scalings_and_what_they_report(strategy):
    x, y = small_regression()
    facts = {}
    for scaling in ("first_batch", "private", "public"):
        with strategy.scope():
            private = PrivateModel(small_model(), DPConfig(scaling=scaling, noise_multiplier=0.5))
            private.compile(optimizer=keras.optimizers.SGD(0.01), loss=mse)
        if scaling == "public":
            with pytest.raises(ValueError, match="public"):
                private.fit(x, y, batch_size=16, verbose=0)
            pub_x, pub_y = small_regression(seed=9)
            private.set_public_layer_scales(pub_x, pub_y)
        private.fit(x, y, batch_size=16, verbose=0)
        alpha = np.array(private.layer_scales)
        assert alpha.shape == (4,) and np.all(alpha > 0)
        assert np.sum(alpha**2) == pytest.approx(4.0)
        facts[scaling] = private.privacy_facts()
    assert any("first private batch" in s for s in facts["first_batch"]["not_covered"])
    assert facts["public"]["not_covered"] == [] and facts["public"]["extra_events"] == []
    (event,) = facts["private"]["extra_events"]
    assert event["name"] == "private_layer_scales" and event["noise_multiplier"] == 5.0
    assert facts["private"]["not_covered"] == []


def test_first_batch_scales_follow_gradient_norms(strategy):
    """alpha_k is proportional to ||g_k|| of the first batch's mean gradient (the paper's rule)."""
    x, y = small_regression(seed=2)
    reference = small_model()
    init = reference.get_weights()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(mse(y[:16], reference(x[:16])))
    norms = np.array([np.linalg.norm(g) for g in
                      tape.gradient(loss, reference.trainable_variables)])
    with strategy.scope():
        inner = small_model()
        inner.set_weights(init)
        private = PrivateModel(inner, DPConfig(scaling="first_batch", noise_multiplier=0.0))
        private.compile(optimizer=keras.optimizers.SGD(0.0), loss=mse)
    private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    want = edp_tf.scaling.normalize(norms)
    np.testing.assert_allclose(private.layer_scales, want, rtol=1e-4)
