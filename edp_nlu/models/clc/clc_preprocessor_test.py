import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models import testing
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor, split_words
from edp_nlu.models.clc.word_vectors import WordVectors


@pytest.fixture(scope="module")
def pre():
    return CLCPreprocessor.from_training_data(
        testing.TOKENS, testing.TAGS, testing.INTENTS, max_words=6, max_word_length=5
    )


def test_encode_shapes_labels_and_report(pre):
    x, y, report = pre.encode(testing.TOKENS, testing.TAGS, testing.INTENTS)
    assert x["word_ids"].shape == (8, 6) and x["char_ids"].shape == (8, 6, 5)
    assert x["word_ids"].dtype == np.int32
    assert report.truncated_utterances == 0 and report.unknown_words == 0
    # padding words are 0, real words are not
    lengths = [len(t) for t in testing.TOKENS]
    assert np.array_equal((x["word_ids"] > 0).sum(axis=1), lengths)
    assert [pre.tag_vocabulary.labels[i] for i in y["tags"][2, :5]] == testing.TAGS[2]
    assert pre.intent_vocabulary.labels[y["intent"][6]] == "message"


def test_unknown_words_chars_truncation_and_empty_are_counted(pre):
    tokens = [["Call", "zebra", "☃x"], [], ["a"] * 9]
    x, y, report = pre.encode(
        tokens, [["O", "B-new", "O"], [], ["O"] * 9], ["call", "nope", "call"]
    )
    assert x["word_ids"][0, 0] > 1  # "Call" is looked up lower-cased
    assert x["word_ids"][0, 1] == 1 and x["word_ids"][0, 2] == 1  # OOV words
    assert x["char_ids"][0, 2, 0] == 1  # unseen character
    assert np.all(x["word_ids"][1] == 0)  # empty utterance: all padding
    assert report.truncated_utterances == 1 and report.truncated_words == 3
    assert report.unknown_tags == 1 and report.unknown_intents == 1
    assert y["tags"].shape == (3, 6)


def test_words_lower_cased_but_characters_keep_case(pre):
    x, _, _ = pre.encode([["Call"], ["call"]])
    assert x["word_ids"][0, 0] == x["word_ids"][1, 0] > 1
    assert x["char_ids"][0, 0, 0] != x["char_ids"][1, 0, 0]
    np.testing.assert_array_equal(x["char_ids"][0, 0, 1:], x["char_ids"][1, 0, 1:])


def test_long_words_are_cut_to_max_word_length(pre):
    x, _, _ = pre.encode([["prescription"]])
    assert np.all(x["char_ids"][0, 0] > 0)  # 12 characters fill all 5 slots


def test_serving_split_matches_python_split():
    texts = ["  call\tmum\u00a0now \u2003 ok\n", "", "one"]
    got = [[w.decode() for w in row] for row in split_words(tf.constant(texts)).to_list()]
    assert got == [t.split() for t in texts]


def test_public_vocabulary_from_vectors():
    vectors = WordVectors(("The", "call", "the"), np.zeros((3, 2), np.float32))
    pre = CLCPreprocessor.from_word_vectors(vectors, testing.TAGS, testing.INTENTS)
    assert pre.word_vocabulary == ["[PAD]", "[UNK]", "the", "call"]
    assert not pre.vocabulary_from_training_data
    assert "Z" in pre.char_vocabulary  # printable ASCII is always covered


def test_bad_sizes_rejected():
    with pytest.raises(ValueError, match="max_words"):
        CLCPreprocessor.from_training_data(
            testing.TOKENS, testing.TAGS, testing.INTENTS, max_words=0
        )
