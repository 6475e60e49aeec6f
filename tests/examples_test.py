"""examples/ run as a user would copy them, at a tiny size: each trains, is private and prints
its epsilon within the budget."""
import importlib
import os
import sys

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
