"""RunSpec: every config field in one typed part, checked once, resolved once; old config.json
files upgraded in one place."""
import dataclasses
import glob
import importlib.util
import os

import pytest

from edp_nlu.configs.base import base_config
from edp_nlu.pipeline import recipes, validation
from edp_nlu.pipeline.run_spec import OLD_DEFAULTS, RunSpec, upgrade_saved_config

_CONFIGS = sorted(p for p in glob.glob(os.path.join(os.path.dirname(__file__), "..", "configs",
                                                    "*.py"))
                  if os.path.basename(p) not in ("__init__.py", "base.py"))
assert _CONFIGS, "no packaged config found: the test would check nothing"


def _packaged(path):
    spec = importlib.util.spec_from_file_location("packaged_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.mark.parametrize("path", _CONFIGS, ids=os.path.basename)
def test_every_packaged_config_parses_and_round_trips(path):
    config = _packaged(path)
    spec = RunSpec.parse(config)
    assert spec.to_dict() == config.to_dict()  # every field in exactly one part
    assert spec.model.model == config.model and spec.model.bert.finetune == config.bert.finetune
    assert spec.privacy.knob("l2_norm_clip") == config.l2_norm_clip


def test_fields_are_named_when_unknown_missing_or_bad():
    config = base_config()
    with config.unlocked():
        config.no_such_field = 1
    with pytest.raises(ValueError, match=r"--config\.no_such_field is not a field"):
        RunSpec.parse(config)
    flat = base_config().to_dict()
    del flat["decoding"]
    with pytest.raises(ValueError, match=r"--config\.decoding is missing"):
        RunSpec.parse(flat)
    del flat["bert"]["pooling"]
    flat["decoding"] = "bio"
    with pytest.raises(ValueError, match=r"--config\.bert\.pooling is missing"):
        RunSpec.parse(flat)
    with pytest.raises(ValueError, match=r"--config\.decoding='greedy' is invalid"):
        RunSpec.parse(base_config().to_dict() | {"decoding": "greedy"})
    with pytest.raises(ValueError, match=r"--config\.label_head_dim=-1 is invalid"):
        RunSpec.parse(base_config().to_dict() | {"label_head_dim": -1})
    no_vectors = base_config().to_dict() | {"label_head_dim": 8}
    no_vectors["clc"]["word_vectors"] = ""
    with pytest.raises(ValueError, match=r"label_head_dim.*clc\.word_vectors"):
        RunSpec.parse(no_vectors)
    assert RunSpec.parse(no_vectors | {"label_head_names": "words"}).model.label_head_names == (
        "words")  # name words need no word vectors
    random_bert = base_config().to_dict() | {"model": "bert", "label_head_dim": 8}
    random_bert["bert"]["checkpoint"] = ""
    with pytest.raises(ValueError, match=r"label_head_dim.*bert\.checkpoint"):
        RunSpec.parse(random_bert)
    assert RunSpec.parse(random_bert | {"label_head_names": "words"}).model.model == "bert"
    random_bert["bert"]["checkpoint"] = "minilm"
    assert RunSpec.parse(random_bert).model.label_head_dim == 8
    with pytest.raises(ValueError, match=r"--config\.public_pretraining=.*give one of the two"):
        RunSpec.parse(base_config().to_dict() | {"public_pretraining": "pub/", "init_from": "r/"})
    with pytest.raises(ValueError, match=r"--config\.label_head_names='glove' is invalid"):
        RunSpec.parse(base_config().to_dict() | {"label_head_names": "glove"})


def test_resolved_fills_the_automatic_fields_once_and_leaves_the_spec_unchanged():
    config = base_config()
    config.update(dict(batch_size=0, epochs=0, learning_rate=0.0, max_words=0))
    spec = RunSpec.parse(config)
    resolved = spec.resolved(1000)
    expected = recipes.resolve(config, 1000)
    assert (resolved.sampling.batch_size, resolved.sampling.epochs,
            resolved.optimizer.learning_rate, resolved.model.max_words) == (
        expected.batch_size, expected.epochs, expected.learning_rate, expected.max_words)
    assert resolved.sampling.batch_size > 0 and spec.sampling.batch_size == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.sampling.batch_size = 5


def test_with_knobs_makes_a_new_checked_spec():
    spec = RunSpec.parse(base_config())
    chunked = spec.with_knobs(physical_batch_size=8)
    assert chunked.privacy.knob("physical_batch_size") == 8
    assert spec.privacy.knob("physical_batch_size") == 0
    with pytest.raises(ValueError, match="microbatch_size"):  # checked: 7 is not whole pairs
        spec.with_knobs(physical_batch_size=7)
    with pytest.raises(ValueError, match="batch_size"):
        spec.with_knobs(batch_size=8)  # not a DPConfig knob


def test_an_old_config_json_gets_what_its_run_used_not_todays_defaults():
    saved = base_config().to_dict()
    for field in ("decoding", "head_dropout", "label_selection", "privacy_unit"):
        del saved[field]
    del saved["bert"]["pooling"]
    saved["augment_copies"] = 1
    upgraded = upgrade_saved_config(saved)
    # base_config says "bio" and 0.1 today; a run before the field decoded with plain Viterbi
    assert upgraded["decoding"] == OLD_DEFAULTS["decoding"] == "viterbi" != base_config().decoding
    assert upgraded["label_selection"] == "training" != base_config().label_selection
    assert upgraded["bert"]["pooling"] == "cls" and upgraded["privacy_unit"] == "example"
    assert upgraded["bert"]["finetune"] == saved["bert"]["finetune"]  # present fields are kept
    spec = RunSpec.of_checked(upgraded)
    assert spec.model.decoding == "viterbi"


@pytest.mark.parametrize("path", _CONFIGS, ids=os.path.basename)
@pytest.mark.parametrize("mechanism", ["sgd", "dpsgd"])
def test_resolution_fills_in_only_what_the_checks_accept(path, mechanism):
    config = _packaged(path)
    config.mechanism = mechanism
    resolved = RunSpec.parse(config).resolved(5000)
    assert resolved.sampling.batch_size > 0 and resolved.sampling.epochs >= 1
    assert RunSpec.parse(resolved.to_config()) == resolved  # valid, and parsing changes nothing


def test_a_run_is_checked_once_not_again_at_each_resolution(monkeypatch):
    calls = []
    real = validation.check_config
    monkeypatch.setattr(validation, "check_config", lambda c: calls.append(1) or real(c))
    config = base_config()
    config.mechanism = "dpsgd"
    RunSpec.parse(config).resolved(1000).with_knobs(physical_batch_size=8)
    assert len(calls) == 1
