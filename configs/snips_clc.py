"""SNIPS (../shared/data/snips) with CLC; choose the mechanism with --config.mechanism."""
from configs.base import base_config


def get_config():
    c = base_config()
    c.name = "snips_clc"
    c.data_dir = "../shared/data/snips"
    c.model = "clc"
    c.batch_size = 512  # large expected batches: less noise per clipped sum (DP)
    c.epochs = 10
    c.target_epsilon = 8.0  # private mechanisms calibrate z0 to epsilon 8 at delta = 0.1/n
    return c
