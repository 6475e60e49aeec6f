"""ATIS (../shared/data/atis) with CLC; the recipe of edp_nlu/configs/snips_clc.py."""
from edp_nlu.configs.snips_clc import get_config as snips_clc


def get_config():
    c = snips_clc()
    c.name = "atis_clc"
    c.data_dir = "../shared/data/atis"
    c.max_words = 46  # the longest ATIS training utterance
    return c
