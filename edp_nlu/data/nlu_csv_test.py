"""NLU-Evaluation-Data CSV loader on tiny fixture files (the real data is not available offline)."""
import collections

import pytest

from edp_nlu.data import nlu_csv
from edp_nlu.data.corpus import DataFormatError, Utterance, bio_error
from edp_nlu.data.loading import load_data
from tests.tiny_runs import CSV_HEADER as HEADER
from tests.tiny_runs import csv_row as row
from tests.tiny_runs import many_csv_rows as many_rows
from tests.tiny_runs import write_csv

SECRET = "zanzibarquux"


@pytest.mark.parametrize("annotation, tokens, tags", [
    ("wake me up at [time : five am] this week",
     "wake me up at five am this week", "O O O O B-time I-time O O"),
    ("[person : Anna Smith]'s [media_type:Podcast]  please",
     "anna smith 's podcast please", "B-person I-person O B-media_type O"),
    ("[ date :today ]", "today", "B-date"),
    ("convert [currency_name:euro] to [currency_name : us dollars].",
     "convert euro to us dollars .", "O B-currency_name O B-currency_name I-currency_name O"),
])
def test_parse_annotation(annotation, tokens, tags):
    assert nlu_csv.parse_annotation(annotation) == (tuple(tokens.split()), tuple(tags.split()))


@pytest.mark.parametrize("annotation, message", [
    (f"wake me [time : {SECRET}", "never closed"),
    (f"wake {SECRET}] me", "']' without '\\['"),
    (f"[time : [date : {SECRET}]]", "nested"),
    (f"[time {SECRET}]", "no ':'"),
    ("[time : ] now", "has no words"),
    (f"[two words : {SECRET}]", "no one-word type"),
    ("   ", "no tokens"),
])
def test_parse_annotation_errors_quote_no_text(annotation, message):
    with pytest.raises(ValueError, match=message) as caught:
        nlu_csv.parse_annotation(annotation)
    assert SECRET not in str(caught.value)


def test_read_file_builds_scenario_intent_and_bio(tmp_path):
    path = write_csv(tmp_path / "alarm.csv", [
        row(1, "alarm", "set", "wake me up at [time : five am]"),
        row(2, "calendar", "query", "what is on [date : tomorrow]; anything?"),  # quoted ';'
    ])
    assert nlu_csv.read_nlu_csv(path) == (
        Utterance(("wake", "me", "up", "at", "five", "am"),
                  ("O", "O", "O", "O", "B-time", "I-time"), "alarm_set"),
        Utterance(("what", "is", "on", "tomorrow", ";", "anything?"),
                  ("O", "O", "O", "B-date", "O", "O"), "calendar_query"))


def test_longer_header_of_the_annotated_file_works(tmp_path):
    header = ("userid;answerid;scenario;intent;status;answer_annotation;notes;suggested_entities;"
              "answer_normalised;answer;question\n")
    path = write_csv(tmp_path / "all.csv",
                     ['1;2;alarm;set;;"[time : six]";;;six;six;q\n'], header=header)
    assert nlu_csv.read_nlu_csv(path) == (Utterance(("six",), ("B-time",), "alarm_set", "1"),)


@pytest.mark.parametrize("content, line, message", [
    (HEADER + row(1, "alarm", "set", "[time : six]") + f"2;alarm;set;[time : {SECRET};x;x\n", 3,
     "never closed"),
    (HEADER + row(1, "alarm", "set", "[time : six]") + "\n", 3, "0 fields"),
    (HEADER + f"1;alarm;set;wake {SECRET};me;x;x\n", 2, "7 fields, the header has 6"),
    (HEADER + row(1, "alarm", "", "[time : six]"), 2, "single words"),
    ("answerid;scenario;answer_annotation\n" + "1;alarm;six\n", 1, "lacks columns \\['intent'\\]"),
    (HEADER, 1, "no rows"),
])
def test_malformed_csv_names_file_and_line(tmp_path, content, line, message):
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as caught:
        nlu_csv.read_nlu_csv(path)
    assert isinstance(caught.value, DataFormatError)
    assert (caught.value.path, caught.value.line) == (str(path), line)
    assert SECRET not in str(caught.value)


def test_empty_undecodable_and_missing_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        nlu_csv.read_nlu_csv(empty)
    broken = tmp_path / "broken.csv"
    broken.write_bytes(HEADER.encode() + b'1;alarm;set;"six";x;x\n2;alarm;set;"\xe9t\xe9";x;x\n')
    with pytest.raises(ValueError, match="UTF-8") as caught:
        nlu_csv.read_nlu_csv(broken)
    assert caught.value.line == 3
    with pytest.raises(ValueError, match="missing"):
        nlu_csv.read_nlu_csv(tmp_path / "nowhere.csv")
    with pytest.raises(ValueError, match="does not exist"):
        nlu_csv.load_nlu_eval_csv(tmp_path / "nowhere")


def test_seeded_split_is_stratified_deterministic_and_complete(tmp_path):
    rows = (many_rows("alarm", "set", 50) + many_rows("weather", "query", 20, 100)
            + many_rows("iot", "cleaning", 3, 200))
    path = write_csv(tmp_path / "data.csv", rows)
    splits = nlu_csv.load_nlu_eval_csv(path, seed=7)
    assert splits == nlu_csv.load_nlu_eval_csv(path, seed=7)
    assert splits != nlu_csv.load_nlu_eval_csv(path, seed=8)
    everything = collections.Counter(splits.train + splits.dev + splits.test)
    assert everything == collections.Counter(nlu_csv.read_nlu_csv(path))  # nothing lost or doubled
    per_split = {name: collections.Counter(u.intent for u in getattr(splits, name))
                 for name in ("train", "dev", "test")}
    # 80/10/10 within each intent (rounded half up): 50 -> 40/5/5, 20 -> 16/2/2, 3 -> 3/0/0.
    assert per_split["train"] == {"alarm_set": 40, "weather_query": 16, "iot_cleaning": 3}
    assert per_split["dev"] == {"alarm_set": 5, "weather_query": 2}
    assert per_split["test"] == {"alarm_set": 5, "weather_query": 2}
    assert "seed 7" in splits.source
    assert all(bio_error(u.tags) is None for u in everything)


def test_ratios_are_validated(tmp_path):
    path = write_csv(tmp_path / "data.csv", many_rows("alarm", "set", 10))
    for ratios in [(0.8, 0.1), (0.9, 0.1, 0.1), (0.0, 0.5, 0.5), (1.2, -0.1, -0.1)]:
        with pytest.raises(ValueError, match="ratios"):
            nlu_csv.load_nlu_eval_csv(path, ratios=ratios)
    splits = nlu_csv.load_nlu_eval_csv(path, ratios=(0.6, 0.2, 0.2))
    assert (len(splits.train), len(splits.dev), len(splits.test)) == (6, 2, 2)


def test_directory_of_csv_files_is_pooled(tmp_path):
    write_csv(tmp_path / "alarm.csv", many_rows("alarm", "set", 10))
    write_csv(tmp_path / "weather.csv", many_rows("weather", "query", 10, 100))
    write_csv(tmp_path / "nested" / "ignored.csv", many_rows("iot", "x", 10))  # not recursive
    assert nlu_csv.is_nlu_csv(tmp_path)
    splits = nlu_csv.load_nlu_eval_csv(tmp_path)
    assert len(splits.train + splits.dev + splits.test) == 20
    assert {u.intent for u in splits.train} == {"alarm_set", "weather_query"}


def test_given_splits_are_used_and_dev_is_carved_from_train(tmp_path):
    # The KFold layout: trainset/*.csv and testset/csv/*.csv.
    write_csv(tmp_path / "trainset" / "alarm.csv", many_rows("alarm", "set", 18))
    write_csv(tmp_path / "testset" / "csv" / "alarm.csv", many_rows("alarm", "set", 4, 100))
    assert nlu_csv.is_nlu_csv(tmp_path)
    splits = load_data(tmp_path, seed=1)
    # dev takes 0.1 / (0.8 + 0.1) of train: 18 / 9 = 2.
    assert (len(splits.train), len(splits.dev), len(splits.test)) == (16, 2, 4)
    assert set(splits.test) == set(nlu_csv.read_nlu_csv(tmp_path / "testset/csv/alarm.csv"))
    write_csv(tmp_path / "dev" / "alarm.csv", many_rows("alarm", "set", 3, 200))
    given = nlu_csv.load_nlu_eval_csv(tmp_path)
    assert (len(given.train), len(given.dev), len(given.test)) == (18, 3, 4)
    assert "given splits" in given.source


def test_split_folders_without_test_are_an_error(tmp_path):
    write_csv(tmp_path / "train" / "alarm.csv", many_rows("alarm", "set", 5))
    with pytest.raises(ValueError, match="no test/ or testset/"):
        nlu_csv.load_nlu_eval_csv(tmp_path)
    (tmp_path / "test").mkdir()
    with pytest.raises(ValueError, match="no .csv files") as caught:
        nlu_csv.load_nlu_eval_csv(tmp_path)
    assert caught.value.path == str(tmp_path / "test")
    assert not nlu_csv.is_nlu_csv(tmp_path / "test")


def test_userid_column_gives_users_and_its_absence_is_said(tmp_path):
    header = "userid;answerid;scenario;intent;answer_annotation\n"
    rows = [f'u{i % 3};{i};alarm;set;"wake me at [time : {i} am]"\n' for i in range(30)]
    with_users = nlu_csv.load_nlu_eval_csv(write_csv(tmp_path / "u" / "all.csv", rows, header))
    every = with_users.train + with_users.dev + with_users.test
    assert {u.user for u in every} == {"u0", "u1", "u2"}
    assert "users from the userid column" in with_users.source
    without = nlu_csv.load_nlu_eval_csv(write_csv(tmp_path / "n" / "all.csv",
                                                  many_rows("alarm", "set", 30)))
    assert all(u.user is None for u in without.train)
    assert "no userid column" in without.source
