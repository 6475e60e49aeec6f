"""Every committed grid is runnable: its cells name config files that exist and only fields those
configs have. A typo in a grid otherwise surfaces hours into a sitting, when its cell starts."""
import glob
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRIDS = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "grids", "*.py"))
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
