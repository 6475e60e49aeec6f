"""LSTM ghost rule (unrolled, in a Bidirectional wrapper, behind a masked Embedding): per-example
norms of the kernels and recurrent kernels equal the plain loop's."""
import keras
import pytest

from edp_tf.testing import assert_fast_norms_exact


def lstm_model():
    inp = keras.Input((5,), dtype="int32")
    h = keras.layers.Embedding(9, 4, mask_zero=True, name="emb")(inp)
    h = keras.layers.Bidirectional(keras.layers.LSTM(3, unroll=True), name="bi")(h)
    model = keras.Model(inp, keras.layers.Dense(2, name="head")(h))
    covered = ["emb/embeddings", "head/kernel"] + [
        f"bi/{d}_lstm/lstm_cell/{v}" for d in ("forward", "backward")
        for v in ("kernel", "recurrent_kernel")]
    return model, covered


@pytest.mark.parametrize("k", [1, 2])
def test_fast_norms_match_per_example_gradients(k):
    keras.utils.set_random_seed(3)
    assert_fast_norms_exact(*lstm_model(), k)
