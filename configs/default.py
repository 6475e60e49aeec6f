"""The default run: CLC with eDP-SGD on the built-in synthetic corpus; minutes on a 2-core CPU.

Batch, epochs and learning rate are automatic (trainers/recipes.py): they follow the training
set's size and the mechanism, so `--data_dir=<your corpus>` and `--mechanism=sgd` get sensible
values too. On this corpus (9,600 training utterances) the private run is an expected batch of
512 for 10 epochs at Adam 2e-2; plain training is batches of 64 for 15 epochs at 2e-3.
"""
from configs.base import base_config


def get_config():
    c = base_config()
    c.target_epsilon = 8.0  # z0 is calibrated so that the epochs end at epsilon <= 8, delta = 0.1/n
    c.synthetic_size = 12000  # DP needs data: 12k utterances (9.6k train)
    c.batch_size = 0  # auto
    c.epochs = 0  # auto
    c.learning_rate = 0.0  # auto
    c.max_words = 0  # auto: 20 on the synthetic corpus, 32 on --data_dir (trainers/recipes.py)
    return c
