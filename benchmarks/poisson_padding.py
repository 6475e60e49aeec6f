"""What the padded Poisson batch costs in rows, and what truncating it would cost in epsilon.

A private step runs `max_batch_size` rows (edp_tf.sampling: the binomial quantile a step's count
stays under with probability 1 - 1e-9), so that neither shapes nor step time tell the count.
Truncated Poisson sampling (keep a random subset when more are drawn) would run fewer rows; its
epsilon is dp-accounting's `TruncatedSubsampledGaussianDpEvent` (PLD): an example's presence can
then evict another, and that costs epsilon fast below the quantile. This prints both, side by
side, for one run's shape:

    python -m benchmarks.poisson_padding --dataset_size=8000 --batch_size=256 \
        --noise_multiplier=1.0 --steps=620
"""
from __future__ import annotations

import dp_accounting
from absl import app, flags
from scipy import stats

from edp_tf.sampling import poisson_max_batch_size

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined when run as a command only: importing `epsilon` (its test) defines none."""
    flags.DEFINE_integer("dataset_size", 8000, "Examples n.")
    flags.DEFINE_integer("batch_size", 256, "Expected batch q n.")
    flags.DEFINE_float("noise_multiplier", 1.0, "Noise multiplier z.")
    flags.DEFINE_integer("steps", 620, "Steps of the run.")
    flags.DEFINE_list("truncated_sizes", [], "Truncated batch sizes (default: 1 to 5 standard "
                      "deviations of the count above its mean).")


def epsilon(n: int, q: float, z: float, steps: int, delta: float, size: int = 0) -> float:
    """PLD epsilon of `steps` Poisson-sampled Gaussian steps, truncated at `size` rows if > 0."""
    event = (dp_accounting.TruncatedSubsampledGaussianDpEvent(n, q, size, z) if size else
             dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)))
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(event, steps)
    return accountant.get_epsilon(delta)


def main(argv) -> None:
    del argv
    n, batch, z, steps = FLAGS.dataset_size, FLAGS.batch_size, FLAGS.noise_multiplier, FLAGS.steps
    q, delta = batch / n, 1.0 / n
    padded = poisson_max_batch_size(n, q)
    full = epsilon(n, q, z, steps, delta)
    std = (n * q * (1 - q)) ** 0.5
    sizes = ([int(s) for s in FLAGS.truncated_sizes] if FLAGS.truncated_sizes else
             [int(round(batch + k * std)) for k in range(1, 6)])
    print(f"n={n}, expected batch {batch}, z={z}, {steps} steps, delta={delta:.3g}")
    print("| rows per step | rows / expected | P(count > rows) | epsilon | epsilon / padded's |")
    print("|---|---|---|---|---|")
    print(f"| {padded} (padded, never truncated) | {padded / batch:.3f} | "
          f"{stats.binom.sf(padded, n, q):.1e} | {full:.3f} | 1.000 |")
    for size in sizes:
        eps = epsilon(n, q, z, steps, delta, size)
        print(f"| {size} (truncated) | {size / batch:.3f} | {stats.binom.sf(size, n, q):.1e} | "
              f"{eps:.3f} | {eps / full:.3f} |")


if __name__ == "__main__":
    define_flags()
    app.run(main)
