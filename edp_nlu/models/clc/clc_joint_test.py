import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models import testing
from edp_nlu.models.clc.clc_joint import CLCJoint
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor
from edp_nlu.models.clc.word_vectors import WordVectors


@pytest.fixture(scope="module")
def data():
    return testing.encoded(CLCPreprocessor, max_words=6, max_word_length=5)


def test_parameter_count(data):
    """(The outputs, training and config of every family: edp_nlu/models/contract_test.py.)"""
    pre, _, _ = data
    model = CLCJoint.from_preprocessor(pre, **testing.TINY_CLC)
    # Two BiLSTM layers: 2 directions x 4 gates x units x (inputs + units + 1).
    units, features = 8, 8 + 4
    lstm = 2 * 4 * units * (features + units + 1) + 2 * 4 * units * (2 * units + units + 1)
    lstm_params = sum(int(np.prod(v.shape)) for v in model.backbone.weights if "lstm" in v.path)
    assert lstm_params == lstm


def test_pretrained_vectors_initialise_and_can_be_frozen(data):
    pre, x, _ = data
    rng = np.random.default_rng(0)
    vectors = WordVectors(("call", "jazz"), rng.normal(size=(2, 6)).astype(np.float32))
    model = CLCJoint.from_preprocessor(
        pre, word_vectors=vectors, word_embeddings_trainable=False, **testing.TINY_CLC
    )
    table = model.backbone.word_embedding.embeddings.numpy()
    assert table.shape[1] == 6
    np.testing.assert_allclose(table[pre.word_vocabulary.index("call")], vectors.vectors[0])
    assert not model.backbone.word_embedding.trainable
    trainable = {v.path for v in model.trainable_variables}
    assert not any("word_embedding" in p for p in trainable)


def _op_types(function, *args) -> set:
    return {op.type for op in function.get_concrete_function(*args).graph.get_operations()}


def test_inference_runs_the_unrolled_lstms_as_loops_with_the_same_outputs(data):
    """`infer` (prediction, serving, the membership losses) traces the LSTMs as loops: the
    outputs equal the unrolled call's, and training keeps its unrolled layers."""
    pre, x, _ = data
    model = CLCJoint.from_preprocessor(pre, **testing.TINY_CLC)
    unrolled = tf.function(lambda inputs: model(inputs, training=False), autograph=False)
    rolled = tf.function(model.infer, autograph=False)
    assert not {"While", "StatelessWhile"} & _op_types(unrolled, x)
    assert {"While", "StatelessWhile"} & _op_types(rolled, x)
    want, got = unrolled(x), rolled(x)
    for key in ("intent_logits", "tag_potentials"):
        # the same float32 operations in the same order per position: rounding only
        np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        model.predict_labels(x)["tag_ids"].numpy(),
        model.crf.decode(want["tag_potentials"], want["tag_mask"], constrained=True)[0].numpy())
    layers = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.RNN)]
    assert layers and all(layer.unroll for layer in layers)
    assert not {"While", "StatelessWhile"} & _op_types(
        tf.function(lambda inputs: model(inputs, training=True), autograph=False), x)


def test_decodes_well_formed_bio_by_default_and_keeps_it_in_its_config(data):
    pre, x, _ = data
    model = CLCJoint.from_preprocessor(pre, **testing.TINY_CLC)
    labels = pre.tag_vocabulary.labels
    # Transitions that make every "I-" tag attractive after anything: unconstrained Viterbi
    # then emits I-x after O or after another type; the BIO decoding must not.
    bias = np.array([3.0 if t.startswith("I-") else 0.0 for t in labels], np.float32)
    model.crf.transitions.assign(np.zeros((len(labels),) * 2, np.float32) + bias)
    model.crf.start_scores.assign(bias)

    def ill_formed(out):
        count = 0
        for row, kept in zip(out["tag_ids"].numpy(), out["tag_mask"].numpy().sum(axis=1)):
            tags = [labels[t] for t in row[:kept]]
            count += sum(t.startswith("I-") and (i == 0 or tags[i - 1][2:] != t[2:])
                         for i, t in enumerate(tags))
        return count

    assert model.decoding == "bio" and ill_formed(model.predict_labels(x)) == 0
    assert ill_formed(model.predict_labels(x, decoding="viterbi")) > 0
    # one forward pass, both decodings: the same as two calls (evaluation traces it once)
    both = model.predict_labels_by_decoding(x, model.decodings())
    assert set(both) == {"bio", "viterbi"} == set(model.decodings())
    for decoding, out in both.items():
        alone = model.predict_labels(x, decoding=decoding)
        for key in alone:
            np.testing.assert_array_equal(out[key].numpy(), alone[key].numpy(), err_msg=key)
    clone = CLCJoint.from_config(model.get_config())
    assert clone.tag_labels == labels and clone.decoding == "bio" and clone.crf.constrained
    plain = CLCJoint.from_preprocessor(pre, decoding="viterbi", **testing.TINY_CLC)
    assert CLCJoint.from_config(plain.get_config()).decoding == "viterbi"
    # a config saved before the BIO decoding existed: no labels, the unconstrained decoding
    older = {k: v for k, v in model.get_config().items() if k not in ("tag_labels", "decoding")}
    older = CLCJoint.from_config(older)
    assert older.decoding == "viterbi" and not older.crf.constrained
    assert older.decodings() == ("viterbi",)
    with pytest.raises(ValueError, match="needs the tag labels"):
        older.predict_labels(x, decoding="bio")
    with pytest.raises(ValueError, match="decoding must be one of"):
        model.predict_labels(x, decoding="greedy")
