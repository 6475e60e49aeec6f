"""SNIPS (../shared/data/snips) with CLC; private by default (per-example DP-SGD, epsilon 8).

    python -m trainers.train --config=configs/snips_clc.py                    # DP, epsilon 8
    python -m trainers.train --config=configs/snips_clc.py --mechanism=sgd    # plain training

Batch, epochs and learning rate are automatic (trainers/recipes.py): private runs an expected
batch of q n (q = 0.053) for 190 steps at Adam 2e-2; plain training batches of 64 for 15 epochs at
2e-3. Per-example clipping, not micro-batches of 2: on SNIPS at epsilon 8 micro-batches of 2 gave
test SER 0.613 and per-example clipping dev SER 0.41 at the same batch and cost
(results/pilot_snips_clc). Chosen on SNIPS (a public benchmark), not on private data.
"""
from configs.base import base_config


def get_config():
    c = base_config()
    c.name = "snips_clc"
    c.data_dir = "../shared/data/snips"
    c.model = "clc"
    c.mechanism = "dpsgd"
    c.replicas = 1  # one device is fastest on a CPU
    c.batch_size = 0  # auto
    c.epochs = 0  # auto
    c.learning_rate = 0.0  # auto
    c.target_epsilon = 8.0  # private mechanisms calibrate z0 to epsilon 8 at delta = 0.1/n
    return c
