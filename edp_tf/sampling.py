"""Poisson sampling for tf.data: the sampling that the accountants' amplification assumes.

Each step takes every example independently with probability q. The batch is padded to a fixed
`max_batch_size` with a 0/1 mask (fed to `fit` as sample_weight), so the private step stays one
compiled graph and every replica gets a full shard; the step normalises by the *expected* batch
q*n (`DPConfig(expected_batch_size=sampler.expected_batch_size)`), never by the realised one.

Why real rows land in uniformly random slots (not first): adding one example to the data then
only fills one more random slot and leaves every other row where it was (a uniformly random
injective placement can be drawn example by example), so exactly one micro-batch changes, whatever
the replica and micro-batch cut: sensitivity C for one example per micro-batch, 2C otherwise.
Packing real rows first would shift all later rows and change many micro-batches.

Overflow (more than `max_batch_size` examples drawn) raises instead of dropping: keeping a random
subset is *truncated* Poisson sampling, where one example's presence can evict another (two
micro-batches change), which the Poisson-subsampled Gaussian accounting does not cover.
`max_batch_size` is the binomial quantile at `overflow_probability` per step (default 1e-9:
a million steps fail with probability 1e-3, loudly, at no privacy cost).

Randomness: a 63-bit key from OS entropy unless `seed` is given. Batches must stay secret for
the amplification to hold, so a fixed seed is reported (`seed_fixed`) and voids the guarantee.
The workers of a multi-worker run must draw the same batches: they pass the `key` that
`edp_tf.multi_worker.shared_key` drew from worker 0's OS entropy (secret, so still private).
"""
from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Any, Optional

import numpy as np
import tensorflow as tf
from scipy import stats

from edp_tf import batch_source, iterators
from edp_tf.accounting import check_sampling_rate, group_sampling_rate
from edp_tf.sampling_unit import SamplingUnit

DEFAULT_OVERFLOW_PROBABILITY = 1e-9


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def expected_batch_size(dataset_size: int, sampling_rate: float) -> float:
    """q * n: what `DPConfig(expected_batch_size=...)` must be given."""
    return _positive_int("dataset_size", dataset_size) * check_sampling_rate(sampling_rate)


def poisson_max_batch_size(
    dataset_size: int,
    sampling_rate: float,
    overflow_probability: float = DEFAULT_OVERFLOW_PROBABILITY,
    multiple: int = 1,
) -> int:
    """Smallest multiple of `multiple` M with P(Binomial(n, q) > M) <= overflow_probability."""
    n = _positive_int("dataset_size", dataset_size)
    q = check_sampling_rate(sampling_rate)
    multiple = _positive_int("multiple", multiple)
    if not 0.0 < overflow_probability < 1.0:
        raise ValueError(f"overflow_probability must be in (0, 1), got {overflow_probability!r}")
    m = int(stats.binom.isf(overflow_probability, n, q))
    while m < n and stats.binom.sf(m, n, q) > overflow_probability:  # isf is approximate
        m += 1
    m = max(m, 1)
    return int(math.ceil(m / multiple) * multiple)


@dataclasses.dataclass(frozen=True)
class PoissonSampler:
    """Poisson-sampled, padded and masked batches of an in-memory dataset.

    Usage:
        sampler = PoissonSampler(dataset_size=n, sampling_rate=q, replicas=4)
        cfg = DPConfig(..., expected_batch_size=sampler.expected_batch_size)
        model.fit(sampler.dataset(x, y), epochs=E)   # steps_per_epoch steps, fresh each epoch

    The dataset is marked as this sampler's (edp_tf.batch_source): a ledger for this sampler
    accepts it as it is, or with `repeat=True`; transformed afterwards (.map, .shuffle, ...) it
    is no longer known to be a Poisson sample and the ledger refuses it.
    """

    dataset_size: int
    sampling_rate: float
    replicas: int = 1
    microbatch_size: Optional[int] = None
    overflow_probability: float = DEFAULT_OVERFLOW_PROBABILITY
    max_batch_size: Optional[int] = None
    seed: Optional[int] = None
    key: Optional[int] = None  # a secret key from OS entropy (multi_worker.shared_key), not a seed

    def __post_init__(self) -> None:
        _positive_int("dataset_size", self.dataset_size)
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))
        _positive_int("replicas", self.replicas)
        if self.microbatch_size is not None:
            _positive_int("microbatch_size", self.microbatch_size)
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be None or an integer, got {self.seed!r}")
        if self.key is not None and (isinstance(self.key, bool) or not isinstance(self.key, int)
                                     or not 0 <= self.key < 2 ** 63):
            raise ValueError(f"key must be None or an integer in [0, 2^63), got {self.key!r}")
        if self.key is not None and self.seed is not None:
            raise ValueError("give a fixed seed or a shared key, not both")
        multiple = self.replicas * (self.microbatch_size or 1)
        if self.max_batch_size is None:
            object.__setattr__(self, "max_batch_size", poisson_max_batch_size(
                self.dataset_size, self.sampling_rate, self.overflow_probability, multiple))
        elif _positive_int("max_batch_size", self.max_batch_size) % multiple:
            raise ValueError(
                f"max_batch_size={self.max_batch_size} must be a multiple of replicas x "
                f"microbatch_size = {multiple}")

    @property
    def unit(self) -> SamplingUnit:
        """What one sampled unit is (edp_tf/sampling_unit.py): here one example's row."""
        return SamplingUnit()

    @property
    def expected_batch_size(self) -> float:
        return self.dataset_size * self.sampling_rate

    @property
    def steps_per_epoch(self) -> int:
        """ceil(1/q): steps that see n examples in expectation."""
        return int(math.ceil(1.0 / self.sampling_rate - 1e-9))

    @property
    def seed_fixed(self) -> bool:
        return self.seed is not None

    def dataset(self, x: Any, y: Any, steps: Optional[int] = None,
                repeat: bool = False) -> tf.data.Dataset:
        """`steps` (default steps_per_epoch) batches of (x, y, mask), fresh at each iteration.

        x and y are nests (arrays, dicts, tuples) of arrays with `dataset_size` rows. Padding rows
        are zeros (empty strings) with mask 0. `repeat=True`: an infinite stream (fresh batches
        at every pass), for `fit(..., steps_per_epoch=...)`.
        """
        n, size, q = self.dataset_size, self.max_batch_size, self.sampling_rate
        return self._stream(x, y, n, steps, 2, lambda seeds, _: _placed(
            n, q, size, seeds, f"Poisson sample larger than max_batch_size={size}"),
            repeat=repeat)

    def _key(self) -> int:
        """The secret key of one dataset(): the fixed seed, the shared key, or OS entropy."""
        return (self.seed if self.seed is not None else
                self.key if self.key is not None else secrets.randbits(63))

    def _stream(self, x, y, rows: int, steps: Optional[int], num_seeds: int,
                rows_of, row_weights=None, repeat: bool = False,
                key: Optional[int] = None) -> tf.data.Dataset:
        """`steps` batches of (x, y, mask) whose rows `rows_of(step seeds, step index)` picks
        (index `rows`: the zero padding row; the step counts from 0 at each pass over the
        `steps` batches); the mask is 1 per real row, or `row_weights[row]`."""
        steps = self.steps_per_epoch if steps is None else _positive_int("steps", steps)
        data = tf.nest.map_structure(lambda a: _with_zero_row(a, rows), (x, y))
        key = self._key() if key is None else key

        def sample(step: tf.Tensor, step_seed: tf.Tensor):
            seeds = tf.random.experimental.stateless_split(
                tf.stack([step_seed, tf.constant(key, tf.int64)]), num=num_seeds)
            index = rows_of(seeds, step)
            mask = (tf.cast(index < rows, tf.float32) if row_weights is None else
                    tf.gather(tf.constant(list(row_weights) + [0.0], tf.float32), index))
            bx, by = tf.nest.map_structure(lambda t: tf.gather(t, index), data)
            return bx, by, mask

        seeds = tf.data.Dataset.random(seed=key, rerandomize_each_iteration=True)
        batches = seeds.take(steps).enumerate().map(
            sample, num_parallel_calls=iterators.PARALLEL_CALLS, deterministic=True)
        if repeat:
            batches = batches.repeat()
        batches = batches.prefetch(iterators.PREFETCHED)
        return batch_source._mark(iterators.without_autotune(batches), self)


def _placed(units: int, q: float, size: int, seeds, what: str,
            eligible: Optional[tf.Tensor] = None) -> tf.Tensor:
    """[size] slots: each of `units` units (those `eligible`, when given), taken with
    probability q, in a uniformly random slot; empty slots hold `units`. More than `size` taken
    raises: truncating is not the sampling the accounting covers."""
    # float64: a float32 uniform would round q up to a multiple of 2**-24 and sample slightly
    # more often than accounted for small q.
    drawn = tf.random.stateless_uniform([units], seeds[0], dtype=tf.float64) < q
    if eligible is not None:
        drawn = tf.logical_and(drawn, eligible)
    taken = tf.cast(tf.where(drawn)[:, 0], tf.int32)
    count = tf.size(taken)
    check = tf.debugging.assert_less_equal(count, size, message=(
        f"{what} (q={q}, n={units}): refusing to truncate, which the accounting does not cover; "
        "raise max_batch_size"))
    with tf.control_dependencies([check]):
        slots = tf.argsort(slot_keys(size, seeds[1]))[:count]
    return tf.tensor_scatter_nd_update(tf.fill([size], units), slots[:, None], taken)


def slot_keys(size: int, seed: tf.Tensor) -> tf.Tensor:
    """Random int64 sort keys over the full 64-bit range: their argsort is a uniform random
    placement of the sampled rows into the padded batch. Float32 keys tied in about 2.5% of
    steps at size ~1000 (argsort then breaks ties by position, which is not uniform); 64-bit
    keys tie with probability about size^2 / 2^65 (4e-14 at size 1200)."""
    return tf.random.stateless_uniform([size], seed, dtype=tf.int64, minval=None, maxval=None)


def _with_zero_row(array, n: int) -> tf.Tensor:
    t = tf.convert_to_tensor(array)
    if t.shape.rank == 0 or t.shape[0] != n:
        raise ValueError(
            f"every array of x and y must have dataset_size={n} rows, got shape {t.shape}")
    return tf.concat([t, tf.zeros_like(t[:1])], axis=0)


@dataclasses.dataclass(frozen=True)
class UserPoissonSampler(PoissonSampler):
    """Poisson sampling over *users*: the batches of user-level DP (DP-FedSGD).

    Each step takes every user independently with probability q (`sampling_rate`); each sampled
    user fills one micro-batch slot of `microbatch_size` rows (k, the per-user cap) with their
    examples, a uniformly random k of them when they have more (fresh randomness, independent of
    the data), the rest padding (mask 0). Users land in uniformly random slots, as rows do in
    `PoissonSampler`, so adding a user fills one more slot and changes exactly one micro-batch:
    with `DPConfig(privacy_unit="user", microbatch_size=k)` the sensitivity is C per user.

    `dataset_size` is the number of users; `max_batch_size` counts rows (slots x k). Build it
    with `UserPoissonSampler.for_users(user_of_each_row, q, k, replicas)`.

    Weights (McMahan et al. 2018): with `user_weights` (w_k = min(n_k / w_hat, 1), from
    `for_users(..., weight_cap=w_hat)`) a user's rows carry mask value w_k instead of 1; the step
    then scales that user's *clipped* update by w_k (so it moves the sum by at most w_k C <= C:
    S stays 1) and the expected batch, the fixed denominator, is q W with W = sum_k w_k. Users
    with few examples count less, without any user counting more than C.
    """

    user_of_row: tuple = ()  # the user index (0 .. dataset_size - 1) of each training row
    user_weights: tuple = ()  # w_k in (0, 1] per user; empty: every user weighs 1

    def __post_init__(self) -> None:
        if self.microbatch_size is None:
            raise ValueError("UserPoissonSampler needs microbatch_size: the cap of rows per user")
        users = _positive_int("dataset_size", self.dataset_size)
        if not self.user_of_row or min(self.user_of_row) < 0 or max(self.user_of_row) >= users:
            raise ValueError(f"user_of_row must give each row a user index in [0, {users})")
        if self.user_weights and (len(self.user_weights) != users or not all(
                0.0 < float(w) <= 1.0 for w in self.user_weights)):
            raise ValueError(f"user_weights must hold one weight in (0, 1] per user ({users})")
        if self.max_batch_size is None:
            slots = poisson_max_batch_size(users, check_sampling_rate(self.sampling_rate),
                                           self.overflow_probability, self.replicas)
            object.__setattr__(self, "max_batch_size", slots * self.microbatch_size)
        super().__post_init__()

    @classmethod
    def for_users(cls, users, sampling_rate: float, examples_per_user: int, replicas: int = 1,
                  seed: Optional[int] = None, weight_cap: Optional[float] = None,
                  **kwargs) -> "UserPoissonSampler":
        """A sampler over the distinct values of `users` (one per training row, any hashable);
        with `weight_cap` w_hat > 0, user k weighs min(n_k / w_hat, 1) (n_k: their rows)."""
        index: dict = {}
        rows = tuple(index.setdefault(u, len(index)) for u in users)
        weights = ()
        if weight_cap is not None:
            if isinstance(weight_cap, bool) or not float(weight_cap) > 0:
                raise ValueError(f"weight_cap must be a number > 0, got {weight_cap!r}")
            counts = [0] * len(index)
            for r in rows:
                counts[r] += 1
            weights = tuple(min(c / float(weight_cap), 1.0) for c in counts)
        return cls(dataset_size=max(1, len(index)), sampling_rate=sampling_rate,
                   replicas=replicas, microbatch_size=examples_per_user, seed=seed,
                   user_of_row=rows, user_weights=weights, **kwargs)

    @property
    def expected_batch_size(self) -> float:
        """q W: the expected total weight of a step's users (q x users without weights)."""
        total = sum(self.user_weights) if self.user_weights else self.dataset_size
        return total * self.sampling_rate

    @property
    def unit(self) -> SamplingUnit:
        """One user's rows (at most microbatch_size) per sampled unit."""
        return SamplingUnit("user", self.microbatch_size)

    @property
    def slots(self) -> int:
        """Users per batch at most (the binomial quantile over users)."""
        return self.max_batch_size // self.microbatch_size

    def dataset(self, x: Any, y: Any, steps: Optional[int] = None,
                repeat: bool = False) -> tf.data.Dataset:
        """`steps` (default steps_per_epoch) batches of (x, y, mask): slot j holds rows
        [j k, (j + 1) k), one sampled user's or none (`repeat` as PoissonSampler's)."""
        users, k, slots, q = self.dataset_size, self.microbatch_size, self.slots, self.sampling_rate
        n = len(self.user_of_row)
        table = _rows_by_user(self.user_of_row, users, n, k)  # [users + 1, width], padded with n
        row_weights = ([self.user_weights[u] for u in self.user_of_row] if self.user_weights
                       else None)
        return self._stream(x, y, n, steps, 3, lambda seeds, _: _grouped_rows(
            table, users, q, slots, k, n, seeds, f"Poisson sample of more than {slots} users"),
            row_weights, repeat)


@dataclasses.dataclass(frozen=True)
class AugmentedPoissonSampler(PoissonSampler):
    """Poisson sampling over *examples* whose rows are augmented copies: the batches of
    augmentation multiplicity (`DPConfig(augment_copies=K)`, De et al. 2022).

    The training arrays hold `variants` rows per example, consecutive (rows [i V, (i + 1) V) are
    example i's, e.g. the example itself and V - 1 augmentations of it made from it and public
    data only). Each step takes every example independently with probability q, as
    `PoissonSampler` does (`dataset_size` is n, the examples, so q, the steps and epsilon are
    those of the same run without copies), and each sampled example fills one slot of `copies`
    (K) rows with a uniformly random K of its V variants: the grouping of `UserPoissonSampler`,
    with an example in place of a user. Slots are placed as rows are, so adding an example fills
    one more slot, one micro-batch of `DPConfig(microbatch_size=1, augment_copies=K)`: S = C.

    `max_batch_size` counts rows (slots x K); `expected_batch_size` is q n, in examples.
    """

    copies: int = 1  # K: rows of an example per step (one micro-batch)
    variants: int = 0  # V >= K: rows of an example in the arrays; 0: K

    def __post_init__(self) -> None:
        copies = _positive_int("copies", self.copies)
        if self.variants == 0:
            object.__setattr__(self, "variants", copies)
        if _positive_int("variants", self.variants) < copies:
            raise ValueError(f"variants={self.variants} must be >= copies={copies}: each step "
                             "takes K of an example's variants")
        if self.microbatch_size not in (None, 1):
            raise ValueError("AugmentedPoissonSampler: one example's copies are one micro-batch "
                             f"(microbatch_size 1), got microbatch_size={self.microbatch_size}")
        if self.max_batch_size is None:
            slots = poisson_max_batch_size(_positive_int("dataset_size", self.dataset_size),
                                           check_sampling_rate(self.sampling_rate),
                                           self.overflow_probability, self.replicas)
            object.__setattr__(self, "max_batch_size", slots * copies)
        elif _positive_int("max_batch_size", self.max_batch_size) % (self.replicas * copies):
            raise ValueError(f"max_batch_size={self.max_batch_size} must be a multiple of "
                             f"replicas x copies = {self.replicas * copies}")
        object.__setattr__(self, "microbatch_size", 1)
        super().__post_init__()

    @property
    def unit(self) -> SamplingUnit:
        """One example's `copies` rows per sampled unit."""
        return SamplingUnit(copies=self.copies)

    @property
    def slots(self) -> int:
        """Examples per batch at most (the binomial quantile over examples)."""
        return self.max_batch_size // self.copies

    def dataset(self, x: Any, y: Any, steps: Optional[int] = None,
                repeat: bool = False) -> tf.data.Dataset:
        """`steps` (default steps_per_epoch) batches of (x, y, mask): slot j holds rows
        [j K, (j + 1) K), K variants of one sampled example, or padding. x and y hold
        dataset_size x variants rows, each example's consecutive (`repeat` as
        PoissonSampler's)."""
        n, k, v, slots = self.dataset_size, self.copies, self.variants, self.slots
        rows = n * v
        for array in tf.nest.flatten((x, y)):
            if not tf.TensorShape(getattr(array, "shape", None)).rank or array.shape[0] != rows:
                raise ValueError(f"x and y must hold dataset_size x variants = {n} x {v} = {rows} "
                                 f"rows (each example's variants consecutive), got shape "
                                 f"{getattr(array, 'shape', None)}")
        table = tf.concat([tf.reshape(tf.range(rows, dtype=tf.int32), [n, v]),
                           tf.fill([1, v], rows)], 0)  # [n + 1, V]: the last is the empty slot
        return self._stream(x, y, rows, steps, 3, lambda seeds, _: _grouped_rows(
            table, n, self.sampling_rate, slots, k, rows, seeds,
            f"Poisson sample larger than {slots} examples"), repeat=repeat)


@dataclasses.dataclass(frozen=True)
class BandMFSampler(PoissonSampler):
    """The batches of amplified BandMF (`DPConfig(bandmf_bands=b)`, edp_tf/bandmf.py): the n
    examples are split once into b groups and step t Poisson-samples group t mod b at rate b q.

    `sampling_rate` is q = B / n, the expected batch over the examples as for DP-SGD (so
    `expected_batch_size` and the padded `max_batch_size` are DP-SGD's: a step's count is
    Binomial(n, q) over the split and the sampling); each example is drawn at rate b q, at
    most once every b steps, which is what the accounting charges (ceil(T / b) steps at b q).

    The split: each example's group is drawn independently and uniformly from the dataset's
    key (OS entropy, the shared key, or a fixed seed), once per `dataset()` and the same in every
    pass. Independent draws, not a balanced cut, so that adding or removing one example leaves
    the others' groups distributed exactly as before (a balanced cut would move them). The split
    depends on no data, so the guarantee holds even for an adversary who learns it.

    Every pass holds a multiple of b steps, so the groups keep their cycle across epochs and
    passes: consecutive draws of one group are always exactly b steps apart, the separation the
    banded strategy's sensitivity needs.
    """

    bands: int = 2

    def __post_init__(self) -> None:
        if _positive_int("bands", self.bands) < 2:
            raise ValueError("BandMFSampler needs bands >= 2 (one band is DP-SGD: use "
                             "PoissonSampler)")
        super().__post_init__()
        group_sampling_rate(self.sampling_rate, self.bands)  # b q <= 1

    @property
    def unit(self) -> SamplingUnit:
        """One example's row, drawn in a cycle of `bands` groups."""
        return SamplingUnit(bands=self.bands)

    @property
    def group_sampling_rate(self) -> float:
        """b q: the rate at which a step samples the examples of its group."""
        return group_sampling_rate(self.sampling_rate, self.bands)

    @property
    def steps_per_epoch(self) -> int:
        """b ceil(1 / (b q)): each group seen once in expectation, a whole number of cycles."""
        return self.bands * int(math.ceil(1.0 / self.group_sampling_rate - 1e-9))

    def groups(self, key: int) -> np.ndarray:
        """The group (0 .. b-1) of each example under `key`."""
        return np.random.default_rng(key).integers(0, self.bands, size=self.dataset_size)

    def dataset(self, x: Any, y: Any, steps: Optional[int] = None,
                repeat: bool = False) -> tf.data.Dataset:
        """`steps` (default steps_per_epoch, a multiple of b) batches of (x, y, mask): step t
        of a pass holds group t mod b's Poisson sample (`repeat` as PoissonSampler's)."""
        steps = self.steps_per_epoch if steps is None else _positive_int("steps", steps)
        if steps % self.bands:
            raise ValueError(f"BandMFSampler.dataset: steps={steps} must be a multiple of "
                             f"bands={self.bands}, so that every group is drawn exactly b steps "
                             "after its previous draw, across passes too")
        n, size, q, b = self.dataset_size, self.max_batch_size, self.group_sampling_rate, self.bands
        key = self._key()
        group = tf.constant(self.groups(key), tf.int32)
        return self._stream(x, y, n, steps, 2, lambda seeds, step: _placed(
            n, q, size, seeds, f"Poisson sample larger than max_batch_size={size}",
            tf.equal(group, tf.cast(step % b, tf.int32))), repeat=repeat, key=key)


def _grouped_rows(table: tf.Tensor, units: int, q: float, slots: int, k: int, rows: int, seeds,
                  what: str) -> tf.Tensor:
    """[slots k] row indices: each of `units` units (users, or examples with copies) taken with
    probability q into a uniformly random slot (`_placed`), which holds a uniformly random k of
    the unit's rows (`table[unit]`, padded with `rows`: the zero padding row), then padding."""
    slot_unit = _placed(units, q, slots, seeds, what)
    candidates = tf.gather(table, slot_unit)  # [slots, width]
    # a uniformly random k of each unit's rows: real rows sorted by random keys first
    keys = tf.where(candidates < rows, tf.random.stateless_uniform(
        tf.shape(candidates), seeds[2], dtype=tf.float32), 2.0)
    chosen = tf.gather(candidates, tf.argsort(keys, axis=1)[:, :k], batch_dims=1)
    return tf.reshape(chosen, [slots * k])


def _rows_by_user(user_of_row, users: int, n: int, k: int) -> tf.Tensor:
    """[users + 1, max(k, largest user)] row indices per user, padded with n (the zero row); the
    last user is the empty one that fills unused slots."""
    by_user: list = [[] for _ in range(users + 1)]
    for row, user in enumerate(user_of_row):
        by_user[user].append(row)
    width = max(k, max(len(r) for r in by_user))
    return tf.constant([r + [n] * (width - len(r)) for r in by_user], tf.int32)


def for_unit(unit: SamplingUnit, dataset_size: int, sampling_rate: float, replicas: int = 1,
             microbatch_size: Optional[int] = None, *, users=None,
             weight_cap: Optional[float] = None, variants: int = 0, seed: Optional[int] = None,
             key: Optional[int] = None) -> PoissonSampler:
    """The sampler whose batches are `unit` (a step's `Mechanism.sampling_unit` or
    `DPConfig.sampling_unit`): the one place a sampler class is chosen, so the library never
    pairs a step with batches of another unit. `users` (the user of each training row) and
    `weight_cap` are for user level, `variants` (rows per example in the arrays) for copies."""
    if unit.privacy_unit == "user":
        if users is None:
            raise ValueError("user-level sampling needs the user of each training row (users=)")
        return UserPoissonSampler.for_users(users, sampling_rate, unit.user_rows, replicas, seed,
                                            weight_cap=weight_cap, key=key)
    common = dict(dataset_size=dataset_size, sampling_rate=sampling_rate, replicas=replicas,
                  seed=seed, key=key)
    if unit.copies > 1:
        return AugmentedPoissonSampler(copies=unit.copies, variants=variants, **common)
    if unit.bands > 1:
        return BandMFSampler(microbatch_size=microbatch_size, bands=unit.bands, **common)
    return PoissonSampler(microbatch_size=microbatch_size, **common)
