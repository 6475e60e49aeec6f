"""The default run: CLC with eDP-SGD on the built-in synthetic corpus; minutes on a 2-core CPU."""
from configs.base import base_config


def get_config():
    c = base_config()
    c.target_epsilon = 8.0  # z0 is calibrated so that the epochs end at epsilon <= 8, delta = 0.1/n
    # DP needs data and large batches: 12k utterances (9.6k train), expected batch 512.
    c.synthetic_size = 12000
    c.batch_size = 512
    return c
