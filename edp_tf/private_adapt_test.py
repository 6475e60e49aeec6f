"""A Normalization adapted with DP: the statistics from a Gaussian query of the stated noise,
charged to the ledger once, and the model trains privately with it."""
import keras
import numpy as np
import pytest

import edp_tf
from edp_tf import private_adapt

N_EX, BATCH, TARGET = 600, 60, 4.0


def _model():
    norm = keras.layers.Normalization(name="norm")
    model = keras.Sequential([keras.Input((3,)), norm, keras.layers.Dense(2)])
    return model, norm


def test_the_released_statistics_carry_exactly_the_stated_noise():
    """400 adaptations of the same 10 rows: the mean's spread is z x sensitivity / n. Its
    sample std over 400 draws has a relative standard error of 1/sqrt(800) = 3.5%, so 15% is
    over 4 of them; noise left out, or scaled by the wrong sensitivity, misses it by far."""
    x = np.random.default_rng(0).normal(size=(10, 1))
    norm = keras.layers.Normalization(name="norm")  # built by the adaptation, for 1 feature
    adapt = private_adapt.PrivateNormalization(norm, -5.0, 5.0, noise_multiplier=0.1)
    rng = np.random.default_rng(1)
    means = []
    for _ in range(400):
        adapt.adapt(x, rng=rng)
        means.append(float(norm.adapt_mean.numpy()[0]))
    want = 0.1 * adapt.sensitivity(1) / 10
    assert np.std(means) == pytest.approx(want, rel=0.15)
    assert abs(np.mean(means) - x.mean()) < 5 * want / np.sqrt(400)


def test_large_data_gets_its_statistics_back():
    x = np.random.default_rng(2).normal(3.0, 2.0, size=(100_000, 3))
    _, norm = _model()
    event = private_adapt.PrivateNormalization(norm, -10.0, 10.0, 1.0).adapt(x)
    # noise std on the mean: z sqrt(d (m^2 + m^4)) / n = 174 / 1e5 = 0.0017; on E[x^2] the same
    np.testing.assert_allclose(norm.adapt_mean.numpy(), 3.0, atol=0.03)
    np.testing.assert_allclose(norm.adapt_variance.numpy(), 4.0, atol=0.15)
    assert (event.name, event.noise_multiplier, event.sampling_rate) == (
        "normalization_adapt:norm", 1.0, None)


def test_make_private_adapts_charges_once_and_trains():
    rng = np.random.default_rng(3)
    x = rng.normal(5.0, 2.0, size=(N_EX, 3)).astype("float32")
    y = (x[:, 0] > 5.0).astype("int32")
    model, norm = _model()
    with pytest.raises(ValueError, match="'norm' \\(Normalization\\)"):  # not adapted: refused
        _fit(edp_tf.make_private(model, target_epsilon=TARGET, epochs=2, batch_size=BATCH), x, y)
    model, norm = _model()
    private = edp_tf.make_private(model, target_epsilon=TARGET, epochs=2, batch_size=BATCH,
                                  private_adapt=[edp_tf.PrivateNormalization(norm, -10, 10, 1.0)])
    _fit(private, x, y, epochs=1)
    # the mean's noise std: 1 x 174 / 600 = 0.29, so 1.5 is 5 of them
    adapted = norm.adapt_mean.numpy().copy()
    assert abs(float(adapted[0]) - 5.0) < 1.5
    names = [e["name"] for e in private.privacy_statement()["extra_events"]]
    assert names == ["normalization_adapt:norm"]
    _fit(private, x, y)  # the planned epoch left: no second adaptation, no second charge
    np.testing.assert_array_equal(norm.adapt_mean.numpy(), adapted)
    statement = private.privacy_statement()
    assert [e["name"] for e in statement["extra_events"]] == names and statement["private"]
    assert TARGET * 0.97 <= statement["epsilon"] <= TARGET  # the steps' noise made room for it


def test_a_layer_not_on_the_models_input_is_refused_in_one_line():
    inputs = keras.Input((3,))
    norm = keras.layers.Normalization(name="inner")
    model = keras.Model(inputs, keras.layers.Dense(2)(norm(keras.layers.Dense(3)(inputs))))
    with pytest.raises(ValueError, match="'inner' must be applied to the model's input"):
        edp_tf.make_private(model, target_epsilon=TARGET, epochs=1, batch_size=BATCH,
                            private_adapt=[edp_tf.PrivateNormalization(norm, -1, 1)])
    with pytest.raises(ValueError, match="low < high"):
        edp_tf.PrivateNormalization(norm, 1, -1)


def test_a_vocabulary_selected_with_dp_keeps_the_common_words_and_not_a_secret_one():
    """500 utterances of common words and one with a secret: with sigma 5 and the threshold
    of delta/10, a word in 100 utterances is kept with probability ~1, the secret (in 1) with
    probability below the threshold's delta. The release is charged with the delta it spends."""
    rng = np.random.default_rng(4)
    words = ["call", "my", "mother", "play", "some", "music"]
    texts = [" ".join(rng.choice(words, 3)) for _ in range(499)] + ["refill zyprexa now"]
    labels = np.array([t.startswith("call") for t in texts], "int32")
    text = keras.layers.TextVectorization(max_tokens=50, output_sequence_length=4, name="tv")
    inputs = keras.Input((), dtype="string")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 4)(text(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(2)(pooled))
    private = edp_tf.make_private(model, target_epsilon=TARGET, epochs=1, batch_size=50,
                                  private_adapt=[edp_tf.PrivateVocabulary(text)])
    _fit(private, np.array(texts), labels)
    vocabulary = text.get_vocabulary()
    assert set(words) <= set(vocabulary) and "zyprexa" not in vocabulary
    (event,) = private.privacy_statement()["extra_events"]
    assert event["name"] == "vocabulary_selection:tv" and event["delta"] > 0
    assert private.privacy_statement()["private"] is True and private.epsilon <= TARGET


def _fit(private, x, y, epochs=None):
    private.compile(keras.optimizers.SGD(0.1),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    private.fit(x, y, epochs=epochs, verbose=0)
