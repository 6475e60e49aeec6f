"""One contract per component kind, run on every model family (keras-hub's habit): what the
pipeline, the private step and the export rely on of a preprocessor, a backbone and a task,
stated once and checked on CLC and BERT alike. A new family joins `FAMILIES`; what is particular
to one family stays in its own tests (edp_nlu/models/clc, edp_nlu/models/bert)."""
import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models import testing
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_nlu.models.clc.clc_joint import CLCJoint
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor


@dataclasses.dataclass(frozen=True)
class Family:
    preprocessor: type
    preprocessor_sizes: dict
    task: type
    task_sizes: dict
    real_words: str  # the input whose non-zero entries are the real words


FAMILIES = {
    "clc": Family(CLCPreprocessor, dict(max_words=6, max_word_length=5), CLCJoint,
                  testing.TINY_CLC, "word_ids"),
    "bert": Family(BertPreprocessor, dict(vocabulary_size=80, sequence_length=12), BertJoint,
                   testing.TINY_BERT, "word_starts"),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    spec = FAMILIES[request.param]
    pre, x, y = testing.encoded(spec.preprocessor, **spec.preprocessor_sizes)
    return request.param, spec, pre, x, y


def _task(spec, pre):
    keras.utils.set_random_seed(0)
    return spec.task.from_preprocessor(pre, **spec.task_sizes)


# ------------------------------------------------------------------ preprocessor


def test_preprocessor_config_round_trip(family):
    _, spec, pre, _, _ = family
    clone = spec.preprocessor.from_config(pre.get_config())
    assert clone.get_config() == pre.get_config()
    assert clone.vocabulary_from_training_data == pre.vocabulary_from_training_data
    want, _, _ = pre.encode(testing.TOKENS)
    got, _, _ = clone.encode(testing.TOKENS)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_preprocessor_reads_raw_strings_as_their_split_tokens(family):
    """Serving takes strings; training takes token lists: the same arrays, whitespace of any
    kind and empty utterances included (SNIPS has irregular whitespace)."""
    _, _, pre, _, _ = family
    texts = ["call  mum\tat 0123-456", "", "Café ☃", " play\u00a0jazz \u2003 now\n"]
    from_strings = pre(tf.constant(texts))
    from_tokens, _, _ = pre.encode([t.split() for t in texts])
    for key, value in from_tokens.items():
        np.testing.assert_array_equal(value, from_strings[key].numpy(), err_msg=key)


# ------------------------------------------------------------------ backbone


def test_backbone_gives_words_states_an_utterance_state_and_the_word_mask(family):
    _, spec, pre, x, _ = family
    encoder = _task(spec, pre).encoder
    out = encoder({name: x[name] for name in encoder.input})
    words = x[spec.real_words].shape[1]
    hidden = out["sequence_output"].shape[-1]
    assert out["sequence_output"].shape == (8, words, hidden)
    assert out["pooled_output"].shape == (8, hidden)
    np.testing.assert_array_equal(np.asarray(out["word_mask"]), x[spec.real_words] > 0)


# ------------------------------------------------------------------ task


def test_task_trains_and_reduces_loss(family):
    _, spec, pre, x, y = family
    model = _task(spec, pre)
    out = model(x)
    words = x[spec.real_words].shape[1]
    assert out["intent_logits"].shape == (8, len(pre.intent_vocabulary))
    assert out["tag_potentials"].shape == (8, words, len(pre.tag_vocabulary))
    np.testing.assert_array_equal(out["tag_mask"].numpy(), x[spec.real_words] > 0)
    assert model.per_example_loss(y, out).shape == (8,)
    model.compile(optimizer=keras.optimizers.Adam(0.02))
    before = float(tf.reduce_mean(model.per_example_loss(y, model(x))))
    model.fit(x, y, batch_size=8, epochs=15, verbose=0)
    after = float(tf.reduce_mean(model.per_example_loss(y, model(x))))
    assert after < 0.7 * before, (before, after)
    assert model.predict_labels(x)["tag_ids"].shape == (8, words)


def test_task_per_example_gradients_vectorise_without_fallback(family):
    """The private path: each example's gradient inside tf.vectorized_map (pfor, no while_loop
    fallback) equals that example's gradient computed alone. BERT's plain vectorised gradients
    need oneDNN off (edp_nlu.models.testing.onednn_enabled): that case reruns itself in a fresh
    process, since the crash would take pytest down with it."""
    name, spec, pre, x, y = family
    if name == "bert" and testing.onednn_enabled():
        testing.rerun_without_onednn(
            __file__, "test_task_per_example_gradients_vectorise_without_fallback[bert]")
        return
    model = _task(spec, pre)
    variables = [v.value for v in model.trainable_variables]

    def one(args):
        xi, yi = tf.nest.map_structure(lambda t: t[None], args)
        with tf.GradientTape() as tape:
            loss = model.per_example_loss(yi, model(xi, training=True))[0]
        grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(g) for g in grads]

    stacked = tf.function(
        lambda x, y: tf.vectorized_map(one, (x, y), fallback_to_while_loop=False),
        autograph=False)(x, y)
    for i in (0, 5):
        single = one(tf.nest.map_structure(lambda t: t[i], (x, y)))
        for got, want in zip(stacked, single):
            # float32 sums in a different order: 1e-5 relative to the gradient scale
            np.testing.assert_allclose(
                got[i].numpy(), want.numpy(), atol=1e-5 * (1 + np.abs(want).max()))


def test_task_config_round_trip_keeps_outputs_and_bio_decoding(family):
    _, spec, pre, x, _ = family
    model = _task(spec, pre)
    clone = spec.task.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    for key in ("intent_logits", "tag_potentials"):
        np.testing.assert_allclose(clone(x)[key], model(x)[key], atol=1e-6, err_msg=key)
    assert clone.tag_labels == pre.tag_vocabulary.labels and clone.decoding == "bio"
    assert clone.crf.allowed_transitions == model.crf.allowed_transitions
