"""The default command on ATIS (see configs/grids/default_on_snips.py).

    python -m trainers.experiment --grid=configs/grids/default_on_atis.py
"""
from configs.grids.common import grid
from configs.grids.default_on_snips import cells


def get_config():
    return grid("default_on_atis", cells("../shared/data/atis"),
                notes="configs/default.py unchanged; only "
                      "--config.data_dir differs.")
