"""The joint task on any word-level encoder: its heads, its loss over real rows, its decodings
and its inference mode, on an encoder of a few weights (the CLC and BERT encoders have their
own tests beside them)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models import joint_task
from edp_nlu.models.joint_task import JointTagger

WORDS, HIDDEN, INTENTS = 4, 6, 3
TAG_LABELS = ("O", "B-x", "I-x")
X = {"word_ids": np.array([[3, 1, 2, 0], [4, 4, 0, 0], [1, 2, 3, 4]], np.int32)}
Y = {"intent": np.array([0, 2, 1]), "tags": np.array([[1, 2, 0, 0], [0, 1, 0, 0],
                                                      [0, 0, 1, 2]])}


def tiny_encoder(unroll=False):
    """Embedding + LSTM over word ids (0 = padding): the three outputs a JointTagger reads."""
    ids = keras.Input(shape=(WORDS,), dtype="int32", name="word_ids")
    states = keras.layers.LSTM(HIDDEN, return_sequences=True, unroll=unroll)(
        keras.layers.Embedding(5, 4)(ids))
    return keras.Model({"word_ids": ids}, {"sequence_output": states,
                                           "pooled_output": keras.ops.mean(states, axis=1),
                                           "word_mask": keras.ops.not_equal(ids, 0)})


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return JointTagger(tiny_encoder(), INTENTS, len(TAG_LABELS), dropout=0.0,
                       tag_labels=TAG_LABELS)


def test_call_gives_the_heads_the_loss_expects(model):
    out = model(X)
    assert out["intent_logits"].shape == (3, INTENTS)
    assert out["tag_potentials"].shape == (3, WORDS, len(TAG_LABELS))
    np.testing.assert_array_equal(out["tag_mask"].numpy(), X["word_ids"] > 0)
    np.testing.assert_allclose(
        model.per_example_loss(Y, out).numpy(),
        joint_task.joint_per_example_loss(model.crf, Y, out).numpy(), rtol=1e-6)


def test_compute_loss_is_the_mean_over_real_rows(model):
    per_example = model.per_example_loss(Y, model(X)).numpy()
    weights = np.array([1.0, 0.0, 1.0])  # the middle row is padding
    loss = model.compute_loss(X, Y, model(X), sample_weight=weights)
    assert float(loss) == pytest.approx((per_example[0] + per_example[2]) / 2, rel=1e-5)
    assert float(model.compute_loss(X, Y, model(X))) == pytest.approx(per_example.mean(),
                                                                      rel=1e-5)


def test_compute_loss_is_divided_by_the_replicas_whose_gradients_keras_sums(model, monkeypatch):
    """Keras' optimizer sums the replicas' gradients: a hand-written loss divides itself. (The
    replica count is read from the strategy in scope: a 2-replica MirroredStrategy would cost
    seconds of start-up for one division, so the test gives compute_loss a strategy object that
    reports 2 replicas.)"""
    whole = float(model.compute_loss(X, Y, model(X)))

    class TwoReplicas:
        num_replicas_in_sync = 2

    monkeypatch.setattr(tf.distribute, "get_strategy", lambda: TwoReplicas())
    assert float(model.compute_loss(X, Y, model(X))) == pytest.approx(whole / 2, rel=1e-6)


def test_decodings_need_the_tag_labels_for_bio():
    encoder = tiny_encoder()
    assert JointTagger(encoder, INTENTS, 3).decodings() == ("viterbi",)
    assert JointTagger(encoder, INTENTS, 3, tag_labels=TAG_LABELS).decoding == "bio"
    with pytest.raises(ValueError, match='decoding="bio" needs the tag labels'):
        JointTagger(encoder, INTENTS, 3, decoding="bio")
    with pytest.raises(ValueError, match="decoding must be one of"):
        JointTagger(encoder, INTENTS, 3, decoding="greedy")


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_intents=0), "num_intents and num_tags must be >= 1"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
    (dict(tag_reduction="max"), "tag_reduction must be one of"),
    (dict(tag_labels=("O", "B-x")), "tag_labels has 2 labels for 3 tags"),
])
def test_bad_heads_are_refused(kwargs, message):
    args = dict(dict(num_intents=INTENTS, num_tags=3), **kwargs)
    with pytest.raises(ValueError, match=message):
        JointTagger(tiny_encoder(), **args)


def test_predictions_of_every_decoding_come_from_one_forward_pass(model):
    out = model(X)
    both = model.predict_labels_by_decoding(X, ("bio", "viterbi"))
    probabilities = tf.nn.softmax(out["intent_logits"]).numpy()
    for decoding, constrained in (("bio", True), ("viterbi", False)):
        got = both[decoding]
        np.testing.assert_array_equal(got["intent_ids"].numpy(), probabilities.argmax(-1))
        np.testing.assert_allclose(got["intent_probability"].numpy(), probabilities.max(-1),
                                   rtol=1e-5)
        want = model.crf.decode(out["tag_potentials"], out["tag_mask"], constrained=constrained)
        np.testing.assert_array_equal(got["tag_ids"].numpy(), want[0].numpy())
    np.testing.assert_array_equal(model.predict_labels(X)["tag_ids"].numpy(),
                                  both["bio"]["tag_ids"].numpy())


def test_infer_rolls_the_unrolled_layers_for_its_trace_only():
    task = JointTagger(tiny_encoder(unroll=True), INTENTS, 3, dropout=0.0)
    lstm = [layer for layer in task._flatten_layers() if isinstance(layer, keras.layers.RNN)]
    assert lstm and lstm[0].unroll
    with joint_task._rolled_recurrences(task):
        assert not lstm[0].unroll
    with pytest.raises(RuntimeError), joint_task._rolled_recurrences(task):
        raise RuntimeError("a failed trace")
    assert lstm[0].unroll  # restored, also after an error
    np.testing.assert_allclose(task.infer(X)["tag_potentials"].numpy(),
                               task(X, training=False)["tag_potentials"].numpy(), atol=1e-5)
