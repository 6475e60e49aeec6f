"""Keras habits the private step keeps: output masks weight each position's loss, dropout masks
are drawn as documented per method, and adapted preprocessing declared public (a
TextVectorization inside the model) trains on one replica and on two.

With noise 0 and a clip no gradient reaches, the private update of one SGD step is
-lr * sum_i grad L_i / D (D = the batch's 16 examples): with L_i = sum_t m_it l_it / T it is
Keras' masked update, -lr * grad(sum_it m_it l_it) / valid, times valid / (D T).
"""
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import DPConfig, PrivateModel, microbatch, per_example_loss, preprocessing_split

T, VOCAB, TAGS, ROWS = 6, 9, 3, 16
SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# An update is read as weights after - before, rounded to the weights' float32 spacing (6e-8
# near 0.5): a large rate puts the updates (gradients ~1e-3) far above it.
LR = 1000.0


def _tagger(rnn: bool = False, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    ids = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 4, mask_zero=True)(ids)
    if rnn:  # Keras' default LSTM runs a while_loop: the step clips it with the loop method
        h = keras.layers.LSTM(4, return_sequences=True)(h)
    return keras.Model(ids, keras.layers.Dense(TAGS, name="tags")(h))


def _tagged(seed: int = 0):
    """Rows of 1..T real tokens then padding (id 0), tags drawn at every position: the padding
    positions' tags are noise that a masked objective must ignore."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=ROWS)
    lengths[0] = T  # one full row, so that the table's row 0 is not only padding
    ids = rng.integers(1, VOCAB, size=(ROWS, T)).astype("int32")
    ids[np.arange(T)[None, :] >= lengths[:, None]] = 0
    tags = rng.integers(0, TAGS, size=(ROWS, T)).astype("int32")
    return ids, tags, float(lengths.sum())


def _keras_update(build, x, y, loss=SCE, loss_weights=None, metrics=None):
    """Weights before, the update of one plain Keras SGD step on the whole batch, and its
    History."""
    model = build()
    before = model.get_weights()
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=loss, loss_weights=loss_weights,
                  metrics=metrics)
    history = model.fit(x, y, batch_size=ROWS, epochs=1, shuffle=False, verbose=0).history
    return before, [a - b for a, b in zip(model.get_weights(), before)], history


def _private_update(build, before, x, y, strategy=None, loss=SCE, loss_weights=None,
                    metrics=None, weighted_metrics=None, **config):
    """The update of one private step from `before`, and its History."""
    scope = strategy.scope() if strategy is not None else keras.utils.custom_object_scope({})
    with scope:
        model = build()
        model.set_weights(before)
        private = PrivateModel(model, DPConfig(l2_norm_clip=1e9, noise_multiplier=0.0, **config),
                               training_statistics=True)
        private.compile(optimizer=keras.optimizers.SGD(LR), loss=loss, loss_weights=loss_weights,
                        metrics=metrics, weighted_metrics=weighted_metrics)
    history = private.fit(x, y, batch_size=ROWS, epochs=1, shuffle=False, verbose=0).history
    if metrics:  # evaluate's compiled metrics, on the trained weights
        history["evaluated"] = private.evaluate(x, y, batch_size=ROWS, verbose=0,
                                                return_dict=True)
        history["predicted"] = model.predict(x, verbose=0)
    return [a - b for a, b in zip(model.get_weights(), before)], history


def _assert_same_update(got, want, scale):
    for g, w in zip(got, want):
        # float32 sums of at most 96 positions: relative errors ~1e-6, and an entry where terms
        # cancel carries an error relative to the variable's largest entries; 1e-4 of those
        # leaves margin, while the unmasked mean (padding tags included) moves these updates by
        # tens of percent.
        np.testing.assert_allclose(g * scale, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


@functools.cache
def _keras_tagger_update(rnn: bool):
    """Keras' reference step of the seeded tagger: the same for every private variant of it."""
    x, y, _ = _tagged()
    return _keras_update(lambda: _tagger(rnn), x, y, metrics=["accuracy"])


@pytest.mark.parametrize("microbatch_size, rnn, replicas", [(1, False, 2), (None, False, 2),
                                                             (1, True, 1)])
def test_masked_tagger_trains_on_keras_masked_objective(strategy, microbatch_size, rnn,
                                                        replicas):
    """Embedding(mask_zero=True) tagger, per-example (ghost, the default) and eDP on 2 replicas,
    and an LSTM tagger (the loop method, one replica: its trace is the slow one): the update
    is Keras' masked update times valid / (D T), and the compiled accuracy (weighted by the
    rows' weights too) is Keras' accuracy over the real positions."""
    x, y, valid = _tagged()
    build = lambda: _tagger(rnn)  # noqa: E731
    before, want, keras_history = _keras_tagger_update(rnn)
    got, history = _private_update(
        build, before, x, y, strategy if replicas == 2 else None, metrics=["accuracy"],
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="weighted_accuracy")],
        microbatch_size=microbatch_size)
    _assert_same_update(got, want, ROWS * T / valid)
    # counts of at most 96 positions: float32 ratios are exact to ~1e-7
    np.testing.assert_allclose(history["accuracy"], keras_history["accuracy"], rtol=1e-6)
    np.testing.assert_allclose(history["weighted_accuracy"], keras_history["accuracy"],
                               rtol=1e-6)
    if replicas == 1:  # on several, evaluate reports the replicas' mean of their own results
        real = x != 0
        accuracy = np.mean(np.argmax(history["predicted"], -1)[real] == y[real])
        for name in ("accuracy", "weighted_accuracy"):  # test_step reads the mask too
            np.testing.assert_allclose(history["evaluated"][name], accuracy, rtol=1e-6)


def _reference_per_example_gradients(model, x, y):
    """Each example's gradient of sum_t m_t l_t / T, the mask taken from the ids (x != 0)
    rather than from Keras' mask machinery."""
    grads = []
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            logits = model(x[i:i + 1], training=True)
            per_position = keras.losses.sparse_categorical_crossentropy(
                y[i:i + 1], logits, from_logits=True)
            loss = tf.reduce_sum(per_position * tf.cast(x[i:i + 1] != 0, tf.float32)) / T
        grads.append([tf.convert_to_tensor(g).numpy().astype(np.float64)
                      for g in tape.gradient(loss, model.trainable_variables)])
    return grads


@pytest.mark.parametrize("method, chunk", [("ghost", None), ("vectorized", None),
                                           ("loop", None), ("ghost", 4)])
def test_every_method_clips_the_masked_per_example_gradient(method, chunk):
    """The norms the clip sees and the clipped sum are those of the masked per-example losses,
    for each per-example method and for chunks (C at the median norm: half are clipped)."""
    model = _tagger()
    x, y, _ = _tagged(seed=1)
    variables = model.trainable_variables
    reference = _reference_per_example_gradients(model, x, y)
    norms = np.array([np.sqrt(sum(np.sum(g ** 2) for g in grads)) for grads in reference])
    C = float(np.median(norms))
    want = [sum(grads[k] * min(1.0, C / n) for grads, n in zip(reference, norms))
            for k in range(len(variables))]
    result, _, _ = tf.function(lambda: microbatch.clipped_gradient_sum(
        model, per_example_loss.as_per_example_loss(SCE), variables, x, y, tf.ones([ROWS]), 1, 1.0,
        (1.0,) * len(variables), C, method, chunk), autograph=False)()
    # float32 against float64 sums of 16 examples: 1e-4 relative leaves margin
    np.testing.assert_allclose(result.norms.numpy(), norms, rtol=1e-4)
    for v, got, expected in zip(variables, result.clipped_sum, want):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-7, err_msg=v.path)


def _joint(seed: int = 0) -> keras.Model:
    """A masked tag output and an unmasked intent output on one trunk."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 4, mask_zero=True)(ids)
    tags = keras.layers.Dense(TAGS, name="tags")(h)
    intent = keras.layers.Dense(2, name="intent")(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(ids, {"tags": tags, "intent": intent})


def test_dict_losses_mask_only_the_masked_output():
    """loss={name: ...}: the tag loss is masked, the intent loss is not. Keras divides the tag
    loss by the valid positions and the intent loss by the rows; the private step divides both
    by the rows (and the tags by T), so Keras' objective with the tag weight scaled by
    valid / (rows T) has the private update."""
    x, tags, valid = _tagged(seed=2)
    y = {"tags": tags, "intent": (x[:, 0] % 2).astype("int32")}
    loss = {"tags": SCE, "intent": SCE}
    weights = {"tags": 1.0, "intent": 0.5}
    before, _, _ = _keras_update(_joint, x, y, loss, weights)
    _, want, _ = _keras_update(_joint, x, y, loss, {"tags": valid / (ROWS * T), "intent": 0.5})
    got, _ = _private_update(_joint, before, x, y, loss=loss, loss_weights=weights,
                             microbatch_size=1)
    _assert_same_update(got, want, 1.0)


PUBLIC_TEXT = ["call my mother at home", "refill the order now", "what is the weather today"]
PRIVATE_TEXT = ["call my brother", "refill my order", "is the weather sunny", "call home now",
                "what is on today", "refill it", "my mother at home", "the weather now"]


def _text_classifier(length=5) -> keras.Model:
    """Sequential [string Input, TextVectorization adapted on public text, Embedding,
    GlobalAveragePooling1D, Dense]."""
    keras.utils.set_random_seed(0)
    tv = keras.layers.TextVectorization(output_sequence_length=length, name="tv")
    tv.adapt(PUBLIC_TEXT)
    return keras.Sequential([keras.Input((), dtype="string"), tv,
                             keras.layers.Embedding(tv.vocabulary_size(), 4),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])


def test_row_wise_preprocessing_is_split_off_and_its_rows_are_each_examples_own():
    """What running the preprocessing once per batch rests on: its batch output's rows are the
    rows of each example alone. TextVectorization without output_sequence_length pads to the
    batch's longest row (not row-wise), and a standardize callable of the user's may read the
    whole batch: no split."""
    texts = tf.constant(PRIVATE_TEXT)
    model = _text_classifier()
    split = preprocessing_split.preprocessing_split(model)
    assert [layer.name for layer in split.layers] == ["tv"]
    assert [v.path for v in split.rest.trainable_variables] == [
        v.path for v in model.trainable_variables]
    batch = split.layers[0](texts).numpy()
    alone = np.concatenate([split.layers[0](texts[i:i + 1]).numpy() for i in range(len(texts))])
    np.testing.assert_array_equal(batch, alone)
    np.testing.assert_array_equal(split.rest(batch).numpy(), model(texts).numpy())
    assert preprocessing_split.preprocessing_split(_text_classifier(length=None)) is None
    custom = keras.layers.TextVectorization(output_sequence_length=5, standardize=tf.strings.lower)
    custom.adapt(PUBLIC_TEXT)
    assert preprocessing_split.preprocessing_split(keras.Sequential([
        keras.Input((), dtype="string"), custom, keras.layers.Embedding(20, 4)])) is None


@pytest.mark.parametrize("method", ["ghost", "vectorized"])
def test_vectorised_methods_clip_a_string_model_as_the_loop_does(method):
    """The split model's per-example norms and clipped sum are the loop's, which runs the whole
    model one example at a time (C at the median norm: half are clipped)."""
    model = _text_classifier()
    texts = tf.constant(PRIVATE_TEXT)
    labels = tf.constant([0, 1, 2, 0, 2, 1, 0, 2])
    variables, loss = model.trainable_variables, per_example_loss.as_per_example_loss(SCE)

    def clip(method, C):
        return tf.function(lambda: microbatch.clipped_gradient_sum(
            model, loss, variables, texts, labels, tf.ones([8]), 1, 1.0, (1.0,) * 3, C,
            method), autograph=False)()[0]

    C = float(np.median(clip("loop", 1e9).norms.numpy()))
    want, got = clip("loop", C), clip(method, C)
    # float32 sums of 8 examples; ghost norms carry a proven bound of at most ~1e-6 relative
    np.testing.assert_allclose(got.norms.numpy(), want.norms.numpy(), rtol=1e-5)
    for v, a, b in zip(variables, got.clipped_sum, want.clipped_sum):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7, err_msg=v.path)


@pytest.mark.parametrize("replicas, length, method", [(1, 5, "ghost"), (2, 5, "ghost"),
                                                      (2, None, "loop")])
def test_text_vectorization_declared_public_trains(replicas, length, method):
    """A TextVectorization adapted on public text inside the model, declared public by its own
    name, trains with the default per-example method on one and two replicas (its inner
    StringLookup is covered by the declaration); without a fixed output length it is not
    row-wise, and the step clips one example at a time instead."""
    strategy = edp_tf.make_strategy(replicas)
    with strategy.scope():
        model = _text_classifier(length)
        private = PrivateModel(model, DPConfig(l2_norm_clip=1.0, noise_multiplier=0.0,
                                               microbatch_size=1), public_layers=["tv"])
        private.compile(optimizer=keras.optimizers.SGD(0.5), loss=SCE)
    before = [w.copy() for w in model.get_weights()]
    labels = np.array([0, 1, 2, 0, 2, 1, 0, 2], "int32")
    data = tf.data.Dataset.from_tensor_slices((PRIVATE_TEXT, labels)).batch(8, drop_remainder=True)
    private.fit(data, epochs=1, verbose=0)
    assert private._stages.value.clip.method == method
    # without noise, only the clipped gradients move them
    assert all(np.abs(a - b).max() > 0 for a, b in zip(model.get_weights(), before))


WIDTH = 64  # dropout mask bits per row: two independent rows agree with probability 2^-64


def _dropout_rows(method, microbatch_size, chunk=None):
    """The dropout mask of each of 8 rows in one step, read from the predictions of
    [Dropout(0.5), Dense(identity)] on rows of ones (nonzero where kept)."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dropout(0.5),
                              keras.layers.Dense(WIDTH, kernel_initializer="identity")])
    variables = model.trainable_variables
    plan = microbatch.ClipPlan(microbatch_size, float(microbatch_size or 8), (1.0,) * 2, 1.0,
                               method, chunk)
    x = tf.ones([8, WIDTH])
    step = tf.function(lambda: microbatch.gradients(
        model, lambda y, p: tf.reduce_mean(p, -1), variables, x, x, tf.ones([8]), plan).y_pred,
        autograph=False)
    return [[tuple(row) for row in (step().numpy() != 0)] for _ in range(2)]  # two steps


@pytest.mark.parametrize("method", ["ghost", "vectorized"])
def test_vectorised_methods_share_one_dropout_draw_across_micro_batches(method):
    """tf.vectorized_map draws once for the replica's step: row r of every micro-batch gets the
    same mask, the rows of one micro-batch differ, and each step draws anew; with chunks, once
    per chunk. (Two independent rows agree with probability 2^-64.)"""
    first, second = _dropout_rows(method, 1)
    assert len(set(first)) == 1 and first != second
    pairs = _dropout_rows(method, 2)[0]
    assert pairs[0] != pairs[1] and pairs[0::2] == [pairs[0]] * 4 and pairs[1::2] == [pairs[1]] * 4
    chunks = _dropout_rows(method, 1, chunk=4)[0]
    assert chunks[:4] == [chunks[0]] * 4 and chunks[4:] == [chunks[4]] * 4
    assert chunks[0] != chunks[4]


@pytest.mark.parametrize("method, microbatch_size", [("loop", 1), ("ghost", None)])
def test_loop_and_edp_draw_a_dropout_mask_per_example(method, microbatch_size):
    """The loop draws per micro-batch and eDP's one pass per row, as plain Keras does."""
    first, second = _dropout_rows(method, microbatch_size)
    assert len(set(first)) == 8 and first != second


def test_replicas_draw_the_same_dropout_masks_as_in_plain_keras():
    """Keras' seed state is one mirrored variable: under a MirroredStrategy every replica draws
    the same masks for its rows, in plain Keras as in the private step."""
    strategy = edp_tf.make_strategy(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dropout(0.5)])
    masks = strategy.run(tf.function(lambda: model(tf.ones([2, WIDTH]), training=True) != 0,
                                     autograph=False))
    one, two = strategy.experimental_local_results(masks)
    np.testing.assert_array_equal(one.numpy(), two.numpy())
    assert not np.array_equal(one.numpy()[0], one.numpy()[1])


def test_help_says_what_the_step_does_with_masks_dropout_and_preprocessing():
    doc = PrivateModel.__doc__
    assert "Embedding(mask_zero=True)" in doc and "valid / (B T)" in doc
    assert "Dropout" in doc and "per_example_method=\"loop\"" in doc
    assert "TextVectorization" in doc and "public_layers" in doc
