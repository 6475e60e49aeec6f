import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import microbatch, onednn_guard
from edp_tf.testing import mse


class _Scores(keras.layers.Layer):
    """x [b, T, 4] @ W [4, 2]; `flat` reshapes to 2-D rows first (the safe form)."""

    def __init__(self, flat, **kwargs):
        super().__init__(**kwargs)
        self.flat = flat

    def build(self, input_shape):
        self.w = self.add_weight(shape=(4, 2), name="w")

    def call(self, x):
        if not self.flat:
            return tf.linalg.matmul(x, self.w)
        out = tf.linalg.matmul(tf.reshape(x, [-1, 4]), self.w)
        return tf.reshape(out, tf.concat([tf.shape(x)[:-1], [2]], 0))


def _model(flat):
    inp = keras.Input((6,), dtype="int32")
    h = _Scores(flat)(keras.layers.Embedding(10, 4)(inp))
    return keras.Model(inp, keras.layers.GlobalAveragePooling1D()(h))


def _trace(model, method):
    x = np.random.default_rng(0).integers(1, 10, size=(4, 6)).astype("int32")
    y = np.zeros((4, 2), "float32")
    plan = microbatch.ClipPlan(1, 1.0, (1.0,) * len(model.trainable_variables), 1.0,
                               method=method)
    return tf.function(lambda: microbatch.gradients(
        model, mse, model.trainable_variables, x, y, tf.ones([4]), plan).clip(1.0).clipped_sum,
        autograph=False)


@pytest.mark.skipif(not onednn_guard.onednn_on_cpu(), reason="oneDNN CPU kernels are off")
@pytest.mark.parametrize("method", ["ghost", "vectorized"])
def test_a_layer_whose_matmul_onednn_miscomputes_is_refused_at_trace_time(method):
    with pytest.raises(ValueError, match="oneDNN CPU kernel miscomputes.*reshape the input"):
        _trace(_model(flat=False), method)()
    assert all(np.isfinite(g.numpy()).all() for g in _trace(_model(flat=True), method)())


def test_only_the_rank_4_with_a_size_1_axis_by_rank_2_pair_is_flagged():
    graph = tf.Graph()
    with graph.as_default():
        a4, a3, pairs = tf.zeros([2, 1, 3, 4]), tf.zeros([2, 3, 4]), tf.zeros([2, 2, 3, 4])
        w, b4 = tf.zeros([4, 5]), tf.zeros([2, 1, 4, 5])
        bad = tf.raw_ops.BatchMatMulV2(x=a4, y=w)
        tf.raw_ops.BatchMatMulV2(x=a4, y=b4)
        tf.raw_ops.BatchMatMulV2(x=a3, y=w)
        tf.raw_ops.BatchMatMulV2(x=pairs, y=w)  # micro-batches of 2: no size-1 axis
    assert onednn_guard.corrupting_matmuls(graph.get_operations()) == [bad.op]
