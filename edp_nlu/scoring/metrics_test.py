"""Metrics against hand-worked examples (the arithmetic is in the comments)."""
import random

import pytest
from seqeval.metrics.sequence_labeling import get_entities

from edp_nlu.data.corpus import Utterance
from edp_nlu.scoring import metrics


def test_slot_spans_bio_and_lenient_conll_chunks():
    assert metrics.slot_spans(["O", "B-name", "I-name", "O", "B-time"]) == [
        ("name", 1, 3), ("time", 4, 5)]
    # Adjacent B- tags are two slots; I- after O or after another type starts a chunk (CoNLL).
    assert metrics.slot_spans(["B-a", "B-a", "O", "I-b", "I-a"]) == [
        ("a", 0, 1), ("a", 1, 2), ("b", 3, 4), ("a", 4, 5)]
    assert metrics.slot_spans([]) == []
    with pytest.raises(ValueError, match="'PAD' at position 1"):
        metrics.slot_spans(["O", "PAD"])
    with pytest.raises(ValueError, match="'B-'"):
        metrics.slot_spans(["B-"])


def test_slot_spans_agree_with_seqeval_chunking():
    # SER and slot F1 must see the same slots: compare on 2000 random, often ill-formed, sequences.
    rng = random.Random(0)
    tags = ["O", "B-a", "I-a", "B-b", "I-b"]
    for _ in range(2000):
        sequence = [rng.choice(tags) for _ in range(rng.randrange(0, 9))]
        ours = [(t, start, end - 1) for t, start, end in metrics.slot_spans(sequence)]
        assert ours == get_entities(sequence), sequence


def test_slot_precision_recall_f1_are_seqeval_s():
    # 300 random corpora of up to 6 often ill-formed sequences (empty ones too: zero division)
    from seqeval import metrics as seqeval_metrics

    rng = random.Random(1)
    tags = ["O", "B-a", "I-a", "B-b", "I-b"]

    def corpus(size):
        return [[rng.choice(tags) for _ in range(n)] for n in size]

    for _ in range(300):
        lengths = [rng.randrange(0, 7) for _ in range(rng.randrange(1, 7))]
        ref, hyp = corpus(lengths), corpus(lengths)
        expected = (seqeval_metrics.precision_score(ref, hyp, zero_division=0),
                    seqeval_metrics.recall_score(ref, hyp, zero_division=0),
                    seqeval_metrics.f1_score(ref, hyp, zero_division=0))
        assert metrics.slot_prf(ref, hyp) == pytest.approx(expected, abs=1e-12), (ref, hyp)
        ours = metrics.evaluate(["x"] * len(ref), ref, ["x"] * len(hyp), hyp)
        assert (ours["slot_precision"], ours["slot_recall"], ours["slot_f1"]) == pytest.approx(
            expected, abs=1e-12)


@pytest.mark.parametrize("reference, hypothesis, expected", [
    ([("a", 0, 2)], [("a", 0, 2)], (0, 0, 0)),                  # exact match
    ([("a", 0, 2)], [("b", 0, 2)], (1, 0, 0)),                  # same span, other type
    ([("a", 0, 2)], [("a", 1, 3)], (1, 0, 0)),                  # same type, overlapping span
    ([("a", 0, 2)], [("b", 1, 3)], (0, 1, 1)),                  # both wrong: deletion + insertion
    ([("a", 0, 2)], [("a", 2, 3)], (0, 1, 1)),                  # adjacent is not overlapping
    ([("a", 0, 1), ("b", 2, 3)], [], (0, 2, 0)),                # missed slots
    ([], [("a", 0, 1), ("a", 3, 4)], (0, 0, 2)),                # invented slots
    # One long hypothesis overlapping two references of its type: it pairs with the first only.
    ([("a", 0, 1), ("a", 2, 3)], [("a", 0, 3)], (1, 1, 0)),
    # One long reference overlapping two hypotheses of its type: it pairs with the first.
    ([("a", 0, 4)], [("a", 0, 1), ("a", 2, 3)], (1, 0, 1)),
    # Several slots at once: exact, type error, boundary error, miss, invention.
    ([("a", 0, 1), ("b", 2, 3), ("c", 4, 6), ("d", 7, 8)],
     [("a", 0, 1), ("c", 2, 3), ("c", 5, 6), ("e", 9, 10)], (2, 1, 1)),
])
def test_slot_errors_rule(reference, hypothesis, expected):
    errors = metrics.slot_errors(reference, hypothesis)
    assert (errors.substitutions, errors.deletions, errors.insertions) == expected


# Four utterances, worked by hand:
#  1. slots: name [1,3) vs hyp name [1,2) -> substitution (boundary); time exact. Intent right.
#  2. city [2,3) vs hyp date [2,3) -> substitution (type); ref date [3,4) -> deletion. Intent wrong.
#  3. no reference slot, hyp time [0,1) -> insertion. Intent right.
#  4. everything right.
# Errors: 2 substitutions + 1 deletion + 1 insertion + 1 intent = 5, over 5 reference slots
# + 4 utterances -> SER 5/9. Intent accuracy 3/4. Sentence accuracy 1/4 (only 4 is all right).
# seqeval: reference slots 5, predicted 5 (name[1], time[4,5], date[2], time[0], title[1,2]),
# correct 2 (time in 1, title in 4): precision 2/5, recall 2/5, F1 2/5.
REF_INTENTS = ["call", "weather", "alarm", "play"]
REF_TAGS = [["O", "B-name", "I-name", "O", "B-time", "I-time"],
            ["O", "O", "B-city", "B-date"],
            ["O", "O"],
            ["O", "B-title", "I-title"]]
HYP_INTENTS = ["call", "alarm", "alarm", "play"]
HYP_TAGS = [["O", "B-name", "O", "O", "B-time", "I-time"],
            ["O", "O", "B-date", "O"],
            ["B-time", "O"],
            ["O", "B-title", "I-title"]]


def test_evaluate_hand_worked_example():
    result = metrics.evaluate(REF_INTENTS, REF_TAGS, HYP_INTENTS, HYP_TAGS)
    assert result["ser"] == pytest.approx(5 / 9)
    assert result["intent_accuracy"] == pytest.approx(3 / 4)
    assert result["sentence_accuracy"] == pytest.approx(1 / 4)
    assert result["slot_precision"] == pytest.approx(2 / 5)
    assert result["slot_recall"] == pytest.approx(2 / 5)
    assert result["slot_f1"] == pytest.approx(2 / 5)
    assert (result["slot_substitutions"], result["slot_deletions"], result["slot_insertions"],
            result["intent_errors"], result["reference_slots"], result["utterances"]) == (
        2, 1, 1, 1, 5, 4)


def test_individual_metric_functions_match_evaluate():
    assert metrics.semantic_error_rate(REF_INTENTS, REF_TAGS, HYP_INTENTS, HYP_TAGS) == \
        pytest.approx(5 / 9)
    assert metrics.intent_accuracy(REF_INTENTS, HYP_INTENTS) == pytest.approx(3 / 4)
    assert metrics.sentence_accuracy(REF_INTENTS, REF_TAGS, HYP_INTENTS, HYP_TAGS) == \
        pytest.approx(1 / 4)
    assert metrics.slot_prf(REF_TAGS, HYP_TAGS) == pytest.approx((0.4, 0.4, 0.4))
    references = [Utterance(tuple("x" * len(t)), tuple(t), i)
                  for i, t in zip(REF_INTENTS, REF_TAGS)]
    assert metrics.evaluate_utterances(references, HYP_INTENTS, HYP_TAGS) == \
        metrics.evaluate(REF_INTENTS, REF_TAGS, HYP_INTENTS, HYP_TAGS)


def test_perfect_and_lenient_predictions():
    perfect = metrics.evaluate(REF_INTENTS, REF_TAGS, REF_INTENTS, REF_TAGS)
    assert perfect["ser"] == 0 and perfect["slot_f1"] == 1 and perfect["sentence_accuracy"] == 1
    # An ill-formed prediction (I-city after O) still finds the city slot under CoNLL chunking,
    # but the sentence is not exactly right.
    lenient = metrics.evaluate(["w"], [["O", "B-city"]], ["w"], [["O", "I-city"]])
    assert lenient["ser"] == 0 and lenient["slot_f1"] == 1 and lenient["sentence_accuracy"] == 0


def test_ser_can_exceed_one_with_many_insertions():
    # 0 reference slots + 1 utterance; 3 inserted slots + 1 intent error -> SER 4.
    result = metrics.evaluate(["a"], [["O", "O", "O"]], ["b"], [["B-x", "B-y", "B-z"]])
    assert result["ser"] == pytest.approx(4.0)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="lengths"):
        metrics.evaluate(["a"], [["O"]], ["a", "b"], [["O"]])
    with pytest.raises(ValueError, match="utterance 1: ref_tags has 2 tags, hyp_tags has 1"):
        metrics.evaluate(["a", "b"], [["O"], ["O", "O"]], ["a", "b"], [["O"], ["O"]])
    with pytest.raises(ValueError, match="no utterances"):
        metrics.evaluate([], [], [], [])
    with pytest.raises(ValueError, match="'UNK'"):
        metrics.evaluate(["a"], [["O"]], ["a"], [["UNK"]])
    with pytest.raises(ValueError):
        metrics.intent_accuracy(["a"], [])
