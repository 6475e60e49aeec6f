"""Stage 3 of the private step: the noise mechanism, clipped sums in, noisy sums out.

Why a stage of its own: each mechanism owns its state and its facts (the generator and its owner
replicas; BandMF's last b - 1 noise vectors; the sparse tables' selection), so a new one is a
class here plus its test, and the step calls `add` whatever it is (Opacus' `add_noise`,
jax-privacy's `add_noise_to_grads` with its own `init_noise_state`). Which one runs is decided
from the `Mechanism` alone (`for_mechanism`), so the step and the accountant cannot disagree.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import tensorflow as tf

from edp_tf import clipping, noise, selection, step_inputs
from edp_tf.mechanism import Mechanism
from edp_tf.untracked import Untracked


class GaussianNoise:
    """N(0, std^2) on each variable, drawn once on its owner replica with std sqrt(N) x the
    per-replica std (noise.add_owned_noise); with sparse embedding noise, each table keeps the
    rows whose noisy counts pass the threshold, with noise on those rows only."""

    def __init__(self, generator, sizes: Sequence[int], replicas: int,
                 rows: Optional[selection.RowSelection] = None):
        self.generator = generator  # held untracked by the caller (its state is a secret)
        self.owners = noise.noise_owners(list(sizes), replicas)
        self.replicas = replicas
        self.rows = rows

    def add(self, clip: clipping.ClipResult, std) -> tuple:
        """(the noisy sums, the fraction of table rows selected or None)."""
        sparse = self.rows.indices if self.rows is not None else ()
        dense = [i for i in range(len(clip.clipped_sum)) if i not in sparse]
        noisy = list(clip.clipped_sum)
        drawn = self._dense([noisy[i] for i in dense], std, [self.owners[i] for i in dense])
        for i, t in zip(dense, drawn):
            noisy[i] = t
        if not sparse:
            return noisy, None
        n = self.replicas
        chosen = selection.select(clip.counts, self.rows, self.generator, n)
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        for i, mask in zip(sparse, chosen):
            draws = None if n == 1 else tf.equal(replica, self.owners[i])
            # sparse on any number of replicas: Adam and momentum leave the other rows be, and
            # with several replicas the all-reduce carries only the selected rows
            noisy[i] = selection.noisy_selected_rows(noisy[i], mask, std * math.sqrt(n),
                                                     self.generator, draws)
        return noisy, selection.selected_fraction(chosen)

    def _dense(self, tensors: list, std, owners: list) -> list:
        return noise.add_owned_noise(tensors, std, self.generator, owners, self.replicas)


class BandedNoise(GaussianNoise):
    """BandMF's correlated noise (noise.add_owned_banded_noise): each owner keeps its variable's
    last b - 1 noise vectors, fresh at every fit and held outside any tracking (never
    checkpointed: with the released updates they would give the clipped sums away)."""

    def __init__(self, generator, variables: Sequence, replicas: int, mechanism: Mechanism,
                 strategy):
        super().__init__(generator, [int(math.prod(v.shape)) for v in variables], replicas)
        with strategy.scope():
            self._history = Untracked(noise.banded_histories(variables, mechanism.bands))
        self.coefficients = mechanism.strategy_coefficients

    @property
    def history(self) -> list:
        return self._history.value

    def _dense(self, tensors: list, std, owners: list) -> list:
        return noise.add_owned_banded_noise(tensors, std, self.generator, owners, self.replicas,
                                            self.history, self.coefficients)


def for_mechanism(mechanism: Mechanism, generator, variables: Sequence, replicas: int,
                  strategy, rows: Optional[selection.RowSelection] = None) -> GaussianNoise:
    """The noise stage the mechanism describes, for the variables the step trains now."""
    if mechanism.bands > 1:  # no sparse tables with BandMF (config.compatibility)
        return BandedNoise(generator, variables, replicas, mechanism, strategy)
    return GaussianNoise(generator, [int(math.prod(v.shape)) for v in variables], replicas, rows)


class ExpectedDenominator:
    """Stage 4, normalise: divide by D, the expected number of micro-batches, a constant of the
    mechanism (so Poisson padding never changes the update)."""

    def __init__(self, mechanism: Mechanism):
        self.expected = mechanism.expected_microbatches

    def noise_std(self, std, w, microbatch_size):
        """(the per-replica noise std, the denominator) of this step; `w`: the rows' mask, cut
        into micro-batches of `microbatch_size` rows as the step cuts them."""
        del w, microbatch_size
        return std, self.expected

    def updates(self, noisy: list, scales, denominator) -> list:
        return clipping.to_update(noisy, scales, denominator)


class ClippedDenominator(ExpectedDenominator):
    """User level, the clipped-denominator estimator: divide by D_t = max(D, users drawn in
    the whole step), the noise scaled by D_t / D, so that the average carries noise of std
    z S C / D whatever D_t is (S = 2: McMahan et al. 2018)."""

    def noise_std(self, std, w, microbatch_size):
        present = step_inputs.real_microbatches(w, microbatch_size)  # one user per micro-batch
        users = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.reduce_sum(tf.cast(present, tf.float32)))
        denominator = tf.maximum(float(self.expected), users)
        return std * denominator / float(self.expected), denominator

    def updates(self, noisy: list, scales, denominator) -> list:
        return clipping.to_update([g / tf.cast(denominator, g.dtype) for g in noisy], scales,
                                  1.0)


def normaliser(mechanism: Mechanism) -> ExpectedDenominator:
    """The normalisation the mechanism describes."""
    if mechanism.user_estimator == "clipped":
        return ClippedDenominator(mechanism)
    return ExpectedDenominator(mechanism)
