"""SNIPS grid: SGD, the paper's eDP, eDP with micro-batches of 2, per-example DP-SGD (and its
sigma = 0 diagnostic) x CLC, BERT; the full epsilon grid (1, 3, 8) for per-example DP-SGD, the
best mechanism of both models, and epsilon 8 for the others.

    python -m trainers.experiment --grid=configs/grids/snips.py
"""
from configs.grids.common import cell, grid


def rows(model: str, config: str) -> list:
    m = model
    return [
        cell(f"{m}_sgd", "SGD (not private)", "sgd", config, "mechanism=sgd"),
        cell(f"{m}_dpsgd_eps8", "per-example DP-SGD, eps 8", "per-example", config,
             "mechanism=dpsgd", "target_epsilon=8.0"),
        cell(f"{m}_dpsgd_sigma0", "per-example, sigma = 0 (clipping only)", "diagnostic", config,
             "mechanism=dpsgd", "target_epsilon=0.0", "noise_multiplier=0.0"),
        cell(f"{m}_edp_k2_eps8", "eDP, micro-batches of 2, eps 8", "eDP k=2", config,
             "mechanism=edp", "microbatch_size=2", "target_epsilon=8.0"),
        cell(f"{m}_edp_paper_eps8", "eDP as in the paper (1 micro-batch/replica, 2 replicas), "
             "eps 8", "eDP paper", config, "mechanism=edp", "microbatch_size=0", "replicas=2",
             "target_epsilon=8.0"),
        cell(f"{m}_dpsgd_eps3", "per-example DP-SGD, eps 3", "per-example", config,
             "mechanism=dpsgd", "target_epsilon=3.0"),
        cell(f"{m}_dpsgd_eps1", "per-example DP-SGD, eps 1", "per-example", config,
             "mechanism=dpsgd", "target_epsilon=1.0"),
    ]


def get_config():
    return grid("snips", rows("bert", "configs/snips_bert.py") + rows("clc", "configs/snips_clc.py"),
                schedule_reference="bert_dpsgd_eps8",
                notes="Cells run in the order listed; BERT first (the issue's headline goal).")
