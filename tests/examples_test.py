"""examples/ run as a user would copy them, at a tiny size: each trains, is private and prints
its epsilon within the budget."""
import importlib
import json
import os
import sys

import keras
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.fixture(scope="module", autouse=True)
def examples_on_path():
    sys.path.insert(0, EXAMPLES)  # two_outputs imports token_tagger, as `python examples/x.py`
    yield
    sys.path.remove(EXAMPLES)


@pytest.mark.parametrize("name", ["text_classifier", "token_tagger", "two_outputs"])
def test_example_trains_privately_and_prints_its_epsilon(name, capsys, tmp_path):
    module = importlib.import_module(name)
    private = module.main(examples=320, epochs=1, target_epsilon=4.0,
                          run_dir=str(tmp_path))[0]
    statement = private.privacy_statement()
    assert statement["private"] is True and 0 < statement["epsilon"] <= 4.0
    assert os.path.isfile(tmp_path / "privacy.json")
    assert f"epsilon {statement['epsilon']:.2f}" in capsys.readouterr().out


def test_the_habits_example_saves_files_keras_loads_and_the_ledger_lists(tmp_path, capsys):
    """keras_habits: a tf.data pipeline, ModelCheckpoint (full and weights-only) and CSVLogger
    under make_private: it trains privately within its budget, the checkpoint loads without
    edp_tf's machinery, the History and the CSV carry epsilon, and privacy.json lists each
    saved file."""
    module = importlib.import_module("keras_habits")
    private = module.main(examples=320, epochs=2, target_epsilon=4.0, run_dir=str(tmp_path))[0]
    statement = private.privacy_statement()
    assert statement["private"] is True and 0 < statement["epsilon"] <= 4.0
    assert f"epsilon {statement['epsilon']:.2f}" in capsys.readouterr().out
    loaded = keras.saving.load_model(tmp_path / "best.keras")
    assert not any("edp_tf" in type(layer).__module__ for layer in loaded._flatten_layers())
    with open(tmp_path / "history.csv") as handle:
        assert handle.readline().split(",")[1] == "epsilon"
    covered = " ".join(json.loads((tmp_path / "privacy.json").read_text())["artifacts"]["covered"])
    assert "best.keras" in covered and "last.weights.h5" in covered
