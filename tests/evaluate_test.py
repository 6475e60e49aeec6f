"""`edp_nlu.evaluate` scores the exported SavedModel; it must agree with the in-memory model.

The run's metrics.json was computed in memory (the Keras model right after training); evaluate_run
reloads the serving SavedModel and scores raw utterance strings. Equal metrics (every count) on
test and dev mean the export serves what was trained, tokenisation included.
"""
import json
import os

import pytest
import tensorflow as tf

import edp_tf
from edp_nlu import evaluate
from edp_nlu.configs.base import base_config
from edp_nlu.data import synthetic
from edp_nlu.pipeline import training
from tests import tiny_runs

NUMBERS = ("ser", "intent_accuracy", "slot_f1", "slot_precision", "slot_recall",
           "sentence_accuracy", "slot_substitutions", "slot_deletions", "slot_insertions",
           "intent_errors", "reference_slots", "utterances")


def tiny_config():
    """CLC, plain SGD, one replica: the cheapest run whose predictions are not all alike."""
    c = base_config()
    c.update(dict(mechanism="sgd", replicas=1, epochs=4, synthetic_size=300, batch_size=16,
                  learning_rate=3e-2, max_words=8, seed=0))
    c.clc.update(dict(word_vectors="", vocabulary_size=2000, lstm_units=8, num_lstm_layers=1,
                      char_embedding_dim=8, char_filters=8))
    return c


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    config = tiny_config()
    run_dir = str(tmp_path_factory.mktemp("evaluate") / "run")
    training.train(config, run_dir, strategy=edp_tf.make_strategy(1))
    with open(os.path.join(run_dir, "metrics.json")) as f:
        metrics = json.load(f)
    splits = synthetic.synthetic_corpus(seed=config.data_seed, size=config.synthetic_size)
    return dict(config=config, run_dir=run_dir, metrics=metrics, splits=splits)


def assert_same_metrics(scored, reference):
    for key in NUMBERS:
        assert scored[key] == pytest.approx(reference[key], rel=1e-9, abs=1e-12), key


def test_model_predictions_vary(finished):
    """Precondition of the comparisons below: a constant model would agree trivially."""
    serve = evaluate.load_serving(finished["run_dir"])
    test = finished["splits"].test
    out = serve(utterances=tf.constant([" ".join(u.tokens) for u in test]))
    intents = {s.decode() for s in out["intent"].numpy()}
    tags = {t.decode() for t in out["slot_tags"].numpy().ravel()} - {"", "O"}
    assert len(intents) > 1 and tags, (intents, tags)


def test_test_split_matches_the_in_memory_metrics(finished):
    result = evaluate.evaluate_run(finished["run_dir"])
    assert_same_metrics(result, finished["metrics"]["test"])
    assert result["split"] == "test" and result["run_dir"] == finished["run_dir"]
    assert result["data"] == "synthetic"
    assert result["utterances"] == len(finished["splits"].test)


def test_dev_split_matches_the_last_epoch(finished):
    # the last epoch's dev metrics were computed with the final weights, like the export
    result = evaluate.evaluate_run(finished["run_dir"], split="dev")
    assert result["split"] == "dev"
    assert_same_metrics(result, finished["metrics"]["epochs"][-1]["dev"])


def test_other_data_dir_in_joint_format(finished, tmp_path):
    """--data_dir replaces the run's own data: here the same test utterances, on disk."""
    splits = finished["splits"]
    data_dir = tmp_path / "joint"
    for name, utterances in (("train", splits.train), ("dev", splits.dev),
                             ("test", splits.test)):
        os.makedirs(data_dir / name)
        for filename, lines in (("seq.in", [" ".join(u.tokens) for u in utterances]),
                                ("seq.out", [" ".join(u.tags) for u in utterances]),
                                ("label", [u.intent for u in utterances])):
            (data_dir / name / filename).write_text("\n".join(lines) + "\n")
    result = evaluate.evaluate_run(finished["run_dir"], data_dir=str(data_dir))
    assert result["data"] == str(data_dir) and result["split"] == "test"
    assert_same_metrics(result, finished["metrics"]["test"])


def test_unfinished_or_missing_runs_are_refused(finished, tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        evaluate.evaluate_run(str(tmp_path))
    unfinished = tmp_path / "unfinished"
    os.makedirs(unfinished)
    with open(os.path.join(finished["run_dir"], "config.json")) as f:
        (unfinished / "config.json").write_text(f.read())
    with pytest.raises(ValueError, match="saved_model"):
        evaluate.evaluate_run(str(unfinished))


def test_command_line_prints_and_writes_the_metrics(finished, tmp_path, capsys):
    output = tmp_path / "scores.json"
    out = tiny_runs.evaluate_command(capsys, f"--run_dir={finished['run_dir']}",
                                     f"--output={output}")
    written = json.loads(output.read_text())
    assert json.loads(out[out.index("{"):]) == written
    assert written["split"] == "test"
    assert_same_metrics(written, finished["metrics"]["test"])


@pytest.mark.parametrize("field, value, named", [("noise_filter", "kalman", "Kalman"),
                                                 ("ema_fraction", 0.5, "ema_fraction")])
def test_checkpoint_scoring_refuses_runs_whose_checkpoint_is_not_what_they_released(
        tmp_path, field, value, named):
    """The Kalman filter's checkpoint holds its extrapolated point, an EMA run's the raw weights:
    scoring either (--decodings, experiments/o_penalty.py) would score weights never released."""
    config = tiny_runs.tiny_config(mechanism="dpsgd", replicas=1, **{field: value})
    with open(tmp_path / "config.json", "w") as f:
        json.dump({"config": config.to_dict()}, f)
    with pytest.raises(ValueError, match=f"{named}.*score its export instead"):
        evaluate.checkpoint_model(str(tmp_path))
