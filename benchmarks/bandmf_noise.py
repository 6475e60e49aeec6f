"""`python -m benchmarks.bandmf_noise`: BandMF's noise against DP-SGD's at the same epsilon,
computed (no training): what correlated noise can give before a run measures what it gives.

For each run length T and band count b (b <= 1 / q, so that b q <= 1), both mechanisms are
calibrated to the same (epsilon, delta) on n examples at rate q: DP-SGD as T steps at q, BandMF
as ceil(T / b) steps at b q (edp_tf.accounting). Reported per row:

  z                 the calibrated multiplier (BandMF's z_t std in units of S C);
  step_std_ratio    the std of one step's noise y_t (stationary, the last step), BandMF / DP-SGD;
  prefix_rmse_ratio the root of the mean squared error of the T prefix sums of the noise (what
                    SGD's iterates accumulate, the objective the strategy is optimised for),
                    BandMF / DP-SGD. Below 1: less noise where it matters at the same epsilon;
                    at the same q and T, DP-SGD's noise on the average falls as 1 / n, so
                    1 / ratio is the data DP-SGD would need for the same error.

    python -m benchmarks.bandmf_noise --n=13084 --q=0.08 --epsilon=8 --steps=300,1000,3000
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

from absl import app, flags

from edp_tf import accounting, bandmf

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_integer("n", 13084, "training examples (SNIPS: 13,084)")
    flags.DEFINE_float("q", 0.08, "sampling rate (the SNIPS BERT config's)")
    flags.DEFINE_float("epsilon", 8.0, "target epsilon")
    flags.DEFINE_float("delta", 0.0, "delta; 0: 0.1 / n, the trainers' default")
    flags.DEFINE_list("steps", ["300", "1000", "3000"], "run lengths T")
    flags.DEFINE_list("bands", [], "band counts b; empty: 1, 2, 3, 4, 6, 8, ... up to 1 / q")
    flags.DEFINE_string("out", "", "JSON file for the rows (and the command)")


def default_bands(q: float) -> list:
    top = int(1.0 / q + 1e-9)
    return sorted({b for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, top) if b <= top})


def row(n: int, q: float, epsilon: float, delta: float, steps: int, bands: int,
        dpsgd_z: float) -> dict:
    """One (T, b) row against DP-SGD's multiplier `dpsgd_z` at the same target."""
    z = dpsgd_z if bands == 1 else accounting.calibrate_noise(
        epsilon, delta, q, 1, steps, bands=bands)
    c = bandmf.optimal_coefficients(steps, bands)
    step_std = z * float(bandmf.marginal_noise_std(c, steps)[-1])
    prefix = z * math.sqrt(bandmf.prefix_sum_error(c, steps))
    dpsgd_prefix = dpsgd_z * math.sqrt(bandmf.prefix_sum_error((1.0,), steps))
    return {"n": n, "q": q, "epsilon": epsilon, "delta": delta, "steps": steps, "bands": bands,
            "z": z, "dpsgd_z": dpsgd_z, "step_std_ratio": step_std / dpsgd_z,
            "prefix_rmse_ratio": prefix / dpsgd_prefix, "coefficients": list(c)}


def write_table(out_dir: str) -> str:
    """results/bandmf/table.md from every JSON there: one table per (n, q, epsilon)."""
    lines = ["# BandMF noise against DP-SGD's at the same epsilon (computed, no training)", "",
             "Written by `python -m benchmarks.bandmf_noise` (the command under each table). "
             "z: the calibrated multiplier (PLD); step std: the std of one step's noise at the "
             "last step, BandMF / DP-SGD; prefix RMSE: the root mean squared error of the T "
             "prefix sums of the noise, BandMF / DP-SGD (the objective the strategy is optimised "
             "for; what SGD's iterates accumulate). BandMF: b groups, ceil(T/b) steps at b q. "
             "At the same q and T, DP-SGD's noise on the averaged update (z S C / (q n)) falls "
             "as 1 / n, so 1 / ratio is the data DP-SGD would need for BandMF's RMSE.",
             ""]
    for name in sorted(os.listdir(out_dir)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(out_dir, name)) as f:
            data = json.load(f)
        if not isinstance(data, dict) or not data.get("rows"):
            continue  # another command's file in the same directory (--out=/tmp/x.json)
        first = data["rows"][0]
        lines += [f"## n = {first['n']}, q = {first['q']:g}, epsilon {first['epsilon']:g}, "
                  f"delta {first['delta']:.3g}", "", f"`{data['command']}`", "",
                  "| T | b | z | step std / DP-SGD | prefix RMSE / DP-SGD | DP-SGD's data for the "
                  "same RMSE (1 / ratio) |", "|---|---|---|---|---|---|"]
        for r in data["rows"]:
            lines.append(f"| {r['steps']} | {r['bands']} | {r['z']:.4f} | "
                         f"{r['step_std_ratio']:.3f} | {r['prefix_rmse_ratio']:.3f} | "
                         f"{1.0 / r['prefix_rmse_ratio']:.2f}x |")
        lines.append("")
    path = os.path.join(out_dir, "table.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def main(argv) -> None:
    del argv

    n, q, eps = FLAGS.n, FLAGS.q, FLAGS.epsilon
    delta = FLAGS.delta or 0.1 / n
    bands = [int(b) for b in FLAGS.bands] or default_bands(q)
    rows = []
    print("| T | b | z | step std / DP-SGD | prefix RMSE / DP-SGD |")
    print("|---|---|---|---|---|")
    for steps in (int(t) for t in FLAGS.steps):
        dpsgd_z = accounting.calibrate_noise(eps, delta, q, 1, steps)
        for b in bands:
            start = time.time()
            r = row(n, q, eps, delta, steps, b, dpsgd_z)
            rows.append(r)
            print(f"| {steps} | {b} | {r['z']:.4f} | {r['step_std_ratio']:.3f} | "
                  f"{r['prefix_rmse_ratio']:.3f} |  ({time.time() - start:.0f} s)", flush=True)
    if FLAGS.out:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
        with open(FLAGS.out, "w") as f:
            json.dump({"command": "python -m benchmarks.bandmf_noise " + " ".join(sys.argv[1:]),
                       "rows": rows}, f, indent=1)
        print("table:", write_table(os.path.dirname(os.path.abspath(FLAGS.out))))


if __name__ == "__main__":
    define_flags()
    app.run(main)
