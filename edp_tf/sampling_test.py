"""Poisson sampling: batch sizes, masks, fixed shapes, real rows, overflow, replica shards."""
import math

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import edp_tf
from edp_tf import sampling
from edp_tf.sampling import slot_keys

N_EX = 1000


def toy_data(n=N_EX):
    """x rows are recognisable functions of their index: a returned row can be traced back."""
    idx = np.arange(n)
    x = {"ids": np.stack([idx, 2 * idx + 1, 3 * idx + 2], 1).astype(np.int32),
         "text": np.array([f"utterance {i}" for i in idx])}
    y = (idx + 1).astype(np.float32)  # +1: a padding row (0) can never look like example 0
    return x, y


def batches(sampler, steps, x=None, y=None):
    if x is None:
        x, y = toy_data(sampler.dataset_size)
    return [tf.nest.map_structure(lambda t: t.numpy(), b) for b in sampler.dataset(x, y, steps)]


def test_mean_and_variance_of_batch_size_match_poisson_sampling():
    q, steps = 0.05, 400
    sampler = sampling.PoissonSampler(N_EX, q, replicas=4)
    sizes = np.array([m.sum() for _, _, m in batches(sampler, steps)])
    mean, var = N_EX * q, N_EX * q * (1 - q)  # 50, 47.5
    # standard error of the mean: sqrt(47.5 / 400) = 0.34 -> 5 standard errors = 1.7
    assert abs(sizes.mean() - mean) < 5 * math.sqrt(var / steps), sizes.mean()
    # sample variance: standard error ~ var * sqrt(2 / (steps - 1)) = 3.4 -> 5 SE = 17. A fixed
    # batch size (variance 0) or sampling with the wrong q would fail this.
    assert abs(sizes.var(ddof=1) - var) < 5 * var * math.sqrt(2 / (steps - 1)), sizes.var()
    assert sampler.expected_batch_size == pytest.approx(50.0)
    assert sampling.expected_batch_size(N_EX, q) == pytest.approx(50.0)


def test_each_example_is_sampled_independently_at_rate_q():
    q, steps = 0.1, 300
    sampler = sampling.PoissonSampler(200, q)
    counts = np.zeros(200)
    for _, y, m in batches(sampler, steps):
        real = (y[m == 1] - 1).astype(int)
        assert len(set(real)) == len(real)  # without replacement within a batch
        counts[real] += 1
    # each count ~ Binomial(300, 0.1): mean 30, std 5.2. A chi-square test of the 200 counts
    # against that law; p > 1e-4 fails by chance once in 10^4 runs.
    expected, var = steps * q, steps * q * (1 - q)
    chi2 = ((counts - expected) ** 2 / var).sum()
    assert stats.chi2.sf(chi2, df=200) > 1e-4, chi2
    assert counts.min() > 0


def test_rows_are_real_examples_masks_mark_them_and_padding_is_zero():
    sampler = sampling.PoissonSampler(N_EX, 0.03, replicas=4, microbatch_size=2)
    assert sampler.max_batch_size % 8 == 0
    x, y = toy_data()
    for bx, by, mask in batches(sampler, 20, x, y):
        assert bx["ids"].shape == (sampler.max_batch_size, 3)
        assert bx["text"].shape == by.shape == mask.shape == (sampler.max_batch_size,)
        assert set(np.unique(mask)) <= {0.0, 1.0} and mask.dtype == np.float32
        real = mask == 1
        idx = (by[real] - 1).astype(int)
        np.testing.assert_array_equal(bx["ids"][real], x["ids"][idx])
        np.testing.assert_array_equal(bx["text"][real].astype(str), x["text"][idx])
        assert not bx["ids"][~real].any() and not by[~real].any()
        assert all(t == b"" for t in bx["text"][~real])


def test_real_rows_are_spread_over_slots_not_packed_first():
    """Uniform random slots keep one example's presence to one micro-batch (see module doc)."""
    sampler = sampling.PoissonSampler(N_EX, 0.03, replicas=4)
    masks = np.stack([m for _, _, m in batches(sampler, 200)])
    size = sampler.max_batch_size
    per_replica = masks.reshape(200, 4, size // 4).sum(axis=(0, 2))
    # each replica's share ~ 1/4 of ~6000 rows: binomial std ~ 34 rows; 5 std = 170
    total = masks.sum()
    assert np.all(np.abs(per_replica - total / 4) < 5 * math.sqrt(total * 3 / 16)), per_replica


def test_fresh_batches_each_iteration_and_reproducible_only_with_seed():
    x, y = toy_data()
    masks = lambda ds: np.stack([m.numpy() for _, _, m in ds])  # noqa: E731
    seeded = sampling.PoissonSampler(N_EX, 0.05, seed=3)
    ds = seeded.dataset(x, y, 3)
    first_epoch, second_epoch = masks(ds), masks(ds)
    assert not np.array_equal(first_epoch, second_epoch)  # each iteration (epoch) re-samples
    same_seed = sampling.PoissonSampler(N_EX, 0.05, seed=3).dataset(x, y, 3)
    np.testing.assert_array_equal(first_epoch, masks(same_seed))  # a fixed seed reproduces
    entropy_a = masks(sampling.PoissonSampler(N_EX, 0.05).dataset(x, y, 3))
    entropy_b = masks(sampling.PoissonSampler(N_EX, 0.05).dataset(x, y, 3))
    assert not np.array_equal(entropy_a, entropy_b)  # OS entropy otherwise
    assert seeded.seed_fixed and not sampling.PoissonSampler(N_EX, 0.05).seed_fixed


def test_overflow_raises_instead_of_truncating():
    sampler = sampling.PoissonSampler(10, 1.0, max_batch_size=8)  # q = 1 draws all 10 rows
    x, y = toy_data(10)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_batch_size"):
        batches(sampler, 1, x, y)


def test_max_batch_size_is_the_binomial_quantile():
    n, q, p = 3000, 64 / 3000, 1e-9
    m = sampling.poisson_max_batch_size(n, q, p)
    assert stats.binom.sf(m, n, q) <= p < stats.binom.sf(m - 1, n, q)
    rounded = sampling.poisson_max_batch_size(n, q, p, multiple=8)
    assert rounded % 8 == 0 and m <= rounded < m + 8
    assert sampling.PoissonSampler(n, q).steps_per_epoch == 47  # ceil(3000 / 64)


def test_every_replica_gets_a_full_shard():
    strategy = edp_tf.make_strategy(4)
    sampler = sampling.PoissonSampler(N_EX, 0.03, replicas=4)
    x, y = toy_data()
    dist = strategy.experimental_distribute_dataset(sampler.dataset(x, y, 2))
    for bx, by, mask in dist:
        shards = strategy.experimental_local_results(mask)
        assert len(shards) == 4
        assert all(s.shape == (sampler.max_batch_size // 4,) for s in shards)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dataset_size=100, sampling_rate=0.0), "sampling_rate"),
        (dict(dataset_size=100, sampling_rate=1.5), "sampling_rate"),
        (dict(dataset_size=0, sampling_rate=0.1), "dataset_size"),
        (dict(dataset_size=100, sampling_rate=0.1, replicas=0), "replicas"),
        (dict(dataset_size=100, sampling_rate=0.1, replicas=4, max_batch_size=30),
         "max_batch_size"),
        (dict(dataset_size=100, sampling_rate=0.1, overflow_probability=0.0), "overflow_prob"),
        (dict(dataset_size=100, sampling_rate=0.1, seed="x"), "seed"),
    ],
)
def test_invalid_parameters_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        sampling.PoissonSampler(**kwargs)


def test_wrong_row_count_is_refused():
    x, y = toy_data(50)
    with pytest.raises(ValueError, match="dataset_size=60"):
        sampling.PoissonSampler(60, 0.1).dataset(x, y)


def test_slot_keys_do_not_tie():
    """Ties would make argsort's placement depend on position; float32 keys tied in ~2.5% of
    draws at this size (about 60 of 2000 expected), 64-bit keys essentially never."""
    size, draws = 1200, 2000
    tied = 0
    for i in range(draws):
        keys = slot_keys(size, tf.constant([i, 7], tf.int64)).numpy()
        tied += len(np.unique(keys)) < size
    assert tied == 0


@pytest.mark.parametrize("copies,variants", [(3, 3), (2, 5)])
def test_augmented_sampler_gives_each_sampled_example_k_of_its_variants_in_one_slot(copies,
                                                                                     variants):
    """Poisson over examples (q n expected, not q n K), each sampled example's slot holding K
    distinct rows of its own V variants; empty slots are all padding."""
    n, q, steps = 60, 0.2, 200
    sampler = sampling.AugmentedPoissonSampler(n, q, replicas=2, copies=copies,
                                               variants=variants)
    assert sampler.expected_batch_size == pytest.approx(q * n)
    assert sampler.steps_per_epoch == sampling.PoissonSampler(n, q).steps_per_epoch
    assert sampler.max_batch_size == sampler.slots * copies
    assert sampler.slots == sampling.PoissonSampler(n, q, replicas=2).max_batch_size
    x, y = toy_data(n * variants)
    examples = []
    for bx, by, mask in batches(sampler, steps, x, y):
        rows = (by.reshape(-1, copies) - 1).astype(int)  # y = row + 1, 0 for padding
        slot_mask = mask.reshape(-1, copies)
        assert np.all(slot_mask == slot_mask[:, :1])  # a slot is all real or all padding
        real = rows[slot_mask[:, 0] == 1]
        owners = real // variants
        assert np.all(owners == owners[:, :1])  # one example per slot
        assert all(len(set(r)) == copies for r in real)  # K distinct variants
        assert len(set(owners[:, 0])) == len(owners)  # an example once per batch
        examples.append(len(owners))
    mean, var = n * q, n * q * (1 - q)
    assert abs(np.mean(examples) - mean) < 5 * math.sqrt(var / steps), np.mean(examples)


def test_augmented_sampler_refuses_arrays_without_every_variant():
    x, y = toy_data(60)
    with pytest.raises(ValueError, match="dataset_size x variants = 30 x 4 = 120"):
        sampling.AugmentedPoissonSampler(30, 0.1, copies=4).dataset(x, y)
    with pytest.raises(ValueError, match="variants=2 must be >= copies=3"):
        sampling.AugmentedPoissonSampler(30, 0.1, copies=3, variants=2)


# ------------------------------------------------------------------------- BandMF
def test_bandmf_sampler_draws_each_group_every_b_steps_at_rate_b_q():
    n, q, bands = 400, 0.02, 5  # each group at b q = 0.1
    sampler = sampling.BandMFSampler(n, q, bands=bands, seed=11)
    assert sampler.group_sampling_rate == pytest.approx(0.1)
    assert sampler.steps_per_epoch == 50 and sampler.expected_batch_size == pytest.approx(8.0)
    group = sampler.groups(11)
    steps = 2 * sampler.steps_per_epoch
    x, y = toy_data(n)
    counts = np.zeros(n)
    stream = sampler.dataset(x, y, sampler.steps_per_epoch, repeat=True).take(steps)
    for t, (_, by, m) in enumerate(stream):
        real = (by.numpy()[m.numpy() == 1] - 1).astype(int)
        # only group t mod b, in the second pass (repeat) too: the cycle never breaks
        assert np.all(group[real] == t % bands), t
        counts[real] += 1
    # an example of group g is eligible at steps/b = 20 steps: count ~ Binomial(20, 0.1),
    # mean 2, var 1.8; the mean over 400 examples has standard error 0.067, 5 of them 0.34
    # (sampling at q instead of b q would give 0.4)
    assert abs(counts.mean() - steps / bands * 0.1) < 5 * math.sqrt(1.8 / n), counts.mean()
    # the split draws groups independently and uniformly: 80 expected per group, sd 8
    assert np.all(np.abs(np.bincount(group, minlength=bands) - n / bands) < 5 * 8)


def test_bandmf_sampler_refuses_what_would_break_the_separation_or_rate():
    sampler = sampling.BandMFSampler(100, 0.05, bands=4)
    x, y = toy_data(100)
    with pytest.raises(ValueError, match="multiple of bands=4"):
        sampler.dataset(x, y, steps=10)
    with pytest.raises(ValueError, match="bands >= 2"):
        sampling.BandMFSampler(100, 0.05, bands=1)
    with pytest.raises(ValueError, match="b q = 1.2 > 1"):
        sampling.BandMFSampler(100, 0.05, bands=24)
    assert sampler.steps_per_epoch % 4 == 0
    assert edp_tf.batch_source.describe(sampler.dataset(x, y)).sampler == sampler
