"""ATIS grid: the same rows as configs/grids/snips.py.

    python -m trainers.experiment --grid=configs/grids/atis.py
"""
from configs.grids.common import grid
from configs.grids.snips import rows


def get_config():
    return grid("atis", rows("bert", "configs/atis_bert.py") + rows("clc", "configs/atis_clc.py"),
                schedule_reference="bert_dpsgd_eps8")
