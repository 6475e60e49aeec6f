"""Label sets without a schema (edp_nlu/pipeline/label_selection.py): selected with DP, kept on
resume and charged once, in a private run on a CSV corpus (the schema files themselves are
edp_nlu/data/schema_test.py's)."""
import json

import pytest

from edp_nlu.data import schema
from edp_nlu.data.corpus import Utterance
from edp_nlu.pipeline import label_selection, training
from edp_tf import accounting
from edp_tf.partition_selection import GaussianThresholding
from tests.tiny_runs import csv_row, many_csv_rows, read, strategy, tiny_config, write_csv


# ------------------------------------------------------------ labels selected with DP (no schema)
def test_each_unit_contributes_its_intent_and_slot_types():
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
    selected = schema.LabelSchema(("call",), ("name",), label_selection.SOURCE,
                                  selection={"noise_stddev": 5.0})
    train = (Utterance(("call", "ann", "now"), ("O", "B-name", "B-time"), "call", "u1"),
             Utterance(("wake", "me", "at", "six"), ("O", "O", "O", "B-time"), "alarm", "u2"))
    assert label_selection.restrict(train, selected) == (
        Utterance(("call", "ann", "now"), ("O", "B-name", "O"), "call", "u1"),
        Utterance(("wake", "me", "at", "six"), ("O", "O", "O", "O"), "[UNK]", "u2"))


def test_a_resumed_run_keeps_its_selected_labels_and_is_charged_once(tmp_path):
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
