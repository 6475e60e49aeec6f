"""SNIPS (../shared/data/snips) with CLC; choose the mechanism with --config.mechanism."""
from configs.base import base_config


def get_config():
    c = base_config()
    c.name = "snips_clc"
    c.data_dir = "../shared/data/snips"
    c.model = "clc"
    c.batch_size = 256
    c.epochs = 10
    return c
