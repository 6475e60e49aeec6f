"""Pilot: CLC private recipes on SNIPS at epsilon 8 (chose the snips_clc defaults; see notes)."""
from configs.grids.common import cell, grid

CLC = "configs/snips_clc.py"
DP = ("mechanism=dpsgd", "target_epsilon=8.0", "replicas=1")


def get_config():
    return grid("pilot_snips_clc", [
        cell("dpsgd_q08_lr1e-2_lin", "per-example, q 0.08, 300 steps, lr 1e-2 linear", "dpsgd",
             CLC, *DP, "batch_size=0", "sampling_rate=0.08", "steps=300", "learning_rate=0.01",
             "lr_schedule=linear", "warmup_fraction=0.05"),
        cell("dpsgd_q08_lr2e-2_lin", "per-example, q 0.08, 300 steps, lr 2e-2 linear", "dpsgd",
             CLC, *DP, "batch_size=0", "sampling_rate=0.08", "steps=300", "learning_rate=0.02",
             "lr_schedule=linear", "warmup_fraction=0.05"),
        cell("dpsgd_q08_lr2e-2_lin_mean", "as above, slot loss per word", "dpsgd",
             CLC, *DP, "batch_size=0", "sampling_rate=0.08", "steps=300", "learning_rate=0.02",
             "lr_schedule=linear", "warmup_fraction=0.05", "slot_loss=mean"),
    ], notes="Chosen on the SNIPS dev split (a public benchmark).")
