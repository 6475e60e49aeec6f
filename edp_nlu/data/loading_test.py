"""Joint-format loader, `conform` and format detection, on fixtures and real data."""
import logging
import pathlib

import pytest

from edp_nlu.data import loading, schema
from edp_nlu.data.corpus import DataFormatError, Splits, Utterance
from edp_nlu.models.labels import LabelVocabulary

SHARED_DATA = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"
SECRET = "zanzibarquux"  # A token that must never appear in an error or log message.

GOOD_SPLIT = {
    "seq.in": f"call  {SECRET} smith \n wake me up at 7 am\n",
    "seq.out": "O B-name I-name \nO O O O B-time I-time \n",
    "label": "call\nalarm#wake\n",
}


def write_split(directory: pathlib.Path, files: dict, raw: dict | None = None) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    for name, content in (raw or {}).items():
        (directory / name).write_bytes(content)
    return directory


def write_corpus(root: pathlib.Path, dev_name: str = "dev", **overrides) -> pathlib.Path:
    for split in ("train", dev_name, "test"):
        write_split(root / split, {**GOOD_SPLIT, **overrides.get(split, {})})
    return root


def test_loads_joint_dir_with_irregular_whitespace(tmp_path):
    splits = loading.load_joint_dir(write_corpus(tmp_path))
    expected = (Utterance(("call", SECRET, "smith"), ("O", "B-name", "I-name"), "call"),
                Utterance(tuple("wake me up at 7 am".split()),
                          ("O", "O", "O", "O", "B-time", "I-time"), "alarm#wake"))
    assert splits.train == splits.dev == splits.test == expected
    assert str(tmp_path) in splits.source and SECRET not in splits.source


def test_accepts_valid_as_dev_dir_name(tmp_path):
    assert len(loading.load_joint_dir(write_corpus(tmp_path, dev_name="valid")).dev) == 2


@pytest.mark.parametrize("files, bad_file, line, message", [
    ({"label": "call\n"}, "label", 2, "line counts differ"),
    ({"seq.in": GOOD_SPLIT["seq.in"] + "extra line\n"}, "seq.in", 3, "line counts differ"),
    ({"seq.out": "O B-name \nO O O O B-time I-time\n"}, "seq.out", 1, "2 tags for 3 tokens"),
    ({"seq.out": "O I-name I-name\nO O O O B-time I-time\n"}, "seq.out", 1, "'I-name' follows 'O'"),
    ({"seq.out": "O B-name I-name\nO O O O B-date I-time\n"}, "seq.out", 2,
     "'I-time' follows 'B-date'"),
    ({"seq.out": "O B-name I-name\nO O O O X-time I-time\n"}, "seq.out", 2, "'X-time' is not"),
    ({"seq.out": "O B- I-name\nO O O O B-time I-time\n"}, "seq.out", 1, "'B-' is not"),
    ({"seq.in": f"call {SECRET} smith\n\n", "seq.out": "O B-name I-name\n\n", "label": "a\n\n"},
     "seq.in", 2, "blank"),
    ({"label": "call me\nalarm\n"}, "label", 1, "whitespace"),
])
def test_malformed_files_name_file_and_line(tmp_path, files, bad_file, line, message):
    write_corpus(tmp_path, train=files)
    with pytest.raises(ValueError, match=message) as caught:
        loading.load_joint_dir(tmp_path)
    error = caught.value
    assert isinstance(error, DataFormatError)
    assert error.path == str(tmp_path / "train" / bad_file)
    assert error.line == line
    assert f"{tmp_path / 'train' / bad_file}, line {line}:" in str(error)
    assert SECRET not in str(error)


def test_empty_file_is_an_error(tmp_path):
    write_corpus(tmp_path, test={"label": ""})
    with pytest.raises(ValueError, match="empty") as caught:
        loading.load_joint_dir(tmp_path)
    assert caught.value.path == str(tmp_path / "test" / "label")


def test_undecodable_bytes_name_the_line(tmp_path):
    write_corpus(tmp_path)
    (tmp_path / "dev" / "seq.in").write_bytes(b"call anna smith\nwake me \xff\xfe up at 7 am\n")
    with pytest.raises(ValueError, match="not valid UTF-8") as caught:
        loading.load_joint_dir(tmp_path)
    assert (caught.value.path, caught.value.line) == (str(tmp_path / "dev" / "seq.in"), 2)


def test_missing_split_or_file_is_an_error(tmp_path):
    write_corpus(tmp_path)
    (tmp_path / "test" / "seq.out").unlink()
    with pytest.raises(ValueError, match="file is missing") as caught:
        loading.load_joint_dir(tmp_path)
    assert caught.value.path == str(tmp_path / "test" / "seq.out")
    (tmp_path / "dev").rename(tmp_path / "other")
    with pytest.raises(ValueError, match="no dev split"):
        loading.load_joint_dir(tmp_path)
    with pytest.raises(ValueError, match="missing"):
        loading.load_joint_dir(tmp_path / "nowhere")


def test_utf8_bom_and_crlf_are_accepted(tmp_path):
    write_corpus(tmp_path)
    (tmp_path / "train" / "label").write_bytes(b"\xef\xbb\xbfcall\r\nalarm\r\n")
    assert [u.intent for u in loading.load_joint_dir(tmp_path).train] == ["call", "alarm"]


def test_only_line_feeds_end_lines(tmp_path):
    # U+2028 and U+0085 are whitespace to str.split() but must not start a new line.
    write_corpus(tmp_path, train={"seq.in": "call\u2028anna smith\nwake me up at 7\x85am\n"})
    assert [len(u.tokens) for u in loading.load_joint_dir(tmp_path).train] == [3, 6]


TRAIN = (Utterance(("a", "b", "c"), ("B-x", "I-x", "O"), "one"),
         Utterance(("a", "b"), ("B-y", "I-y"), "two"),
         Utterance(("a",), ("B-z",), "one"))


def test_training_schema_vocabularies_are_ordered():
    labels = schema.schema_from_training_data(TRAIN)
    tags, intents = labels.tag_vocabulary, labels.intent_vocabulary
    assert tags.labels == ("O", "B-x", "I-x", "B-y", "I-y", "B-z", "I-z")  # B and I of each type
    assert intents.labels == (loading.UNKNOWN_INTENT, "one", "two")
    assert [tags.id(t) for t in ("O", "I-x", "B-z", "B-w")] == [0, 2, 5, 0]
    assert (intents.id("two"), intents.id("never seen")) == (2, 0)


def test_conform_maps_unseen_labels_counts_and_logs_without_text(caplog):
    tags = LabelVocabulary(("O", "B-x", "I-x", "B-y", "I-y", "B-z"))  # no I-z
    intents = LabelVocabulary((loading.UNKNOWN_INTENT, "one", "two"))
    dev = (Utterance((SECRET, "b", "c"), ("B-w", "I-w", "B-x"), "one"),  # unseen type w
           Utterance(("a", "b", "c"), ("B-x", "I-x", "I-x"), "three"),   # unseen intent
           Utterance(("a", "b", "c"), ("B-q", "I-y", "O"), "two"),       # seen I-y loses B-q
           Utterance(("a", "b"), ("B-z", "I-z"), "one"))                 # I-z never in train
    with caplog.at_level(logging.WARNING, logger="edp_nlu.data.loading"):
        conformed, counts = loading.conform(dev, tags, intents, "dev")
    assert [u.tags for u in conformed] == [("O", "O", "B-x"), ("B-x", "I-x", "I-x"),
                                           ("O", "B-y", "O"), ("B-z", "O")]
    assert [u.intent for u in conformed] == ["one", loading.UNKNOWN_INTENT, "two", "one"]
    assert [u.tokens for u in conformed] == [u.tokens for u in dev]
    assert counts == loading.UnseenCounts(
        split="dev", utterances=4, tokens=11, remapped_tag_tokens=5, unknown_intent_utterances=1,
        unseen_tags=("B-q", "B-w", "I-w", "I-z"), unseen_intents=("three",))
    assert "dev: 5 of 11 tokens" in caplog.text and "1 of 4 utterances" in caplog.text
    assert SECRET not in caplog.text
    assert all(loading.bio_error(u.tags) is None for u in conformed)


def test_conform_is_silent_and_identity_on_train(caplog):
    labels = schema.schema_from_training_data(TRAIN)
    with caplog.at_level(logging.WARNING, logger="edp_nlu.data.loading"):
        conformed, counts = loading.conform(TRAIN, labels.tag_vocabulary, labels.intent_vocabulary,
                                            "train")
    assert conformed == TRAIN
    assert counts.remapped_tag_tokens == counts.unknown_intent_utterances == 0
    assert caplog.text == ""


def test_load_data_detects_formats(tmp_path):
    assert loading.load_data(None).source.startswith("synthetic")
    assert loading.load_data("", seed=3).source == loading.load_data(None, seed=3).source
    assert loading.load_data(write_corpus(tmp_path / "joint")).source.startswith("joint format")
    csv_file = tmp_path / "nlu.csv"
    csv_file.write_text("answerid;scenario;intent;answer_annotation\n"
                        + "".join(f"{i};alarm;set;wake me at [time : {i} am]\n" for i in range(10)),
                        encoding="utf-8")
    assert loading.load_data(csv_file).source.startswith("NLU-Evaluation-Data")
    assert loading.load_data(tmp_path).source.startswith("NLU-Evaluation-Data")  # dir with a .csv
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="unrecognised data"):
        loading.load_data(tmp_path / "empty")
    with pytest.raises(ValueError, match="does not exist"):
        loading.load_data(tmp_path / "nowhere")


def test_describe_has_counts_and_no_text(tmp_path):
    stats = loading.describe(loading.load_joint_dir(write_corpus(tmp_path)))
    assert stats["train"] == {"utterances": 2, "distinct_utterances": 2, "tokens": 9,
                              "max_tokens": 6, "intents": 2, "slot_types": 2, "tags": 5}
    assert SECRET not in repr(stats)


def _real(name):
    path = SHARED_DATA / name
    if not (path / "train" / "seq.in").is_file():
        pytest.skip(f"{path} is absent (shared development data)")
    return loading.load_joint_dir(path), path


def _labels_file(path):
    return [line for line in (path).read_text(encoding="utf-8").split("\n") if line]


def test_snips_counts_match_source_md():
    splits, path = _real("snips")
    stats = loading.describe(splits)
    assert [stats[s]["utterances"] for s in ("train", "dev", "test")] == [13084, 700, 700]
    assert [stats[s]["tokens"] for s in ("train", "dev", "test")] == [117700, 6384, 6354]
    assert [stats[s]["max_tokens"] for s in ("train", "dev", "test")] == [35, 22, 24]
    assert [stats[s]["intents"] for s in ("train", "dev", "test")] == [7, 7, 7]
    assert (stats["train"]["slot_types"], stats["train"]["tags"]) == (39, 72)
    assert (stats["all"]["slot_types"], stats["all"]["tags"]) == (39, 72)
    labels = schema.read_data_dir_schema(path)  # What the trainer uses: B- and I- of each type.
    assert set(labels.tags) >= set(_labels_file(path / "slot_label.txt")) - {"PAD", "UNK"}
    assert set(labels.slot_types) == {t[2:] for u in splits.train for t in u.tags if t != "O"}
    assert set(labels.intents) == set(_labels_file(path / "intent_label.txt")) - {"UNK"}
    for name in ("dev", "test"):
        _, counts = loading.conform(getattr(splits, name), labels.tag_vocabulary,
                                    labels.intent_vocabulary, name)
        assert counts.remapped_tag_tokens == counts.unknown_intent_utterances == 0


def test_atis_counts_and_unseen_labels_match_source_md():
    splits, path = _real("atis")
    stats = loading.describe(splits)
    assert [stats[s]["utterances"] for s in ("train", "dev", "test")] == [4478, 500, 893]
    assert [stats[s]["tokens"] for s in ("train", "dev", "test")] == [50497, 5703, 9164]
    assert [stats[s]["max_tokens"] for s in ("train", "dev", "test")] == [46, 35, 30]
    assert stats["train"]["intents"] == 21 and stats["all"]["intents"] == 26
    assert (stats["train"]["slot_types"], stats["train"]["tags"]) == (79, 120)
    assert (stats["all"]["slot_types"], stats["all"]["tags"]) == (83, 127)
    assert [sum("#" in u.intent for u in getattr(splits, s)) for s in ("train", "dev", "test")] \
        == [23, 3, 15]
    labels = schema.read_data_dir_schema(path)  # What the trainer uses: B- and I- of each type.
    assert set(labels.tags) >= set(_labels_file(path / "slot_label.txt")) - {"PAD", "UNK"}
    _, dev = loading.conform(splits.dev, labels.tag_vocabulary, labels.intent_vocabulary, "dev")
    _, test = loading.conform(splits.test, labels.tag_vocabulary, labels.intent_vocabulary, "test")
    # SOURCE.md lists 7 tags absent from train; 3 are I- tags of types train has (in the schema).
    assert set(dev.unseen_tags + test.unseen_tags) == {
        "B-booking_class", "B-compartment", "B-flight", "B-stoploc.airport_code"}
    assert dev.unseen_intents == ("atis_airfare#atis_flight_time",)
    assert dev.unknown_intent_utterances == 1
    assert test.unseen_intents == ("atis_airfare#atis_flight", "atis_day_name",
                                   "atis_flight#atis_airline", "atis_flight_no#atis_airline")
    assert test.unknown_intent_utterances == 5


def test_user_level_dev_and_test_hold_no_training_user():
    def said(user, word):
        return Utterance((word,), ("O",), "greet", user)

    splits = Splits((said("a", "hi"), said("b", "yo")), (said("a", "hey"), said("c", "hello")),
                    (said("b", "sup"), said("d", "howdy")), "toy")
    kept, dropped = loading.without_training_users(splits)
    assert dropped == 2
    assert [u.user for u in kept.dev] == ["c"] and [u.user for u in kept.test] == ["d"]
    assert kept.train == splits.train


def test_train_subset_is_fixed_nested_in_order_and_leaves_dev_and_test():
    splits = loading.load_data(None, seed=0, synthetic_size=400)  # 320 train
    half, quarter = (loading.subset_train(splits, f) for f in (0.5, 0.25))
    assert (len(half.train), len(quarter.train)) == (160, 80)
    assert (half.dev, half.test) == (splits.dev, splits.test)
    assert loading.subset_train(splits, 0.5) == half  # the same subset at every call
    position = {u: i for i, u in enumerate(splits.train)}  # synthetic utterances are distinct
    for part in (half, quarter):  # a subset of train, in train's order
        indices = [position[u] for u in part.train]
        assert indices == sorted(indices) and len(set(indices)) == len(indices)
    assert set(quarter.train) <= set(half.train)  # one permutation cut short
    # neither a prefix nor a stride: drawn across the whole split
    assert max(position[u] for u in quarter.train) > 240 and min(
        position[u] for u in quarter.train) < 80
    assert "train subset 160 of 320" in half.source
    assert loading.subset_train(splits, 1.0) is splits


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5, "0.5", True])
def test_a_bad_train_fraction_names_the_field(fraction):
    splits = loading.load_data(None, synthetic_size=100)
    with pytest.raises(ValueError, match="train_fraction"):
        loading.subset_train(splits, fraction)


def test_a_train_subset_refuses_planted_canaries():
    splits = loading.load_data(None, synthetic_size=100, synthetic_canaries=2)
    with pytest.raises(ValueError, match="canaries"):
        loading.subset_train(splits, 0.5)
