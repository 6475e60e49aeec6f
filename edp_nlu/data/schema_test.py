"""Label schemas: where the label sets come from (a schema file, JointBERT's label files, the
generator's, else the training split's), and bad files named."""
import json
import os

import pytest

from edp_nlu.data import schema, synthetic
from edp_nlu.data.corpus import Utterance

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared",
                      "data")


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
