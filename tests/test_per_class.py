"""Per-class scores against hand-worked examples, the frequency buckets, the list of lost classes,
and `edp_nlu.evaluate --per_class` on a tiny run beside a stub model."""
import json
import os
import subprocess
import sys

import pytest

from tests import tiny_runs
from edp_nlu.scoring import metrics
from edp_nlu.scoring import per_class as pc
from edp_nlu.scoring.per_class import INTENT, SLOT, ClassScore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


# ---------------------------------------------------------------- the command on a tiny run


WIDTH = 64  # tags served per utterance: more than any synthetic utterance has words


def write_stub_run(run_dir, config, intents, tags=None):
    """A run directory without training: the config (as the trainer writes it) and a SavedModel
    with the serving signature of a real export that serves, for each utterance text, the intent
    and tags `intents` and `tags` map it to (tags: all O when not given or not listed)."""
    import tensorflow as tf

    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump({"config": config.to_dict()}, f)
    keys = list(intents)
    intent_table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        keys, [intents[k] for k in keys]), default_value="none")
    tag_table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        keys, [" ".join((tags or {}).get(k, ())) for k in keys]), default_value="")

    class Stub(tf.Module):
        def __init__(self):
            super().__init__()
            self.intent_table, self.tag_table = intent_table, tag_table

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="utterances")])
        def serve(self, utterances):
            words = tf.strings.split(self.tag_table.lookup(utterances))
            n = tf.shape(utterances)[0]
            return {"intent": self.intent_table.lookup(utterances),
                    "slot_tags": words.to_tensor(default_value="O", shape=[n, WIDTH])}

    stub = Stub()
    tf.saved_model.save(stub, os.path.join(run_dir, "saved_model"),
                        signatures={"serving_default": stub.serve})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs on the tiny synthetic corpus of tests/tiny_runs.py, with exports that need no
    training and whose scores are known: `oracle` serves every test utterance's reference intent
    and tags; `prior` serves the training split's most frequent intent and no slot."""
    base = tmp_path_factory.mktemp("per_class")
    config = tiny_runs.tiny_config(mechanism="sgd", replicas=1)
    splits = tiny_runs.corpus(config)
    text = {" ".join(u.tokens): u for u in splits.test}
    # a perfect oracle needs each test text to have one annotation
    assert all(" ".join(u.tokens) in text and text[" ".join(u.tokens)] == u
               for u in splits.test)
    oracle, prior = str(base / "oracle"), str(base / "prior")
    write_stub_run(oracle, config, {t: u.intent for t, u in text.items()},
                   {t: u.tags for t, u in text.items()})
    train_intents = [u.intent for u in splits.train]
    majority = max(sorted(set(train_intents)), key=train_intents.count)
    write_stub_run(prior, config, {t: majority for t in text})
    # the oracle again, as a private run on the same data (its ledger says so)
    private = str(base / "private")
    private_config = tiny_runs.tiny_config(mechanism="dpsgd", replicas=1)
    write_stub_run(private, private_config, {t: u.intent for t, u in text.items()},
                   {t: u.tags for t, u in text.items()})
    with open(os.path.join(private, "privacy.json"), "w") as f:
        json.dump({"private": True, "epsilon": 8.0}, f)
    return dict(config=config, splits=splits, oracle=oracle, prior=prior, majority=majority,
                private=private)


def test_command_prints_the_report_and_writes_json_md_and_png(runs, tmp_path):
    prefix = str(tmp_path / "results" / "tiny_clc")
    proc = subprocess.run(
        [sys.executable, "-m", "edp_nlu.evaluate", f"--run_dir={runs['prior']}",
         f"--compare_to={runs['oracle']}", "--per_class", f"--per_class_results={prefix}",
         "--command=python -m edp_nlu.train --config=tiny"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("diagnostic: not a DP release")
    written = json.loads(open(runs["prior"] + "-per_class.json").read())
    assert written["diagnostic"].startswith("diagnostic: not a DP release")
    # nothing goes into either run directory, and no privacy statement is written
    for run in ("prior", "oracle"):
        assert sorted(os.listdir(runs[run])) == ["config.json", "saved_model"]
    assert not os.path.exists(os.path.join(runs["prior"], "privacy.json"))

    train, test = runs["splits"].train, runs["splits"].test
    test_slots = [span for u in test for span in metrics.slot_spans(u.tags)]
    majority = (INTENT, runs["majority"])
    for c in written["classes"]:
        key = (c["kind"], c["name"])
        if c["kind"] == INTENT:
            train_count = sum(u.intent == c["name"] for u in train)
            support = sum(u.intent == c["name"] for u in test)
        else:
            train_count = sum(t == c["name"] for u in train for t, _, _ in
                              metrics.slot_spans(u.tags))
            support = sum(t == c["name"] for t, _, _ in test_slots)
        assert (c["train_count"], c["support"]) == (train_count, support), key
        assert c["bucket"] == pc.bucket_of(train_count)
        if support:  # the oracle is right on everything; the prior on the majority intent only
            assert c["reference"]["score"] == 1.0, key
            assert c["run"]["score"] == (1.0 if key == majority else 0.0), key
            assert c["gap"] == (0.0 if key == majority else 1.0), key
    expected_lost = sorted((c["kind"], c["name"]) for c in written["classes"]
                           if c["support"] >= 5 and (c["kind"], c["name"]) != majority)
    assert expected_lost and sorted((c["kind"], c["name"]) for c in written["lost"]) == (
        expected_lost)
    rare = [c for c in written["classes"] if c["support"] and c["support"] < 5]
    assert not {(c["kind"], c["name"]) for c in rare} & set(expected_lost)
    intents = {r["bucket"]: r for r in written["by_bucket"] if r["kind"] == INTENT}
    for row in intents.values():  # pooled accuracy of the prior: the majority's share
        if row["classes"]:
            share = sum(c["support"] for c in written["classes"] if (c["kind"], c["name"]) ==
                        majority and c["bucket"] == row["bucket"]) / row["support"]
            assert row["pooled"] == pytest.approx(share) and row["reference_pooled"] == 1.0
    assert "loses" in out and "gap = reference - run" in out
    assert "rank correlation of training count with the gap" in out

    md = open(prefix + ".md").read()
    assert md.count("not a DP release") == 1 and "python -m edp_nlu.train --config=tiny" in md
    assert "python -m edp_nlu.evaluate --run_dir=" in md
    assert os.path.getsize(prefix + ".png") > 1000
    # no training utterance text in anything the command printed or wrote
    texts = {" ".join(u.tokens) for u in train if len(u.tokens) >= 3}
    for blob in (out, md, json.dumps(written)):
        assert not [t for t in texts if t in blob]


def test_per_class_run_alone_and_its_output_path(runs, tmp_path):
    from edp_nlu import evaluate

    result = evaluate.per_class_run(runs["oracle"], split="dev")
    assert result["split"] == "dev" and "compare_to" not in result
    assert result["diagnostic"] == pc.DIAGNOSTIC
    dev = runs["splits"].dev
    intents = [c for c in result["classes"] if c["kind"] == INTENT]
    # the oracle knows test utterances only: on dev it serves "none" except where texts repeat
    assert sum(c["support"] for c in intents) == len(dev)
    text = evaluate.per_class_text(result)
    assert text.splitlines()[0] == pc.DIAGNOSTIC and "| intent |" in text


def test_a_comparison_on_other_data_is_refused(runs, tmp_path):
    from edp_nlu import evaluate

    other = tmp_path / "other"
    os.makedirs(other)
    config = json.load(open(os.path.join(runs["oracle"], "config.json")))
    config["config"]["synthetic_size"] += 1
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="synthetic_size"):
        evaluate.per_class_run(runs["prior"], str(other))


def test_a_train_subset_is_other_data_and_a_config_before_the_field_is_not(runs, tmp_path):
    """train_fraction decides the training split; a config.json written before the field
    trained on all of it (1.0), so it compares equal to one that says 1.0."""
    import shutil

    from edp_nlu import evaluate

    older = tmp_path / "older"
    shutil.copytree(runs["oracle"], older)
    config = json.loads((older / "config.json").read_text())
    assert config["config"].pop("train_fraction") == 1.0
    (older / "config.json").write_text(json.dumps(config))
    assert evaluate.per_class_run(runs["prior"], str(older))  # not refused
    config["config"]["train_fraction"] = 0.5
    (older / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="train_fraction"):
        evaluate.per_class_run(runs["prior"], str(older))


def evaluate_command(*args):
    return subprocess.run([sys.executable, "-m", "edp_nlu.evaluate", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def test_a_private_run_is_not_scored_on_its_training_split(runs):
    """Exact scores of a private run on its training split, overall or per class, are unnoised
    statistics of the data epsilon protects: refused with one line, exit code 2."""
    from edp_nlu import evaluate

    private = runs["private"]
    for args in (["--per_class"], []):
        proc = evaluate_command(f"--run_dir={private}", "--split=train", *args)
        assert proc.returncode == 2, (args, proc.stdout[-2000:], proc.stderr[-2000:])
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("error: --split=train: ") and "private run" in line, line
    for score in (lambda: evaluate.evaluate_run(private, split="train"),
                  lambda: evaluate.per_class_run(private, split="train"),
                  lambda: evaluate.per_class_run(runs["oracle"], private, split="train"),
                  lambda: evaluate.scores_by_decoding(private, split="train")):
        with pytest.raises(ValueError, match="private run"):
            score()
    assert evaluate.is_private_run(private) and not evaluate.is_private_run(runs["oracle"])
    # a plain-training run's training split is no one's secret
    assert evaluate.per_class_run(runs["oracle"], split="train")["split"] == "train"


def test_the_per_class_report_of_a_private_run_stays_out_of_its_directory(runs, tmp_path):
    """per_class.json holds per-class training counts, unnoised: by default it goes beside the
    run directory, and a private run's directory (which privacy.json lists file by file) is
    refused as its place."""
    from edp_nlu import evaluate

    private = runs["private"]
    before = sorted(os.listdir(private))
    proc = evaluate_command(f"--run_dir={private}", "--per_class")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(private)) == before  # nothing written into the run
    written = json.loads(open(private + "-per_class.json").read())
    assert written["diagnostic"] == pc.DIAGNOSTIC and written["split"] == "test"
    assert f"wrote {private}-per_class.json" in proc.stdout
    inside = os.path.join(private, "per_class.json")
    refused = evaluate_command(f"--run_dir={private}", "--per_class", f"--output={inside}")
    assert refused.returncode == 2 and not os.path.exists(inside)
    (line,) = refused.stderr.strip().splitlines()
    assert "inside the private run" in line, line
    # the reference's directory too, when it is the private one
    with pytest.raises(ValueError, match="inside the private run"):
        evaluate.per_class_output(runs["oracle"], os.path.join(private, "x.json"), private)
    assert evaluate.per_class_output(runs["oracle"], None, private) == (
        runs["oracle"] + "-per_class.json")
