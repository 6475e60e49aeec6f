"""The CLC backbone on its own: the backward LSTM reads the later words of padded utterances,
the character CNN's windows are 'same' convolution windows, and bad sizes are refused by name
(the joint model built on it is clc_joint_test.py's)."""
import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models import testing
from edp_nlu.models.clc.clc_backbone import CLCBackbone, _char_windows
from edp_nlu.models.clc.clc_joint import CLCJoint
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor


@pytest.fixture(scope="module")
def data():
    return testing.encoded(CLCPreprocessor, max_words=6, max_word_length=5)


@pytest.mark.parametrize("unroll", [True, False])
def test_the_backward_direction_reads_the_later_words_of_a_padded_utterance(data, unroll):
    """Each word's backward LSTM features depend on the words after it, also in utterances
    shorter than max_words (Keras' unrolled go_backwards zeroing made them all zero), and the
    padded positions are zero in both directions."""
    pre, x, _ = data
    backbone = CLCJoint.from_preprocessor(  # one layer: its forward half sees earlier words only
        pre, unroll=unroll, num_lstm_layers=1, **testing.TINY_CLC).backbone
    row = 0  # "call mum at 0123": 4 of 6 words
    changed = {k: np.array(v) for k, v in x.items()}
    changed["word_ids"][row, 3] = changed["word_ids"][1, 0]
    changed["char_ids"][row, 3] = changed["char_ids"][1, 0]
    units = testing.TINY_CLC["lstm_units"]
    before = backbone(x)["sequence_output"].numpy()[row]
    after = backbone(changed)["sequence_output"].numpy()[row]
    # every word before the changed one: some backward feature is non-zero and changes
    assert np.abs(before[:3, units:] - after[:3, units:]).max(axis=1).min() > 0
    assert np.abs(before[:4, units:]).max(axis=1).min() > 0
    np.testing.assert_array_equal(before[:3, :units], after[:3, :units])
    np.testing.assert_array_equal(before[4:], 0.0)


def test_rejects_mismatched_embeddings(data):
    pre, _, _ = data
    vectors_matrix = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="word_embeddings has 3 rows"):
        CLCBackbone(word_vocabulary_size=10, char_vocabulary_size=5, word_embeddings=vectors_matrix)


@pytest.mark.parametrize("kernel_size", [1, 3, 4])
def test_char_windows_are_zero_padded_same_convolution_windows(kernel_size):
    """The character CNN is a Dense layer on these windows: entry [.., e, i * d + j] must be
    character e + i - left's feature j, zero outside the word ('same' padding)."""
    chars = np.random.default_rng(0).normal(size=(2, 3, 5, 4)).astype(np.float32)
    left = (kernel_size - 1) // 2
    padded = np.pad(chars, [(0, 0), (0, 0), (left, kernel_size - 1 - left), (0, 0)])
    want = np.concatenate([padded[:, :, i:i + 5, :] for i in range(kernel_size)], axis=-1)
    np.testing.assert_array_equal(_char_windows(tf.constant(chars), kernel_size).numpy(), want)


@pytest.mark.parametrize("name", ["word_vocabulary_size", "char_vocabulary_size", "max_words",
                                  "max_word_length", "lstm_units", "num_lstm_layers"])
def test_sizes_below_one_are_refused_by_name(name):
    sizes = dict(word_vocabulary_size=10, char_vocabulary_size=5, max_words=4, max_word_length=3,
                 lstm_units=2, num_lstm_layers=1)
    with pytest.raises(ValueError, match=f"CLCBackbone {name} must be >= 1, got 0"):
        CLCBackbone(**dict(sizes, **{name: 0}))


def test_outputs_are_zero_at_padding_and_pooled_over_real_words(data):
    """The intent head reads the max over real words only; padded positions stay zero."""
    pre, x, _ = data
    sizes = {k: v for k, v in testing.TINY_CLC.items() if k != "head_dropout"}
    backbone = CLCBackbone(len(pre.word_vocabulary), len(pre.char_vocabulary), max_words=6,
                           max_word_length=5, **sizes)
    out = {k: v.numpy() for k, v in backbone(x).items()}
    real = x["word_ids"] > 0
    np.testing.assert_array_equal(out["word_mask"], real)
    assert out["sequence_output"].shape == (8, 6, 2 * testing.TINY_CLC["lstm_units"])
    np.testing.assert_array_equal(out["sequence_output"][~real], 0.0)
    want = np.stack([out["sequence_output"][b][real[b]].max(axis=0) for b in range(8)])
    np.testing.assert_array_equal(out["pooled_output"], want)
