"""How long releasing a training iterator takes (`python -m benchmarks.benchmark --release_after`).

    python -m benchmarks.benchmark --release_after=150 --release_runs=4 --replicas=2 \
        --output=results/benchmarks/iterator_release.json

Each run is a fresh process that iterates a distributed Poisson sampler dataset (as fit does,
one batch per 20 ms) for --release_after seconds, then times the release of the iterator.
`edp_tf` is the library's pipeline (edp_tf/iterators.py: autotuning off in the input and device
pipelines); `tf_default` is the same dataset with tf.data's default autotuning, under a plain
MirroredStrategy. The runs of both go side by side, so load hits them alike.
"""
from __future__ import annotations

import multiprocessing
import time

VARIANTS = ("edp_tf", "tf_default")


def one_run(variant: str, seconds: float, replicas: int) -> dict:
    """Iterates for `seconds`, then releases the iterator: {"variant", "batches", "release_s"}."""
    from edp_nlu import cli

    cli.quiet_unless_verbose([])  # a spawned process: silence TensorFlow's start-up lines here too
    import numpy as np
    import tensorflow as tf

    import edp_tf

    if variant == "edp_tf":
        strategy = edp_tf.make_strategy(replicas)
    else:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
        strategy = tf.distribute.MirroredStrategy(
            [d.name for d in tf.config.list_logical_devices("CPU")])
    n = 2000
    sampler = edp_tf.PoissonSampler(dataset_size=n, sampling_rate=0.05, replicas=replicas)
    dataset = sampler.dataset(np.zeros((n, 20), np.float32), np.zeros(n, np.int32), repeat=True)
    if variant == "tf_default":
        options = tf.data.Options()
        options.autotune.enabled = True
        dataset = dataset.with_options(options)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    start, batches = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        next(iterator)
        batches += 1
        time.sleep(0.02)  # a training step's stand-in
    released = time.monotonic()
    del iterator
    return {"variant": variant, "batches": batches,
            "release_s": round(time.monotonic() - released, 4)}


def run(seconds: float, runs: int, replicas: int) -> list:
    """`runs` fresh processes per variant, all at once; their results."""
    jobs = [(variant, seconds, replicas) for variant in VARIANTS for _ in range(runs)]
    context = multiprocessing.get_context("spawn")  # TensorFlow starts afresh in each
    with context.Pool(len(jobs), maxtasksperchild=1) as pool:
        return pool.starmap(one_run, jobs, chunksize=1)


def table(results: list, seconds: float) -> str:
    lines = [f"| pipeline | runs | release after {seconds:g} s (each) | over 1 s |",
             "|---|---|---|---|"]
    for variant in VARIANTS:
        times = [r["release_s"] for r in results if r["variant"] == variant]
        lines.append(f"| {variant} | {len(times)} | {', '.join(f'{t:.2f}' for t in times)} s "
                     f"| {sum(t > 1.0 for t in times)} |")
    return "\n".join(lines)
