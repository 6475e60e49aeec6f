"""ATIS (../shared/data/atis) with CLC; choose the mechanism with --config.mechanism."""
from configs.base import base_config


def get_config():
    c = base_config()
    c.name = "atis_clc"
    c.data_dir = "../shared/data/atis"
    c.model = "clc"
    c.batch_size = 256
    c.epochs = 10
    return c
