"""Per-class scores against hand-worked examples, the frequency buckets and the list of lost
classes (`edp_nlu.evaluate --per_class` on tiny runs is tests/per_class_test.py's)."""
import pytest

from edp_nlu.scoring import metrics
from edp_nlu.scoring import per_class as pc
from edp_nlu.scoring.per_class import INTENT, SLOT, ClassScore

# Five utterances, worked by hand (spans are (type, start, end exclusive), CoNLL chunking):
#  1. A, [B-x I-x O B-y]  hyp A, same tags          -> A right; x(0,2), y(3,4) right
#  2. A, [B-x O]          hyp B, [B-x B-x]          -> A wrong (B predicted); x(0,1) right, x(1,2)
#                                                      invented
#  3. B, [O B-y I-y]      hyp B, [O B-y O]          -> B right; y(1,3) vs y(1,2): boundary, wrong
#  4. C, [B-x]            hyp A, [B-y]              -> C wrong (A predicted); x missed, y invented
#  5. C, [B-z I-z]        hyp C, [I-z I-z]          -> C right; I-z starts a chunk: z(0,2) right
REF_INTENTS = ["A", "A", "B", "C", "C"]
REF_TAGS = [["B-x", "I-x", "O", "B-y"], ["B-x", "O"], ["O", "B-y", "I-y"], ["B-x"],
            ["B-z", "I-z"]]
HYP_INTENTS = ["A", "B", "B", "A", "C"]
HYP_TAGS = [["B-x", "I-x", "O", "B-y"], ["B-x", "B-x"], ["O", "B-y", "O"], ["B-y"],
            ["I-z", "I-z"]]
# Training split: A x3, B x1, no C; slots: x twice in [B-x I-x B-x] (two chunks), y once
# (an I- after nothing starts a chunk), no z.
TRAIN_INTENTS = ["A", "A", "A", "B"]
TRAIN_TAGS = [["B-x", "I-x", "B-x"], ["I-y", "O"], ["O"], ["O"]]


def hand_scores():
    counts = pc.training_counts(TRAIN_INTENTS, TRAIN_TAGS)
    return {(s.kind, s.name): s
            for s in pc.class_scores(REF_INTENTS, REF_TAGS, HYP_INTENTS, HYP_TAGS, counts)}


def test_training_counts_are_utterances_per_intent_and_spans_per_slot_type():
    assert pc.training_counts(TRAIN_INTENTS, TRAIN_TAGS) == {
        (INTENT, "A"): 3, (INTENT, "B"): 1, (SLOT, "x"): 2, (SLOT, "y"): 1}


@pytest.mark.parametrize("key, counts, scores", [
    # (train, support, predicted, correct), (precision, recall, f1, score)
    ((INTENT, "A"), (3, 2, 2, 1), (1 / 2, 1 / 2, 1 / 2, 1 / 2)),
    ((INTENT, "B"), (1, 1, 2, 1), (1 / 2, 1, 2 / 3, 1)),  # accuracy is recall, not F1
    ((INTENT, "C"), (0, 2, 1, 1), (1, 1 / 2, 2 / 3, 1 / 2)),
    ((SLOT, "x"), (2, 3, 3, 2), (2 / 3, 2 / 3, 2 / 3, 2 / 3)),
    ((SLOT, "y"), (1, 2, 3, 1), (1 / 3, 1 / 2, 2 / 5, 2 / 5)),  # a boundary error is wrong
    ((SLOT, "z"), (0, 1, 1, 1), (1, 1, 1, 1)),
])
def test_class_scores_by_hand(key, counts, scores):
    s = hand_scores()[key]
    assert (s.train_count, s.support, s.predicted, s.correct) == counts
    assert (s.precision, s.recall, s.f1, s.score) == pytest.approx(scores)


def test_read_as_counts_what_each_class_became_by_hand():
    scores = hand_scores()
    assert scores[(INTENT, "A")].read_as == (("B", 1),)  # utterance 2
    assert scores[(INTENT, "C")].read_as == (("A", 1),)  # utterance 4
    assert scores[(SLOT, "x")].read_as == (("y", 1),)  # utterance 4: its span tagged y
    assert scores[(SLOT, "y")].read_as == (("y", 1),)  # utterance 3: its boundaries only
    assert scores[(INTENT, "B")].read_as == scores[(SLOT, "z")].read_as == ()  # all right


def test_read_as_takes_the_most_overlapping_span_and_says_o_when_missed():
    ref = [["B-a", "I-a", "I-a", "O", "B-a"], ["B-a", "O"]]
    hyp = [["B-b", "B-c", "I-c", "O", "O"], ["B-a", "O"]]
    scores = {(s.kind, s.name): s for s in pc.class_scores(["i", "i"], ref, ["i", "i"], hyp, {})}
    # c covers two of the first span's three words, b one; the last span has no overlap
    assert scores[(SLOT, "a")].read_as == (("O", 1), ("c", 1))
    assert scores[(SLOT, "a")].to_json()["read_as"] == [["O", 1], ["c", 1]]
    row = next(line for line in pc.class_table(list(scores.values())).splitlines()
               if "| a |" in line)
    assert row.endswith("| O 1, c 1 |")


def test_class_scores_list_every_class_intents_first():
    keys = list(hand_scores())
    assert keys == [(INTENT, "A"), (INTENT, "B"), (INTENT, "C"), (SLOT, "x"), (SLOT, "y"),
                    (SLOT, "z")]


def test_per_type_counts_add_up_to_the_micro_slot_scores_and_intent_accuracy():
    scores = hand_scores().values()
    slots = [s for s in scores if s.kind == SLOT]
    correct = sum(s.correct for s in slots)
    overall = metrics.evaluate(REF_INTENTS, REF_TAGS, HYP_INTENTS, HYP_TAGS)
    assert correct / sum(s.predicted for s in slots) == pytest.approx(overall["slot_precision"])
    assert correct / sum(s.support for s in slots) == pytest.approx(overall["slot_recall"])
    intents = [s for s in scores if s.kind == INTENT]
    assert sum(s.correct for s in intents) / len(REF_INTENTS) == pytest.approx(
        overall["intent_accuracy"])


def test_undefined_scores_are_none_not_zero():
    never_predicted = ClassScore(SLOT, "t", 4, 3, 0, 0)
    assert never_predicted.precision is None and never_predicted.f1 == 0.0
    only_predicted = ClassScore(SLOT, "t", 4, 0, 2, 0)
    assert only_predicted.recall is None and only_predicted.score is None


@pytest.mark.parametrize("count, bucket", [
    (0, "<20"), (19, "<20"), (20, "20-99"), (99, "20-99"), (100, "100-499"), (499, "100-499"),
    (500, ">=500"), (12345, ">=500")])
def test_bucket_boundaries(count, bucket):
    assert pc.bucket_of(count) == bucket
    assert ClassScore(INTENT, "a", count, 1, 1, 1).bucket == bucket


def test_negative_count_is_refused():
    with pytest.raises(ValueError, match="negative"):
        pc.bucket_of(-1)


def pair(kind, name, support, run_correct, ref_correct, run_predicted=None, ref_predicted=None,
         train=50):
    run = ClassScore(kind, name, train, support,
                     support if run_predicted is None else run_predicted, run_correct)
    ref = ClassScore(kind, name, train, support,
                     support if ref_predicted is None else ref_predicted, ref_correct)
    return run, ref


def test_lost_classes_are_gaps_of_a_tenth_on_five_references_largest_first():
    cases = [
        pair(INTENT, "exactly_a_tenth", 10, 9, 10),      # 1.0 - 0.9: lost (float-safe)
        pair(INTENT, "just_under", 100, 91, 100),        # gap 0.09: kept
        pair(INTENT, "too_few", 4, 0, 4),                # gap 1.0 on 4 references: kept
        pair(INTENT, "five_refs", 5, 3, 5, train=3),     # gap 0.4 on 5: lost
        pair(INTENT, "run_better", 10, 10, 5),           # negative gap: kept
        # same recall, but the run invents 10 more slots: F1 1.0 -> 0.5, lost
        pair(SLOT, "precision", 10, 10, 10, run_predicted=30, ref_predicted=10),
    ]
    run = [a for a, _ in cases]
    ref = [b for _, b in cases]
    gaps = pc.compare(run, ref)
    lost = pc.losses(gaps)
    assert [(g.run.kind, g.run.name) for g in lost] == [
        (SLOT, "precision"), (INTENT, "five_refs"), (INTENT, "exactly_a_tenth")]
    assert lost[0].gap == pytest.approx(0.5) and lost[1].gap == pytest.approx(0.4)
    assert pc.losses(gaps, min_gap=0.05, min_support=100) == [
        g for g in gaps if g.run.name == "just_under"]


def test_compare_refuses_reports_on_other_data():
    run = [ClassScore(INTENT, "a", 10, 5, 5, 5)]
    with pytest.raises(ValueError, match="not the same data"):
        pc.compare(run, [ClassScore(INTENT, "a", 11, 5, 5, 5)])


def test_compare_pairs_a_class_one_report_never_predicts():
    # the reference predicted a class with no test reference; the run never did
    run = [ClassScore(INTENT, "a", 10, 5, 5, 5)]
    ref = [ClassScore(INTENT, "a", 10, 5, 4, 4), ClassScore(INTENT, "b", 10, 0, 1, 0)]
    gaps = {g.run.name: g for g in pc.compare(run, ref)}
    assert gaps["a"].gap == pytest.approx(-0.2)
    assert gaps["b"].run.predicted == 0 and gaps["b"].gap is None


def test_by_bucket_pools_each_buckets_classes():
    run = [ClassScore(INTENT, "rare1", 5, 4, 4, 2), ClassScore(INTENT, "rare2", 10, 1, 1, 1),
           ClassScore(INTENT, "common", 800, 10, 10, 10),
           ClassScore(SLOT, "s", 30, 2, 6, 2), ClassScore(SLOT, "unseen", 30, 0, 3, 0)]
    ref = [dataclass_copy(s, correct=s.support, predicted=s.support) for s in run]
    rows = {(r["kind"], r["bucket"]): r for r in pc.by_bucket(run, ref)}
    rare = rows[(INTENT, "<20")]
    # pooled: (2 + 1) / (4 + 1); class mean: (0.5 + 1) / 2
    assert (rare["classes"], rare["support"]) == (2, 5)
    assert rare["pooled"] == pytest.approx(0.6) and rare["mean"] == pytest.approx(0.75)
    assert rare["gap_pooled"] == pytest.approx(0.4) and rare["gap_mean"] == pytest.approx(0.25)
    # slots pool F1: 2 * 2 / (2 + 6); the type without test references is left out
    assert rows[(SLOT, "20-99")]["classes"] == 1
    assert rows[(SLOT, "20-99")]["pooled"] == pytest.approx(0.5)
    assert rows[(INTENT, "20-99")]["classes"] == 0 and rows[(INTENT, "20-99")]["pooled"] is None


def test_rank_correlation_by_hand():
    assert pc.rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert pc.rank_correlation([1, 2, 3, 4], [9, 1, 0.5, 0]) == pytest.approx(-1.0)
    # ties at mean ranks: x ranks (0, 1.5, 1.5, 3), y ranks (0, 1, 2, 3): covariance 4.5,
    # variances 4.5 and 5 -> 4.5 / sqrt(22.5)
    assert pc.rank_correlation([1, 5, 5, 9], [1, 2, 3, 4]) == pytest.approx(4.5 / 22.5 ** 0.5)
    assert pc.rank_correlation([1, 2], [1, 2]) is None  # too few
    assert pc.rank_correlation([1, 1, 1], [1, 2, 3]) is None  # constant


def test_frequency_and_gap_keeps_classes_with_enough_references():
    gaps = pc.compare(
        [ClassScore(SLOT, "rare", 10, 10, 10, 2), ClassScore(SLOT, "mid", 100, 10, 10, 6),
         ClassScore(SLOT, "common", 1000, 10, 10, 9), ClassScore(SLOT, "tiny", 1, 2, 2, 2)],
        [ClassScore(SLOT, "rare", 10, 10, 10, 8), ClassScore(SLOT, "mid", 100, 10, 10, 9),
         ClassScore(SLOT, "common", 1000, 10, 10, 10), ClassScore(SLOT, "tiny", 1, 2, 2, 0)])
    rows = {r["kind"]: r for r in pc.frequency_and_gap(gaps)}
    # gaps 0.6, 0.3, 0.1 fall as counts rise ("tiny", 2 references, is left out); the reference
    # scores 0.8, 0.9, 1.0 rise
    assert rows[SLOT]["classes"] == 3
    assert rows[SLOT]["count_vs_gap"] == pytest.approx(-1.0)
    assert rows[SLOT]["count_vs_reference"] == pytest.approx(1.0)
    assert rows[INTENT]["classes"] == 0 and rows[INTENT]["count_vs_gap"] is None


def dataclass_copy(score, **changes):
    import dataclasses

    return dataclasses.replace(score, **changes)
