import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models import label_names, testing
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_nlu.models.clc.clc_joint import CLCJoint
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor
from edp_nlu.models.clc.word_vectors import WordVectors
from edp_nlu.models.label_aware_head import LabelAwareHead, head_width, name_heads
from edp_tf import microbatch
from edp_tf.testing import assert_fast_norms_exact


def _head(spans=None, seed=0, correction=False):
    keras.utils.set_random_seed(seed)
    head = LabelAwareHead(4, 3, spans=spans, correction=correction)
    head.build((None, 5))
    head.set_label_embeddings(np.array([[1, 0, 0], [2, 0, 0], [0, 0, 1], [0, 0, 0]], "float32"))
    return head


def test_logits_are_names_through_one_projection_plus_span_and_bias():
    head = _head(spans=[0, 1, 2, 1], correction=True)
    head.label_bias.assign([0.1, 0.2, 0.3, 0.4])
    x = np.random.default_rng(1).normal(size=(2, 7, 5)).astype("float32")
    without = head(x).numpy()
    head.correction.kernel.assign(np.random.default_rng(5).normal(size=(5, 4)))
    names = head.label_embeddings.numpy()
    np.testing.assert_allclose(np.linalg.norm(names[:3], axis=1), 1.0)  # unit rows, 0 stays 0
    projected = x @ head.projection.kernel.numpy()
    span = x @ head.span_head.kernel.numpy() + head.span_head.bias.numpy()
    want = projected @ names.T + span[..., [0, 1, 2, 1]] + [0.1, 0.2, 0.3, 0.4]
    np.testing.assert_allclose(without, want, rtol=1e-5, atol=1e-5)  # the correction starts at 0
    want += x @ head.correction.kernel.numpy()
    np.testing.assert_allclose(head(x).numpy(), want, rtol=1e-5, atol=1e-5)


def _moved_by_steps_on_label_0(layer, x) -> np.ndarray:
    before = layer(x).numpy().mean(axis=0)
    optimizer = keras.optimizers.SGD(0.1)
    for _ in range(5):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                np.zeros(len(x)), layer(x), from_logits=True))
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply_gradients(zip(grads, layer.trainable_variables))
    return layer(x).numpy().mean(axis=0) - before


def test_what_one_label_learns_moves_the_labels_named_like_it():
    """The point of the head: steps on examples of label 0 raise the logit of label 1 (the same
    name direction) and lower that of label 2 (an orthogonal name); a plain Dense lowers every
    column but label 0's. Fails if the names are not used."""
    x = 1.0 + np.random.default_rng(2).normal(size=(64, 5)).astype("float32")
    moved = _moved_by_steps_on_label_0(_head(), x)
    assert moved[1] > 0.5 and moved[2] < 0.0, moved
    keras.utils.set_random_seed(0)
    plain = keras.layers.Dense(4)
    plain.build((None, 5))
    assert _moved_by_steps_on_label_0(plain, x)[1] < 0.0


def test_ghost_norms_cover_the_head_exactly():
    """The per-example step clips this head with ghost norms for its projection and span kernels
    (the names are not trained), equal to the loop's per-example norms."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(10, 4)(inp)
    head = LabelAwareHead(2, 3, spans=[1, 2])
    logits = head(h)
    head.set_label_embeddings(np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]], "float32"))
    model = keras.Model(inp, keras.layers.GlobalAveragePooling1D()(logits))
    assert_fast_norms_exact(model, ["embedding/embeddings", "label_aware_head/projection/kernel",
                                    "label_aware_head/span_logits/kernel"], k=1)


def test_a_joint_model_with_named_heads_saves_and_loads_its_names(tmp_path):
    pre = CLCPreprocessor.from_training_data(testing.TOKENS, testing.TAGS, testing.INTENTS,
                                             max_words=5, max_word_length=5)
    vectors = WordVectors(("call", "contact", "music", "phone", "genre", "medication"),
                          np.eye(6, 4, dtype="float32") + 0.1)
    model = CLCJoint.from_preprocessor(pre, **{**testing.TINY_CLC, "num_lstm_layers": 1},
                                       label_embedding_dim=4)
    unknown = name_heads(model, pre, vectors)
    assert "B-message" in unknown and "B-contact" not in unknown
    names = model.tag_head.label_embeddings.numpy()
    assert np.abs(names).sum() > 0
    x, _, _ = pre.encode(testing.TOKENS, testing.TAGS, testing.INTENTS)
    want = model(x)["tag_potentials"].numpy()
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.tag_head.label_embeddings.numpy(), names)
    np.testing.assert_allclose(loaded(x)["tag_potentials"].numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_bert_model_reads_the_names_with_its_own_encoder():
    pre = BertPreprocessor.from_training_data(testing.TOKENS, testing.TAGS, testing.INTENTS,
                                              sequence_length=12, max_words=5)
    keras.utils.set_random_seed(4)
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT, label_embedding_dim=4)
    assert name_heads(model, pre) == []
    names = model.tag_head.label_embeddings.numpy()
    labels = pre.tag_vocabulary.labels
    outside = labels.index("O")
    assert not names[outside].any()  # "O" has no name: its span score alone
    named = [i for i in range(len(labels)) if i != outside]
    np.testing.assert_allclose(np.linalg.norm(names[named], axis=1), 1.0, rtol=1e-5)
    # B-contact and I-contact share a name; B-contact and B-phone do not
    b, i, phone = (labels.index(t) for t in ("B-contact", "I-contact", "B-phone"))
    np.testing.assert_allclose(names[b], names[i], rtol=1e-5)
    assert not np.allclose(names[b], names[phone], atol=1e-3)


COMPOSED_TAGS = [["B-fromloc.city_name", "O", "B-toloc.city_name"],
                 ["B-stoploc.airport_code", "O", "O"]]


def _composed(dim: int, source: str, vectors=None):
    tokens = [["from", "x", "to"], ["via", "y", "z"]]
    pre = CLCPreprocessor.from_training_data(tokens, COMPOSED_TAGS, ["flight", "fare"],
                                             max_words=3, max_word_length=5)
    model = CLCJoint.from_preprocessor(pre, **{**testing.TINY_CLC, "num_lstm_layers": 1},
                                       label_embedding_dim=dim)
    return pre, model, name_heads(model, pre, vectors, source)


def test_name_words_give_each_word_a_dimension_and_a_composed_name_their_sum():
    """With source="words" a tag's name vector is the unit-normed count of its name's words, so
    the rare "stop location airport code" shares its "location" dimension with the frequent
    from/to types and no weight of its own; B- and I- of a type share it."""
    pre, model, unknown = _composed(10, "words")
    assert unknown == [] and model.label_names_source == "words"
    labels = pre.tag_vocabulary.labels
    names = model.tag_head.label_embeddings.numpy()
    counts, words = label_names.word_count_matrix(labels)
    np.testing.assert_allclose(names[:, :len(words)], label_names.unit_rows(counts), rtol=1e-6)
    assert not names[:, len(words):].any()  # padded to the heads' width
    fr, to, stop = (labels.index(t) for t in ("B-fromloc.city_name", "B-toloc.city_name",
                                             "B-stoploc.airport_code"))
    np.testing.assert_allclose(names[fr] @ names[to], 0.75, rtol=1e-6)  # 3 of 4 words shared
    np.testing.assert_allclose(names[fr] @ names[stop], 0.25, rtol=1e-6)  # "location"


def test_name_words_refuse_a_head_narrower_than_their_count():
    with pytest.raises(ValueError, match=r"label_head_dim=4: .* 8 distinct words.*>= 8"):
        _composed(4, "words")
    with pytest.raises(ValueError, match=r">= 9"):
        _composed(8, "vectors+words")


def test_the_width_follows_a_schema_with_more_name_words_than_asked():
    """With "words" the width is the most distinct words a head's names have when the config
    asks for fewer (the intents' 2 here, the tags' 8), and the config's when it is enough, so a
    run built with it resumes as built; the other sources keep the config's width."""
    intents, tags = ["flight", "fare"], sorted({t for row in COMPOSED_TAGS for t in row})
    assert head_width(4, "words", (intents, tags)) == 8
    assert head_width(64, "words", (intents, tags)) == 64
    assert head_width(4, "vectors", (intents, tags)) == 4
    assert head_width(4, "vectors+words", (intents, tags)) == 4
    assert head_width(0, "words", (intents, tags)) == 0  # plain heads stay plain


def test_vectors_and_words_are_each_half_of_the_name():
    vectors = WordVectors(("from", "to", "city", "location", "stop"),
                          np.eye(5, 3, dtype="float32") + 0.1)
    pre, model, _ = _composed(12, "vectors+words", vectors)
    names = model.tag_head.label_embeddings.numpy()
    labels = pre.tag_vocabulary.labels
    fr = labels.index("B-fromloc.city_name")
    # 12 = 4 vector dimensions (the table's 3, zero-padded) + 8 word dimensions
    np.testing.assert_allclose(np.linalg.norm(names[fr, :4]), np.sqrt(0.5), rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(names[fr, 4:]), np.sqrt(0.5), rtol=1e-5)
    counts, _ = label_names.word_count_matrix(labels)
    np.testing.assert_allclose(names[:, 4:] * np.sqrt(2), label_names.unit_rows(counts),
                               rtol=1e-5, atol=1e-6)


def test_a_bert_model_takes_name_words_without_reading_the_names():
    pre = BertPreprocessor.from_training_data(testing.TOKENS, testing.TAGS, testing.INTENTS,
                                              sequence_length=12, max_words=5)
    keras.utils.set_random_seed(4)
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT, label_embedding_dim=8)
    assert name_heads(model, pre, source="words") == []
    labels = pre.tag_vocabulary.labels
    counts, words = label_names.word_count_matrix(labels)
    np.testing.assert_allclose(model.tag_head.label_embeddings.numpy()[:, :len(words)],
                               label_names.unit_rows(counts), rtol=1e-6)
    x, _, _ = pre.encode(testing.TOKENS, testing.TAGS, testing.INTENTS)
    assert model(x)["tag_potentials"].shape[-1] == len(labels)


def test_the_heads_kernels_share_one_input_gram():
    """The projection, span and correction kernels read the same input: the ghost pass keeps one
    row tensor (and so one Gram over the positions) for the three, not one per kernel, which on a
    tag head over every word would triple the head's largest Gram."""
    keras.utils.set_random_seed(4)
    inp = keras.Input((6,), dtype="int32")
    head = LabelAwareHead(2, 3, spans=[1, 2], correction=True, name="shared_input_head")
    logits = head(keras.layers.Embedding(10, 4)(inp))
    model = keras.Model(inp, keras.layers.GlobalAveragePooling1D()(logits))
    variables = model.trainable_variables
    paths = [v.path for v in variables]
    layout = {}

    @tf.function(autograph=False)
    def run():
        p = microbatch.ghost_pass(model, keras.losses.MeanSquaredError(), variables,
                                  np.ones((4, 6), "int32"), np.ones((4, 2), "float32"),
                                  tf.ones([4]), 1, 1.0)
        layout.update({paths[w.index]: ia for w, (ia, _) in zip(p.plan.ghost, p.plan.layout)})
        return 0

    run()
    kernels = [f"shared_input_head/{name}/kernel"
               for name in ("projection", "span_logits", "correction")]
    assert all(k in layout for k in kernels), layout  # all three ghost-normed
    assert len({layout[k] for k in kernels}) == 1, layout
