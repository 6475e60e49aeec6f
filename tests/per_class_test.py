"""`edp_nlu.evaluate --per_class` on a tiny run beside a stub model (the per-class scores
themselves are edp_nlu/scoring/per_class_test.py's)."""
import json
import os
import subprocess
import sys

import pytest

from edp_nlu import cli, evaluate
from edp_nlu.scoring import metrics
from edp_nlu.scoring import per_class as pc
from edp_nlu.scoring.per_class import INTENT
from tests import tiny_runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="utterances")],
                     autograph=False)
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
    assert f"wrote {runs['prior']}-per_class.json" in out  # by default beside the run directory
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


def refusal_line(capsys, *args: str) -> str:
    """The one line `python -m edp_nlu.evaluate *args` prints before it exits with code 2: a
    user error (cli.USER_ERRORS) with a one-line message, raised before anything is written."""
    with pytest.raises(cli.USER_ERRORS) as refused:
        tiny_runs.evaluate_command(capsys, *args)
    line = f"error: {refused.value}"  # as cli.run prints it
    assert "\n" not in line, line
    return line


def test_a_private_run_is_not_scored_on_its_training_split(runs, capsys):
    """Exact scores of a private run on its training split, overall or per class, are unnoised
    statistics of the data epsilon protects: refused with one line, exit code 2 (the command
    once, with --per_class; the scoring functions of both paths below)."""
    private = runs["private"]
    line = refusal_line(capsys, f"--run_dir={private}", "--split=train", "--per_class")
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


def test_the_per_class_report_of_a_private_run_stays_out_of_its_directory(runs, tmp_path,
                                                                          capsys):
    """per_class.json holds per-class training counts, unnoised: by default it goes beside the
    run directory, and a private run's directory (which privacy.json lists file by file) is
    refused as its place."""
    private = runs["private"]
    before = sorted(os.listdir(private))
    # the command writes where per_class_output says (its default path: the report test above)
    assert evaluate.per_class_output(private, None) == private + "-per_class.json"
    written = evaluate.per_class_run(private)
    assert written["diagnostic"] == pc.DIAGNOSTIC and written["split"] == "test"
    inside = os.path.join(private, "per_class.json")
    line = refusal_line(capsys, f"--run_dir={private}", "--per_class", f"--output={inside}")
    assert not os.path.exists(inside)
    assert sorted(os.listdir(private)) == before  # nothing written into the run
    assert "inside the private run" in line, line
    # the reference's directory too, when it is the private one
    with pytest.raises(ValueError, match="inside the private run"):
        evaluate.per_class_output(runs["oracle"], os.path.join(private, "x.json"), private)
    assert evaluate.per_class_output(runs["oracle"], None, private) == (
        runs["oracle"] + "-per_class.json")
