"""BertJoint cuts its word pieces in a private step without changing it (edp_tf/padding.py)."""
import keras
import numpy as np
import tensorflow as tf

from edp_nlu.models import testing
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_tf import microbatch, padding


def test_cut_pieces_give_the_padded_step():
    pre = BertPreprocessor.from_training_data(testing.TOKENS, testing.TAGS, testing.INTENTS,
                                              vocabulary_size=80, sequence_length=24)
    model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    x, y, _ = pre.encode(testing.TOKENS, testing.TAGS, testing.INTENTS)
    lengths = x["padding_mask"].sum(1)
    assert lengths.max() < 24  # even the longest row has padding to cut
    w = np.ones(len(lengths), np.float32)
    variables = model.trainable_variables
    spec = ({name: tf.TensorSpec(v.shape, v.dtype) for name, v in x.items()},)

    def step(cuts):
        model.cuts_padding = cuts

        @tf.function(autograph=False, input_signature=spec)
        def run(xx):
            cut = padding.cut(model, xx)["token_ids"]
            # eDP's one micro-batch in chunks of 3 rows, sorted: the BERT model's cut under the
            # library's sorting, at a fraction of a per-example trace (the library's tests
            # cover per-example grouping on a small model)
            result, losses, y_pred = microbatch.clipped_gradient_sum(
                model, model.per_example_loss, variables, xx, y, w, None, float(len(w)),
                [1.0] * len(variables), 1.0, "ghost", 3)
            return tf.shape(cut)[1], result.clipped_sum, result.norms, losses, y_pred

        return [tf.nest.map_structure(lambda t: t.numpy(), o) for o in run(x)]

    padded, cut = step(False), step(True)
    assert padded[0] == 24 and cut[0] == lengths.max()
    # float32 sums of the same terms in another order (fewer masked positions): rounding only
    for a, b in zip(padded[1], cut[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    for a, b in zip(tf.nest.flatten(padded[2:]), tf.nest.flatten(cut[2:])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_plain_step_on_cut_pieces_trains_the_same_weights():
    pre = BertPreprocessor.from_training_data(testing.TOKENS, testing.TAGS, testing.INTENTS,
                                              vocabulary_size=80, sequence_length=24)
    x, y, _ = pre.encode(testing.TOKENS, testing.TAGS, testing.INTENTS)
    trained, seen = [], []
    for cuts in (False, True):
        keras.utils.set_random_seed(7)  # the same initial weights in both models
        model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
        model.cuts_padding = cuts
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=model.per_example_loss)
        original = model.encoder.call

        def call(inputs, *args, original=original, **kwargs):  # the pieces each trace saw
            seen.append((cuts, inputs["token_ids"].shape[1]))
            return original(inputs, *args, **kwargs)

        model.encoder.call = call
        model.train_on_batch(x, y)
        trained.append([v.numpy() for v in model.trainable_variables])
    assert {s for c, s in seen if not c} == {24} and {s for c, s in seen if c} == {None}
    for a, b in zip(*trained):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
