"""Label schemas (edp_nlu/data/schema.py): where the label sets come from, and what epsilon
covers."""
import json
import os

import pytest

from edp_nlu.data import schema, synthetic
from edp_nlu.data.corpus import Utterance

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                      "shared", "data")


def test_schema_json_in_the_data_dir(tmp_path):
    (tmp_path / "schema.json").write_text(json.dumps(
        {"intents": ["call", "alarm"], "slot_types": ["name", "time"]}))
    s = schema.read_data_dir_schema(str(tmp_path))
    assert s.intents == ("call", "alarm") and not s.from_training_data
    assert s.tags == ("O", "B-name", "I-name", "B-time", "I-time")
    assert schema.not_covered(s) == []


def test_jointbert_label_files(tmp_path):
    (tmp_path / "intent_label.txt").write_text("UNK\ncall\nalarm\n")
    (tmp_path / "slot_label.txt").write_text("PAD\nUNK\nO\nB-name\nI-name\nB-time\n")
    s = schema.read_data_dir_schema(str(tmp_path))
    assert s.intents == ("call", "alarm") and s.slot_types == ("name", "time")
    (tmp_path / "slot_label.txt").write_text("PAD\nname\n")
    with pytest.raises(ValueError, match="slot_label.txt"):
        schema.read_data_dir_schema(str(tmp_path))


@pytest.mark.parametrize("content, message", [
    ("{", "label schema"), (json.dumps({"intents": ["a"]}), "exactly the keys"),
    (json.dumps({"intents": ["a", "a"], "slot_types": []}), "duplicates"),
    (json.dumps({"intents": ["a b"], "slot_types": []}), "without spaces"),
    (json.dumps({"intents": [], "slot_types": ["x"]}), "no intents"),
])
def test_bad_schema_files_name_the_file(tmp_path, content, message):
    path = tmp_path / "labels.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        schema.read_schema_file(str(path))


def test_no_schema_falls_back_to_training_labels_and_says_so(tmp_path):
    assert schema.read_data_dir_schema(str(tmp_path)) is None
    train = [Utterance(("call", "ann"), ("O", "B-name"), "call"),
             Utterance(("wake", "me"), ("O", "O"), "alarm")]
    s = schema.schema_from_training_data(train)
    assert s.intents == ("alarm", "call") and s.slot_types == ("name",) and s.from_training_data
    (sentence,) = schema.not_covered(s)
    assert "training split" in sentence and "not cover" in sentence


def test_synthetic_schema_covers_every_generated_label():
    s = synthetic.label_schema()
    corpus = synthetic.synthetic_corpus(size=600, canaries=3)
    for u in list(corpus.train) + list(corpus.test):
        assert u.intent in s.intents and set(u.tags) <= set(s.tags)


@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED, "snips")), reason="no ../shared/data")
def test_snips_ships_its_schema():
    s = schema.read_data_dir_schema(os.path.join(SHARED, "snips"))
    assert len(s.intents) == 7 and len(s.tags) == 1 + 2 * len(s.slot_types)


# ------------------------------------------------------------ labels selected with DP (no schema)
def test_each_unit_contributes_its_intent_and_slot_types():
    from edp_nlu.pipeline import label_selection

    train = [Utterance(("call", "ann", "now"), ("O", "B-name", "B-time"), "call", "u1"),
             Utterance(("ann", "smith"), ("B-name", "I-name"), "call", "u1"),
             Utterance(("hi",), ("O",), "[UNK]", "u2")]
    assert label_selection.contributions(train) == [
        [("intent", "call"), ("slot", "name"), ("slot", "time")],
        [("intent", "call"), ("slot", "name"), ("slot", "name")],  # counted once (dict.fromkeys)
        []]
    by_user = label_selection.contributions(train, [u.user for u in train])
    assert [set(c) for c in by_user] == [
        {("intent", "call"), ("slot", "name"), ("slot", "time")}, set()]


def test_unselected_labels_become_unk_and_o_keeping_the_user():
    from edp_nlu.pipeline import label_selection

    selected = schema.LabelSchema(("call",), ("name",), label_selection.SOURCE,
                                  selection={"noise_stddev": 5.0})
    train = (Utterance(("call", "ann", "now"), ("O", "B-name", "B-time"), "call", "u1"),
             Utterance(("wake", "me", "at", "six"), ("O", "O", "O", "B-time"), "alarm", "u2"))
    assert label_selection.restrict(train, selected) == (
        Utterance(("call", "ann", "now"), ("O", "B-name", "O"), "call", "u1"),
        Utterance(("wake", "me", "at", "six"), ("O", "O", "O", "O"), "[UNK]", "u2"))


def test_a_resumed_run_keeps_its_selected_labels_and_is_charged_once(tmp_path):
    from edp_tf.partition_selection import GaussianThresholding
    from edp_nlu.pipeline import label_selection

    assert label_selection.resumed(str(tmp_path)) is None
    assert not label_selection.charged(str(tmp_path))
    selector = GaussianThresholding.for_delta(5.0, 4, 1e-6)
    selection = dict(selector.to_dict(), unit="example", event="label_selection")
    (tmp_path / "label_schema.json").write_text(json.dumps(
        {"intents": ["call"], "slot_types": ["name"], "source": label_selection.SOURCE,
         "from_training_data": False, "selection": selection}))
    again = label_selection.resumed(str(tmp_path))
    assert again.intents == ("call",) and again.selection == selection
    assert label_selection.event(again) == selector.extra_event("label_selection")
    (tmp_path / "privacy.json").write_text(json.dumps(
        {"extra_events": [selector.extra_event("label_selection").to_dict()]}))
    assert label_selection.charged(str(tmp_path))


def test_private_run_on_a_csv_corpus_without_schema_selects_its_labels_privately(tmp_path):
    """The default command on a user's CSV corpus: no schema, so a private run selects the label
    sets with DP. The frequent labels are kept, the intent and slot type of one utterance are not
    (a chance of 1e-5 each: P[1 + N(0, 25) > tau ~ 22]); the selection is charged as an extra
    event with its delta, calibration to the target counts it, and the run is private."""
    import math

    from edp_tf import accounting
    from tests.tiny_runs import csv_row, many_csv_rows, read, strategy, tiny_config, write_csv
    from edp_nlu.pipeline import training

    rare = csv_row(9000, "iot", "hue_off", "turn off the [device_type : lamp]")
    path = write_csv(tmp_path / "corpus" / "data.csv", many_csv_rows("alarm", "set", 120)
                     + many_csv_rows("weather", "query", 120, 1000) + [rare])
    config = tiny_config("clc", "dpsgd", replicas=1, data_dir=str(path), target_epsilon=8.0)
    assert config.label_selection == "private" and not config.label_schema
    run_dir = str(tmp_path / "run")
    summary = training.train(config, run_dir, strategy=strategy(1), export=False)
    privacy = read(run_dir, "privacy.json")
    assert privacy["private"] is True and summary["private"] is True
    (event,) = [e for e in privacy["extra_events"] if e["name"] == "label_selection"]
    assert event["sensitivity"] == 2.0 and event["noise_multiplier"] == 5.0
    assert 0 < event["delta"] <= 0.1 * privacy["delta"]
    records = [accounting.EpochRecord.from_dict(e) for e in privacy["epochs"]]
    assert privacy["epsilon"] == pytest.approx(accounting.compute_epsilon(
        records, privacy["sampling_rate"], privacy["delta"], privacy["extra_events"]))
    assert privacy["epsilon"] <= 8.0
    assert not any("label sets" in s for s in privacy["not_covered"])
    assert "differential privacy" in privacy["artifacts"]["label_sets"]
    assert "label_schema.json" in privacy["artifacts"]["covered"]
    labels = read(run_dir, "label_schema.json")
    assert labels["from_training_data"] is False and labels["selection"]["max_partitions"] == 4
    assert labels["intents"] == ["alarm_set", "weather_query"]
    assert labels["slot_types"] == ["date", "time"]
    assert math.isfinite(summary["epsilon"])
