"""How much data closes the gap: private (eps 8) / plain test SER against the training set's size n.

The default recipe only, its automatic values untouched (edp_nlu/pipeline/recipes.py): a private
run samples q = 0.16 of n per step for a fixed number of steps, so at a fixed epsilon its noise
multiplier is nearly the same at every n while the expected batch q n grows, and the noise per
example, z C / (q n), falls as 1 / n. Plain training gets batches of 64 for max(15 epochs, 3,000
steps).

* The synthetic corpus (edp_nlu/configs/default.py): `synthetic_size` = n / 0.8 (80% of it is the
  training split), so the n of each row is its training set's.
* SNIPS with CLC (edp_nlu/configs/snips_clc.py): `train_fraction` keeps that share of the training
  split, drawn with a fixed public seed (edp_nlu/data/loading.py subset_train); dev and test stay
  whole. 100% is results/snips's clc_sgd_both_directions and clc_dpsgd_eps8_both_directions(_run2)
  (the same recipe and commands but for --config.diagnostics=True, which releases statistics and
  does not change training).

Cells run in the order listed, the cheapest informative points first (2-core machine shared with
other jobs); one run per row.
"""
from experiments.grids.common import cell, grid, with_heads_before

DEFAULT = "edp_nlu/configs/default.py"
SNIPS_CLC = "edp_nlu/configs/snips_clc.py"


def synthetic(n: int) -> list:
    size = f"synthetic_size={n * 5 // 4}"  # 80% train: n training utterances
    k = f"{n // 1000}k"
    return [cell(f"synthetic_n{k}_private", f"synthetic, n = {n:,}, the default command "
                 "(per-example DP-SGD, eps 8)", "private", DEFAULT, size),
            cell(f"synthetic_n{k}_sgd", f"synthetic, n = {n:,}, the default command, "
                 "--mechanism=sgd (not private)", "sgd", DEFAULT, size, "mechanism=sgd")]


def snips(percent: int) -> list:
    fraction = f"train_fraction={percent / 100}"
    return [cell(f"snips_clc_{percent}pct_private", f"SNIPS CLC, {percent}% of train, "
                 "per-example DP-SGD, eps 8 (snips_clc's default)", "private", SNIPS_CLC,
                 fraction),
            cell(f"snips_clc_{percent}pct_sgd", f"SNIPS CLC, {percent}% of train, SGD (not "
                 "private)", "sgd", SNIPS_CLC, fraction, "mechanism=sgd")]


def get_config():
    # the cells ran before the CLC configs' heads and weight averaging changed
    return with_heads_before(_grid())


def _grid():
    syn10k = synthetic(10_000)
    # SNIPS first after the synthetic private row: its plain SER is far from 0, so its ratio
    # answers the 1.2x question; the synthetic plain SER is ~1 error in 1,200 utterances at 10k
    # (results/pilot_default), so that ratio is mostly test-set noise
    cells = (syn10k[:1] + snips(25) + syn10k[1:] + snips(50) + synthetic(30_000)
             + synthetic(100_000))
    return grid("data_curve", cells, notes=(
        "Private / plain SER against n (experiments/grids/data_curve.py; the curve: "
        "results/data_curve/curve.md). SNIPS at 100% is results/snips's "
        "clc_sgd_both_directions and clc_dpsgd_eps8_both_directions(_run2)."))
