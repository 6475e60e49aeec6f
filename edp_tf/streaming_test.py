"""Streaming Poisson sampling: the same law as PoissonSampler (every record in every step
independently with probability q, uniformly random slots), blocks that do not change it, the
count check, overflow, spill files removed, and a private fit with its ledger."""
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import batch_source, ledger
from edp_tf.streaming import StreamingPoissonSampler, _bernoulli_arrivals, text_lines

N, Q = 40, 0.2  # 5 steps per epoch, expected batch 8


def corpus(n=N):
    return lambda: (f"{i}".encode() for i in range(n))


def inclusion_counts(sampler, epochs, steps=None):
    """[record, step] counts over `epochs` epochs, and the slots each record landed in."""
    steps = steps or sampler.steps_per_epoch
    counts = np.zeros((sampler.dataset_size, steps))
    slots = []
    for epoch in range(epochs):
        for step, (batch, mask) in enumerate(sampler.batches(corpus(sampler.dataset_size),
                                                             steps, epoch)):
            assert len(batch) == len(mask) == sampler.max_batch_size
            assert all((row != b"") == bool(m) for row, m in zip(batch, mask))
            for slot, row in enumerate(batch):
                if row:
                    counts[int(row), step] += 1
                    slots.append(slot)
    return counts, np.array(slots)


@pytest.mark.parametrize("block_records", [65536, 5])  # one block; a block per step
def test_each_record_is_taken_in_each_step_with_probability_q(block_records):
    """4,000 epochs: each of the 200 (record, step) counts is Binomial(4000, 0.2), sd 25.3;
    5.5 sd (140) bounds all 200 with probability > 0.99999. The pair count of two steps of one
    record is Binomial(4000, q^2) if independent (mean 160, sd 12.4): a pooled 5 sd check."""
    sampler = StreamingPoissonSampler(N, Q, seed=7, block_records=block_records)
    assert (sampler.steps_per_block == 1) == (block_records == 5)
    epochs = 4000
    counts, slots = inclusion_counts(sampler, epochs)
    sd = math.sqrt(epochs * Q * (1 - Q))
    assert np.max(np.abs(counts - epochs * Q)) < 5.5 * sd
    # Slots: uniform over max_batch_size (chi-square, 5 sd of its df).
    m = sampler.max_batch_size
    seen = np.bincount(slots, minlength=m)
    chi2 = float(np.sum((seen - len(slots) / m) ** 2 / (len(slots) / m)))
    assert abs(chi2 - (m - 1)) < 5 * math.sqrt(2 * (m - 1))


def test_arrivals_are_independent_across_steps():
    """200,000 records over 3 steps: P(step 0 and 2) = q^2 = 0.04 (sd of the frequency 4.4e-4),
    and no record is taken twice in one step."""
    rng = np.random.default_rng(0)
    pairs = list(_bernoulli_arrivals(200_000, 3, Q, rng))
    taken = np.zeros((200_000, 3), bool)
    for index, step in pairs:
        assert not taken[index, step]
        taken[index, step] = True
    assert np.all(np.abs(taken.mean(0) - Q) < 5 * math.sqrt(Q * (1 - Q) / 200_000))
    both = np.mean(taken[:, 0] & taken[:, 2])
    assert abs(both - Q * Q) < 5 * math.sqrt(Q * Q * (1 - Q * Q) / 200_000)


def test_fixed_seed_repeats_per_epoch_and_entropy_does_not():
    fixed = StreamingPoissonSampler(N, Q, seed=3)
    run = lambda s, epoch: [b for b, _ in s.batches(corpus(), epoch=epoch)]  # noqa: E731
    assert run(fixed, 0) == run(fixed, 0) != run(fixed, 1)
    private = StreamingPoissonSampler(N, Q)
    assert not private.seed_fixed and run(private, 0) != run(private, 0)


def test_a_shared_key_gives_every_worker_the_same_batches():
    """Two workers' samplers with the same secret key draw one Poisson sample per step between
    them (the same batches); another key, or none, draws other batches. 8 steps of batches of
    ~8 of 40 records: equal by chance with probability far below 1e-9."""
    run = lambda s, epoch: [b for b, _ in s.batches(corpus(), epoch=epoch)]  # noqa: E731
    key = 2**62 + 12345
    worker_0, worker_1 = (StreamingPoissonSampler(N, Q, key=key) for _ in range(2))
    assert not worker_0.seed_fixed
    assert run(worker_0, 0) == run(worker_1, 0) != run(worker_0, 1)
    assert run(StreamingPoissonSampler(N, Q, key=key + 1), 0) != run(worker_0, 0)
    assert run(StreamingPoissonSampler(N, Q), 0) != run(worker_0, 0)


def test_a_reader_with_another_count_is_refused_before_any_batch(tmp_path):
    sampler = StreamingPoissonSampler(N, Q, work_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"gave 39 records .* dataset_size=40"):
        next(sampler.batches(corpus(39)))
    with pytest.raises(TypeError, match="records must be bytes, got str"):
        next(sampler.batches(lambda: iter(["text"] * N)))
    assert os.listdir(tmp_path) == []  # spill files removed on error too


def test_overflow_raises_instead_of_truncating(tmp_path):
    sampler = StreamingPoissonSampler(N, 0.9, max_batch_size=4, work_dir=str(tmp_path))
    with pytest.raises(ValueError, match="larger than max_batch_size=4"):
        list(sampler.batches(corpus()))
    assert os.listdir(tmp_path) == []


def test_spill_files_are_private_and_removed_after_the_epoch(tmp_path):
    sampler = StreamingPoissonSampler(N, Q, work_dir=str(tmp_path), block_records=8)
    stream = sampler.batches(corpus())
    next(stream)
    (spill,) = os.listdir(tmp_path)
    assert os.stat(tmp_path / spill).st_mode & 0o077 == 0
    assert len(os.listdir(tmp_path / spill)) == math.ceil(5 / sampler.steps_per_block) > 1
    list(stream)
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="work_dir"):
        StreamingPoissonSampler(N, Q, work_dir=str(tmp_path / "missing"))


def test_private_fit_on_streamed_records_with_its_ledger(tmp_path):
    """Records are text lines "x1 x2 x3 y", parsed in tf.data; 2 replicas, 3 epochs."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    lines = [" ".join(f"{v:.4f}" for v in (*row, row @ [1.0, -2.0, 0.5])).encode() for row in x]
    sampler = StreamingPoissonSampler(64, 0.25, replicas=2)
    strategy = edp_tf.make_strategy(2)

    def parse(record):  # one text line -> (x, y); padding rows are b"" (mask 0)
        filled = tf.where(record == "", "0 0 0 0", record)
        values = tf.strings.to_number(tf.strings.split(filled), tf.float32)
        return values[:3], values[3:]

    with strategy.scope():
        model = edp_tf.PrivateModel(
            keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]),
            edp_tf.DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0,
                            expected_batch_size=sampler.expected_batch_size))
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    led = ledger.PrivacyLedger.for_sampler(str(tmp_path), sampler, 1 / 64)
    batches = batch_source.map_rows(sampler.record_dataset(lambda: iter(lines)), parse)
    history = model.fit(batches, epochs=3, verbose=0, callbacks=[led])
    content = ledger.read_ledger(str(tmp_path))
    assert len(history.history["noise_multiplier"]) == 3 and content["private"] is True
    assert content["batch_source"] == {"kind": "sampler", "row_maps": ["parse"],
                                       "sampler": "StreamingPoissonSampler"}
    assert content["sampling"] == "poisson" and content["sampling_rate"] == 0.25
    assert [e["steps"] for e in content["epochs"]] == [4, 4, 4]


def test_text_lines_reads_shards_in_order(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\n")
    (tmp_path / "b.txt").write_bytes(b"three")
    read = text_lines([tmp_path / "a.txt", tmp_path / "b.txt"])
    assert list(read()) == list(read()) == [b"one", b"two", b"three"]
    with pytest.raises(ValueError, match="missing"):
        text_lines([tmp_path / "c.txt"])
