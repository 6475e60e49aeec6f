"""Pilot: augmentation multiplicity (De et al. 2022) on SNIPS with CLC at epsilon 8.

    python -m experiments.experiment --grid=experiments/grids/augmentation.py

snips_clc's private recipe (per-example DP-SGD, q 0.16, 150 steps, Adam 3e-2) with K = 1, 4 and
8 rows per example: the example and K - 1 augmented copies (words outside slots masked with
probability 0.15, slots with a public filler given another value with probability 0.5:
edp_nlu/data/augment.py), their losses averaged inside the example's one clip. Same q, steps,
S and epsilon in every cell; only each step's work grows K times. Every cell clips in chunks of
512 rows (`physical_batch_size`: the same mechanism, chunks of whole examples, one after the
other): unchunked, K = 1 alone held 11.7 GB and was killed for memory on the shared machine.
On SNIPS the public fillers cover the city and timeRange slots only, so most copies differ by
masked words.
The membership-inference rows of K > 1 score every training row, the copies included.
clc_k1, clc_k4 and clc_k8 ran with the backward LSTM that a Keras bug zeroed at most words
(docs/results.md); clc_k4_both_directions runs with the fix. ATIS's K = 4 and 8 are cells of
experiments/grids/atis.py.
"""
from experiments.grids.common import cell, grid, with_heads_before

CLC = "edp_nlu/configs/snips_clc.py"
DP = ("mechanism=dpsgd", "target_epsilon=8.0", "replicas=1", "diagnostics=True",
      "physical_batch_size=512")


def get_config():
    # the cells ran before the CLC configs' heads and weight averaging changed
    return with_heads_before(_grid())


def _grid():
    return grid("augmentation", [
        cell("clc_k1", "per-example DP-SGD, eps 8, K = 1 (no copies: snips_clc's recipe)",
             "per-example", CLC, *DP),
        cell("clc_k4", "per-example DP-SGD, eps 8, K = 4 (the example + 3 augmented copies "
             "in one clip)", "per-example", CLC, *DP, "augment_copies=4"),
        cell("clc_k8", "per-example DP-SGD, eps 8, K = 8 (the example + 7 augmented copies "
             "in one clip)", "per-example", CLC, *DP, "augment_copies=8"),
        # after the fix of the backward LSTM (docs/results.md); K = 1 with the fix is the SNIPS
        # grid's clc_dpsgd_eps8_both_directions and _run2 (0.215, 0.206)
        cell("clc_k4_both_directions", "per-example DP-SGD, eps 8, K = 4, backward LSTM fixed",
             "per-example", CLC, *DP, "augment_copies=4"),
    ])
