"""The streaming benchmark (`python -m benchmarks.benchmark --scale`): memory and time of one
epoch of Poisson sampling over a corpus on disk, at 100k and 1M utterances.

Each size is written as sharded text (one utterance per line: tokens, tags and intent separated
by tabs) and then measured in a fresh process, so that its peak resident memory is its own:
one epoch of `StreamingPoissonSampler.batches` at a fixed expected batch (q = batch / n, so
the epoch has n / batch steps), every batch consumed and its real rows counted. No training:
the question is whether reading and sampling stay flat in memory and linear in time.
"""
from __future__ import annotations

import multiprocessing
import os
import resource
import time

from edp_nlu.data import synthetic

LINE = "{tokens}\t{tags}\t{intent}\n"


def write_corpus(directory: str, size: int, shards: int = 8, seed: int = 0) -> list:
    """`size` synthetic utterances in `shards` text files; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"shard{i:03d}.txt") for i in range(shards)]
    stream = synthetic.utterances(seed)
    for i, path in enumerate(paths):
        count = size // shards + (i < size % shards)
        with open(path, "w", encoding="utf-8") as handle:
            for _ in range(count):
                u = next(stream)
                handle.write(LINE.format(tokens=" ".join(u.tokens), tags=" ".join(u.tags),
                                         intent=u.intent))
    return paths


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def measure_epoch(paths: list, size: int, expected_batch: int, block_records: int,
                  work_dir: str) -> dict:
    """One epoch of streaming + sampling in this process: seconds, steps, rows, memory."""
    from edp_nlu import cli

    cli.quiet_unless_verbose([])  # a spawned process: silence TensorFlow's start-up lines here too
    from edp_tf.streaming import StreamingPoissonSampler, text_lines

    sampler = StreamingPoissonSampler(size, expected_batch / size, block_records=block_records,
                                      work_dir=work_dir)
    after_imports = _peak_rss_mb()
    start = time.perf_counter()
    steps = rows = 0
    for batch, mask in sampler.batches(text_lines(paths)):
        steps += 1
        rows += int(mask.sum())
    seconds = time.perf_counter() - start
    peak = _peak_rss_mb()
    return {"utterances": size, "sampling_rate": sampler.sampling_rate, "steps": steps,
            "rows_sampled": rows, "max_batch_size": sampler.max_batch_size,
            "block_records": block_records, "seconds": seconds,
            "peak_rss_mb": peak, "rss_after_imports_mb": after_imports,
            "rss_growth_mb": peak - after_imports}


def run_scale(sizes, directory: str, expected_batch: int = 512,
              block_records: int = 65536) -> list:
    """Writes each corpus (reusing one already there) and measures it in a fresh process."""
    results = []
    context = multiprocessing.get_context("spawn")
    for size in sizes:
        corpus_dir = os.path.join(directory, f"corpus_{size}")
        done = os.path.join(corpus_dir, "COMPLETE")
        start = time.perf_counter()
        if os.path.exists(done):
            paths = sorted(os.path.join(corpus_dir, f) for f in os.listdir(corpus_dir)
                           if f.endswith(".txt"))
            written = None
        else:
            paths = write_corpus(corpus_dir, size)
            open(done, "w").close()
            written = time.perf_counter() - start
        with context.Pool(1) as pool:
            result = pool.apply(measure_epoch, (paths, size, expected_batch, block_records,
                                                directory))
        result["write_seconds"] = written
        result["bytes_on_disk"] = sum(os.path.getsize(p) for p in paths)
        results.append(result)
    return results


def table(results: list) -> str:
    lines = ["| utterances | on disk | steps | seconds / epoch | us / utterance | peak RSS | "
             "RSS growth while streaming |", "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['utterances']:,} | {r['bytes_on_disk'] / 2**20:.0f} MiB | {r['steps']:,} | "
            f"{r['seconds']:.1f} | {1e6 * r['seconds'] / r['utterances']:.1f} | "
            f"{r['peak_rss_mb']:.0f} MiB | {r['rss_growth_mb']:.0f} MiB |")
    return "\n".join(lines)
