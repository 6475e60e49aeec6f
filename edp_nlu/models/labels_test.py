import pytest

from edp_nlu.models import labels
from edp_nlu.models.labels import bio_transitions


def test_tag_vocabulary_reserves_o_and_sorts():
    vocab = labels.build_tag_vocabulary([["B-x", "O"], ["I-x", "B-a"]])
    assert vocab.labels == ("O", "B-a", "B-x", "I-x")
    assert vocab.id("B-x") == 2 and vocab.id("B-unseen") == 0


def test_tag_vocabulary_rejects_non_bio():
    with pytest.raises(ValueError, match="not BIO"):
        labels.build_tag_vocabulary([["O", "PER"]])


def test_intent_vocabulary_reserves_unknown():
    vocab = labels.build_intent_vocabulary(["b", "a", "b"])
    assert vocab.labels == ("[UNK]", "a", "b")
    assert vocab.id("zzz") == 0


def test_encode_labels_counts_unknowns():
    report = labels.EncodingReport()
    tags = labels.build_tag_vocabulary([["O", "B-x"]])
    intents = labels.build_intent_vocabulary(["a"])
    tag_ids, intent_ids = labels.encode_labels([["B-x", "B-y"]], ["a", "c"], tags, intents, report)
    assert tag_ids == [[1, 0]] and intent_ids == [1, 0]
    assert report.unknown_tags == 1 and report.unknown_intents == 1


def test_check_lengths_names_the_utterance():
    with pytest.raises(ValueError, match="utterance 1: 2 tokens but 1 tags"):
        labels.check_lengths([["a"], ["b", "c"]], [["O"], ["O"]], None)
    with pytest.raises(ValueError, match="split it first"):
        labels.check_lengths(["a b"], None, None)


def test_label_vocabularies_accept_a_trainers_label_lists():
    overrides = {"tag_vocabulary": ["O", "B-x"], "intent_vocabulary": ("<unknown_intent>", "a")}
    tags, intents = labels.label_vocabularies([["O"]], ["b"], overrides)
    assert tags.labels == ("O", "B-x") and intents.unknown == "<unknown_intent>"
    assert overrides == {}


def test_duplicate_labels_rejected():
    with pytest.raises(ValueError, match="unique"):
        labels.LabelVocabulary(("O", "O"))


def test_bio_transitions_allow_i_only_after_its_own_b_or_i():
    tags = ("O", "B-a", "I-a", "B-b", "I-b")
    start, allowed = bio_transitions(tags)
    assert start == [True, True, False, True, False]
    for i, before in enumerate(tags):
        for j, after in enumerate(tags):
            want = not after.startswith("I-") or before in (f"B-{after[2:]}", after)
            assert allowed[i][j] == want, (before, after)
    with pytest.raises(ValueError, match="'X-a' is not BIO"):
        bio_transitions(("O", "X-a"))
    with pytest.raises(ValueError, match="'B-' is not BIO"):
        bio_transitions(("O", "B-"))
