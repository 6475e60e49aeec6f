import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models import testing
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor


@pytest.fixture(scope="module")
def data():
    return testing.encoded(BertPreprocessor, vocabulary_size=80, sequence_length=12)


def test_trains_and_reduces_loss(data):
    pre, x, y = data
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    out = model(x)
    assert out["tag_potentials"].shape == (8, 10, len(pre.tag_vocabulary))
    np.testing.assert_array_equal(out["tag_mask"].numpy(), x["word_starts"] > 0)
    model.compile(optimizer=keras.optimizers.Adam(0.02))
    before = float(tf.reduce_mean(model.per_example_loss(y, model(x))))
    model.fit(x, y, batch_size=8, epochs=15, verbose=0)
    after = float(tf.reduce_mean(model.per_example_loss(y, model(x))))
    assert after < 0.7 * before, (before, after)


def test_per_example_gradients_vectorise_without_fallback(data):
    """Each example's gradient inside tf.vectorized_map (pfor, no while_loop fallback) equals its
    gradient computed alone. Needs oneDNN off (see edp_nlu.models.testing.onednn_enabled): else it
    reruns itself in a fresh process, since the crash would take pytest down with it."""
    if testing.onednn_enabled():
        testing.rerun_without_onednn(
            __file__, "test_per_example_gradients_vectorise_without_fallback"
        )
        return
    pre, x, y = data
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    variables = [v.value for v in model.trainable_variables]

    def one(args):
        xi, yi = tf.nest.map_structure(lambda t: t[None], args)
        with tf.GradientTape() as tape:
            loss = model.per_example_loss(yi, model(xi, training=True))[0]
        grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(g) for g in grads]

    stacked = tf.function(
        lambda x, y: tf.vectorized_map(one, (x, y), fallback_to_while_loop=False)
    )(x, y)
    for i in (0, 6):
        single = one(tf.nest.map_structure(lambda t: t[i], (x, y)))
        for got, want in zip(stacked, single):
            # float32 sums in a different order: 1e-5 relative to the gradient scale
            np.testing.assert_allclose(
                got[i].numpy(), want.numpy(), atol=1e-5 * (1 + np.abs(want).max())
            )


def test_config_round_trip(data):
    pre, x, _ = data
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    clone = BertJoint.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone(x)["intent_logits"], model(x)["intent_logits"], atol=1e-6)


def test_config_keeps_the_bio_decoding(data):
    pre = data[0]
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    clone = BertJoint.from_config(model.get_config())
    assert clone.tag_labels == pre.tag_vocabulary.labels and clone.decoding == "bio"
    assert clone.crf.allowed_transitions == model.crf.allowed_transitions
