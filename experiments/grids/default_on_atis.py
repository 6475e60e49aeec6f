"""The default command on ATIS (see experiments/grids/default_on_snips.py).

    python -m experiments.experiment --grid=experiments/grids/default_on_atis.py
"""
from experiments.grids.common import grid, with_heads_before
from experiments.grids.default_on_snips import NOTES, cells


def get_config():
    # the cells ran before default.py's heads and weight averaging changed
    return with_heads_before(grid("default_on_atis", cells("../shared/data/atis"),
                                  notes=NOTES))
