"""Every committed grid is runnable: its cells name config files that exist and only fields those
configs have. A typo in a grid otherwise surfaces hours into a sitting, when its cell starts."""
import glob
import importlib.util
import os

import pytest

from edp_nlu.configs import atis_bert, snips_clc
from experiments.grids.common import (
    BERT_FULL_FINETUNING,
    BERT_NAME_RECIPE,
    CLC_CONFIGS,
    CLC_NAME_WORD_RECIPE,
    HEADS_BEFORE,
    bert_private,
    cell,
    grid,
    with_heads_before,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRIDS = sorted(p for p in glob.glob(os.path.join(ROOT, "experiments", "grids", "*.py"))
               if os.path.basename(p) not in ("__init__.py", "common.py"))


def load(path: str):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_there_are_grids():
    assert len(GRIDS) >= 4


@pytest.mark.parametrize("path", GRIDS, ids=os.path.basename)
def test_grid_cells_name_real_configs_and_fields(path):
    g = load(path)
    names = [c.name for c in g.cells]
    assert len(names) == len(set(names)), f"{path}: duplicate cell names"
    for c in g.cells:
        config = load(os.path.join(ROOT, c.config))
        for override in c.overrides:
            field, sep, _ = override.partition("=")
            assert sep, f"{path}: cell {c.name}: override {override!r} is not field=value"
            node = config
            for part in field.split("."):
                assert part in node, f"{path}: cell {c.name}: no config field {field!r}"
                node = node[part]


@pytest.mark.parametrize("path", GRIDS, ids=os.path.basename)
def test_private_cells_do_not_set_what_the_private_recipe_replaces(path):
    """In a private run bert.private_finetune / bert.private_dropout (when set) replace
    bert.finetune / bert.dropout, so a private cell passing the latter would not run what its
    label says. Likewise private_ema_fraction (when >= 0) replaces ema_fraction."""
    for c in load(path).cells:
        config = load(os.path.join(ROOT, c.config))
        given = dict(o.partition("=")[::2] for o in c.overrides)
        if given.get("mechanism", config.mechanism) == "sgd":
            continue
        if float(given.get("private_ema_fraction", config.private_ema_fraction)) >= 0:
            assert "ema_fraction" not in given, (
                f"{path}: cell {c.name} sets ema_fraction, which private_ema_fraction replaces "
                "in private runs: set private_ema_fraction")
        if "bert" not in config:
            continue
        for field in ("finetune", "dropout"):
            recipe = given.get(f"bert.private_{field}", config.bert.get(f"private_{field}"))
            if recipe not in (None, "", "-1.0", -1.0):
                assert f"bert.{field}" not in given, (
                    f"{path}: cell {c.name} sets bert.{field}, which bert.private_{field}="
                    f"{recipe!r} replaces in private runs: set bert.private_{field}")


@pytest.mark.parametrize("path", GRIDS, ids=os.path.basename)
def test_cells_name_the_heads_and_averaging_they_run_with(path):
    """The CLC and BERT configs' recipes changed their heads (and CLC's private runs average the
    weights): a cell that leaves those fields open would run something else than what it ran
    (or, in a new grid, something its label does not say)."""
    for c in load(path).cells:
        if c.config in HEADS_BEFORE:
            fields = {p.partition("=")[0] for p in HEADS_BEFORE[c.config]}
            given = {o.partition("=")[0] for o in c.overrides}
            assert fields <= given, f"{path}: cell {c.name} leaves {fields - given} open"


def test_with_heads_before_fills_only_what_a_cell_leaves_open():
    g = with_heads_before(grid("x", [
        cell("a", "a", "f", CLC_CONFIGS[0], "label_head_dim=64", "ema_fraction=0.1"),
        cell("b", "b", "f", "edp_nlu/configs/snips_bert.py", "mechanism=dpsgd",
             "label_head_dim=32"),
        cell("c", "c", "f", "edp_nlu/configs/elsewhere.py", "mechanism=dpsgd")]))
    a, b, c = g.cells
    assert a.overrides == ("label_head_dim=64", "ema_fraction=0.1", "label_head_names=vectors",
                           "label_head_correction=False", "private_ema_fraction=-1.0")
    assert b.overrides == ("mechanism=dpsgd", "label_head_dim=32", "label_head_names=vectors",
                           "label_head_correction=False")
    assert c.overrides == ("mechanism=dpsgd",)


@pytest.mark.parametrize("config, recipe", [(snips_clc, CLC_NAME_WORD_RECIPE),
                                            (atis_bert, BERT_NAME_RECIPE)])
def test_the_heads_recipes_are_the_configs_ones(config, recipe):
    """Cells that measure a config's heads recipe elsewhere name it by these values: they must
    be what the config sets, or the cells measure something their labels do not say."""
    config = config.get_config()
    for field, value in (p.split("=") for p in recipe):
        assert str(config[field]) == value, field


def test_bert_private_pins_cells_against_the_private_recipe():
    assert bert_private() == BERT_FULL_FINETUNING
    pinned = bert_private("steps=150", "bert.finetune=lora", "bert.dropout=0.0")
    assert pinned[:3] == ("steps=150", "bert.private_finetune=lora", "bert.private_dropout=0.0")
    assert set(pinned[3:]) == {"private_learning_rate=0.002", "bert.lora_layout=per_head"}
    # a LoRA cell that names its layout keeps it; a cell without LoRA gets no layout
    assert "bert.lora_layout=per_head" not in bert_private("bert.finetune=lora",
                                                           "bert.lora_layout=matrix")
    assert not any(o.startswith("bert.lora_layout") for o in bert_private("steps=150"))
