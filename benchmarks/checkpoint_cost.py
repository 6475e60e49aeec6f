"""What a checkpoint inside an epoch costs: the time to write, hash and commit one
(edp_nlu/pipeline/checkpoints.py) for a MiniLM-L6-sized model with Adam's two moments, and for
a CLC-sized one, so that `--config.checkpoint_seconds` can be weighed against a run's time.

    python -m benchmarks.checkpoint_cost
"""
from __future__ import annotations

import os
import tempfile
import time

import tensorflow as tf
from absl import app

from edp_nlu.pipeline import checkpoints, run_files

# (name, weights): MiniLM-L6's 22.7M weights; the default CLC's ~0.2M trainable ones
SIZES = (("MiniLM-L6 + Adam", 22_700_000), ("CLC + Adam", 200_000))


def seconds_per_checkpoint(weights: int, repeats: int = 3) -> list:
    """Seconds of each of `repeats` commits of a checkpoint of `weights` float32 weights and
    two moments of the same size (what the trainer writes with Adam)."""
    rows = max(1, weights // 1000)
    model = tf.Variable(tf.random.normal([rows, 1000]))
    moments = [tf.Variable(tf.zeros([rows, 1000])) for _ in range(2)]
    checkpoint = tf.train.Checkpoint(model=model, moments=moments)
    run_dir, state = tempfile.mkdtemp(prefix="edp-ckpt-"), {}
    path = os.path.join(run_dir, run_files.STATE_FILE)
    times = []
    for step in range(1, repeats + 1):
        started = time.perf_counter()
        checkpoints.write(checkpoint, run_dir, state, 0, None,
                          lambda s: run_files.write_json(path, s), steps_done=step)
        times.append(time.perf_counter() - started)
    return times


def main(argv) -> None:
    del argv
    print("| model | weights | MB written | seconds per checkpoint (3 commits) |")
    print("|---|---:|---:|---|")
    for name, weights in SIZES:
        times = seconds_per_checkpoint(weights)
        print(f"| {name} | {weights:,} | {3 * 4 * weights / 1e6:.0f} | "
              + ", ".join(f"{t:.2f}" for t in times) + " |")


if __name__ == "__main__":
    app.run(main)
